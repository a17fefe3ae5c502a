/* What one CPU kernel file calls in another: the fused decode layer (cpu_layer.c) runs the
 * GEMV (cpu_gemv.c) and the attention work unit (cpu_attention.c) inside its own parallel
 * region. Every file includes this header, so the compiler checks each definition against it. */
#ifndef LLMLAB_CPU_KERNELS_H
#define LLMLAB_CPU_KERNELS_H

#include <stdint.h>

void llmlab_gemv_rows(const float *x, const float *W, const float *bias, const float *add,
                      float *y, int64_t N, int64_t K);

int llmlab_attention_unit(int64_t head_dim, const float *query, int64_t q_stride_token,
                          int64_t q_stride_head, const float *key_cache,
                          const float *value_cache, const int32_t *block_table,
                          int64_t block_size, int64_t num_kv_heads, int64_t group,
                          int64_t kv_head, int64_t q_start, int64_t tile_len, int64_t first_pos,
                          float scale, float *out, int64_t out_stride_token);

#endif
