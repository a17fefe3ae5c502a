/* Greedy sampling's argmax for the CPU: each row's index of its largest logit.
 *
 * A greedy step picks, per request, the token with the largest logit: one pass over a row of
 * vocab floats (49,152 for SmolLM2). torch.argmax walks a row one element at a time (43 us a
 * row on a 2-core Zen 4: 1.4 ms of a batch-64 step), this kernel VW lanes at a time, rows
 * shared among the threads. Same answer as torch.argmax: the first index of the maximum, and
 * where a row holds a NaN, the first NaN's index (torch orders NaN above every number). Built
 * with the other CPU kernels into one library (llmlab/ops/cpu_library.py); `llmlab.sampling.
 * sample` calls it through `cpu_backend.argmax_rows`.
 */
#include <stdint.h>

#include "cpu_kernels.h"
#include "cpu_vec.h"

/* The first index of row x[0:V]'s maximum (of its first NaN if it has one). Each lane keeps
 * the largest value it has seen and where, replacing it only by a strictly larger one, so
 * within a lane the first of equal maxima stays; across lanes the smallest index of the
 * maximum wins. */
static int64_t argmax_row(const float *x, int64_t V) {
    const int64_t full = V / VW * VW;
    int64_t best = 0;
    if (full) {
        vf vmax = vload(x);
        vi vidx, lane;
        for (int i = 0; i < VW; i++) lane[i] = i;
        vidx = lane;
        vi nan = vmax != vmax;
        for (int64_t k = VW; k < full; k += VW) {
            const vf v = vload(x + k);
            const vi gt = v > vmax;                          /* -1 where v is larger */
            vmax = (vf)((gt & (vi)v) | (~gt & (vi)vmax));
            vidx = (gt & (lane + (int32_t)k)) | (~gt & vidx);
            nan |= v != v;
        }
        int any_nan = 0;
        for (int i = 0; i < VW; i++) any_nan |= nan[i];
        if (any_nan) {
            for (int64_t k = 0; k < V; k++)
                if (x[k] != x[k]) return k;
        }
        float m = vmax[0];
        best = vidx[0];
        for (int i = 1; i < VW; i++)
            if (vmax[i] > m || (vmax[i] == m && vidx[i] < best)) m = vmax[i], best = vidx[i];
    }
    for (int64_t k = full; k < V; k++) {                     /* the last V % VW */
        if (x[k] != x[k]) return k;
        if (x[k] > x[best]) best = k;
    }
    return best;
}

/* out[b] = argmax of row b of x (rows every `stride` floats, each of V contiguous floats), for
 * b < B; V >= 1. Rows are shared among the threads from 2 rows on. */
void llmlab_argmax_rows(const float *x, int64_t stride, int64_t B, int64_t V, int64_t *out) {
#pragma omp parallel for schedule(static) if (B > 1)
    for (int64_t b = 0; b < B; b++) out[b] = argmax_row(x + b * stride, V);
}
