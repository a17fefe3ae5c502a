/* The elementwise steps of a decoder layer for the CPU, one call each instead of 5-15 PyTorch ops.
 *
 * At batch 1 a layer's matmuls stream ~14 MB of weights in ~0.4 ms; the norms, the rotary
 * embedding and the SwiGLU product are tiny, but as PyTorch code they are ~60 separate operator
 * calls per layer, each with a few microseconds of dispatch: together a quarter of the step.
 * vLLM has custom ops for exactly these (rms_norm, fused_add_rms_norm, rotary_embedding,
 * silu_and_mul); these are ours. Same math as llmlab/model.py; float32; rows may be strided
 * (they are often views of a stacked matmul output), each row's elements contiguous.
 * Built with the other CPU kernels into one library (llmlab/ops/cpu_backend.py).
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "cpu_vec.h"

/* out[t] = (x[t] (+ residual[t])) / sqrt(mean((x[t] (+ residual[t]))^2) + eps) * weight.
 * With `residual`, the sum x + residual is also written to `sum_out` (the residual stream the
 * next layer reads). Rows: x every x_stride floats, residual every res_stride, out and sum_out
 * contiguous [T, D]. D % 16 == 0 (checked by the caller). */
void llmlab_rms_norm(const float *x, int64_t x_stride, const float *residual, int64_t res_stride,
                     const float *weight, float *sum_out, float *out, int64_t T, int64_t D,
                     float eps) {
#pragma omp parallel for schedule(static) if (T > 16)
    for (int64_t t = 0; t < T; t++) {
        const float *xr = x + t * x_stride;
        float *o = out + t * D;
        const float *src = xr;
        if (residual) {
            float *s = sum_out + t * D;
            const float *rr = residual + t * res_stride;
            for (int64_t d = 0; d < D; d += VW) vstore(s + d, vload(xr + d) + vload(rr + d));
            src = s;
        }
        vf sq = {0};
        for (int64_t d = 0; d < D; d += VW) {
            const vf v = vload(src + d);
            sq += v * v;
        }
        float total = 0.0f;
        for (int i = 0; i < VW; i++) total += sq[i];
        const float r = 1.0f / sqrtf(total / (float)D + eps);
        for (int64_t d = 0; d < D; d += VW) vstore(o + d, vload(weight + d) * (vload(src + d) * r));
    }
}

/* out[t] = silu(gate[t]) * up[t], silu(g) = g / (1 + e^-g); gate rows every gate_stride floats,
 * up rows every up_stride, out contiguous [T, I]; I % 16 == 0. */
void llmlab_silu_mul(const float *gate, int64_t gate_stride, const float *up, int64_t up_stride,
                     float *out, int64_t T, int64_t I) {
#pragma omp parallel for schedule(static) if (T * I > 65536)
    for (int64_t t = 0; t < T; t++) {
        const float *g = gate + t * gate_stride, *u = up + t * up_stride;
        float *o = out + t * I;
        for (int64_t i = 0; i < I; i += VW) {
            const vf gv = vload(g + i);
            vstore(o + i, gv / (1.0f + vexp(-gv)) * vload(u + i));
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
    const int64_t half = D / 2;
#pragma omp parallel for schedule(static) if (T * heads > 512)
    for (int64_t t = 0; t < T; t++) {
        const float *c = cos + t * half, *s = sin + t * half;
        for (int64_t h = 0; h < heads; h++) {
            const float *xr = x + t * x_stride + h * D;
            float *o = out + (t * heads + h) * D;
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
}
