/* The elementwise steps of a decoder layer for the CPU, one call each instead of 5-15 PyTorch ops.
 *
 * At batch 1 a layer's matmuls stream ~14 MB of weights in ~0.4 ms; the norms, the rotary
 * embedding and the SwiGLU product are tiny, but as PyTorch code they are ~60 separate operator
 * calls per layer, each with a few microseconds of dispatch: together a quarter of the step.
 * vLLM has custom ops for exactly these (rms_norm, fused_add_rms_norm, rotary_embedding,
 * silu_and_mul); these are ours. Same math as llmlab/model.py; float32; rows may be strided
 * (they are often views of a stacked matmul output), each row's elements contiguous.
 * Built with the other CPU kernels into one library (llmlab/ops/cpu_library.py).
 *
 * At the end, `llmlab_decode_layer`: a whole decoder layer for one token in one call, what a
 * batch-1 decode step runs (see there).
 */
#include <math.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#include "cpu_kernels.h"
#include "cpu_vec.h"

/* One row of RMSNorm: out = src / sqrt(mean(src^2) + eps) * weight, src = x (+ residual, then
 * also written to sum_out). */
static inline void norm_row(const float *x, const float *residual, const float *weight,
                            float *sum_out, float *out, int64_t D, float eps) {
    const float *src = x;
    if (residual) {
        for (int64_t d = 0; d < D; d += VW) vstore(sum_out + d, vload(x + d) + vload(residual + d));
        src = sum_out;
    }
    vf sq = {0};
    for (int64_t d = 0; d < D; d += VW) {
        const vf v = vload(src + d);
        sq += v * v;
    }
    float total = 0.0f;
    for (int i = 0; i < VW; i++) total += sq[i];
    const float r = 1.0f / sqrtf(total / (float)D + eps);
    for (int64_t d = 0; d < D; d += VW) vstore(out + d, vload(weight + d) * (vload(src + d) * r));
}

/* out[t] = (x[t] (+ residual[t])) / sqrt(mean((x[t] (+ residual[t]))^2) + eps) * weight.
 * With `residual`, the sum x + residual is also written to `sum_out` (the residual stream the
 * next layer reads). Rows: x every x_stride floats, residual every res_stride, out and sum_out
 * contiguous [T, D]. D % 16 == 0 (checked by the caller). */
void llmlab_rms_norm(const float *x, int64_t x_stride, const float *residual, int64_t res_stride,
                     const float *weight, float *sum_out, float *out, int64_t T, int64_t D,
                     float eps) {
#pragma omp parallel for schedule(static) if (T > 16)
    for (int64_t t = 0; t < T; t++)
        norm_row(x + t * x_stride, residual ? residual + t * res_stride : NULL, weight,
                 residual ? sum_out + t * D : NULL, out + t * D, D, eps);
}

/* out[i] = silu(gate[i]) * up[i] for i < n (n % 16 == 0), silu(g) = g / (1 + e^-g). */
static inline void silu_mul_row(const float *g, const float *u, float *o, int64_t n) {
    for (int64_t i = 0; i < n; i += VW) {
        const vf gv = vload(g + i);
        vstore(o + i, gv / (1.0f + vexp(-gv)) * vload(u + i));
    }
}

/* out[t] = silu(gate[t]) * up[t]; gate rows every gate_stride floats, up rows every up_stride,
 * out contiguous [T, I]; I % 16 == 0. */
void llmlab_silu_mul(const float *gate, int64_t gate_stride, const float *up, int64_t up_stride,
                     float *out, int64_t T, int64_t I) {
#pragma omp parallel for schedule(static) if (T * I > 65536)
    for (int64_t t = 0; t < T; t++)
        silu_mul_row(gate + t * gate_stride, up + t * up_stride, out + t * I, I);
}

/* One token's rotary embedding over `heads` heads of size D: x [heads, D] contiguous,
 * cos, sin [D/2], out [heads, D]. */
static inline void rope_row(const float *x, const float *c, const float *s, float *out,
                            int64_t heads, int64_t D) {
    const int64_t half = D / 2;
    for (int64_t h = 0; h < heads; h++) {
        const float *xr = x + h * D;
        float *o = out + h * D;
        int64_t i = 0;
        for (; i + VW <= half; i += VW) {
            const vf x1 = vload(xr + i), x2 = vload(xr + half + i);
            const vf cv = vload(c + i), sv = vload(s + i);
            vstore(o + i, x1 * cv - x2 * sv);
            vstore(o + half + i, x2 * cv + x1 * sv);
        }
        for (; i < half; i++) {
            const float x1 = xr[i], x2 = xr[half + i];
            o[i] = x1 * c[i] - x2 * s[i];
            o[half + i] = x2 * c[i] + x1 * s[i];
        }
    }
}

/* Rotary embedding, Hugging Face's "rotate half" layout: for each head, the pairs
 * (x_i, x_{i+D/2}) turn by the angle whose cos/sin are cos[t, i], sin[t, i]:
 *   out_i = x_i cos - x_{i+D/2} sin,   out_{i+D/2} = x_{i+D/2} cos + x_i sin.
 * x: [T, heads, D] with token stride x_stride (heads contiguous); cos, sin: [T, D/2]
 * contiguous; out: contiguous [T, heads, D]. D/2 % 16 == 0 or D/2 < 16 (then scalar). */
void llmlab_rope(const float *x, int64_t x_stride, const float *cos, const float *sin,
                 float *out, int64_t T, int64_t heads, int64_t D) {
#pragma omp parallel for schedule(static) if (T * heads > 512)
    for (int64_t t = 0; t < T; t++)
        rope_row(x + t * x_stride, cos + t * (D / 2), sin + t * (D / 2), out + t * heads * D,
                 heads, D);
}

/* A whole decoder layer for ONE new token of one sequence (a batch-1 decode step), in one call.
 *
 * At batch 1 each layer streams ~14 MB of weights through four GEMVs, ~0.3 ms; driving the
 * same layer from Python as ~15 kernel calls (CpuDecoderLayer in llmlab/model_cpu.py) adds
 * ~0.1 ms of interpreter and dispatch time between them, a third of the step. vLLM removes
 * that launch overhead on a GPU by replaying a captured CUDA graph of the decode step; on a
 * CPU the equivalent is to run the layer's sequence of kernels from C. Same math, same
 * kernels, same order of float operations as that kernel-by-kernel path (so the results
 * are identical):
 *
 *   h = rms_norm(x) · ln1;  [q k v] = W_qkv h (+ b_qkv);  q, k = rope(q), rope(k)
 *   cache[slot] = k, v;     a = attention(q, cached K/V of positions < seq_len)
 *   x' = x + W_o a;         h = rms_norm(x') · ln2;  [g u] = W_gate_up h
 *   x_out = x' + W_down (silu(g) * u)
 *
 * One OpenMP parallel region: the GEMVs split their rows among the threads, attention its KV
 * heads; the region's barriers replace the kernel calls. A barrier is where threads wait for
 * each other (tens of microseconds to wake a sleeping one), so there are only the six the
 * data needs (after each of the four GEMVs, after attention, after SiLU x up): every thread
 * takes the RMSNorm of the row itself into its own copy, and each KV head's attention unit
 * first rotates its own query heads and key and writes its k and v into the cache.
 * x [hidden] (read), x_out [hidden] (written; not x), scratch: at least
 * 3 * heads * head_dim + 2 * kv_heads * head_dim + 3 * inter floats. W_qkv is q, k, v
 * stacked [heads*hd + 2*kv_heads*hd, hidden], W_gate_up [2*inter, hidden]; cos, sin [hd/2];
 * *slot (-1: do not cache), block_table and *seq_len (incl. this token) as for
 * llmlab_paged_attention. The four matrices are of type `wtype` (LLMLAB_W_F32, _BF16, or _INT8
 * with the s_* scales per output row; cpu_quant.c); the cache is float32. hidden, inter % 16
 * == 0; head_dim one of the attention kernel's sizes (the caller checks). Returns -1 if the attention kernel refused head_dim, else 0. */
/* Seconds per phase of llmlab_decode_layer (LAYER_PHASES of llmlab/ops/cpu_backend.py), added
 * into `seconds` while it is set, NULL to stop: how `bench decode_profile` splits a layer. The
 * calling thread (OpenMP's master) reads the clock after each barrier; off, a test per phase. */
static double *phase_seconds = NULL;

void llmlab_time_layer_phases(double *seconds) { phase_seconds = seconds; }

static inline double wall_seconds(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

#define PHASE(i)                                                      \
    if (clock_out) {                                                  \
        _Pragma("omp master")                                         \
        {                                                             \
            const double now = wall_seconds();                        \
            clock_out[i] += now - last;                               \
            last = now;                                               \
        }                                                             \
    }

int llmlab_decode_layer(const float *x, float *x_out, float *scratch, const float *ln1,
                        const float *ln2, float eps, const void *w_qkv, const float *b_qkv,
                        const void *w_o, const void *w_gate_up, const void *w_down,
                        int64_t wtype, const float *s_qkv, const float *s_o,
                        const float *s_gate_up, const float *s_down,
                        const float *cos, const float *sin, float *key_cache,
                        float *value_cache, const int64_t *slot, const int32_t *block_table,
                        const int32_t *seq_len, int64_t block_size, int64_t hidden,
                        int64_t heads, int64_t kv_heads, int64_t head_dim, int64_t inter,
                        float scale) {
    const int64_t qw = heads * head_dim, kw = kv_heads * head_dim, group = heads / kv_heads;
    float *qkv = scratch, *q = qkv + qw + 2 * kw, *att = q + qw, *gu = att + qw,
          *act = gu + 2 * inter;
    int rc = 0;
    double *clock_out = phase_seconds, last = clock_out ? wall_seconds() : 0.0;
#pragma omp parallel
    {
        PHASE(0)                                                         /* region start */
        /* each thread norms the row itself (hidden floats, a microsecond) into its own copy, so
         * no barrier waits for one thread to do it: each barrier costs a wake-up of the other
         * threads (tens of microseconds when they sleep) */
        float hl[hidden];
        norm_row(x, NULL, ln1, NULL, hl, hidden, eps);
        llmlab_qgemv_rows(hl, w_qkv, wtype, s_qkv, b_qkv, NULL, qkv, qw + 2 * kw, hidden);
        PHASE(1)                                                         /* norm + qkv */
        /* one unit per KV head: RoPE of its query heads and of its key, its k and v into the
         * cache slot, then its attention. A unit reads only its own head's cache, so no barrier
         * separates the rotation from the attention. */
#pragma omp for schedule(dynamic, 1)
        for (int64_t g = 0; g < kv_heads; g++) {
            const int64_t hq = g * group * head_dim, hk = g * head_dim;
            rope_row(qkv + hq, cos, sin, q + hq, group, head_dim);
            if (*slot >= 0) {              /* k (rotated) and v straight into their cache slot */
                rope_row(qkv + qw + hk, cos, sin, key_cache + *slot * kw + hk, 1, head_dim);
                memcpy(value_cache + *slot * kw + hk, qkv + qw + kw + hk,
                       sizeof(float) * head_dim);
            }
            if (llmlab_attention_unit(head_dim, q, qw, head_dim, key_cache, value_cache,
                                      block_table, block_size, kv_heads, group, g, 0, 1,
                                      *seq_len - 1, scale, 0, 1.0f, 1.0f, att, qw) != 0) {
#pragma omp atomic write
                rc = -1;
            }
        }
        PHASE(2)                                                 /* rope + attention */
        llmlab_qgemv_rows(att, w_o, wtype, s_o, NULL, x, x_out, hidden, qw);   /* x' = x + W_o a */
        PHASE(3)
        norm_row(x_out, NULL, ln2, NULL, hl, hidden, eps);   /* per thread, as above */
        llmlab_qgemv_rows(hl, w_gate_up, wtype, s_gate_up, NULL, NULL, gu, 2 * inter, hidden);
        PHASE(4)                                                         /* norm + gate/up */
#pragma omp for schedule(static)
        for (int64_t i = 0; i < inter; i += VW)
            silu_mul_row(gu + i, gu + inter + i, act + i, VW);
        PHASE(5)
        llmlab_qgemv_rows(act, w_down, wtype, s_down, NULL, x_out, x_out, hidden, inter);
                                                                 /* x_out = x' + W_down … */
        PHASE(6)
    }
    if (clock_out) clock_out[7] += wall_seconds() - last;                /* region end */
    return rc;
}
