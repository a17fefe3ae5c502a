/* Matmuls of a batch (2+ rows of x; one row: llmlab_packed_gemv_rows) on weights packed once at
 * load.
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
 *   packed the same way (one byte each) and multiplied in integers: each row of x rounded to
 *   int16, `vpdpwssd` on the block's pairs widened to int16 (see the int8 micro-tile); from
 *   INT16_MAX_ROWS rows on a panel is widened to bf16 exactly (|q| <= 127 fits bf16's 8
 *   significant bits) once per thread, into a per-thread buffer, and the bf16 tile runs.
 *
 *   Micro-tile. MR = 6 rows of x times NR = 4 blocks (64 columns): 24 accumulators, 4 weight
 *   vectors and a broadcast in the 32 registers; per pair of k, 4 loads and 6 broadcasts feed
 *   24 `vdpbf16ps` (int8: 4 loads widened to int16, 24 `vpdpwssd`). x is rounded to bf16 (int16
 *   for int8 weights) once per call, by the calling thread (as cpu_quant.c's one-row bf16 path
 *   does); sums stay float32; the int8 scale (per column) and the bias are applied when the
 *   tile is stored.
 *
 *   Work units: (panel of 64 columns, chunk of rows) pairs, shared by the threads, so a small
 *   matrix (W_o: 9 panels) still splits evenly over 2 threads.
 *
 * bf16 and int8 weights on CPUs with AVX-512 BF16, float32 ones with AVX-512F; on CPUs without
 * them but with AVX2 and FMA, AVX2 tiles on the same blocks (the section "AVX2 and FMA" below).
 * Python packs weights only where `llmlab_isa` reports one of them; the call returns -1
 * otherwise. Elsewhere cpu_quant.c's portable matmul runs.
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
/* int8 from this many rows x on: widened to bf16 instead of int16 (a prompt's rows). Below it
 * the int16 tile is faster: `vpmovsxbw` is one instruction per 32 weights where bf16 takes five;
 * from it the panel widened to bf16 once per thread serves enough rows that the widening costs
 * less than what `vdpbf16ps` runs faster than `vpdpwssd` (2-core Zen 4, a layer's four int8
 * matmuls, ms, int16 against bf16: 64 rows 1.43 / 1.54, 128 rows 3.08 / 3.09, 192 rows 3.98 /
 * 3.82, 512 rows 11.6 / 11.3). -D to measure another. */
#ifndef INT16_MAX_ROWS
#define INT16_MAX_ROWS 128
#endif
#define F32_ROWS_PER_UNIT 32   /* float32: 64 rows -> 2 x 32 (one of 64: 85.4 ms against 83.2) */

/* P[nb][kp][j][e] = W[nb*16 + j][g*kp + e], zero where nb*16 + j >= N, with g = 2 k's per
 * lane for elements of `elem` 2 (bf16) or 1 (int8) bytes (K even), g = 1 for 4 (float32: one
 * k per 64-byte vector, P[nb][k][j]). out holds ceil(N/16)*16*K elements.
 * A lane's g elements are one unit of g * elem bytes (4 for float32 and bf16, 2 for int8), so
 * packing moves units: row j of a block is read front to back and written every 16 units, a
 * block (16 rows, 37 KB for float32 at K = 576) staying in the core's caches meanwhile. The
 * fixed unit size makes each copy one move (a memcpy of `elem` bytes, a call per element,
 * packed 0.9-3 GB/s on a 2-core Zen 4, this 8-13). pack_block writes block nb. */
__attribute__((always_inline))
static inline void pack_block(const char *W, int64_t N, int64_t units, int64_t nb, char *dst,
                              int64_t unit) {
    for (int64_t j = 0; j < PK; j++) {
        const int64_t n = nb * PK + j;
        const char *row = n < N ? W + n * units * unit : NULL;
        for (int64_t u = 0; u < units; u++) {
            char *to = dst + (u * PK + j) * unit;
            if (row) memcpy(to, row + u * unit, (size_t)unit);
            else memset(to, 0, (size_t)unit);
        }
    }
}

void llmlab_pack_weight(const void *W, int64_t elem, int64_t N, int64_t K, void *out) {
    const int64_t unit = elem == 1 ? 2 : 4;   /* a float32, a bf16 pair or an int8 pair */
    const int64_t blocks = (N + PK - 1) / PK, units = K * elem / unit;
#pragma omp parallel for schedule(static)
    for (int64_t nb = 0; nb < blocks; nb++) {
        char *dst = (char *)out + nb * PK * K * elem;
        if (unit == 4) pack_block((const char *)W, N, units, nb, dst, 4);
        else pack_block((const char *)W, N, units, nb, dst, 2);   /* a constant: one move each */
    }
}

#ifdef LLMLAB_X86

/* the valid columns of block j of a tile whose first block's first column has `cols` valid
 * columns from it on (the last panel's last block may be partial) */
static inline __mmask16 block_mask(int64_t cols, int j) {
    const int64_t left = cols - j * PK;
    return left >= PK ? (__mmask16)0xFFFF : left <= 0 ? 0 : (__mmask16)((1u << left) - 1);
}

/* A micro-tile's sums into y: acc[i][j] * scale + bias per column (scales NULL: 1, an exact
 * multiply, so float32 tiles store acc + bias), masked to the `cols` valid columns from the
 * first block's first */
__attribute__((target("avx512f"), always_inline))
static inline void store_tile(int mr, int nr, __m512 acc[MR][NR], float *y, int64_t ldy,
                              int64_t cols, const float *scales, const float *bias) {
    for (int j = 0; j < nr; j++) {
        const __mmask16 m = block_mask(cols, j);
        if (!m) break;
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

/* The int8 micro-tile: y[mr rows, nr blocks] = x_int16[mr rows] . P[nr blocks] (int8), each row
 * of x rounded to int16 with its own step (llmlab_x_to_int16; the one-row GEMV below is this
 * tile with one row). Per pair it asks for `ahead_lines` lines from `ahead` + (pair x
 * ahead_lines) x 64 bytes into L2 (the GEMV's next unit; none in the batch matmul).
 * Per pair of k, one 32-byte load of a block widened to int16 (`vpmovsxbw`) serves the mr rows:
 * mr * nr `vpdpwssd` (AVX-512 VNNI) or `vpmaddwd` + `vpaddd`, 2 products per int32 lane, so
 * the int32 sums move to float32 every LLMLAB_INT16_SUM_STEPS pairs (cpu_kernels.h's bound).
 * The float32 sums add up in y itself (24 more registers beside the 24 int32 sums there are
 * not); after the last pair, times the row's step and the column's scale, plus the bias. x:
 * int16 pairs as uint32, row stride xs pairs; steps: the rows' int16 steps.
 * Below INT16_MAX_ROWS rows it replaced the bf16 path (a panel widened to bf16 once per
 * thread, the bf16 micro-tile on x rounded to bf16): on a 2-core Zen 4 (both builds alternated
 * in one process) a layer's four int8 matmuls from memory took 0.20 / 0.29 / 1.39 ms at 2 / 8
 * / 64 rows against 0.39 / 0.52 / 1.54, an int8 decode step of SmolLM2-135M 12.3-12.6 /
 * 18.4-21.1 / 89.2-94.4 ms at batch 2 / 8 / 64 against 18.4-18.5 / 25.0-29.3 / 96.2-99.3
 * (three runs), and the outputs' error against float64 math fell from 1-2 % to 0.02-0.03 %
 * of their mean size; a 64 x 128-token int8 prefill (rows of 2048) stayed as fast. */

/* one micro-tile's int32 sums `a` into y (first: y holds nothing yet; last: times the rows'
 * steps, then the scale and bias as store_tile applies them) */
__attribute__((target("avx512f"), always_inline))
static inline void i16_flush(int mr, int nr, __v16si a[MR][NR], int first, int last,
                             const float *steps, float *y, int64_t ldy, int64_t cols,
                             const float *scales, const float *bias) {
    __m512 f[MR][NR];
    for (int j = 0; j < nr; j++) {
        const __mmask16 m = block_mask(cols, j);
        for (int i = 0; i < mr; i++) {
            f[i][j] = _mm512_cvtepi32_ps((__m512i)a[i][j]);
            if (!first) f[i][j] += _mm512_maskz_loadu_ps(m, y + i * ldy + j * PK);
            if (last) f[i][j] *= _mm512_set1_ps(steps[i]);
        }
    }
    store_tile(mr, nr, f, y, ldy, cols, last ? scales : NULL, last ? bias : NULL);
}

/* The sums are typed as vectors of 16 ints, the type the instruction's builtin takes: typed
 * __m512i (8 long longs), GCC 12 kept them on the stack, a load and a store around each
 * `vpdpwssd` ([64 x 576] x [576 x 3072] and a layer's other int8 matmuls: 1.5 times as long) */
#define I16_DOT_VNNI(a, w, x) __builtin_ia32_vpdpwssd_v16si(a, w, x)
#define I16_DOT_BW(a, w, x) (a + (__v16si)_mm512_madd_epi16((__m512i)w, (__m512i)x))

/* the pairs [k0, k1) of a micro-tile, mr and nr constants once inlined */
#define I16_MICRO(NAME, TARGET, DOT)                                                          \
    __attribute__((target(TARGET), always_inline))                                            \
    static inline void NAME(int mr, int nr, const uint32_t *x, int64_t xs, const float *steps, \
                            const int8_t *w, int64_t bstride, int64_t k0, int64_t k1,         \
                            int64_t kp_n, float *y, int64_t ldy, int64_t cols,                \
                            const float *scales, const float *bias, const char *ahead,        \
                            int ahead_lines) {                                                \
        __v16si a[MR][NR];                                                                    \
        for (int i = 0; i < MR; i++)                                                          \
            for (int j = 0; j < NR; j++) a[i][j] = (__v16si)_mm512_setzero_si512();           \
        for (int64_t kp = k0; kp < k1; kp++) {                                                \
            for (int l = 0; l < ahead_lines; l++)                                             \
                _mm_prefetch(ahead + (kp * ahead_lines + l) * 64, _MM_HINT_T1);               \
            __v16si wv[NR];                                                                   \
            for (int j = 0; j < nr; j++)                                                      \
                wv[j] = (__v16si)_mm512_cvtepi8_epi16(                                        \
                    _mm256_loadu_si256((const __m256i *)(w + j * bstride + kp * 2 * PK)));    \
            for (int i = 0; i < mr; i++) {                                                    \
                const __v16si xv = (__v16si)_mm512_set1_epi32((int)x[i * xs + kp]);           \
                for (int j = 0; j < nr; j++) a[i][j] = DOT(a[i][j], wv[j], xv);               \
            }                                                                                 \
        }                                                                                     \
        i16_flush(mr, nr, a, k0 == 0, k1 == kp_n, steps, y, ldy, cols, scales, bias);         \
    }

/* the micro-tile over all pairs, LLMLAB_INT16_SUM_STEPS at a time, through MICRO(R, C) */
#define I16_TILE(NAME, TARGET)                                                                \
    __attribute__((target(TARGET)))                                                          \
    static void NAME(int mr, int nr, const uint32_t *x, int64_t xs, const float *steps,       \
                     const int8_t *w, int64_t bstride, int64_t kp_n, float *y, int64_t ldy,   \
                     int64_t cols, const float *scales, const float *bias, const char *ahead, \
                     int ahead_lines) {                                                       \
        for (int64_t k0 = 0; k0 < kp_n; k0 += LLMLAB_INT16_SUM_STEPS) {                       \
            const int64_t k1 = k0 + LLMLAB_INT16_SUM_STEPS < kp_n                             \
                                   ? k0 + LLMLAB_INT16_SUM_STEPS : kp_n;                      \
            BY_TILE_SIZE(MICRO)                                                               \
        }                                                                                     \
    }
#define MICRO(R, C) \
    micro_i16_vnni(R, C, x, xs, steps, w, bstride, k0, k1, kp_n, y, ldy, cols, scales, bias, \
                   ahead, ahead_lines)
I16_MICRO(micro_i16_vnni, "avx512f,avx512bw,avx512vnni", I16_DOT_VNNI)
I16_TILE(tile_i16_vnni, "avx512f,avx512bw,avx512vnni")
#undef MICRO
#define MICRO(R, C) \
    micro_i16_bw(R, C, x, xs, steps, w, bstride, k0, k1, kp_n, y, ldy, cols, scales, bias, \
                 ahead, ahead_lines)
I16_MICRO(micro_i16_bw, "avx512f,avx512bw", I16_DOT_BW)
I16_TILE(tile_i16_bw, "avx512f,avx512bw")
#undef MICRO
#undef I16_TILE
#undef I16_MICRO

/* the int8 tile with `vpdpwssd` where vnni, else with `vpmaddwd` + `vpaddd` */
static void tile_int8(int vnni, int mr, int nr, const uint32_t *x, int64_t xs, const float *steps,
                      const int8_t *w, int64_t bstride, int64_t kp_n, float *y, int64_t ldy,
                      int64_t cols, const float *scales, const float *bias, const char *ahead,
                      int ahead_lines) {
    if (vnni)
        tile_i16_vnni(mr, nr, x, xs, steps, w, bstride, kp_n, y, ldy, cols, scales, bias, ahead,
                      ahead_lines);
    else
        tile_i16_bw(mr, nr, x, xs, steps, w, bstride, kp_n, y, ldy, cols, scales, bias, ahead,
                    ahead_lines);
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

/* a float32 tile: tile_f32 (AVX-512) or tile_f32_avx2 */
typedef void f32_tile_fn(int mr, int nr, const float *x, int64_t xs, const float *w,
                         int64_t bstride, int64_t K, float *y, int64_t ldy, int64_t cols,
                         const float *bias, const char *ahead, int64_t ahead_bytes);

/* Work unit (panel p, rows [t0, t1), chunk c of `chunks`) on float32 weights: its tiles, which
 * between them ask for the chunk's share of panel p + 1 (the thread's next panel under the
 * static schedule), spread evenly over the tiles */
static void run_unit_f32(f32_tile_fn *tile_fn, int64_t p, int64_t panels, int64_t c,
                         int64_t chunks, int64_t t0, int64_t t1, const float *x,
                         int64_t x_stride, const float *P, const float *bias, float *y,
                         int64_t N, int64_t K) {
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
        tile_fn(mr, nr, x + t * x_stride, x_stride, P + b0 * PK * K, PK * K, K, y + t * N + n0,
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

/* Work unit u: the rows [t0, t1) of x against panel p (NR blocks): x as bf16 pairs for bf16
 * weights, and for int8 ones from INT16_MAX_ROWS rows on, whose panel is then widened to bf16
 * once per thread and panel (*widened: the panel in the thread's buffer; steps is then NULL);
 * below, x as int16 pairs with the rows' steps (vnni: with `vpdpwssd`). Returns -1 out of
 * memory. */
__attribute__((target("avx512f,avx512bw,avx512bf16")))
static int run_unit(int64_t p, int64_t t0, int64_t t1, const uint32_t *xb, const float *steps,
                    const void *P, int64_t wtype, const float *scales, const float *bias,
                    float *y, int64_t N, int64_t K, int vnni, int64_t *widened) {
    const int64_t blocks = (N + PK - 1) / PK, b0 = p * NR;
    const int nr = (int)(blocks - b0 < NR ? blocks - b0 : NR);
    const int64_t bstride = PK * K;   /* elements between blocks */
    const int64_t n0 = b0 * PK, cols = N - n0;
    const float *s = scales ? scales + n0 : NULL, *b = bias ? bias + n0 : NULL;
    const int int8 = wtype == LLMLAB_W_INT8, int16 = int8 && steps;
    const int8_t *panel8 = (const int8_t *)P + b0 * bstride;   /* int8: one byte each */
    const uint16_t *w = (const uint16_t *)P + b0 * bstride;
    if (int8 && !int16) {
        uint16_t *buf = thread_buffer(nr * bstride * 2);
        if (!buf) return -1;
        if (*widened != p) int8_to_bf16(panel8, buf, nr * bstride);
        *widened = p;
        w = buf;
    }
    for (int64_t t = t0; t < t1; t += MR) {
        const int mr = (int)(t1 - t < MR ? t1 - t : MR);
        const uint32_t *xt = xb + t * (K / 2);
        float *yt = y + t * N + n0;
        if (int16)
            tile_int8(vnni, mr, nr, xt, K / 2, steps + t, panel8, bstride, K / 2, yt, N, cols, s,
                      b, NULL, 0);
        else
            tile(mr, nr, xt, K / 2, w, bstride, K / 2, yt, N, cols, s, b);
    }
    return 0;
}

/* ---- AVX2 and FMA (x86 CPUs without AVX-512: most laptops') --------------------------------
 *
 * The same packed blocks, read with 8-float vectors: a block's 16 columns are two halves. On
 * such a CPU cpu_quant.c's widening kernels made bf16 and int8 slower than float32 at every
 * batch (kernels built with -march=haswell and capped to AVX2 on a 2-core Zen 4, SmolLM2-135M
 * decode step, float32 / bf16 / int8: batch 1 28.9 / 36.1 / 59.7 ms, batch 64 234 / 1315 /
 * 1112 ms). Without bf16 or int8 dot instructions:
 *
 *   float32: per k, a block's two halves times a broadcast x, MR rows (12 sums).
 *   bf16: per pair of k, a half's 8 (k, k+1) pairs widened in registers (even k: shifted left
 *         16 bits; odd k: the low 16 bits cleared) and two FMAs with x[k], x[k+1] in float32 (x
 *         is not rounded: AVX2 has no bf16 product to round it for). MR2 rows.
 *   int8: per pair of k, a half's pairs widened to int16 (`vpmovsxbw`), `vpmaddwd` with the
 *         row's int16 pair of x and `vpaddd`: the integers of the AVX-512 int8 tile, flushed to
 *         float32 at the same steps, so the outputs equal it to the bit. At every row count
 *         (there is no bf16 path to switch to). MR rows.
 *
 * With them (the same probe, a later run): 23.7 / 14.4 / 9.2 ms at batch 1, 186.8 / 187.9 /
 * 164.8 at batch 64. From about 16 rows the matmuls are arithmetic, and bf16 needs float32's
 * one FMA per product: as fast as float32 there, no faster (`vpmaddwd` does 16 of int8's
 * products per instruction against an FMA's 8). */
#define MR2 4   /* rows of x per bf16 micro-tile: 8 sums, 4 widened halves, 2 of x */
#ifndef BF16_F32_ROWS
#define BF16_F32_ROWS 8   /* bf16 units from this many rows on: widened to float32 first */
#endif

/* lanes 0 .. n-1 of 8 set, n clamped to [0, 8] */
__attribute__((target("avx2"), always_inline))
static inline __m256i lanes_below(int64_t n) {
    n = n < 0 ? 0 : n > 8 ? 8 : n;
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    return _mm256_cmpgt_epi32(_mm256_set1_epi32((int)n), lane);
}

/* A block's sums (mr rows, two halves) into y as store_tile does: acc * scale + bias, masked
 * to the `cols` valid columns from the block's first */
__attribute__((target("avx2,fma"), always_inline))
static inline void store_block_avx2(int mr, __m256 acc[][2], float *y, int64_t ldy, int64_t cols,
                                    const float *scales, const float *bias) {
    for (int h = 0; h < 2; h++) {
        const __m256i m = lanes_below(cols - 8 * h);
        const __m256 s = scales ? _mm256_maskload_ps(scales + 8 * h, m) : _mm256_set1_ps(1);
        const __m256 b = bias ? _mm256_maskload_ps(bias + 8 * h, m) : _mm256_setzero_ps();
        for (int i = 0; i < mr; i++)
            _mm256_maskstore_ps(y + i * ldy + 8 * h, m, _mm256_fmadd_ps(acc[i][h], s, b));
    }
}

/* float32: y[mr rows, one block] = x . P[block] (one k per 16 floats), asking for
 * `ahead_bytes` from `ahead` as micro_f32 does */
__attribute__((target("avx2,fma"), always_inline))
static inline void micro_f32_avx2(int mr, const float *x, int64_t xs, const float *w, int64_t K,
                                  float *y, int64_t ldy, int64_t cols, const float *bias,
                                  const char *ahead, int64_t ahead_bytes) {
    __m256 acc[MR][2];
    for (int i = 0; i < MR; i++) acc[i][0] = acc[i][1] = _mm256_setzero_ps();
    for (int64_t k = 0; k < K; k++) {
        if (k * 64 < ahead_bytes) _mm_prefetch(ahead + k * 64, _MM_HINT_T1);
        const __m256 w0 = _mm256_loadu_ps(w + k * PK), w1 = _mm256_loadu_ps(w + k * PK + 8);
        for (int i = 0; i < mr; i++) {
            const __m256 xv = _mm256_set1_ps(x[i * xs + k]);
            acc[i][0] = _mm256_fmadd_ps(w0, xv, acc[i][0]);
            acc[i][1] = _mm256_fmadd_ps(w1, xv, acc[i][1]);
        }
    }
    store_block_avx2(mr, acc, y, ldy, cols, NULL, bias);
}

/* tile_f32 on AVX2: the nr blocks one after another, each asking for its share of `ahead` */
__attribute__((target("avx2,fma")))
static void tile_f32_avx2(int mr, int nr, const float *x, int64_t xs, const float *w,
                          int64_t bstride, int64_t K, float *y, int64_t ldy, int64_t cols,
                          const float *bias, const char *ahead, int64_t ahead_bytes) {
    const int64_t share = (ahead_bytes / nr + 63) / 64 * 64;
    for (int j = 0; j < nr; j++) {
#define MICRO(R)                                                                              \
    micro_f32_avx2(R, x, xs, w + j * bstride, K, y + j * PK, ldy, cols - j * PK,              \
                   bias ? bias + j * PK : NULL, ahead + j * share, share)
        switch (mr) {
            case 1: MICRO(1); break; case 2: MICRO(2); break; case 3: MICRO(3); break;
            case 4: MICRO(4); break; case 5: MICRO(5); break; default: MICRO(6);
        }
#undef MICRO
    }
}

/* bf16: y[mr rows, one block] = x (float32, row stride xs) . P[block] (bf16 pairs). With one or
 * two rows the even and odd k add into separate sums (more chains of FMAs in flight), added
 * at the end. */
__attribute__((target("avx2,fma"), always_inline))
static inline void micro_bf16_avx2(int mr, const float *x, int64_t xs, const uint16_t *w,
                                   int64_t kp_n, float *y, int64_t ldy, int64_t cols,
                                   const float *bias) {
    const int split = mr <= 2;
    const __m256i odd = _mm256_set1_epi32((int)0xFFFF0000u);
    __m256 acc[MR2][2], acc_odd[2][2];
    for (int i = 0; i < MR2; i++) acc[i][0] = acc[i][1] = _mm256_setzero_ps();
    for (int i = 0; i < 2; i++) acc_odd[i][0] = acc_odd[i][1] = _mm256_setzero_ps();
    for (int64_t kp = 0; kp < kp_n; kp++) {
        __m256 we[2], wo[2];
        for (int h = 0; h < 2; h++) {
            const __m256i v = _mm256_loadu_si256((const __m256i *)(w + kp * 2 * PK + 16 * h));
            we[h] = _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
            wo[h] = _mm256_castsi256_ps(_mm256_and_si256(v, odd));
        }
        for (int i = 0; i < mr; i++) {
            const __m256 x0 = _mm256_set1_ps(x[i * xs + 2 * kp]);
            const __m256 x1 = _mm256_set1_ps(x[i * xs + 2 * kp + 1]);
            for (int h = 0; h < 2; h++) {
                acc[i][h] = _mm256_fmadd_ps(we[h], x0, acc[i][h]);
                if (split) acc_odd[i][h] = _mm256_fmadd_ps(wo[h], x1, acc_odd[i][h]);
                else acc[i][h] = _mm256_fmadd_ps(wo[h], x1, acc[i][h]);
            }
        }
    }
    if (split)
        for (int i = 0; i < mr; i++)
            for (int h = 0; h < 2; h++) acc[i][h] = _mm256_add_ps(acc[i][h], acc_odd[i][h]);
    store_block_avx2(mr, acc, y, ldy, cols, NULL, bias);
}

/* the int8 micro-tile's pairs [k0, k1) on AVX2 (mr rows, one block), flushed as i16_flush
 * does: y = (y +) float(sums), after the last pair times the row's step, the scale, the bias */
__attribute__((target("avx2,fma"), always_inline))
static inline void micro_int8_avx2(int mr, const uint32_t *x, int64_t xs, const float *steps,
                                   const int8_t *w, int64_t k0, int64_t k1, int64_t kp_n,
                                   float *y, int64_t ldy, int64_t cols, const float *scales,
                                   const float *bias) {
    __v8si a[MR][2];    /* typed as ints, not __m256i: see I16_DOT_VNNI */
    for (int i = 0; i < MR; i++) a[i][0] = a[i][1] = (__v8si)_mm256_setzero_si256();
    for (int64_t kp = k0; kp < k1; kp++) {
        __m256i wv[2];
        for (int h = 0; h < 2; h++)
            wv[h] = _mm256_cvtepi8_epi16(
                _mm_loadu_si128((const __m128i *)(w + kp * 2 * PK + 16 * h)));
        for (int i = 0; i < mr; i++) {
            const __m256i xv = _mm256_set1_epi32((int)x[i * xs + kp]);
            for (int h = 0; h < 2; h++)
                a[i][h] += (__v8si)_mm256_madd_epi16(wv[h], xv);
        }
    }
    __m256 f[MR][2];
    for (int h = 0; h < 2; h++) {
        const __m256i m = lanes_below(cols - 8 * h);
        for (int i = 0; i < mr; i++) {
            f[i][h] = _mm256_cvtepi32_ps((__m256i)a[i][h]);
            if (k0 != 0) f[i][h] += _mm256_maskload_ps(y + i * ldy + 8 * h, m);
            if (k1 == kp_n) f[i][h] *= _mm256_set1_ps(steps[i]);
        }
    }
    store_block_avx2(mr, f, y, ldy, cols, k1 == kp_n ? scales : NULL,
                     k1 == kp_n ? bias : NULL);
}

/* MICRO(R) with the tile's rows mr as the constant R (up to 4, or up to 6 with MORE) */
#define BY_ROWS_UPTO4(MICRO, MORE) \
    switch (mr) { case 1: MICRO(1); break; case 2: MICRO(2); break; \
                  case 3: MICRO(3); break; case 4: MICRO(4); break; MORE }
#define BY_ROWS(MICRO) BY_ROWS_UPTO4(MICRO, case 5: MICRO(5); break; default: MICRO(6);)

/* the bf16 tile on AVX2: x float32 rows (stride xs floats), mr <= MR2, blocks one by one */
__attribute__((target("avx2,fma")))
static void tile_bf16_avx2(int mr, int nr, const float *x, int64_t xs, const uint16_t *w,
                           int64_t bstride, int64_t kp_n, float *y, int64_t ldy, int64_t cols,
                           const float *bias) {
    for (int j = 0; j < nr; j++) {
        const float *b = bias ? bias + j * PK : NULL;
#define MICRO(R) micro_bf16_avx2(R, x, xs, w + j * bstride, kp_n, y + j * PK, ldy, cols - j * PK, b)
        BY_ROWS_UPTO4(MICRO, default: MICRO(4);)
#undef MICRO
    }
}

/* the int8 tile on AVX2: x int16 pairs (stride xs pairs) with the rows' steps, mr <= MR rows
 * (12 sums, 2 widened halves, x and a product: 16 registers), blocks one by one */
__attribute__((target("avx2,fma")))
static void tile_int8_avx2(int mr, int nr, const uint32_t *x, int64_t xs, const float *steps,
                           const int8_t *w, int64_t bstride, int64_t kp_n, float *y,
                           int64_t ldy, int64_t cols, const float *scales, const float *bias) {
    for (int j = 0; j < nr; j++) {
        const float *s = scales + j * PK, *b = bias ? bias + j * PK : NULL;
        for (int64_t k0 = 0; k0 < kp_n; k0 += LLMLAB_INT16_SUM_STEPS) {
            const int64_t k1 =
                k0 + LLMLAB_INT16_SUM_STEPS < kp_n ? k0 + LLMLAB_INT16_SUM_STEPS : kp_n;
#define MICRO(R) micro_int8_avx2(R, x, xs, steps, w + j * bstride, k0, k1, kp_n, y + j * PK, \
                                 ldy, cols - j * PK, s, b)
            BY_ROWS(MICRO)
#undef MICRO
        }
    }
}
#undef BY_ROWS
#undef BY_ROWS_UPTO4

/* `blocks` bf16 blocks (pairs) -> float32 blocks (one k per 16 floats, tile_f32's layout) */
__attribute__((target("avx2")))
static void bf16_blocks_to_f32(const uint16_t *w, int64_t blocks, int64_t K, float *out) {
    const __m256i odd = _mm256_set1_epi32((int)0xFFFF0000u);
    for (int64_t i = 0; i < blocks * K / 2; i++, w += 2 * PK, out += 2 * PK)
        for (int h = 0; h < 2; h++) {
            const __m256i v = _mm256_loadu_si256((const __m256i *)(w + 16 * h));
            _mm256_storeu_si256((__m256i *)(out + 8 * h), _mm256_slli_epi32(v, 16));
            _mm256_storeu_si256((__m256i *)(out + PK + 8 * h), _mm256_and_si256(v, odd));
        }
}

/* Work unit: rows [t0, t1) against panel p on AVX2, bf16 (x float32, row stride x_stride) or
 * int8 (xi: int16 pairs, K / 2 a row, with the rows' steps). A bf16 unit of BF16_F32_ROWS rows
 * or more widens its panel to float32 once per thread (*widened: the panel in the thread's
 * buffer) and runs the float32 tile: per product the same one FMA, without a widening per
 * MR2 rows; its tiles ask for chunk c's share of panel p + 1 as run_unit_f32's do. Returns -1
 * out of memory. */
static int run_unit_avx2(int64_t p, int64_t panels, int64_t c, int64_t chunks, int64_t t0,
                         int64_t t1, const float *x, int64_t x_stride, const uint32_t *xi,
                         const float *steps, const void *P, int64_t wtype, const float *scales,
                         const float *bias, float *y, int64_t N, int64_t K, int64_t *widened) {
    const int64_t blocks = (N + PK - 1) / PK, b0 = p * NR;
    const int nr = (int)(blocks - b0 < NR ? blocks - b0 : NR);
    const int64_t bstride = PK * K, n0 = b0 * PK, cols = N - n0;
    const float *s = scales ? scales + n0 : NULL, *b = bias ? bias + n0 : NULL;
    if (wtype == LLMLAB_W_INT8) {
        for (int64_t t = t0; t < t1; t += MR)
            tile_int8_avx2((int)(t1 - t < MR ? t1 - t : MR), nr, xi + t * (K / 2), K / 2,
                           steps + t, (const int8_t *)P + b0 * bstride, bstride, K / 2,
                           y + t * N + n0, N, cols, s, b);
        return 0;
    }
    const uint16_t *w = (const uint16_t *)P + b0 * bstride;
    if (t1 - t0 < BF16_F32_ROWS) {
        for (int64_t t = t0; t < t1; t += MR2)
            tile_bf16_avx2((int)(t1 - t < MR2 ? t1 - t : MR2), nr, x + t * x_stride, x_stride,
                           w, bstride, K / 2, y + t * N + n0, N, cols, b);
        return 0;
    }
    float *buf = (float *)thread_buffer(nr * bstride * 4);
    if (!buf) return -1;
    if (*widened != p) bf16_blocks_to_f32(w, nr, K, buf);
    *widened = p;
    const int64_t panel_bytes = NR * bstride * 2;
    const int64_t share = p + 1 < panels ? panel_bytes / chunks : 0;
    const char *ahead = (const char *)P + (p + 1) * panel_bytes + c * share;
    const int64_t per_tile = (share / ((t1 - t0 + MR - 1) / MR) + 63) / 64 * 64;
    for (int64_t t = t0, i = 0; t < t1; t += MR, i++)
        tile_f32_avx2((int)(t1 - t < MR ? t1 - t : MR), nr, x + t * x_stride, x_stride, buf,
                      bstride, K, y + t * N + n0, N, cols, b, ahead + i * per_tile, per_tile);
    return 0;
}
#endif

#define GEMV_BLOCKS NR   /* blocks per unit of the one-row GEMV: the batch matmul's panel */

/* An int8 unit of the one-row GEMV asks for the thread's whole next unit while it runs:
 * GEMV_BLOCKS blocks of PK rows x K int8 spread over its K / 2 pairs, 2 lines a pair. Its four
 * blocks are read 32 bytes a pair each, streams the hardware prefetchers follow badly: on a
 * 2-core Zen 4 (alternated in one process) 60 [3072, 576] int8 GEMVs from memory read 31-32 GB/s
 * without, 37-40 with (1 line a pair: 32; 3 or 4: 32-35), and an int8 batch-1 decode step of
 * SmolLM2-135M took 5.91 ms against 6.58 (medians of 12 rounds; 10 of them faster). A bf16
 * unit, read 64 bytes a pair, gains nothing from its next unit asked for (a bf16 step took 7.78
 * ms with it, 7.35 without), and float32 keeps the quarter micro_f32 asks for. */
#define INT8_GEMV_AHEAD_LINES 2

/* Which tiles run weights of type wtype (LLMLAB_W_F32, _BF16, _INT8) packed by
 * llmlab_pack_weight on this CPU: LLMLAB_PACKED_AVX512 (float32: AVX-512F; bf16, int8: AVX-512
 * BF16), else LLMLAB_PACKED_AVX2 (AVX2 and FMA), else 0: none */
int llmlab_packed_tiles(int64_t wtype) {
    const int isa = llmlab_isa();
    if (isa & (wtype == LLMLAB_W_F32 ? LLMLAB_ISA_AVX512 : LLMLAB_ISA_AVX512_BF16))
        return LLMLAB_PACKED_AVX512;
    return isa & LLMLAB_ISA_AVX2 ? LLMLAB_PACKED_AVX2 : 0;
}


/* y[n] = add[n] + (x . W[n] (* scales[n]) + bias[n]) for n < N, one row of x against weights
 * packed by llmlab_pack_weight (wtype LLMLAB_W_F32, LLMLAB_W_BF16, or LLMLAB_W_INT8 with its
 * scales): the batch-1 GEMV of the fused decode layer (cpu_layer.c) and of llmlab_packed_gemm,
 * read front to back. Dense rows read four at a time are streams of K * 2 bytes each, too short
 * for the hardware prefetchers (on a 2-core Zen 4 a dense [92160, 576] bf16 GEMV read 23 GB/s,
 * the same bytes packed 35, a plain sum 35). Each output is the micro-tile's sum for one row,
 * the same operations as llmlab_packed_gemm's tile on that row (int8: x rounded to int16, see
 * the int8 micro-tile; a float32 unit also asks for the start of the thread's next unit, as
 * the batch tiles do, an int8 unit for all of it: INT8_GEMV_AHEAD_LINES). Then `add`, which
 * may be y, is added. An orphaned `omp for` without its barrier (see llmlab_gemv_rows); bf16
 * and int8: K % 32 == 0; the tiles llmlab_packed_tiles names (the caller checks that there are
 * some). */
void llmlab_packed_gemv_rows(const float *x, const void *P, int64_t wtype, const float *scales,
                             const float *bias, const float *add, float *y, int64_t N,
                             int64_t K) {
#ifdef LLMLAB_X86
    const int vnni = llmlab_isa() & LLMLAB_ISA_AVX512_VNNI;
    const int int8 = wtype == LLMLAB_W_INT8, f32 = wtype == LLMLAB_W_F32;
    const int avx512 = llmlab_packed_tiles(wtype) == LLMLAB_PACKED_AVX512;
    /* each thread rounds x once, for its blocks: to bf16 pairs, or to int16 pairs and their
     * step (float32, and bf16 on AVX2: x as it is) */
    uint32_t xb[f32 ? 1 : K / 2];
    float step = 0.0f;
    if (int8) step = llmlab_x_to_int16(x, (int16_t *)xb, K);
    else if (!f32 && avx512) row_to_bf16(x, xb, K);
    const int64_t blocks = (N + PK - 1) / PK, units = (blocks + GEMV_BLOCKS - 1) / GEMV_BLOCKS;
#pragma omp for schedule(static) nowait
    for (int64_t u = 0; u < units; u++) {
        const int64_t b0 = u * GEMV_BLOCKS, n0 = b0 * PK;
        const int nr = (int)(blocks - b0 < GEMV_BLOCKS ? blocks - b0 : GEMV_BLOCKS);
        float sums[GEMV_BLOCKS * PK];
        if (f32)   /* one line per k of the next unit: its first K * 64 bytes */
            (avx512 ? tile_f32 : tile_f32_avx2)(
                1, nr, x, K, (const float *)P + b0 * PK * K, PK * K, K, sums, GEMV_BLOCKS * PK,
                N - n0, bias ? bias + n0 : NULL,
                (const char *)((const float *)P + (b0 + GEMV_BLOCKS) * PK * K),
                u + 1 < units ? K * 64 : 0);
        else if (!avx512 && int8)
            tile_int8_avx2(1, nr, xb, K / 2, &step, (const int8_t *)P + b0 * PK * K, PK * K,
                           K / 2, sums, GEMV_BLOCKS * PK, N - n0, scales + n0,
                           bias ? bias + n0 : NULL);
        else if (!avx512)
            tile_bf16_avx2(1, nr, x, K, (const uint16_t *)P + b0 * PK * K, PK * K, K / 2, sums,
                           GEMV_BLOCKS * PK, N - n0, bias ? bias + n0 : NULL);
        else if (!int8)
            tile(1, nr, xb, K / 2, (const uint16_t *)P + b0 * PK * K, PK * K, K / 2, sums,
                 GEMV_BLOCKS * PK, N - n0, NULL, bias ? bias + n0 : NULL);
        else
            tile_int8(vnni, 1, nr, xb, K / 2, &step, (const int8_t *)P + b0 * PK * K, PK * K,
                      K / 2, sums, GEMV_BLOCKS * PK, N - n0, scales + n0,
                      bias ? bias + n0 : NULL, (const char *)P + (b0 + GEMV_BLOCKS) * PK * K,
                      u + 1 < units ? INT8_GEMV_AHEAD_LINES : 0);
        const int64_t n1 = n0 + nr * PK < N ? n0 + nr * PK : N;
        for (int64_t n = n0; n < n1; n++) y[n] = (add ? add[n] : 0.0f) + sums[n - n0];
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
    const int tiles = llmlab_packed_tiles(LLMLAB_W_F32);
    if (!tiles) return -1;
    f32_tile_fn *tile_fn = tiles == LLMLAB_PACKED_AVX512 ? tile_f32 : tile_f32_avx2;
    const int64_t panels = ((N + PK - 1) / PK + NR - 1) / NR;
    const int64_t chunks = (T + F32_ROWS_PER_UNIT - 1) / F32_ROWS_PER_UNIT;
    const int64_t rows = (T + chunks - 1) / chunks;
#pragma omp parallel for schedule(static)
    for (int64_t u = 0; u < panels * chunks; u++) {
        const int64_t p = u / chunks, c = u % chunks, t0 = c * rows;
        const int64_t t1 = t0 + rows < T ? t0 + rows : T;
        if (t0 < t1)
            run_unit_f32(tile_fn, p, panels, c, chunks, t0, t1, x, x_stride, P, bias, y, N, K);
    }
    return 0;
#else
    (void)x; (void)x_stride; (void)P; (void)bias; (void)y; (void)T; (void)N; (void)K;
    return -1;
#endif
}

/* y[T, N] (contiguous) = x[T, K] (row stride x_stride) W^T (* scales[N]) (+ bias[N]), W packed
 * by llmlab_pack_weight: float32 (AVX-512F FMAs), or bf16 or int8 with per-column scales
 * (AVX-512 BF16, K % 32 == 0); without AVX-512 (BF16) the AVX2 tiles; on all threads. Returns
 * -1 where this CPU lacks the instructions (or out of memory), else 0. */
int llmlab_packed_gemm(const float *x, int64_t x_stride, const void *P, int64_t wtype,
                       const float *scales, const float *bias, float *y, int64_t T, int64_t N,
                       int64_t K) {
    if (wtype == LLMLAB_W_F32) return packed_gemm_f32(x, x_stride, P, bias, y, T, N, K);
#ifdef LLMLAB_X86
    const int tiles = llmlab_packed_tiles(wtype), avx512 = tiles == LLMLAB_PACKED_AVX512;
    if (!tiles || K % 32) return -1;
    const int int8 = wtype == LLMLAB_W_INT8, vnni = llmlab_isa() & LLMLAB_ISA_AVX512_VNNI;
    if (T == 1 && int8) {   /* the same integer sums, in the GEMV's units that stream W */
#pragma omp parallel
        llmlab_packed_gemv_rows(x, P, wtype, scales, bias, NULL, y, N, K);
        return 0;
    }
    const int int16 = int8 && (T < INT16_MAX_ROWS || !avx512);   /* AVX2: int16 at any T */
    uint32_t *xb = (uint32_t *)malloc((size_t)(T * K * 2));
    float *steps = int16 ? (float *)malloc((size_t)T * sizeof(float)) : NULL;
    if (!xb || (int16 && !steps)) {
        free(xb);
        free(steps);
        return -1;
    }
    const int64_t panels = ((N + PK - 1) / PK + NR - 1) / NR;
    const int64_t chunks = (T + ROWS_PER_UNIT - 1) / ROWS_PER_UNIT;
    const int64_t rows = (T + chunks - 1) / chunks;   /* even chunks: 64 rows -> 2 x 32 */
    /* x to bf16 (or int16) on this thread, before the region: T*K conversions against T*N*K
     * products, and no barrier for the other threads to wait at (a wake-up each, when they
     * sleep). bf16 on AVX2 reads x as it is. */
    for (int64_t t = 0; t < T; t++) {
        if (int16)
            steps[t] = llmlab_x_to_int16(x + t * x_stride, (int16_t *)(xb + t * (K / 2)), K);
        else if (avx512)
            row_to_bf16(x + t * x_stride, xb + t * (K / 2), K);
    }
    int rc = 0;
#pragma omp parallel
    {
        int64_t widened = -1;
#pragma omp for schedule(static)
        for (int64_t u = 0; u < panels * chunks; u++) {
            const int64_t p = u / chunks, c = u % chunks, t0 = c * rows;
            const int64_t t1 = t0 + rows < T ? t0 + rows : T;
            if ((avx512 ? run_unit(p, t0, t1, xb, steps, P, wtype, scales, bias, y, N, K, vnni,
                                   &widened)
                        : run_unit_avx2(p, panels, c, chunks, t0, t1, x, x_stride, xb, steps, P,
                                        wtype, scales, bias, y, N, K, &widened)) != 0) {
#pragma omp atomic write
                rc = -1;
            }
        }
    }
    free(steps);
    free(xb);
    return rc;
#else
    (void)x; (void)x_stride; (void)P; (void)wtype; (void)scales; (void)bias; (void)y; (void)T;
    (void)N; (void)K;
    return -1;
#endif
}
