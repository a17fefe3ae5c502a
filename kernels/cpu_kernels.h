/* Every entry point of the CPU kernel library: those Python calls through ctypes
 * (llmlab/ops/cpu_library.py reads their signatures from this header, the one place they are
 * written), and those one kernel file calls in another (the fused decode
 * layer in cpu_layer.c runs the GEMV rows of cpu_gemv.c and the attention work unit of
 * cpu_attention.c inside its own parallel region). Every file includes this header, so the
 * compiler checks each definition against it. */
#ifndef LLMLAB_CPU_KERNELS_H
#define LLMLAB_CPU_KERNELS_H

#include <stdint.h>

/* weight types of the matmuls (cpu_quant.c) */
#define LLMLAB_W_F32 0
#define LLMLAB_W_BF16 1
#define LLMLAB_W_INT8 2   /* int8 with one float32 scale per output row */
#define LLMLAB_W_BF16_PACKED 3   /* bf16 in cpu_gemm.c's blocks (the fused decode layer's GEMVs) */
#define LLMLAB_W_INT8_PACKED 4   /* int8 in those blocks, with its scales per output row */
#define LLMLAB_W_F32_PACKED 5    /* float32 in those blocks */

/* int8 weights against x rounded to int16 (llmlab_x_to_int16) sum pairs of products into int32
 * lanes: 128 steps of 2 products (|x| <= 32767, |w| <= 128: 2 * 32767 * 128 * 128 = 2^30) stay
 * below 2^31, so longer rows move their sums to float32 every LLMLAB_INT16_SUM_STEPS steps
 * (cpu_quant.c's dense VNNI GEMV, cpu_gemm.c's packed int8 micro-tile) */
#define LLMLAB_INT16_SUM_STEPS 128

/* instruction sets chosen at run time (llmlab_isa) */
#define LLMLAB_ISA_AVX512 1
#define LLMLAB_ISA_AVX512_BF16 2
#define LLMLAB_ISA_AVX512_VNNI 4
#define LLMLAB_ISA_AVX2 8   /* AVX2 and FMA */

/* called from Python */
int llmlab_paged_attention(const float *query, int64_t q_stride_token, int64_t q_stride_head,
                           const void *key_cache, const void *value_cache,
                           const int32_t *block_tables, int64_t block_table_stride,
                           const int32_t *cu_seqlens_q, const int32_t *seq_lens,
                           int64_t num_seqs, int64_t num_heads, int64_t num_kv_heads,
                           int64_t head_dim, int64_t block_size, float scale, int64_t kv_fp8,
                           float k_scale, float v_scale, float *out);

void llmlab_reshape_and_cache(const void *key, const void *value, int64_t key_stride_token,
                              int64_t value_stride_token, void *key_cache, void *value_cache,
                              const int64_t *slot_mapping, int64_t num_tokens, int64_t row_elems,
                              int64_t elem_bytes);

void llmlab_rms_norm(const float *x, int64_t x_stride, const float *residual, int64_t res_stride,
                     const float *weight, float *sum_out, float *out, int64_t T, int64_t D,
                     float eps);

void llmlab_silu_mul(const float *gate, int64_t gate_stride, const float *up, int64_t up_stride,
                     float *out, int64_t T, int64_t I);

void llmlab_rope(const float *x, int64_t x_stride, const float *cos, const float *sin,
                 float *out, int64_t T, int64_t heads, int64_t D);

void llmlab_gemv(const float *x, const float *W, const float *bias, float *y, int64_t N,
                 int64_t K);

int llmlab_decode_layers(int64_t n_layers, void *const *layers, const float *x, float *x_out,
                         float *scratch, float eps, int64_t wtype, const float *cos,
                         const float *sin, const int64_t *slot, const int32_t *block_table,
                         const int32_t *seq_len, int64_t block_size, int64_t hidden,
                         int64_t heads, int64_t kv_heads, int64_t head_dim, int64_t inter,
                         float scale);

int llmlab_decode_steps(
    int64_t n_layers, void *const *layers, void *const *head, int64_t embed_type,
    int64_t head_type, int64_t vocab, float *x, float *scratch, float *logits, float eps,
    int64_t wtype, const float *cos, const float *sin, const int64_t *slots,
    const int32_t *block_table, const int32_t *seq_lens, int64_t block_size, int64_t hidden,
    int64_t heads, int64_t kv_heads, int64_t head_dim, int64_t inter, float scale, int64_t token,
    const int64_t *stop_ids, int64_t n_stop, int64_t steps, int64_t *tokens);

int llmlab_decode_attention(
    const float *qkv, int64_t qkv_stride, const float *cos, const float *sin,
    const int64_t *slot_mapping, const int32_t *block_tables, int64_t block_table_stride,
    const int32_t *seq_lens, int64_t num_seqs, float *key_cache, float *value_cache,
    int64_t block_size, int64_t heads, int64_t kv_heads, int64_t head_dim, float scale,
    float *q, float *out);

void llmlab_time_layer_phases(double *seconds);

int llmlab_isa(void);

void llmlab_set_isa_cap(int64_t cap);

void llmlab_qgemm(const float *x, int64_t x_stride, const void *W, int64_t wtype,
                  const float *scales, const float *bias, float *y, int64_t T, int64_t N,
                  int64_t K);

void llmlab_pack_weight(const void *W, int64_t elem, int64_t N, int64_t K, void *out);

int llmlab_packed_gemm(const float *x, int64_t x_stride, const void *P, int64_t wtype,
                       const float *scales, const float *bias, float *y, int64_t T, int64_t N,
                       int64_t K);

void llmlab_argmax_rows(const float *x, int64_t stride, int64_t B, int64_t V, int64_t *out);

/* called from another kernel file */

void llmlab_qgemv_rows(const float *x, const void *W, int64_t wtype, const float *scales,
                       const float *bias, const float *add, float *y, int64_t N, int64_t K);

void llmlab_packed_gemv_rows(const float *x, const void *P, int64_t wtype, const float *scales,
                             const float *bias, const float *add, float *y, int64_t N,
                             int64_t K);

float llmlab_x_to_int16(const float *x, int16_t *xq, int64_t K);   /* x86: AVX-512BW or AVX2 */

void llmlab_widen_row(const void *W, int64_t wtype, int64_t n, int64_t K, float *dst);

#define LLMLAB_PACKED_AVX512 2   /* what llmlab_packed_tiles returns */
#define LLMLAB_PACKED_AVX2 1
int llmlab_packed_tiles(int64_t wtype);


void llmlab_gemv_rows(const float *x, const float *W, const float *bias, const float *add,
                      float *y, int64_t N, int64_t K);

int llmlab_attention_unit(int64_t head_dim, const float *query, int64_t q_stride_token,
                          int64_t q_stride_head, const void *key_cache,
                          const void *value_cache, const int32_t *block_table,
                          int64_t block_size, int64_t num_kv_heads, int64_t group,
                          int64_t kv_head, int64_t q_start, int64_t tile_len, int64_t first_pos,
                          float scale, int64_t kv_fp8, float k_scale, float v_scale, float *out,
                          int64_t out_stride_token);

#endif
