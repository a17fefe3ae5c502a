// Paged decode attention: one new query token per sequence against its paged K/V cache.
//
// Grid (num_heads, num_seqs), NUM_WARPS warps per block. Each block computes one query head
// of one sequence; GQA maps it to KV head  head / (num_heads / num_kv_heads).
//   1. Each lane holds VEC = ceil(head_dim / 32) elements of the (pre-scaled) query,
//      dims lane, lane + 32, ... so a warp covers one head_dim row with coalesced loads.
//   2. Warp w visits context positions w, w + NUM_WARPS, ...: it finds the position's slot
//      through the block table, dots the key row with the query (a warp-wide shuffle sum) and
//      folds the score into its own online softmax: running max m, running sum l and an
//      unnormalised accumulator acc of the value rows, rescaled by exp(m_old - m_new)
//      whenever the max grows.
//   3. The warps' (m, l, acc) are merged through shared memory, exactly like the split-K
//      merge: with M = max_w m_w, out = sum_w e^(m_w - M) acc_w / sum_w e^(m_w - M) l_w.
// Softmax and accumulation are fp32 for every input dtype. Only positions < seq_len are read,
// so unused cache slots (whatever they hold) never reach the output.
#include <math.h>
#include <stdint.h>

#include "dtype_utils.cuh"
#include "llmlab_kernels.h"

namespace {

constexpr int kWarpSize = 32;
constexpr int kNumWarps = 4;

// T: query/out element; C: cache element (T itself, or fp8 e4m3 holding value / scale:
// k_scale is folded into the pre-scaled query, v_scale into the final division).
template <typename T, typename C, int VEC>
__global__ void __launch_bounds__(kNumWarps* kWarpSize)
    paged_decode_kernel(T* __restrict__ out, const T* __restrict__ query,
                        const C* __restrict__ key_cache, const C* __restrict__ value_cache,
                        const int32_t* __restrict__ block_tables,
                        const int32_t* __restrict__ seq_lens, int num_heads, int num_kv_heads,
                        int head_dim, int block_size, int max_blocks_per_seq, float scale,
                        float k_scale, float v_scale) {
  scale *= k_scale;
  const int head = blockIdx.x;
  const int64_t seq = blockIdx.y;
  const int kv_head = head / (num_heads / num_kv_heads);
  const int warp = threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  const int seq_len = seq_lens[seq];
  const int32_t* table = block_tables + seq * max_blocks_per_seq;

  const T* q_row = query + (seq * num_heads + head) * head_dim;
  float q[VEC];
#pragma unroll
  for (int j = 0; j < VEC; ++j) {
    const int d = lane + kWarpSize * j;
    q[j] = d < head_dim ? llmlab::to_float(q_row[d]) * scale : 0.0f;
  }

  float m = -INFINITY;  // running max of the scores seen by this warp
  float l = 0.0f;       // running sum of exp(score - m)
  float acc[VEC];       // running sum of exp(score - m) * v, this lane's dims
#pragma unroll
  for (int j = 0; j < VEC; ++j) acc[j] = 0.0f;

  for (int pos = warp; pos < seq_len; pos += kNumWarps) {
    const int64_t block = table[pos / block_size];
    const int64_t slot = block * block_size + pos % block_size;
    const int64_t row = (slot * num_kv_heads + kv_head) * head_dim;
    float partial = 0.0f;
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      const int d = lane + kWarpSize * j;
      if (d < head_dim) partial += q[j] * llmlab::to_float(key_cache[row + d]);
    }
#pragma unroll
    for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
      partial += __shfl_xor_sync(0xffffffffu, partial, offset);
    }
    const float m_new = fmaxf(m, partial);
    const float alpha = expf(m - m_new);  // 0 on the first position (m = -inf)
    const float p = expf(partial - m_new);
    l = l * alpha + p;
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      const int d = lane + kWarpSize * j;
      const float v = d < head_dim ? llmlab::to_float(value_cache[row + d]) : 0.0f;
      acc[j] = acc[j] * alpha + p * v;
    }
    m = m_new;
  }

  __shared__ float s_m[kNumWarps];
  __shared__ float s_l[kNumWarps];
  __shared__ float s_acc[kNumWarps][VEC * kWarpSize];
  if (lane == 0) {
    s_m[warp] = m;
    s_l[warp] = l;
  }
#pragma unroll
  for (int j = 0; j < VEC; ++j) s_acc[warp][lane + kWarpSize * j] = acc[j];
  __syncthreads();

  float m_max = -INFINITY;
  for (int w = 0; w < kNumWarps; ++w) m_max = fmaxf(m_max, s_m[w]);
  float weight[kNumWarps];  // a warp that saw no position (m = -inf) weighs 0
  float denom = 0.0f;
  for (int w = 0; w < kNumWarps; ++w) {
    weight[w] = s_m[w] == -INFINITY ? 0.0f : expf(s_m[w] - m_max);
    denom += weight[w] * s_l[w];
  }
  T* out_row = out + (seq * num_heads + head) * head_dim;
  for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
    float num = 0.0f;
    for (int w = 0; w < kNumWarps; ++w) num += weight[w] * s_acc[w][d];
    out_row[d] = llmlab::from_float<T>(num * v_scale / denom);
  }
}

template <typename T, typename C = T>
cudaError_t launch_decode(void* out, const void* query, const void* key_cache,
                          const void* value_cache, const int32_t* block_tables,
                          const int32_t* seq_lens, int num_seqs, int num_heads, int num_kv_heads,
                          int head_dim, int block_size, int max_blocks_per_seq, float scale,
                          cudaStream_t stream, float k_scale = 1.0f, float v_scale = 1.0f) {
  const dim3 grid(num_heads, num_seqs);
  const dim3 block(kNumWarps * kWarpSize);
#define LLMLAB_LAUNCH_DECODE(VEC)                                                          \
  paged_decode_kernel<T, C, VEC><<<grid, block, 0, stream>>>(                              \
      static_cast<T*>(out), static_cast<const T*>(query), static_cast<const C*>(key_cache), \
      static_cast<const C*>(value_cache), block_tables, seq_lens, num_heads, num_kv_heads,  \
      head_dim, block_size, max_blocks_per_seq, scale, k_scale, v_scale)
  if (head_dim <= 32) {
    LLMLAB_LAUNCH_DECODE(1);
  } else if (head_dim <= 64) {
    LLMLAB_LAUNCH_DECODE(2);
  } else if (head_dim <= 128) {
    LLMLAB_LAUNCH_DECODE(4);
  } else if (head_dim <= LLMLAB_MAX_HEAD_DIM) {
    LLMLAB_LAUNCH_DECODE(8);
  } else {
    return cudaErrorInvalidValue;
  }
#undef LLMLAB_LAUNCH_DECODE
  return cudaGetLastError();
}

}  // namespace

extern "C" cudaError_t llmlab_paged_attention_decode(
    void* out, const void* query, const void* key_cache, const void* value_cache,
    const int32_t* block_tables, const int32_t* seq_lens, int num_seqs, int num_heads,
    int num_kv_heads, int head_dim, int block_size, int max_blocks_per_seq, float scale,
    int dtype, cudaStream_t stream) {
  if (num_seqs == 0) return cudaSuccess;
  if (num_kv_heads <= 0 || num_heads % num_kv_heads != 0) return cudaErrorInvalidValue;
  switch (dtype) {
    case LLMLAB_FLOAT32:
      return launch_decode<float>(out, query, key_cache, value_cache, block_tables, seq_lens,
                                  num_seqs, num_heads, num_kv_heads, head_dim, block_size,
                                  max_blocks_per_seq, scale, stream);
    case LLMLAB_FLOAT16:
      return launch_decode<__half>(out, query, key_cache, value_cache, block_tables, seq_lens,
                                   num_seqs, num_heads, num_kv_heads, head_dim, block_size,
                                   max_blocks_per_seq, scale, stream);
    case LLMLAB_BFLOAT16:
      return launch_decode<__nv_bfloat16>(out, query, key_cache, value_cache, block_tables,
                                          seq_lens, num_seqs, num_heads, num_kv_heads, head_dim,
                                          block_size, max_blocks_per_seq, scale, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

extern "C" cudaError_t llmlab_paged_attention_decode_fp8(
    void* out, const void* query, const void* key_cache, const void* value_cache,
    const int32_t* block_tables, const int32_t* seq_lens, int num_seqs, int num_heads,
    int num_kv_heads, int head_dim, int block_size, int max_blocks_per_seq, float scale,
    int dtype, float k_scale, float v_scale, cudaStream_t stream) {
  if (num_seqs == 0) return cudaSuccess;
  if (num_kv_heads <= 0 || num_heads % num_kv_heads != 0) return cudaErrorInvalidValue;
  if (!(k_scale > 0.0f) || !(v_scale > 0.0f)) return cudaErrorInvalidValue;
  switch (dtype) {
    case LLMLAB_FLOAT32:
      return launch_decode<float, __nv_fp8_e4m3>(
          out, query, key_cache, value_cache, block_tables, seq_lens, num_seqs, num_heads,
          num_kv_heads, head_dim, block_size, max_blocks_per_seq, scale, stream, k_scale,
          v_scale);
    case LLMLAB_FLOAT16:
      return launch_decode<__half, __nv_fp8_e4m3>(
          out, query, key_cache, value_cache, block_tables, seq_lens, num_seqs, num_heads,
          num_kv_heads, head_dim, block_size, max_blocks_per_seq, scale, stream, k_scale,
          v_scale);
    case LLMLAB_BFLOAT16:
      return launch_decode<__nv_bfloat16, __nv_fp8_e4m3>(
          out, query, key_cache, value_cache, block_tables, seq_lens, num_seqs, num_heads,
          num_kv_heads, head_dim, block_size, max_blocks_per_seq, scale, stream, k_scale,
          v_scale);
    default:
      return cudaErrorInvalidValue;
  }
}
