/* Matmuls on weights stored in fewer bytes: bfloat16 and int8 (per-output-channel scales).
 *
 * Decode streams every weight once per step, so a weight stored in 2 bytes (bf16) or 1 byte
 * (int8) instead of 4 halves or quarters the time of a memory-bound step. The weights are
 * widened to float32 *inside* these kernels, a vector at a time, never into a float copy of the
 * matrix:
 *
 *   bf16 -> f32: the bf16 bits are the top 16 bits of the float32 (shift left by 16);
 *   int8 -> f32: convert, and multiply the row's dot product by its scale once at the end
 *                (y[n] = scale[n] * sum_k q[n,k] x[k]: the scale of an output channel commutes
 *                out of its dot product, which is why the scales are per output channel).
 *
 * Instruction sets are chosen at run time, not at build time: each fast variant is compiled
 * with a `target` attribute and called only when this CPU reports the feature (cpuid through
 * `__builtin_cpu_supports`), below a cap that Python can lower (`llmlab_set_isa_cap`, used by
 * the tests to run the fallback on a CPU that has the instructions). Variants:
 *
 *   bf16, AVX-512 BF16 (`vdpbf16ps`): x rounded to bf16 once per call, then 32 products per
 *         instruction, accumulated in float32. Needs K % 32 == 0.
 *   int8, AVX-512F: 16 int8 widened by `vpmovsxbd` + `vcvtdq2ps`, then float32 FMAs (x stays
 *         float32: weight-only quantization, no rounding of the activations).
 *   int8, one row, AVX-512 VNNI: x rounded to int16 once per call (one scale), 32 int8 widened
 *         to int16 and summed in pairs into int32 by `vpdpwssd`: two instructions per 32
 *         weights where the widening takes ten, so the GEMV streams instead of computing.
 *         (Where the weights are packed, on a CPU with AVX-512 BF16 or AVX2, one row reads the
 *         packed blocks instead: cpu_gemm.c's llmlab_packed_gemv_rows, the same rounding of x.)
 *   bf16 / int8, portable: vector extensions; the compiler uses what the build targets.
 *
 * Two entry points per weight type: `llmlab_qgemv_rows` (one row of x, an orphaned `omp for`
 * that the fused decode layer of cpu_layer.c calls inside its region, like llmlab_gemv_rows)
 * and `llmlab_qgemm` (T rows: each thread widens a tile of 4 weight rows once into float32
 * on its stack, then takes the dot products of all T rows of x with it).
 */
#include <stdint.h>
#include <string.h>

#include "cpu_kernels.h"
#include "cpu_vec.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define LLMLAB_X86 1
#endif

typedef uint16_t vu16 __attribute__((vector_size(VW * 2)));
typedef int8_t vi8 __attribute__((vector_size(VW)));

/* ---- what this CPU can run ----------------------------------------------------------------- */

static int64_t isa_cap = -1;   /* -1: everything this CPU has */

int llmlab_isa(void) {
    int have = 0;
#ifdef LLMLAB_X86
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f")) have |= LLMLAB_ISA_AVX512;
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bf16"))
        have |= LLMLAB_ISA_AVX512_BF16;
    if (__builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vnni"))
        have |= LLMLAB_ISA_AVX512_VNNI;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) have |= LLMLAB_ISA_AVX2;
#endif
    return isa_cap < 0 ? have : (int)(have & isa_cap);
}

void llmlab_set_isa_cap(int64_t cap) { isa_cap = cap; }

/* ---- portable widening --------------------------------------------------------------------- */

static inline vf bf16_load(const uint16_t *p) {
    vu16 h;
    memcpy(&h, p, sizeof h);
    return (vf)(__builtin_convertvector(h, vi) << 16);
}

static inline vf int8_load(const int8_t *p) {   /* (GCC 12 makes this scalar code) */
    vi8 b;
    memcpy(&b, p, sizeof b);
    return __builtin_convertvector(__builtin_convertvector(b, vi), vf);
}

/* Elements k .. k+15 of the weight row at w, widened to float32 (int8 NOT scaled). The callers
 * below pass `wtype` as a constant (one call per type), so after inlining the tests fold away. */
static inline __attribute__((always_inline)) vf w_load(int64_t wtype, const void *w, int64_t k) {
    if (wtype == LLMLAB_W_BF16) return bf16_load((const uint16_t *)w + k);
    if (wtype == LLMLAB_W_INT8) return int8_load((const int8_t *)w + k);
    return vload((const float *)w + k);
}

/* the start of row n of W [N, K] of type wtype */
static inline const void *w_row(const void *W, int64_t wtype, int64_t n, int64_t K) {
    const int64_t bytes = wtype == LLMLAB_W_BF16 ? 2 : wtype == LLMLAB_W_INT8 ? 1 : 4;
    return (const char *)W + n * K * bytes;
}

static inline __attribute__((always_inline)) void widen_typed(int64_t wtype, const void *w,
                                                             int64_t K, float *dst) {
    for (int64_t k = 0; k < K; k += VW) vstore(dst + k, w_load(wtype, w, k));
}

/* Row n of W widened to float32, `K` values (K % 16 == 0) into dst; int8 rows are NOT scaled
 * (also cpu_layer.c's embedding lookup). */
void llmlab_widen_row(const void *W, int64_t wtype, int64_t n, int64_t K, float *dst) {
    const void *w = w_row(W, wtype, n, K);
    if (wtype == LLMLAB_W_BF16) widen_typed(LLMLAB_W_BF16, w, K, dst);
    else if (wtype == LLMLAB_W_INT8) widen_typed(LLMLAB_W_INT8, w, K, dst);
    else memcpy(dst, w, sizeof(float) * K);
}

static inline __attribute__((always_inline)) float dot_typed(int64_t wtype, const void *w,
                                                            const float *x, int64_t K) {
    vf a = {0}, b = {0};   /* two accumulators: two chains of multiply-adds in flight */
    int64_t k = 0;
    for (; k + 2 * VW <= K; k += 2 * VW) {
        a += w_load(wtype, w, k) * vload(x + k);
        b += w_load(wtype, w, k + VW) * vload(x + k + VW);
    }
    for (; k < K; k += VW) a += w_load(wtype, w, k) * vload(x + k);
    return hsum(a + b);
}

/* dot(W[n], x), portable, W of any type */
static inline float dot_row(const void *W, int64_t wtype, int64_t n, const float *x, int64_t K) {
    const void *w = w_row(W, wtype, n, K);
    if (wtype == LLMLAB_W_BF16) return dot_typed(LLMLAB_W_BF16, w, x, K);
    if (wtype == LLMLAB_W_INT8) return dot_typed(LLMLAB_W_INT8, w, x, K);
    return dot_typed(LLMLAB_W_F32, w, x, K);
}

/* ---- AVX-512 BF16 -------------------------------------------------------------------------- */

#ifdef LLMLAB_X86
/* the four-row loops' end: each row's accumulator summed into its dot */
__attribute__((target("avx512f")))
static inline void sums4_avx512(float *dots, __m512 a0, __m512 a1, __m512 a2, __m512 a3) {
    dots[0] = _mm512_reduce_add_ps(a0);
    dots[1] = _mm512_reduce_add_ps(a1);
    dots[2] = _mm512_reduce_add_ps(a2);
    dots[3] = _mm512_reduce_add_ps(a3);
}

/* x [K] float32 -> bf16 pairs (round to nearest even), K % 32 == 0 */
__attribute__((target("avx512f,avx512bf16")))
static void x_to_bf16(const float *x, __m512bh *xb, int64_t K) {
    for (int64_t k = 0; k < K; k += 32)
        xb[k / 32] = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(x + k + 16), _mm512_loadu_ps(x + k));
}

__attribute__((target("avx512f,avx512bf16")))
static float dot_bf16_avx512(const uint16_t *w, const __m512bh *xb, int64_t K) {
    __m512 a = _mm512_setzero_ps(), b = _mm512_setzero_ps();
    int64_t k = 0;
    for (; k + 64 <= K; k += 64) {
        a = _mm512_dpbf16_ps(a, (__m512bh)_mm512_loadu_si512(w + k), xb[k / 32]);
        b = _mm512_dpbf16_ps(b, (__m512bh)_mm512_loadu_si512(w + k + 32), xb[k / 32 + 1]);
    }
    for (; k < K; k += 32)
        a = _mm512_dpbf16_ps(a, (__m512bh)_mm512_loadu_si512(w + k), xb[k / 32]);
    return _mm512_reduce_add_ps(_mm512_add_ps(a, b));
}

/* y rows [n_lo, n_hi) of one x row, bf16 weights, on this thread: four rows at a time (four
 * streams from memory, as llmlab_gemv_rows), then the rest one by one */
__attribute__((target("avx512f,avx512bf16")))
static void bf16_rows_avx512(const float *x, const uint16_t *W, int64_t n_lo, int64_t n_hi,
                             int64_t K, float *dots) {
    __m512bh xb[K / 32];
    x_to_bf16(x, xb, K);
    int64_t n = n_lo;
    for (; n + 4 <= n_hi; n += 4) {
        const uint16_t *w0 = W + n * K, *w1 = w0 + K, *w2 = w1 + K, *w3 = w2 + K;
        __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        for (int64_t k = 0; k < K; k += 32) {
            prefetch_ahead(w0 + 4 * k, 4 * 64);     /* the four rows' block, as it is read */
            const __m512bh xv = xb[k / 32];
            a0 = _mm512_dpbf16_ps(a0, (__m512bh)_mm512_loadu_si512(w0 + k), xv);
            a1 = _mm512_dpbf16_ps(a1, (__m512bh)_mm512_loadu_si512(w1 + k), xv);
            a2 = _mm512_dpbf16_ps(a2, (__m512bh)_mm512_loadu_si512(w2 + k), xv);
            a3 = _mm512_dpbf16_ps(a3, (__m512bh)_mm512_loadu_si512(w3 + k), xv);
        }
        sums4_avx512(dots + n - n_lo, a0, a1, a2, a3);
    }
    for (; n < n_hi; n++) dots[n - n_lo] = dot_bf16_avx512(W + n * K, xb, K);
}

/* y[T, N] = x W^T (+ bias), bf16 W, inside the caller's parallel region: x rounded to bf16
 * 32 rows at a time (each thread converts them: T*K work against T*N*K products), then the
 * weight rows shared among the threads. */
__attribute__((target("avx512f,avx512bf16")))
static void qgemm_bf16_avx512(const float *x, int64_t x_stride, const uint16_t *W,
                              const float *bias, float *y, int64_t T, int64_t N, int64_t K) {
    const int64_t kb = K / 32;
    __m512bh xb[32 * kb];                  /* 32 rows of x: 64 * K bytes on this stack */
    for (int64_t t0 = 0; t0 < T; t0 += 32) {
        const int64_t tn = T - t0 < 32 ? T - t0 : 32;
        for (int64_t t = 0; t < tn; t++) x_to_bf16(x + (t0 + t) * x_stride, xb + t * kb, K);
#pragma omp for schedule(static)
        for (int64_t n = 0; n < N; n++) {
            const float b = bias ? bias[n] : 0.0f;
            for (int64_t t = 0; t < tn; t++)
                y[(t0 + t) * N + n] = dot_bf16_avx512(W + n * K, xb + t * kb, K) + b;
        }
    }
}
#endif

/* ---- AVX-512F: int8 widened by vpmovsxbd + vcvtdq2ps ---------------------------------------- */

#ifdef LLMLAB_X86
__attribute__((target("avx512f")))
static inline __m512 int8_load_avx512(const int8_t *p) {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)p)));
}

__attribute__((target("avx512f")))
static float dot_int8_avx512(const int8_t *w, const float *x, int64_t K) {
    __m512 a = _mm512_setzero_ps(), b = _mm512_setzero_ps();
    int64_t k = 0;
    for (; k + 32 <= K; k += 32) {
        a = _mm512_fmadd_ps(int8_load_avx512(w + k), _mm512_loadu_ps(x + k), a);
        b = _mm512_fmadd_ps(int8_load_avx512(w + k + 16), _mm512_loadu_ps(x + k + 16), b);
    }
    for (; k < K; k += 16) a = _mm512_fmadd_ps(int8_load_avx512(w + k), _mm512_loadu_ps(x + k), a);
    return _mm512_reduce_add_ps(_mm512_add_ps(a, b));
}

__attribute__((target("avx512f")))
static void int8_rows_avx512(const float *x, const int8_t *W, int64_t n_lo, int64_t n_hi,
                             int64_t K, float *dots) {
    int64_t n = n_lo;
    for (; n + 4 <= n_hi; n += 4) {          /* four rows at a time: four streams */
        const int8_t *w0 = W + n * K, *w1 = w0 + K, *w2 = w1 + K, *w3 = w2 + K;
        __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        for (int64_t k = 0; k < K; k += 16) {
            prefetch_ahead(w0 + 4 * k, 4 * 16);
            const __m512 xv = _mm512_loadu_ps(x + k);
            a0 = _mm512_fmadd_ps(int8_load_avx512(w0 + k), xv, a0);
            a1 = _mm512_fmadd_ps(int8_load_avx512(w1 + k), xv, a1);
            a2 = _mm512_fmadd_ps(int8_load_avx512(w2 + k), xv, a2);
            a3 = _mm512_fmadd_ps(int8_load_avx512(w3 + k), xv, a3);
        }
        sums4_avx512(dots + n - n_lo, a0, a1, a2, a3);
    }
    for (; n < n_hi; n++) dots[n - n_lo] = dot_int8_avx512(W + n * K, x, K);
}

__attribute__((target("avx512f")))
static void widen_int8_avx512(const int8_t *w, int64_t K, float *dst) {
    for (int64_t k = 0; k < K; k += 16) _mm512_storeu_ps(dst + k, int8_load_avx512(w + k));
}

/* ---- AVX-512 VNNI: int8 weights against x in int16 (vpdpwssd) -------------------------------- */

/* llmlab_x_to_int16 (below) with AVX-512BW */
__attribute__((target("avx512f,avx512bw")))
static float x_to_int16_avx512(const float *x, int16_t *xq, int64_t K) {
    __m512 m = _mm512_setzero_ps();
    for (int64_t k = 0; k < K; k += 16) m = _mm512_max_ps(m, _mm512_abs_ps(_mm512_loadu_ps(x + k)));
    const float amax = _mm512_reduce_max_ps(m);
    const __m512 inv = _mm512_set1_ps(amax > 0.0f ? 32767.0f / amax : 0.0f);
    for (int64_t k = 0; k < K; k += 16) {      /* round to nearest: |x| / amax * 32767 <= 32767 */
        const __m512i q = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(x + k), inv));
        _mm256_storeu_si256((__m256i *)(xq + k), _mm512_cvtepi32_epi16(q));
    }
    return amax / 32767.0f;
}

/* the same on AVX2: the same largest |x|, multiply and rounding, so the same int16 values */
__attribute__((target("avx2")))
static float x_to_int16_avx2(const float *x, int16_t *xq, int64_t K) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 m = _mm256_setzero_ps();
    for (int64_t k = 0; k < K; k += 8)
        m = _mm256_max_ps(m, _mm256_andnot_ps(sign, _mm256_loadu_ps(x + k)));   /* |x| */
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    const float amax = _mm_cvtss_f32(_mm_max_ss(h, _mm_movehdup_ps(h)));
    const __m256 inv = _mm256_set1_ps(amax > 0.0f ? 32767.0f / amax : 0.0f);
    for (int64_t k = 0; k < K; k += 16) {   /* packs interleaves 128-bit lanes: put them back */
        const __m256i lo = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + k), inv));
        const __m256i hi = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + k + 8), inv));
        _mm256_storeu_si256((__m256i *)(xq + k),
                            _mm256_permute4x64_epi64(_mm256_packs_epi32(lo, hi), 0xD8));
    }
    return amax / 32767.0f;
}

/* x [K] float32 -> int16 with one scale, returned (max|x| / 32767; 0 for x = 0): an int16 step
 * is 1/65534 of the largest |x|, finer than bf16's rounding of that element. K % 16 == 0;
 * AVX-512BW, else AVX2 (the caller checks llmlab_isa for one of them). */
float llmlab_x_to_int16(const float *x, int16_t *xq, int64_t K) {
    /* (a CPU with AVX-512 BF16 or VNNI has AVX-512BW) */
    return llmlab_isa() & (LLMLAB_ISA_AVX512_BF16 | LLMLAB_ISA_AVX512_VNNI)
               ? x_to_int16_avx512(x, xq, K) : x_to_int16_avx2(x, xq, K);
}

/* a step is 32 weights of a row, 2 products per int32 lane: LLMLAB_INT16_SUM_STEPS of them,
 * then the sums move to float32 */
#define VNNI_STEPS LLMLAB_INT16_SUM_STEPS

/* dots of rows [n_lo, n_hi) with x as `llmlab_x_to_int16` gave it (scale `xs`), four rows at a
 * time: 32 int8 widened to int16 (vpmovsxbw) then 32 products summed in pairs (vpdpwssd), where
 * the AVX-512F path needs two widenings, a conversion and two FMAs. K % 32 == 0. */
__attribute__((target("avx512f,avx512bw,avx512vnni")))
static void int8_rows_vnni(const int16_t *xq, float xs, const int8_t *W, int64_t n_lo,
                           int64_t n_hi, int64_t K, float *dots) {
    for (int64_t n = n_lo; n < n_hi; n += 4) {
        const int64_t rows = n_hi - n < 4 ? n_hi - n : 4;
        __m512 f[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(),
                       _mm512_setzero_ps()};
        for (int64_t k0 = 0; k0 < K; k0 += 32 * VNNI_STEPS) {
            const int64_t k1 = k0 + 32 * VNNI_STEPS < K ? k0 + 32 * VNNI_STEPS : K;
            __m512i a[4] = {_mm512_setzero_si512(), _mm512_setzero_si512(),
                            _mm512_setzero_si512(), _mm512_setzero_si512()};
            for (int64_t k = k0; k < k1; k += 32) {
                prefetch_ahead(W + n * K + 4 * k, 4 * 32);
                const __m512i xv = _mm512_loadu_si512(xq + k);
                for (int64_t i = 0; i < rows; i++) {
                    const __m256i w8 = _mm256_loadu_si256((const __m256i *)(W + (n + i) * K + k));
                    a[i] = _mm512_dpwssd_epi32(a[i], _mm512_cvtepi8_epi16(w8), xv);
                }
            }
            for (int64_t i = 0; i < rows; i++) f[i] = _mm512_add_ps(f[i], _mm512_cvtepi32_ps(a[i]));
        }
        for (int64_t i = 0; i < rows; i++) dots[n + i - n_lo] = xs * _mm512_reduce_add_ps(f[i]);
    }
}
#endif

/* whether weights of type `wtype` (of rows of K) run the x86 variant made for weights of type
 * `type`, rows a multiple of `k_multiple`, on a CPU with the instruction-set bit `isa` */
static inline int use_variant(int64_t wtype, int64_t K, int64_t type, int64_t k_multiple,
                              int isa) {
#ifdef LLMLAB_X86
    return wtype == type && K % k_multiple == 0 && (llmlab_isa() & isa);
#else
    (void)wtype; (void)K; (void)type; (void)k_multiple; (void)isa;
    return 0;
#endif
}

static inline int use_avx512_int8(int64_t wtype) {
    return use_variant(wtype, 0, LLMLAB_W_INT8, 1, LLMLAB_ISA_AVX512);
}

static inline int use_vnni_int8(int64_t wtype, int64_t K) {
    return use_variant(wtype, K, LLMLAB_W_INT8, 32, LLMLAB_ISA_AVX512_VNNI);
}

static inline int use_bf16_isa(int64_t wtype, int64_t K) {
    return use_variant(wtype, K, LLMLAB_W_BF16, 32, LLMLAB_ISA_AVX512_BF16);
}

static inline float finish(float dot, int64_t n, const float *scales, const float *bias,
                           const float *add) {
    float v = scales ? dot * scales[n] : dot;
    if (bias) v += bias[n];
    return add ? add[n] + v : v;
}

/* ---- entry points -------------------------------------------------------------------------- */

#define ROWS_PER_CHUNK 16

/* y[n] = add[n] + scale[n] * (W[n] . x) + bias[n] for n < N; W of type `wtype`, `scales` per
 * row (int8; NULL otherwise), add and bias may be NULL, add may be y. An orphaned `omp for`
 * without its barrier (see llmlab_gemv_rows). f32 weights go to llmlab_gemv_rows itself.
 * K % 16 == 0. */
void llmlab_qgemv_rows(const float *x, const void *W, int64_t wtype, const float *scales,
                       const float *bias, const float *add, float *y, int64_t N, int64_t K) {
    if (wtype == LLMLAB_W_F32) {
        llmlab_gemv_rows(x, (const float *)W, bias, add, y, N, K);
        return;
    }
    const int fast = use_bf16_isa(wtype, K), fast_int8 = use_avx512_int8(wtype),
              vnni = use_vnni_int8(wtype, K);
    int16_t xq[vnni ? K : 1];                  /* each thread rounds x once, for its rows */
    float xs = 0.0f;
#ifdef LLMLAB_X86
    if (vnni) xs = llmlab_x_to_int16(x, xq, K);
#endif
#pragma omp for schedule(static) nowait
    for (int64_t n0 = 0; n0 < N; n0 += ROWS_PER_CHUNK) {
        const int64_t n1 = n0 + ROWS_PER_CHUNK < N ? n0 + ROWS_PER_CHUNK : N;
        float dots[ROWS_PER_CHUNK];
#ifdef LLMLAB_X86
        if (fast) bf16_rows_avx512(x, (const uint16_t *)W, n0, n1, K, dots);
        else if (vnni) int8_rows_vnni(xq, xs, (const int8_t *)W, n0, n1, K, dots);
        else if (fast_int8) int8_rows_avx512(x, (const int8_t *)W, n0, n1, K, dots);
        else
#endif
            for (int64_t n = n0; n < n1; n++) dots[n - n0] = dot_row(W, wtype, n, x, K);
        for (int64_t n = n0; n < n1; n++) y[n] = finish(dots[n - n0], n, scales, bias, add);
    }
    (void)fast; (void)fast_int8; (void)xs;
}

/* y[T, N] (contiguous) = x[T, K] (row stride x_stride) W[N, K]^T * scale + bias, on all threads.
 * Each thread widens 4 rows of W at a time into float32 on its stack (or, with AVX-512 BF16,
 * uses them as they are against x rounded to bf16) and multiplies every row of x by them. */
void llmlab_qgemm(const float *x, int64_t x_stride, const void *W, int64_t wtype,
                  const float *scales, const float *bias, float *y, int64_t T, int64_t N,
                  int64_t K) {
    /* vdpbf16ps for a few rows; from 4 rows on, the widened tile's 4 x 4 register blocks
     * (measured faster here: the dot-per-(row, token) of the bf16 variant reduces each time) */
    const int fast = use_bf16_isa(wtype, K) && T < 4, fast_int8 = use_avx512_int8(wtype);
#pragma omp parallel
    {
        if (T == 1) {                          /* one row: the GEMV, four weight rows at once */
            llmlab_qgemv_rows(x, W, wtype, scales, bias, NULL, y, N, K);
        } else
#ifdef LLMLAB_X86
        if (fast) {
            qgemm_bf16_avx512(x, x_stride, (const uint16_t *)W, bias, y, T, N, K);
        } else
#endif
        {
            float tile[4][K];
#pragma omp for schedule(static)
            for (int64_t n0 = 0; n0 < N; n0 += 4) {
                const int64_t rows = N - n0 < 4 ? N - n0 : 4;
                for (int64_t i = 0; i < rows; i++) {
#ifdef LLMLAB_X86
                    if (fast_int8) widen_int8_avx512((const int8_t *)W + (n0 + i) * K, K, tile[i]);
                    else
#endif
                        llmlab_widen_row(W, wtype, n0 + i, K, tile[i]);
                }
                int64_t t = 0;
                for (; t + 4 <= T; t += 4) {         /* 4 weight rows x 4 rows of x */
                    const float *x0 = x + t * x_stride, *x1 = x0 + x_stride,
                                *x2 = x1 + x_stride, *x3 = x2 + x_stride;
                    vf a[4][4] = {{{0}}};
                    for (int64_t k = 0; k < K; k += VW) {
                        const vf v0 = vload(x0 + k), v1 = vload(x1 + k), v2 = vload(x2 + k),
                                 v3 = vload(x3 + k);
                        for (int64_t i = 0; i < 4; i++) {
                            const vf w = vload(tile[i] + k);
                            a[i][0] += w * v0; a[i][1] += w * v1;
                            a[i][2] += w * v2; a[i][3] += w * v3;
                        }
                    }
                    for (int64_t i = 0; i < rows; i++)
                        for (int64_t j = 0; j < 4; j++)
                            y[(t + j) * N + n0 + i] = finish(hsum(a[i][j]), n0 + i, scales, bias,
                                                             NULL);
                }
                for (; t < T; t++) {
                    const float *xr = x + t * x_stride;
                    vf a[4] = {{0}, {0}, {0}, {0}};
                    for (int64_t k = 0; k < K; k += VW) {
                        const vf xv = vload(xr + k);
                        for (int64_t i = 0; i < 4; i++) a[i] += vload(tile[i] + k) * xv;
                    }
                    for (int64_t i = 0; i < rows; i++)
                        y[t * N + n0 + i] = finish(hsum(a[i]), n0 + i, scales, bias, NULL);
                }
            }
        }
    }
    (void)fast; (void)fast_int8;
}
