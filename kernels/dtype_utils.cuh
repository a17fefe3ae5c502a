// Float conversions for the element types the kernels accept: fp32 / fp16 / bf16 everywhere,
// and fp8 e4m3 for a KV cache (stored = value / scale; cuda_fp8.h converts in software on GPUs
// without fp8 instructions).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

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

}  // namespace llmlab
