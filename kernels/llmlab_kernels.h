// C launcher API of the llmlab CUDA kernels.
//
// Plain C types only (no torch headers), so every .cu file compiles standalone with nvcc and the
// torch glue lives in binding.cpp. Layouts are the NHD ones of llmlab.ops:
//   key_cache, value_cache: [num_blocks, block_size, num_kv_heads, head_dim], contiguous
//   key, value:             [num_tokens, num_kv_heads, head_dim], contiguous
//   query, out (decode):    [num_seqs, num_heads, head_dim], contiguous
//   block_tables:           [num_seqs, max_blocks_per_seq] int32
//   seq_lens:               [num_seqs] int32 (>= 1)
//   slot_mapping:           [num_tokens] int64, slot = block * block_size + offset, -1 = skip
// Every launcher returns a cudaError_t (cudaSuccess = 0), or cudaErrorInvalidValue for
// arguments it cannot handle (unknown dtype, head_dim > LLMLAB_MAX_HEAD_DIM).
#pragma once

#include <cuda_runtime.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

// Element type of every float tensor of one call.
enum LlmlabDtype { LLMLAB_FLOAT32 = 0, LLMLAB_FLOAT16 = 1, LLMLAB_BFLOAT16 = 2 };

#define LLMLAB_MAX_HEAD_DIM 256

cudaError_t llmlab_reshape_and_cache(const void* key, const void* value, void* key_cache,
                                     void* value_cache, const int64_t* slot_mapping,
                                     int num_tokens, int num_kv_heads, int head_dim, int dtype,
                                     cudaStream_t stream);

cudaError_t llmlab_paged_attention_decode(void* out, const void* query, const void* key_cache,
                                          const void* value_cache, const int32_t* block_tables,
                                          const int32_t* seq_lens, int num_seqs, int num_heads,
                                          int num_kv_heads, int head_dim, int block_size,
                                          int max_blocks_per_seq, float scale, int dtype,
                                          cudaStream_t stream);

// fp8 e4m3 KV cache (one byte per value, stored = value / scale with one scale for K and one
// for V per layer): `dtype` is that of key/value (write) or query/out (decode).
cudaError_t llmlab_reshape_and_cache_fp8(const void* key, const void* value, void* key_cache,
                                         void* value_cache, const int64_t* slot_mapping,
                                         int num_tokens, int num_kv_heads, int head_dim,
                                         int dtype, float k_scale, float v_scale,
                                         cudaStream_t stream);

cudaError_t llmlab_paged_attention_decode_fp8(void* out, const void* query,
                                              const void* key_cache, const void* value_cache,
                                              const int32_t* block_tables,
                                              const int32_t* seq_lens, int num_seqs,
                                              int num_heads, int num_kv_heads, int head_dim,
                                              int block_size, int max_blocks_per_seq,
                                              float scale, int dtype, float k_scale,
                                              float v_scale, cudaStream_t stream);

#ifdef __cplusplus
}
#endif
