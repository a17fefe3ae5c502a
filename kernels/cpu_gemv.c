/* y = W x for one row x: the linear layers of a decode step at batch 1, for the CPU.
 *
 * With one token per step, `y = x Wᵀ` reads every weight once and does 2 FLOPs per weight: the
 * time is the time to stream W from memory. This kernel is that stream: each thread takes a
 * contiguous range of W's rows, four at a time, and walks them in VW-float vectors against x
 * (which stays in L1), then sums each row's vector horizontally. On SmolLM2's small per-layer
 * matrices (0.4-3.5 MB) it is faster than oneDNN's GEMV, whose per-call set-up shows at
 * these sizes. Built with the other CPU kernels into one library (llmlab/ops/cpu_library.py);
 * the engine's CPU fast path (`CpuLinear` in llmlab/model_cpu.py) calls it for one-row inputs.
 */
#include <stdint.h>
#include <string.h>

#include "cpu_kernels.h"
#include "cpu_vec.h"

/* y[n] = add[n] + W[n]·x + bias[n] for n < N (add, bias may be NULL), the rows shared among
 * the threads of the enclosing parallel region: an orphaned `omp for` without its barrier, so a
 * fused kernel (cpu_layer.c's decode layer) calls it inside its own region and waits for the
 * rows where it needs them, and outside any region it runs on one thread. `add` may be `y`
 * itself (a residual added in place). W, x, y contiguous; K % 16 == 0 (the caller checks). */
void llmlab_gemv_rows(const float *x, const float *W, const float *bias, const float *add,
                      float *y, int64_t N, int64_t K) {
#pragma omp for schedule(static) nowait
    for (int64_t n0 = 0; n0 < N; n0 += 4) {
        float r[4];
        const int64_t rows = N - n0 < 4 ? N - n0 : 4;
        if (rows == 4) {                      /* four rows at once: four streams, one x */
            const float *w0 = W + n0 * K, *w1 = w0 + K, *w2 = w1 + K, *w3 = w2 + K;
            vf a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0};
            for (int64_t k = 0; k < K; k += VW) {
                prefetch_ahead(w0 + 4 * k, 4 * sizeof(vf));  /* the block, as it is read */
                vf xv = vload(x + k);
                a0 += vload(w0 + k) * xv; a1 += vload(w1 + k) * xv;
                a2 += vload(w2 + k) * xv; a3 += vload(w3 + k) * xv;
            }
            r[0] = hsum(a0); r[1] = hsum(a1); r[2] = hsum(a2); r[3] = hsum(a3);
        } else {                              /* the last N % 4 rows */
            for (int64_t i = 0; i < rows; i++) {
                vf a = {0};
                for (int64_t k = 0; k < K; k += VW) a += vload(W + (n0 + i) * K + k) * vload(x + k);
                r[i] = hsum(a);
            }
        }
        for (int64_t i = 0; i < rows; i++) {
            float v = r[i];
            if (bias) v += bias[n0 + i];
            y[n0 + i] = add ? add[n0 + i] + v : v;
        }
    }
}

/* y[N] = W[N, K] x[K] (+ bias[N], which may be NULL) on all threads. */
void llmlab_gemv(const float *x, const float *W, const float *bias, float *y, int64_t N,
                 int64_t K) {
#pragma omp parallel
    llmlab_gemv_rows(x, W, bias, NULL, y, N, K);
}
