// C launcher API of the llmlab CUDA kernels.
//
// Plain C types only (no torch headers), so every .cu file compiles standalone with nvcc and the
// torch glue lives in binding.cpp. Layouts are the NHD ones of llmlab.ops:
//   key_cache, value_cache: [num_blocks, block_size, num_kv_heads, head_dim], contiguous
//   key, value:             [num_tokens, num_kv_heads, head_dim], contiguous
//   query, out:             [num_rows, num_heads, head_dim], contiguous (a row = a new token)
//   block_tables:           [num_seqs, max_blocks_per_seq] int32
//   seq_lens:               [num_seqs] int32 (>= 1)
//   cu_seqlens_q:           [num_seqs + 1] int32, offsets of each sequence's rows
//   slot_mapping:           [num_tokens] int64, slot = block * block_size + offset, -1 = skip
// Every launcher returns a cudaError_t (cudaSuccess = 0), or cudaErrorInvalidValue for
// arguments it cannot handle (unknown dtype, head_dim or GQA group out of range).
#pragma once

#include <cuda_runtime.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

// Element type of every float tensor of one call.
enum LlmlabDtype { LLMLAB_FLOAT32 = 0, LLMLAB_FLOAT16 = 1, LLMLAB_BFLOAT16 = 2 };

#define LLMLAB_MAX_HEAD_DIM 256
#define LLMLAB_MAX_GQA_GROUP 8       // query heads per KV head that one attention block serves
#define LLMLAB_MAX_PARTITIONS 8192  // the merge keeps one weight per partition in shared memory

cudaError_t llmlab_reshape_and_cache(const void* key, const void* value, void* key_cache,
                                     void* value_cache, const int64_t* slot_mapping,
                                     int num_tokens, int num_kv_heads, int head_dim, int dtype,
                                     cudaStream_t stream);

// fp8 e4m3 KV cache (one byte per value, stored = value / scale with one scale for K and one
// for V per layer): `dtype` is that of key and value.
cudaError_t llmlab_reshape_and_cache_fp8(const void* key, const void* value, void* key_cache,
                                         void* value_cache, const int64_t* slot_mapping,
                                         int num_tokens, int num_kv_heads, int head_dim,
                                         int dtype, float k_scale, float v_scale,
                                         cudaStream_t stream);

// Paged attention over the cache for decode and for mixed prefill + decode steps ("varlen"):
// every query row is one new token, attending causally to the positions of its sequence up to
// its own. Row r of a decode step (cu_seqlens_q == NULL) is sequence r's last position
// (seq_lens[r] - 1); otherwise row r belongs to the sequence s with
// cu_seqlens_q[s] <= r < cu_seqlens_q[s + 1] and sits at position
// seq_lens[s] - (cu_seqlens_q[s + 1] - cu_seqlens_q[s]) + (r - cu_seqlens_q[s]).
typedef struct LlmlabPagedAttention {
  void* out;                    // [num_rows, num_heads, head_dim], dtype `dtype`
  const void* query;            // [num_rows, num_heads, head_dim], dtype `dtype`
  const void* key_cache;        // NHD, `dtype` or fp8 e4m3 (cache_fp8), 16-byte aligned
  const void* value_cache;      // like key_cache
  const int32_t* block_tables;  // [num_seqs, max_blocks_per_seq]
  const int32_t* seq_lens;      // [num_seqs]: cached context + new tokens
  const int32_t* cu_seqlens_q;  // [num_seqs + 1], or NULL for a decode step (one row per seq)
  // Split context ("v2"): num_partitions > 1 cuts each row's context into partitions of
  // partition_size positions, one thread block each, merged by a second kernel. The launcher
  // writes the partial results here (fp32); all three are NULL when num_partitions == 1.
  float* partial_acc;  // [num_rows, num_heads, num_partitions, head_dim]: sum exp(s - m) v
  float* partial_max;  // [num_rows, num_heads, num_partitions]: m, the partition's max score
  float* partial_sum;  // [num_rows, num_heads, num_partitions]: l = sum exp(s - m)
  int num_rows;        // query rows (new tokens)
  int num_seqs;
  int num_heads;
  int num_kv_heads;  // num_heads / num_kv_heads (the GQA group) in 1..LLMLAB_MAX_GQA_GROUP
  int head_dim;      // <= LLMLAB_MAX_HEAD_DIM, a multiple of 4 (fp32 cache) or 8 (others)
  int block_size;
  int max_blocks_per_seq;
  int partition_size;  // 0: one partition spanning the whole context (num_partitions == 1)
  int num_partitions;  // >= ceil(max_blocks_per_seq * block_size / partition_size),
                       // <= LLMLAB_MAX_PARTITIONS
  int dtype;           // LlmlabDtype of query / out
  int cache_fp8;       // 1: the cache holds fp8 e4m3 = value / scale
  float scale;         // softmax scale, usually head_dim ** -0.5
  float k_scale;       // fp8 cache only (1 otherwise): stored key = key / k_scale
  float v_scale;       // fp8 cache only (1 otherwise): stored value = value / v_scale
} LlmlabPagedAttention;

cudaError_t llmlab_paged_attention(const LlmlabPagedAttention* args, cudaStream_t stream);

#ifdef __cplusplus
}
#endif
