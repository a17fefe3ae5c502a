/* Paged attention for the CPU: the "cpu" backend of llmlab.ops.
 *
 * C99 with GCC/Clang vector extensions and OpenMP, no torch header: `llmlab/ops/cpu_library.py`
 * compiles this file with the system C compiler on first use (about a second) and calls it
 * through ctypes with raw pointers. Layouts are those of kernels/README.md (NHD cache of
 * float32, or of fp8 e4m3 with a scale per layer).
 *
 * One function serves decode, prefill, chunked prefill and prefix-cache hits: sequence s brings
 * q_len = cu_seqlens_q[s+1] - cu_seqlens_q[s] new tokens (1 for decode); new token i sits at
 * position seq_len - q_len + i and sees keys 0..that position. The torch backend copies each
 * sequence's K/V out of its blocks into a padded batch before attending; this kernel reads the
 * K/V rows where they are, through the block table, and never reads a slot past the last
 * position a query may see (so NaN in unused slots cannot leak in).
 *
 * Work unit = (sequence, KV head, tile of up to Q_TILE new tokens). Its query rows are the
 * tile's tokens times the `group` query heads that share the KV head (GQA): each K/V row is
 * loaded once per unit and used by all of them. Keys go K_CHUNK at a time, across block
 * boundaries. Per chunk and query row:
 *   1. scores s_j = q·k_j (q pre-scaled): head_dim/VW fused multiply-adds of VW-float vectors
 *      (cpu_vec.h), then a horizontal sum per key;
 *   2. causal mask, online softmax: running max m, running sum l, and the output acc rescaled
 *      by exp(m_old - m_new) when the max grows;
 *   3. acc += p_j · v_j over the visible keys.
 * At the end out = acc / l. `vexp` (cpu_vec.h) is a polynomial on whole vectors.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "cpu_kernels.h"
#include "cpu_vec.h"

#define K_CHUNK VW    /* keys per online-softmax update: one vector of scores */
#define Q_TILE 16     /* new tokens per work unit (prefill); decode has 1 */
#define MAX_GROUP 16  /* query heads per KV head */

typedef uint8_t vu8 __attribute__((vector_size(VW)));
typedef uint32_t vu32 __attribute__((vector_size(VW * 4)));

/* VW fp8 e4m3 values (1 sign, 4 exponent bits with bias 7, 3 mantissa bits; no infinities,
 * and the cache never holds NaN: values are clamped to +-448 before they are stored) widened
 * to float32 with integer operations only: the sign goes to bit 31, exponent and mantissa to
 * bits 20-26 (a float32 with exponent bias 127, subnormals included), then one multiply by
 * 2^(127-7) moves the bias from 127 to 7. */
static inline vf fp8_load(const uint8_t *p) {
    vu8 b;
    memcpy(&b, p, sizeof b);
    const vu32 u = __builtin_convertvector(b, vu32);
    return (vf)(((u & 0x80) << 24) | ((u & 0x7f) << 20)) * 0x1p120f;
}

/* K or V row elements c .. c+VW-1 of a cache row, float32 or fp8 (FP8 a constant) */
static inline __attribute__((always_inline)) vf kv_load(const int FP8, const char *row, int c) {
    return FP8 ? fp8_load((const uint8_t *)row + c) : vload((const float *)row + c);
}

/* Where position `pos`'s K (or V) row of head `kv_head` sits in a cache: the block table maps
 * the position to its slot, a slot holds [num_kv_heads, HD] elements of `es` bytes. */
static inline __attribute__((always_inline)) const char *cache_row(
        const void *cache, const int32_t *block_table, int64_t block_size, int64_t row_elems,
        int64_t kv_head, const int HD, int64_t es, int64_t pos) {
    const int64_t slot = (int64_t)block_table[pos / block_size] * block_size + pos % block_size;
    return (const char *)cache + (slot * row_elems + kv_head * HD) * es;
}

/* Step 0: one query row, pre-scaled, into q; its output and softmax state start empty. */
static inline __attribute__((always_inline)) void start_row(const int HD, const float *src,
                                                            float scale, vf *q, vf *acc,
                                                            float *m, float *l) {
    for (int c = 0; c < HD / VW; c++) {
        q[c] = vload(src + c * VW) * scale;
        acc[c] = vsplat(0.0f);
    }
    *m = -INFINITY;
    *l = 0.0f;
}

/* Steps 1-3 (see the top of this file) for one query row over the chunk's first `visible`
 * keys, whose K and V rows are krow[j] and vrow[j]. */
static inline __attribute__((always_inline)) void attend_chunk(
        const int HD, const int FP8, const vf *q, vf *acc, float *m, float *l,
        const char *const *krow, const char *const *vrow, int visible, vi lane) {
    const int nv = HD / VW;
    vf s = vsplat(-INFINITY);
    for (int j = 0; j < visible; j++) {
        vf k = kv_load(FP8, krow[j], 0) * q[0];
        for (int c = 1; c < nv; c++) k += kv_load(FP8, krow[j], c * VW) * q[c];
        s[j] = hsum(k);
    }
    float chunk_max = s[0];
    for (int j = 1; j < visible; j++) chunk_max = s[j] > chunk_max ? s[j] : chunk_max;
    const float m_new = chunk_max > *m ? chunk_max : *m;
    vi keep = lane < visible;
    vf p = (vf)((vi)vexp(s - m_new) & keep);   /* masked lanes exactly 0 */
    const float correction = *m == -INFINITY ? 0.0f : vexp(vsplat(*m - m_new))[0];
    float sum = hsum(p);
    *l = *l * correction + sum;
    *m = m_new;
    if (correction != 1.0f)
        for (int c = 0; c < nv; c++) acc[c] *= correction;
    for (int j = 0; j < visible; j++) {
        const float pj = p[j];
        for (int c = 0; c < nv; c++) acc[c] += kv_load(FP8, vrow[j], c * VW) * pj;
    }
}

/* One work unit with head_dim HD (a constant after inlining: the loops over HD unroll). The
 * cache holds float32, or with FP8 e4m3 bytes that stand for value / scale: k_scale is folded
 * into the pre-scaled query, v_scale into the final division. */
static inline __attribute__((always_inline)) void attend_unit(
        const int HD, const int FP8, const float *query, int64_t q_stride_token,
        int64_t q_stride_head, const void *key_cache, const void *value_cache,
        const int32_t *block_table, int64_t block_size, int64_t num_kv_heads, int64_t group,
        int64_t kv_head, int64_t q_start, int64_t tile_len, int64_t first_pos, float scale,
        float k_scale, float v_scale, float *out, int64_t out_stride_token) {
    const int64_t es = FP8 ? 1 : 4;                  /* bytes per cache element */
    if (FP8) scale *= k_scale;
    const int nv = HD / VW;                          /* vectors per row */
    const int64_t rows = tile_len * group;           /* row r: token r / group, head r % group */
    vf q[rows][nv], acc[rows][nv];                   /* a few KB on this thread's stack */
    float m[rows], l[rows];
    const int64_t row_elems = num_kv_heads * HD;     /* one cache slot: [num_kv_heads, HD] */
    vi lane;
    for (int j = 0; j < VW; j++) lane[j] = j;
    for (int64_t r = 0; r < rows; r++)
        start_row(HD, query + (q_start + r / group) * q_stride_token
                      + (kv_head * group + r % group) * q_stride_head,
                  scale, q[r], acc[r], &m[r], &l[r]);

    const int64_t num_keys = first_pos + tile_len;   /* the tile's last token sees keys < this */
    for (int64_t k0 = 0; k0 < num_keys; k0 += K_CHUNK) {
        const int nk = num_keys - k0 < K_CHUNK ? (int)(num_keys - k0) : K_CHUNK;
        const char *krow[K_CHUNK], *vrow[K_CHUNK];
        for (int j = 0; j < nk; j++) {
            krow[j] = cache_row(key_cache, block_table, block_size, row_elems, kv_head, HD, es,
                                k0 + j);
            vrow[j] = cache_row(value_cache, block_table, block_size, row_elems, kv_head, HD,
                                es, k0 + j);
        }
        /* ask for the next chunk's K/V rows now, into L2 (locality 1: `prefetcht2` on x86):
         * they arrive while this chunk computes. Into L1 instead (the default hint), the 128
         * lines of a chunk outnumber the L1's miss buffers: at batch 64 (30 layers of a 64 x 192
         * token float32 cache, 2-core Zen 4) the L2 hint took attention from 43-44 ms to 35-37 */
        for (int64_t pos = k0 + K_CHUNK; pos < k0 + 2 * K_CHUNK && pos < num_keys; pos++) {
            const char *kn = cache_row(key_cache, block_table, block_size, row_elems, kv_head,
                                       HD, es, pos);
            const char *vn = cache_row(value_cache, block_table, block_size, row_elems, kv_head,
                                       HD, es, pos);
            for (int64_t c = 0; c < HD * es; c += 64) {
                __builtin_prefetch(kn + c, 0, 1);
                __builtin_prefetch(vn + c, 0, 1);
            }
        }
        for (int64_t r0 = 0; r0 < rows; r0 += group) {
            /* the `group` rows of one token share its causal limit */
            const int64_t visible64 = first_pos + r0 / group + 1 - k0;
            if (visible64 <= 0) continue;
            const int visible = visible64 < nk ? (int)visible64 : nk;
            for (int64_t r = r0; r < r0 + group; r++)
                attend_chunk(HD, FP8, q[r], acc[r], &m[r], &l[r], krow, vrow, visible, lane);
        }
    }
    for (int64_t r = 0; r < rows; r++) {
        float *dst = out + (q_start + r / group) * out_stride_token
                     + (kv_head * group + r % group) * HD;
        const float inv = (FP8 ? v_scale : 1.0f) / l[r];
        for (int c = 0; c < nv; c++) vstore(dst + c * VW, acc[r][c] * inv);
    }
}

#define ATTEND(HD, FP8) attend_unit(HD, FP8, query, q_stride_token, q_stride_head, key_cache, \
    value_cache, block_table, block_size, num_kv_heads, group, kv_head, q_start, tile_len, \
    first_pos, scale, k_scale, v_scale, out, out_stride_token)
/* attend_unit's variant for this head_dim (one per supported size), returning 0; -1 for a
 * size without one */
#define ATTEND_BY_HEAD_DIM(FP8)                 \
    switch (head_dim) {                         \
        case 16: ATTEND(16, FP8); return 0;     \
        case 32: ATTEND(32, FP8); return 0;     \
        case 64: ATTEND(64, FP8); return 0;     \
        case 128: ATTEND(128, FP8); return 0;   \
        case 256: ATTEND(256, FP8); return 0;   \
        default: return -1;                     \
    }

/* The fp8-cache variants, in a function of their own so that the float32 ones below keep
 * their code as it was (same inlining, same size). */
static __attribute__((noinline)) int attention_unit_fp8(
        int64_t head_dim, const float *query, int64_t q_stride_token, int64_t q_stride_head,
        const void *key_cache, const void *value_cache, const int32_t *block_table,
        int64_t block_size, int64_t num_kv_heads, int64_t group, int64_t kv_head,
        int64_t q_start, int64_t tile_len, int64_t first_pos, float scale, float k_scale,
        float v_scale, float *out, int64_t out_stride_token) {
    ATTEND_BY_HEAD_DIM(1);
}

/* One work unit (see the top of this file) for any supported head_dim: attend_unit unrolled
 * for that size. Also what cpu_layer.c's fused decode layer calls, one KV head per call.
 * Returns -1 for a head_dim without a variant, 0 when done. */
int llmlab_attention_unit(int64_t head_dim, const float *query, int64_t q_stride_token,
                          int64_t q_stride_head, const void *key_cache,
                          const void *value_cache, const int32_t *block_table,
                          int64_t block_size, int64_t num_kv_heads, int64_t group,
                          int64_t kv_head, int64_t q_start, int64_t tile_len, int64_t first_pos,
                          float scale, int64_t kv_fp8, float k_scale, float v_scale, float *out,
                          int64_t out_stride_token) {
    if (kv_fp8)
        return attention_unit_fp8(head_dim, query, q_stride_token, q_stride_head, key_cache,
                                  value_cache, block_table, block_size, num_kv_heads, group,
                                  kv_head, q_start, tile_len, first_pos, scale, k_scale, v_scale,
                                  out, out_stride_token);
    ATTEND_BY_HEAD_DIM(0);
}
#undef ATTEND_BY_HEAD_DIM
#undef ATTEND

/* out[T, num_heads, head_dim] (contiguous) = paged causal attention of query[T, num_heads,
 * head_dim] (token stride q_stride_token, head stride q_stride_head, head_dim contiguous).
 * head_dim must be 16, 32, 64, 128 or 256 and num_heads / num_kv_heads at most MAX_GROUP:
 * returns -1 otherwise (the caller checks first), 0 when done. */
int llmlab_paged_attention(const float *query, int64_t q_stride_token, int64_t q_stride_head,
                           const void *key_cache, const void *value_cache,
                           const int32_t *block_tables, int64_t block_table_stride,
                           const int32_t *cu_seqlens_q, const int32_t *seq_lens,
                           int64_t num_seqs, int64_t num_heads, int64_t num_kv_heads,
                           int64_t head_dim, int64_t block_size, float scale, int64_t kv_fp8,
                           float k_scale, float v_scale, float *out) {
    const int64_t group = num_heads / num_kv_heads;
    if (group > MAX_GROUP || !(head_dim == 16 || head_dim == 32 || head_dim == 64
                               || head_dim == 128 || head_dim == 256))
        return -1;
    int64_t total_units = 0;                 /* one unit per (sequence, tile, KV head) */
    for (int64_t s = 0; s < num_seqs; s++) {
        const int64_t q_len = cu_seqlens_q[s + 1] - cu_seqlens_q[s];
        total_units += (q_len + Q_TILE - 1) / Q_TILE * num_kv_heads;
    }
#pragma omp parallel
    {
        int64_t s = 0, base = 0;             /* this thread's position in the unit list */
#pragma omp for schedule(dynamic, 1)
        for (int64_t u = 0; u < total_units; u++) {
            if (u < base) { s = 0; base = 0; }
            for (;; s++) {                   /* units come in increasing order per thread */
                const int64_t q_len = cu_seqlens_q[s + 1] - cu_seqlens_q[s];
                const int64_t per_seq = (q_len + Q_TILE - 1) / Q_TILE * num_kv_heads;
                if (u < base + per_seq) break;
                base += per_seq;
            }
            const int64_t local = u - base;
            const int64_t tile = local / num_kv_heads, kv_head = local % num_kv_heads;
            const int64_t q_len = cu_seqlens_q[s + 1] - cu_seqlens_q[s];
            const int64_t tile_start = tile * Q_TILE;
            const int64_t tile_len = q_len - tile_start < Q_TILE ? q_len - tile_start : Q_TILE;
            const int64_t first_pos = seq_lens[s] - q_len + tile_start;
            llmlab_attention_unit(head_dim, query, q_stride_token, q_stride_head, key_cache,
                                  value_cache, block_tables + s * block_table_stride, block_size,
                                  num_kv_heads, group, kv_head, cu_seqlens_q[s] + tile_start,
                                  tile_len, first_pos, scale, kv_fp8, k_scale, v_scale, out,
                                  num_heads * head_dim);
        }
    }
    return 0;
}

/* Write key/value rows (token strides in elements, each row num_kv_heads * head_dim contiguous
 * elements of elem_bytes: 4 for float32, 1 for fp8 rows already quantized) into their cache
 * slots; slot -1 is skipped. */
void llmlab_reshape_and_cache(const void *key, const void *value, int64_t key_stride_token,
                              int64_t value_stride_token, void *key_cache, void *value_cache,
                              const int64_t *slot_mapping, int64_t num_tokens, int64_t row_elems,
                              int64_t elem_bytes) {
    const int64_t row = row_elems * elem_bytes;
#pragma omp parallel for schedule(static) if (num_tokens > 64)
    for (int64_t t = 0; t < num_tokens; t++) {
        const int64_t slot = slot_mapping[t];
        if (slot < 0) continue;
        memcpy((char *)key_cache + slot * row,
               (const char *)key + t * key_stride_token * elem_bytes, row);
        memcpy((char *)value_cache + slot * row,
               (const char *)value + t * value_stride_token * elem_bytes, row);
    }
}
