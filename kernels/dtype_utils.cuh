// Float conversions for the element types the kernels accept: fp32 / fp16 / bf16 everywhere,
// and fp8 e4m3 for a KV cache (stored = value / scale; cuda_fp8.h converts in software on GPUs
// without fp8 instructions).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <stdint.h>

#include "llmlab_kernels.h"

namespace llmlab {

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_float(__nv_fp8_e4m3 x) { return static_cast<float>(x); }

template <typename T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ float from_float<float>(float x) { return x; }
template <>
__device__ __forceinline__ __half from_float<__half>(float x) { return __float2half(x); }
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
  return __float2bfloat16(x);
}

template <>
__device__ __forceinline__ __nv_fp8_e4m3 from_float<__nv_fp8_e4m3>(float x) {
  return __nv_fp8_e4m3(x);  // saturates to +-448 (__NV_SATFINITE): never NaN from a finite x
}

// Element i of a tensor whose dtype (LlmlabDtype) is known only at run time: for the tensors a
// kernel touches once or twice per element (the query, the output), where one compiled kernel
// per dtype would buy nothing.
__device__ __forceinline__ float load_as_float(const void* p, int64_t i, int dtype) {
  switch (dtype) {
    case LLMLAB_FLOAT16:
      return __half2float(static_cast<const __half*>(p)[i]);
    case LLMLAB_BFLOAT16:
      return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
    default:
      return static_cast<const float*>(p)[i];
  }
}

__device__ __forceinline__ void store_from_float(void* p, int64_t i, int dtype, float x) {
  switch (dtype) {
    case LLMLAB_FLOAT16:
      static_cast<__half*>(p)[i] = __float2half(x);
      break;
    case LLMLAB_BFLOAT16:
      static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16(x);
      break;
    default:
      static_cast<float*>(p)[i] = x;
  }
}

// One vector load from a cache row, widened to float. A lane of the attention kernel reads its
// share of a K or V row with these: 16 bytes (4 fp32 or 8 fp16 / bf16 values) in one
// instruction; 8 bytes for an fp8 cache, so every cache dtype gives a lane 8 values per load
// and the registers a lane spends on its query and accumulator slices stay the same.
// `Raw` is what travels from memory (loaded first, several at a time); `widen` converts it.
template <typename C>
struct CacheVec;

template <>
struct CacheVec<float> {
  using Raw = float4;
  static constexpr int kElems = 4;
  __device__ __forceinline__ static void widen(const Raw& r, float* out) {
    out[0] = r.x;
    out[1] = r.y;
    out[2] = r.z;
    out[3] = r.w;
  }
};

template <>
struct CacheVec<__half> {
  using Raw = uint4;
  static constexpr int kElems = 8;
  __device__ __forceinline__ static void widen(const Raw& r, float* out) {
    const __half2* pairs = reinterpret_cast<const __half2*>(&r);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 f = __half22float2(pairs[i]);
      out[2 * i] = f.x;
      out[2 * i + 1] = f.y;
    }
  }
};

template <>
struct CacheVec<__nv_bfloat16> {
  using Raw = uint4;
  static constexpr int kElems = 8;
  __device__ __forceinline__ static void widen(const Raw& r, float* out) {
    const __nv_bfloat162* pairs = reinterpret_cast<const __nv_bfloat162*>(&r);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 f = __bfloat1622float2(pairs[i]);
      out[2 * i] = f.x;
      out[2 * i + 1] = f.y;
    }
  }
};

template <>
struct CacheVec<__nv_fp8_e4m3> {
  using Raw = uint2;
  static constexpr int kElems = 8;
  __device__ __forceinline__ static void widen(const Raw& r, float* out) {
    const __nv_fp8x2_e4m3* pairs = reinterpret_cast<const __nv_fp8x2_e4m3*>(&r);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 f = static_cast<float2>(pairs[i]);
      out[2 * i] = f.x;
      out[2 * i + 1] = f.y;
    }
  }
};

// Load one vector of a cache row through the read-only data cache. `p` must be aligned to the
// vector's size (the launcher checks the cache pointers; row offsets are multiples of it).
template <typename C>
__device__ __forceinline__ typename CacheVec<C>::Raw load_vec(const C* p) {
  return __ldg(reinterpret_cast<const typename CacheVec<C>::Raw*>(p));
}

// A zero vector: what a lane holds for a key past the tile's end or a row slice past head_dim,
// so nothing unused is ever read (an unused cache slot may hold NaN).
template <typename C>
__device__ __forceinline__ typename CacheVec<C>::Raw zero_vec() {
  typename CacheVec<C>::Raw r;
  r = {};
  return r;
}

}  // namespace llmlab
