/* Matmuls of a batch (2+ rows of x for bf16 weights, 4+ for int8) on weights packed once at load.
 *
 * Decode at batch 64 multiplies 64 rows by every weight: the step is no longer a stream of
 * weights but arithmetic, and the kernel must feed the multiply units. `llmlab_qgemm`
 * (cpu_quant.c) widens each weight row to float32 and takes dot products with float32 FMAs: at
 * batch 64 it ran at half the speed of oneDNN's float32 matmul, so a bf16 model decoded slower
 * than a float32 one. This file is the batch path instead, built on AVX-512 BF16's
 * `vdpbf16ps` (two bf16 products per float32 lane: twice the float32 FMA's work per
 * instruction), as oneDNN's and llama.cpp's repacked bf16 kernels are:
 *
 *   Packing (`llmlab_pack_weight`, once at load). W [N, K] becomes blocks of 16 output
 *   columns: P[nb][k/2][16][2] = W[16 nb + j][k + e]. One 64-byte load of P is the pairs
 *   (k, k+1) of 16 columns, exactly the operand `vdpbf16ps` multiplies by a broadcast pair of x,
 *   so the 16 lanes of an accumulator are 16 outputs: no horizontal sums, and each block is
 *   read front to back. N is padded to a multiple of 16 with zero columns. int8 weights are
 *   packed the same way (one byte each) and widened to bf16 exactly (|q| <= 127 fits bf16's
 *   8 significant bits), a panel at a time, into a per-thread buffer.
 *
 *   Micro-tile. MR = 6 rows of x times NR = 4 blocks (64 columns): 24 accumulators, 4 weight
 *   vectors and a broadcast in the 32 registers; per pair of k, 4 loads and 6 broadcasts feed
 *   24 `vdpbf16ps`. x is rounded to bf16 once per call, by the calling thread (as cpu_quant.c's
 *   one-row bf16 path does); sums stay float32; the int8 scale (per column) and the bias are
 *   applied when the tile is stored.
 *
 *   Work units: (panel of 64 columns, chunk of rows) pairs, shared by the threads, so a small
 *   matrix (W_o: 9 panels) still splits evenly over 2 threads.
 *
 * Only for CPUs with AVX-512 BF16 (Python packs only where `llmlab_isa` reports it; the call
 * returns -1 otherwise). Elsewhere cpu_quant.c's portable matmul runs.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_kernels.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define LLMLAB_X86 1
#endif

#define PK 16    /* output columns per packed block: one float32 vector */
#define NR 4     /* blocks per micro-tile */
#define MR 6     /* rows of x per micro-tile */
#define ROWS_PER_UNIT 48
#define F32_ROWS_PER_UNIT 32   /* float32: 64 rows -> 2 x 32 (one of 64: 85.4 ms against 83.2) */

/* P[nb][kp][j][e] = W[nb*16 + j][g*kp + e], zero where nb*16 + j >= N, with g = 2 k's per
 * lane for elements of `elem` 2 (bf16) or 1 (int8) bytes (K even), g = 1 for 4 (float32: one
 * k per 64-byte vector, P[nb][k][j]). out holds ceil(N/16)*16*K elements. */
void llmlab_pack_weight(const void *W, int64_t elem, int64_t N, int64_t K, void *out) {
    const int64_t blocks = (N + PK - 1) / PK, g = elem == 4 ? 1 : 2;
#pragma omp parallel for schedule(static)
    for (int64_t nb = 0; nb < blocks; nb++) {
        char *dst = (char *)out + nb * PK * K * elem;
        for (int64_t kp = 0; kp < K / g; kp++)
            for (int64_t j = 0; j < PK; j++) {
                const int64_t n = nb * PK + j;
                for (int64_t e = 0; e < g; e++, dst += elem) {
                    if (n < N) memcpy(dst, (const char *)W + (n * K + g * kp + e) * elem, elem);
                    else memset(dst, 0, elem);
                }
            }
    }
}

#ifdef LLMLAB_X86

/* A micro-tile's sums into y: acc[i][j] * scale + bias per column (scales NULL: 1, an exact
 * multiply, so float32 tiles store acc + bias), masked to the `cols` valid columns from the
 * first block's first */
__attribute__((target("avx512f"), always_inline))
static inline void store_tile(int mr, int nr, __m512 acc[MR][NR], float *y, int64_t ldy,
                              int64_t cols, const float *scales, const float *bias) {
    for (int j = 0; j < nr; j++) {
        const int64_t left = cols - j * PK;
        if (left <= 0) break;
        const __mmask16 m = left >= PK ? (__mmask16)0xFFFF : (__mmask16)((1u << left) - 1);
        const __m512 s = scales ? _mm512_maskz_loadu_ps(m, scales + j * PK) : _mm512_set1_ps(1);
        const __m512 b = bias ? _mm512_maskz_loadu_ps(m, bias + j * PK) : _mm512_setzero_ps();
        for (int i = 0; i < mr; i++)
            _mm512_mask_storeu_ps(y + i * ldy + j * PK, m, _mm512_fmadd_ps(acc[i][j], s, b));
    }
}

/* One micro-tile: y[mr rows, nr blocks] = x_bf16[mr rows] . P[nr blocks]; mr <= MR, nr <= NR,
 * both constants once inlined (see tile()). x: bf16 pairs as uint32, row stride xs pairs;
 * w: the first block, blocks bstride bf16 apart; cols: valid columns from the first block's
 * first (the last panel's last block may be partial). */
__attribute__((target("avx512f,avx512bf16"), always_inline))
static inline void micro(int mr, int nr, const uint32_t *x, int64_t xs, const uint16_t *w,
                         int64_t bstride, int64_t kp_n, float *y, int64_t ldy, int64_t cols,
                         const float *scales, const float *bias) {
    __m512 acc[MR][NR];
    for (int i = 0; i < MR; i++)
        for (int j = 0; j < NR; j++) acc[i][j] = _mm512_setzero_ps();
    for (int64_t kp = 0; kp < kp_n; kp++) {
        __m512i wv[NR];
        for (int j = 0; j < nr; j++) wv[j] = _mm512_loadu_si512(w + j * bstride + kp * 2 * PK);
        for (int i = 0; i < mr; i++) {
            const __m512i xv = _mm512_set1_epi32((int)x[i * xs + kp]);
            for (int j = 0; j < nr; j++)
                acc[i][j] = _mm512_dpbf16_ps(acc[i][j], (__m512bh)wv[j], (__m512bh)xv);
        }
    }
    store_tile(mr, nr, acc, y, ldy, cols, scales, bias);
}

/* CALL(R, C) with the tile's rows mr and blocks nr as the constants R <= MR, C <= NR: one
 * specialisation of a micro-tile per pair */
#define BY_BLOCKS(CALL, R) \
    switch (nr) { case 1: CALL(R, 1); break; case 2: CALL(R, 2); break; \
                  case 3: CALL(R, 3); break; default: CALL(R, 4); }
#define BY_TILE_SIZE(CALL) \
    switch (mr) { case 1: BY_BLOCKS(CALL, 1); break; case 2: BY_BLOCKS(CALL, 2); break; \
                  case 3: BY_BLOCKS(CALL, 3); break; case 4: BY_BLOCKS(CALL, 4); break; \
                  case 5: BY_BLOCKS(CALL, 5); break; default: BY_BLOCKS(CALL, 6); }

/* micro() with mr, nr as compile-time constants */
__attribute__((target("avx512f,avx512bf16")))
static void tile(int mr, int nr, const uint32_t *x, int64_t xs, const uint16_t *w,
                 int64_t bstride, int64_t kp_n, float *y, int64_t ldy, int64_t cols,
                 const float *scales, const float *bias) {
#define MICRO(R, C) micro(R, C, x, xs, w, bstride, kp_n, y, ldy, cols, scales, bias)
    BY_TILE_SIZE(MICRO)
#undef MICRO
}

/* The float32 micro-tile: y[mr rows, nr blocks] = x[mr rows] . P[nr blocks] with P one k per
 * vector (P[nb][k][16]): per k, nr loads, mr broadcasts of x and mr * nr FMAs. While it runs
 * it asks for `ahead_bytes` from `ahead` into L2, one line per k: the next panel, which
 * arrives while this one computes (oneDNN's float32 matmul stalls on each cold panel; with the
 * weights of 30 layers streamed from memory at batch 64 this kernel took 82-83 ms per step's
 * matmuls where oneDNN took 91-92, 2 ms of the gain the prefetch's, on a 2-core Zen 4). */
__attribute__((target("avx512f"), always_inline))
static inline void micro_f32(int mr, int nr, const float *x, int64_t xs, const float *w,
                             int64_t bstride, int64_t K, float *y, int64_t ldy, int64_t cols,
                             const float *bias, const char *ahead, int64_t ahead_bytes) {
    __m512 acc[MR][NR];
    for (int i = 0; i < MR; i++)
        for (int j = 0; j < NR; j++) acc[i][j] = _mm512_setzero_ps();
    for (int64_t k = 0; k < K; k++) {
        if (k * 64 < ahead_bytes) _mm_prefetch(ahead + k * 64, _MM_HINT_T1);
        __m512 wv[NR];
        for (int j = 0; j < nr; j++) wv[j] = _mm512_loadu_ps(w + j * bstride + k * PK);
        for (int i = 0; i < mr; i++) {
            const __m512 xv = _mm512_set1_ps(x[i * xs + k]);
            for (int j = 0; j < nr; j++) acc[i][j] = _mm512_fmadd_ps(wv[j], xv, acc[i][j]);
        }
    }
    store_tile(mr, nr, acc, y, ldy, cols, NULL, bias);
}

/* micro_f32() with mr, nr as compile-time constants */
__attribute__((target("avx512f")))
static void tile_f32(int mr, int nr, const float *x, int64_t xs, const float *w, int64_t bstride,
                     int64_t K, float *y, int64_t ldy, int64_t cols, const float *bias,
                     const char *ahead, int64_t ahead_bytes) {
#define MICRO(R, C) micro_f32(R, C, x, xs, w, bstride, K, y, ldy, cols, bias, ahead, ahead_bytes)
    BY_TILE_SIZE(MICRO)
#undef MICRO
}

/* Work unit (panel p, rows [t0, t1), chunk c of `chunks`) on float32 weights: its tiles, which
 * between them ask for the chunk's share of panel p + 1 (the thread's next panel under the
 * static schedule), spread evenly over the tiles */
__attribute__((target("avx512f")))
static void run_unit_f32(int64_t p, int64_t panels, int64_t c, int64_t chunks, int64_t t0,
                         int64_t t1, const float *x, int64_t x_stride, const float *P,
                         const float *bias, float *y, int64_t N, int64_t K) {
    const int64_t blocks = (N + PK - 1) / PK, b0 = p * NR;
    const int nr = (int)(blocks - b0 < NR ? blocks - b0 : NR);
    const int64_t panel_bytes = NR * PK * K * 4;
    const int64_t share = p + 1 < panels ? panel_bytes / chunks : 0;
    const char *ahead = (const char *)P + (p + 1) * panel_bytes + c * share;
    const int64_t tiles = (t1 - t0 + MR - 1) / MR;
    const int64_t per_tile = (share / tiles + 63) / 64 * 64;
    const int64_t n0 = b0 * PK;
    for (int64_t t = t0, i = 0; t < t1; t += MR, i++) {
        const int mr = (int)(t1 - t < MR ? t1 - t : MR);
        tile_f32(mr, nr, x + t * x_stride, x_stride, P + b0 * PK * K, PK * K, K, y + t * N + n0,
                 N, N - n0, bias ? bias + n0 : NULL, ahead + i * per_tile, per_tile);
    }
}

/* x float32 rows -> bf16 pairs (round to nearest even), K % 32 == 0 */
__attribute__((target("avx512f,avx512bf16")))
static void row_to_bf16(const float *x, uint32_t *xb, int64_t K) {
    for (int64_t k = 0; k < K; k += 32) {
        const __m512bh v = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(x + k + 16), _mm512_loadu_ps(x + k));
        _mm512_storeu_si512(xb + k / 2, (__m512i)v);
    }
}

/* `count` int8 values -> bf16, in order (count % 32 == 0) */
__attribute__((target("avx512f,avx512bw,avx512bf16")))
static void int8_to_bf16(const int8_t *q, uint16_t *out, int64_t count) {
    for (int64_t i = 0; i < count; i += 32) {
        const __m512i w16 = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(q + i)));
        const __m512 lo = _mm512_cvtepi32_ps(_mm512_cvtepi16_epi32(_mm512_castsi512_si256(w16)));
        const __m512 hi =
            _mm512_cvtepi32_ps(_mm512_cvtepi16_epi32(_mm512_extracti64x4_epi64(w16, 1)));
        _mm512_storeu_si512(out + i, (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
    }
}

/* a per-thread buffer of at least `bytes` (kept between calls) */
static uint16_t *thread_buffer(int64_t bytes) {
    static __thread uint16_t *buf = NULL;
    static __thread int64_t have = 0;
    if (bytes > have) {
        free(buf);
        buf = (uint16_t *)malloc((size_t)bytes);
        have = buf ? bytes : 0;
    }
    return buf;
}

/* Work unit u: the rows [t0, t1) of x against panel p (NR blocks) */
__attribute__((target("avx512f,avx512bw,avx512bf16")))
static int run_unit(int64_t p, int64_t t0, int64_t t1, const uint32_t *xb, const void *P,
                    int64_t wtype, const float *scales, const float *bias, float *y, int64_t N,
                    int64_t K, int64_t *widened) {
    const int64_t blocks = (N + PK - 1) / PK, b0 = p * NR;
    const int nr = (int)(blocks - b0 < NR ? blocks - b0 : NR);
    const int64_t bstride = PK * K;   /* elements between blocks */
    const uint16_t *w = (const uint16_t *)P + b0 * bstride;
    if (wtype == LLMLAB_W_INT8) {     /* the panel widened to bf16 once per thread and panel */
        uint16_t *buf = thread_buffer(nr * bstride * 2);
        if (!buf) return -1;
        if (*widened != p) int8_to_bf16((const int8_t *)P + b0 * bstride, buf, nr * bstride);
        *widened = p;
        w = buf;
    }
    const int64_t n0 = b0 * PK, cols = N - n0;
    for (int64_t t = t0; t < t1; t += MR) {
        const int mr = (int)(t1 - t < MR ? t1 - t : MR);
        tile(mr, nr, xb + t * (K / 2), K / 2, w, bstride, K / 2, y + t * N + n0, N, cols,
             scales ? scales + n0 : NULL, bias ? bias + n0 : NULL);
    }
    return 0;
}
#endif

#define GEMV_BLOCKS NR   /* blocks per unit of the one-row GEMV: the batch matmul's panel */

#ifdef LLMLAB_X86
/* int8 from one row: x rounded to int16 once (llmlab_x_to_int16, as cpu_quant.c's dense VNNI
 * GEMV does), then per pair of k one 32-byte load of a block (16 columns x 2 int8) widened to
 * int16 and multiplied by x's broadcast pair into the block's 16 int32 sums: `vpdpwssd` with
 * AVX-512 VNNI, `vpmaddwd` + `vpaddd` (the same integers) without. A pair of k is 2 products
 * per int32 lane, so the sums move to float32 every LLMLAB_INT16_SUM_STEPS pairs (the bound in
 * cpu_kernels.h). sums[j * 16 + i]: column i of block j, times x's int16 step, before the scale. */
#define INT8_PAIR_STEPS LLMLAB_INT16_SUM_STEPS
#define INT8_UNIT_BODY(DOT)                                                                   \
    __m512 f[NR];                                                                             \
    for (int j = 0; j < nr; j++) f[j] = _mm512_setzero_ps();                                  \
    for (int64_t k0 = 0; k0 < kp_n; k0 += INT8_PAIR_STEPS) {                                  \
        const int64_t k1 = k0 + INT8_PAIR_STEPS < kp_n ? k0 + INT8_PAIR_STEPS : kp_n;         \
        __m512i a[NR];                                                                        \
        for (int j = 0; j < nr; j++) a[j] = _mm512_setzero_si512();                           \
        for (int64_t kp = k0; kp < k1; kp++) {                                                \
            const __m512i xv = _mm512_set1_epi32((int)xq[kp]);                                \
            for (int j = 0; j < nr; j++) {                                                    \
                const __m512i w16 = _mm512_cvtepi8_epi16(                                     \
                    _mm256_loadu_si256((const __m256i *)(w + j * bstride + kp * 2 * PK)));    \
                a[j] = DOT(a[j], w16, xv);                                                    \
            }                                                                                 \
        }                                                                                     \
        for (int j = 0; j < nr; j++) f[j] = _mm512_add_ps(f[j], _mm512_cvtepi32_ps(a[j]));    \
    }                                                                                         \
    for (int j = 0; j < nr; j++) _mm512_storeu_ps(sums + j * PK, _mm512_mul_ps(f[j], xs));

#define DOT_VNNI(a, w, x) _mm512_dpwssd_epi32(a, w, x)
#define DOT_BW(a, w, x) _mm512_add_epi32(a, _mm512_madd_epi16(w, x))

__attribute__((target("avx512f,avx512bw,avx512vnni"), always_inline))
static inline void int8_unit_vnni(int nr, const uint32_t *xq, __m512 xs, const int8_t *w,
                                  int64_t bstride, int64_t kp_n, float *sums) {
    INT8_UNIT_BODY(DOT_VNNI)
}

__attribute__((target("avx512f,avx512bw"), always_inline))
static inline void int8_unit_bw(int nr, const uint32_t *xq, __m512 xs, const int8_t *w,
                                int64_t bstride, int64_t kp_n, float *sums) {
    INT8_UNIT_BODY(DOT_BW)
}

/* one unit of nr blocks (nr a constant in each case, so the sums stay in registers) */
#define BY_NR(F)                                      \
    switch (nr) {                                     \
    case 1: F(1, xq, xs, w, bstride, kp_n, sums); break; \
    case 2: F(2, xq, xs, w, bstride, kp_n, sums); break; \
    case 3: F(3, xq, xs, w, bstride, kp_n, sums); break; \
    default: F(4, xq, xs, w, bstride, kp_n, sums);    \
    }

__attribute__((target("avx512f,avx512bw,avx512vnni")))
static void int8_row_vnni(int nr, const uint32_t *xq, __m512 xs, const int8_t *w,
                          int64_t bstride, int64_t kp_n, float *sums) {
    BY_NR(int8_unit_vnni)
}

__attribute__((target("avx512f,avx512bw")))
static void int8_row_bw(int nr, const uint32_t *xq, __m512 xs, const int8_t *w, int64_t bstride,
                        int64_t kp_n, float *sums) {
    BY_NR(int8_unit_bw)
}
#undef BY_NR
#endif

/* y[n] = add[n] + (x . W[n] (* scales[n]) + bias[n]) for n < N, one row of x against weights
 * packed by llmlab_pack_weight (wtype LLMLAB_W_F32, LLMLAB_W_BF16, or LLMLAB_W_INT8 with its
 * scales): the batch-1 GEMV of the fused decode layer (cpu_layer.c) and of llmlab_packed_gemm,
 * read front to back. Dense rows read four at a time are streams of K * 2 bytes each, too short
 * for the hardware prefetchers (on a 2-core Zen 4 a dense [92160, 576] bf16 GEMV read 23 GB/s,
 * the same bytes packed 35, a plain sum 35). float32 and bf16: each output is the micro-tile's
 * sum for one row (the same operations as llmlab_packed_gemm's tile on that row; a float32
 * unit also asks for the start of the thread's next unit, as the batch tiles do); int8: see
 * INT8_UNIT_BODY. Then `add`, which may be y, is added. An orphaned `omp for` without its
 * barrier (see llmlab_gemv_rows); float32: AVX-512F; bf16 and int8: K % 32 == 0 and AVX-512
 * BF16 (the caller checks llmlab_isa). */
void llmlab_packed_gemv_rows(const float *x, const void *P, int64_t wtype, const float *scales,
                             const float *bias, const float *add, float *y, int64_t N,
                             int64_t K) {
#ifdef LLMLAB_X86
    const int int8 = wtype == LLMLAB_W_INT8, vnni = llmlab_isa() & LLMLAB_ISA_AVX512_VNNI;
    const int f32 = wtype == LLMLAB_W_F32;
    uint32_t xb[f32 ? 1 : K / 2];     /* each thread rounds x once, for its blocks: bf16 pairs */
    __m512 xs = _mm512_setzero_ps();  /* or int16 pairs, and the int16 step (float32: x as is) */
    if (int8) xs = _mm512_set1_ps(llmlab_x_to_int16(x, (int16_t *)xb, K));
    else if (!f32) row_to_bf16(x, xb, K);
    const int64_t blocks = (N + PK - 1) / PK, units = (blocks + GEMV_BLOCKS - 1) / GEMV_BLOCKS;
#pragma omp for schedule(static) nowait
    for (int64_t u = 0; u < units; u++) {
        const int64_t b0 = u * GEMV_BLOCKS, n0 = b0 * PK;
        const int nr = (int)(blocks - b0 < GEMV_BLOCKS ? blocks - b0 : GEMV_BLOCKS);
        float sums[GEMV_BLOCKS * PK];
        if (f32)   /* one line per k of the next unit: its first K * 64 bytes */
            tile_f32(1, nr, x, K, (const float *)P + b0 * PK * K, PK * K, K, sums,
                     GEMV_BLOCKS * PK, N - n0, bias ? bias + n0 : NULL,
                     (const char *)((const float *)P + (b0 + GEMV_BLOCKS) * PK * K),
                     u + 1 < units ? K * 64 : 0);
        else if (!int8)
            tile(1, nr, xb, K / 2, (const uint16_t *)P + b0 * PK * K, PK * K, K / 2, sums,
                 GEMV_BLOCKS * PK, N - n0, NULL, bias ? bias + n0 : NULL);
        else if (vnni)
            int8_row_vnni(nr, xb, xs, (const int8_t *)P + b0 * PK * K, PK * K, K / 2, sums);
        else
            int8_row_bw(nr, xb, xs, (const int8_t *)P + b0 * PK * K, PK * K, K / 2, sums);
        const int64_t n1 = n0 + nr * PK < N ? n0 + nr * PK : N;
        for (int64_t n = n0; n < n1; n++) {
            float v = sums[n - n0];
            if (int8) v = v * scales[n] + (bias ? bias[n] : 0.0f);
            y[n] = (add ? add[n] : 0.0f) + v;
        }
    }
#else
    (void)x; (void)P; (void)wtype; (void)scales; (void)bias; (void)add; (void)y; (void)N;
    (void)K;
#endif
}

/* The float32 case of llmlab_packed_gemm: units (panel, chunk of rows) in panel order under a
 * static schedule, so each thread's next panel is the one after its current one */
static int packed_gemm_f32(const float *x, int64_t x_stride, const float *P, const float *bias,
                           float *y, int64_t T, int64_t N, int64_t K) {
#ifdef LLMLAB_X86
    if (!(llmlab_isa() & LLMLAB_ISA_AVX512)) return -1;
    const int64_t panels = ((N + PK - 1) / PK + NR - 1) / NR;
    const int64_t chunks = (T + F32_ROWS_PER_UNIT - 1) / F32_ROWS_PER_UNIT;
    const int64_t rows = (T + chunks - 1) / chunks;
#pragma omp parallel for schedule(static)
    for (int64_t u = 0; u < panels * chunks; u++) {
        const int64_t p = u / chunks, c = u % chunks, t0 = c * rows;
        const int64_t t1 = t0 + rows < T ? t0 + rows : T;
        if (t0 < t1) run_unit_f32(p, panels, c, chunks, t0, t1, x, x_stride, P, bias, y, N, K);
    }
    return 0;
#else
    (void)x; (void)x_stride; (void)P; (void)bias; (void)y; (void)T; (void)N; (void)K;
    return -1;
#endif
}

/* y[T, N] (contiguous) = x[T, K] (row stride x_stride) W^T (* scales[N]) (+ bias[N]), W packed
 * by llmlab_pack_weight: float32 (AVX-512F FMAs), or bf16 or int8 with per-column scales
 * (AVX-512 BF16, K % 32 == 0); on all threads. Returns -1 where this CPU lacks the
 * instructions (or out of memory), else 0. */
int llmlab_packed_gemm(const float *x, int64_t x_stride, const void *P, int64_t wtype,
                       const float *scales, const float *bias, float *y, int64_t T, int64_t N,
                       int64_t K) {
    if (wtype == LLMLAB_W_F32) return packed_gemm_f32(x, x_stride, P, bias, y, T, N, K);
#ifdef LLMLAB_X86
    if (!(llmlab_isa() & LLMLAB_ISA_AVX512_BF16) || K % 32) return -1;
    if (T == 1 && wtype == LLMLAB_W_INT8) {   /* no panel widened for one row: see above */
#pragma omp parallel
        llmlab_packed_gemv_rows(x, P, wtype, scales, bias, NULL, y, N, K);
        return 0;
    }
    uint32_t *xb = (uint32_t *)malloc((size_t)(T * K * 2));
    if (!xb) return -1;
    const int64_t panels = ((N + PK - 1) / PK + NR - 1) / NR;
    const int64_t chunks = (T + ROWS_PER_UNIT - 1) / ROWS_PER_UNIT;
    const int64_t rows = (T + chunks - 1) / chunks;   /* even chunks: 64 rows -> 2 x 32 */
    /* x to bf16 on this thread, before the region: T*K conversions against T*N*K products,
     * and no barrier for the other threads to wait at (a wake-up each, when they sleep) */
    for (int64_t t = 0; t < T; t++) row_to_bf16(x + t * x_stride, xb + t * (K / 2), K);
    int rc = 0;
#pragma omp parallel
    {
        int64_t widened = -1;
#pragma omp for schedule(static)
        for (int64_t u = 0; u < panels * chunks; u++) {
            const int64_t p = u / chunks, t0 = (u % chunks) * rows;
            const int64_t t1 = t0 + rows < T ? t0 + rows : T;
            if (run_unit(p, t0, t1, xb, P, wtype, scales, bias, y, N, K, &widened) != 0) {
#pragma omp atomic write
                rc = -1;
            }
        }
    }
    free(xb);
    return rc;
#else
    (void)x; (void)x_stride; (void)P; (void)wtype; (void)scales; (void)bias; (void)y; (void)T;
    (void)N; (void)K;
    return -1;
#endif
}
