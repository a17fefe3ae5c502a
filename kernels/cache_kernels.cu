// reshape_and_cache: scatter each new token's K and V row into its cache slot.
#include <stdint.h>

#include "dtype_utils.cuh"
#include "llmlab_kernels.h"

namespace {

// One thread block per token; threads stride over the token's num_kv_heads * head_dim
// elements. The copy moves raw elements, so one kernel per element width serves every dtype.
template <typename Elem>
__global__ void reshape_and_cache_kernel(const Elem* __restrict__ key,
                                         const Elem* __restrict__ value,
                                         Elem* __restrict__ key_cache,
                                         Elem* __restrict__ value_cache,
                                         const int64_t* __restrict__ slot_mapping, int row) {
  const int64_t token = blockIdx.x;
  const int64_t slot = slot_mapping[token];
  if (slot < 0) return;  // -1: a token that must not be cached (e.g. padding)
  const Elem* k_src = key + token * row;
  const Elem* v_src = value + token * row;
  Elem* k_dst = key_cache + slot * row;  // NHD: a slot is one contiguous [kv_heads, d] row
  Elem* v_dst = value_cache + slot * row;
  for (int i = threadIdx.x; i < row; i += blockDim.x) {
    k_dst[i] = k_src[i];
    v_dst[i] = v_src[i];
  }
}

// The fp8 write: each element divided by its scale and rounded to e4m3 (saturating).
template <typename T>
__global__ void reshape_and_cache_fp8_kernel(const T* __restrict__ key, const T* __restrict__ value,
                                             __nv_fp8_e4m3* __restrict__ key_cache,
                                             __nv_fp8_e4m3* __restrict__ value_cache,
                                             const int64_t* __restrict__ slot_mapping, int row,
                                             float inv_k_scale, float inv_v_scale) {
  const int64_t token = blockIdx.x;
  const int64_t slot = slot_mapping[token];
  if (slot < 0) return;
  for (int i = threadIdx.x; i < row; i += blockDim.x) {
    key_cache[slot * row + i] =
        llmlab::from_float<__nv_fp8_e4m3>(llmlab::to_float(key[token * row + i]) * inv_k_scale);
    value_cache[slot * row + i] = llmlab::from_float<__nv_fp8_e4m3>(
        llmlab::to_float(value[token * row + i]) * inv_v_scale);
  }
}

template <typename T>
void launch_fp8_write(const void* key, const void* value, void* key_cache, void* value_cache,
                      const int64_t* slot_mapping, int num_tokens, int row, int threads,
                      float k_scale, float v_scale, cudaStream_t stream) {
  reshape_and_cache_fp8_kernel<T><<<num_tokens, threads, 0, stream>>>(
      static_cast<const T*>(key), static_cast<const T*>(value),
      static_cast<__nv_fp8_e4m3*>(key_cache), static_cast<__nv_fp8_e4m3*>(value_cache),
      slot_mapping, row, 1.0f / k_scale, 1.0f / v_scale);
}

}  // namespace

extern "C" cudaError_t llmlab_reshape_and_cache_fp8(const void* key, const void* value,
                                                    void* key_cache, void* value_cache,
                                                    const int64_t* slot_mapping, int num_tokens,
                                                    int num_kv_heads, int head_dim, int dtype,
                                                    float k_scale, float v_scale,
                                                    cudaStream_t stream) {
  if (num_tokens == 0) return cudaSuccess;
  if (!(k_scale > 0.0f) || !(v_scale > 0.0f)) return cudaErrorInvalidValue;
  const int row = num_kv_heads * head_dim;
  const int threads = row < 256 ? ((row + 31) / 32) * 32 : 256;
  switch (dtype) {
    case LLMLAB_FLOAT32:
      launch_fp8_write<float>(key, value, key_cache, value_cache, slot_mapping, num_tokens, row,
                              threads, k_scale, v_scale, stream);
      break;
    case LLMLAB_FLOAT16:
      launch_fp8_write<__half>(key, value, key_cache, value_cache, slot_mapping, num_tokens, row,
                               threads, k_scale, v_scale, stream);
      break;
    case LLMLAB_BFLOAT16:
      launch_fp8_write<__nv_bfloat16>(key, value, key_cache, value_cache, slot_mapping,
                                      num_tokens, row, threads, k_scale, v_scale, stream);
      break;
    default:
      return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

extern "C" cudaError_t llmlab_reshape_and_cache(const void* key, const void* value,
                                                void* key_cache, void* value_cache,
                                                const int64_t* slot_mapping, int num_tokens,
                                                int num_kv_heads, int head_dim, int dtype,
                                                cudaStream_t stream) {
  if (num_tokens == 0) return cudaSuccess;
  const int row = num_kv_heads * head_dim;
  const int threads = row < 256 ? ((row + 31) / 32) * 32 : 256;
  if (dtype == LLMLAB_FLOAT32) {
    reshape_and_cache_kernel<uint32_t><<<num_tokens, threads, 0, stream>>>(
        static_cast<const uint32_t*>(key), static_cast<const uint32_t*>(value),
        static_cast<uint32_t*>(key_cache), static_cast<uint32_t*>(value_cache), slot_mapping,
        row);
  } else if (dtype == LLMLAB_FLOAT16 || dtype == LLMLAB_BFLOAT16) {
    reshape_and_cache_kernel<uint16_t><<<num_tokens, threads, 0, stream>>>(
        static_cast<const uint16_t*>(key), static_cast<const uint16_t*>(value),
        static_cast<uint16_t*>(key_cache), static_cast<uint16_t*>(value_cache), slot_mapping,
        row);
  } else {
    return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}
