// Torch glue for the llmlab CUDA kernels: checks the tensors, picks the stream, calls the C
// launchers of llmlab_kernels.h. Built by llmlab/ops/cuda_backend.py with
// torch.utils.cpp_extension.load together with the .cu files of this directory.
#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/extension.h>

#include "llmlab_kernels.h"

namespace {

int dtype_code(const torch::Tensor& t) {
  switch (t.scalar_type()) {
    case torch::kFloat32:
      return LLMLAB_FLOAT32;
    case torch::kFloat16:
      return LLMLAB_FLOAT16;
    case torch::kBFloat16:
      return LLMLAB_BFLOAT16;
    default:
      TORCH_CHECK(false, "llmlab cuda ops: dtype ", t.scalar_type(),
                  " is not one of float32, float16, bfloat16");
  }
  return -1;
}

void check_cuda_contiguous(const torch::Tensor& t, const char* name) {
  TORCH_CHECK(t.is_cuda(), name, " must be a CUDA tensor, got ", t.device());
  TORCH_CHECK(t.is_contiguous(), name, " must be contiguous");
}

bool is_fp8(const torch::Tensor& t) { return t.scalar_type() == torch::kFloat8_e4m3fn; }

void reshape_and_cache(torch::Tensor key, torch::Tensor value, torch::Tensor key_cache,
                       torch::Tensor value_cache, torch::Tensor slot_mapping, double k_scale,
                       double v_scale) {
  check_cuda_contiguous(key, "key");
  check_cuda_contiguous(value, "value");
  check_cuda_contiguous(key_cache, "key_cache");
  check_cuda_contiguous(value_cache, "value_cache");
  check_cuda_contiguous(slot_mapping, "slot_mapping");
  TORCH_CHECK(slot_mapping.scalar_type() == torch::kInt64, "slot_mapping must be int64");
  TORCH_CHECK(is_fp8(key_cache) || key.scalar_type() == key_cache.scalar_type(),
              "key and key_cache dtypes differ");
  const c10::cuda::CUDAGuard guard(key.device());
  if (is_fp8(key_cache)) {  // an fp8 cache stores key / k_scale, value / v_scale
    const cudaError_t err = llmlab_reshape_and_cache_fp8(
        key.data_ptr(), value.data_ptr(), key_cache.data_ptr(), value_cache.data_ptr(),
        slot_mapping.data_ptr<int64_t>(), static_cast<int>(key.size(0)),
        static_cast<int>(key_cache.size(2)), static_cast<int>(key_cache.size(3)),
        dtype_code(key), static_cast<float>(k_scale), static_cast<float>(v_scale),
        c10::cuda::getCurrentCUDAStream());
    TORCH_CHECK(err == cudaSuccess, "llmlab_reshape_and_cache_fp8: ", cudaGetErrorString(err));
    return;
  }
  const cudaError_t err = llmlab_reshape_and_cache(
      key.data_ptr(), value.data_ptr(), key_cache.data_ptr(), value_cache.data_ptr(),
      slot_mapping.data_ptr<int64_t>(), static_cast<int>(key.size(0)),
      static_cast<int>(key_cache.size(2)), static_cast<int>(key_cache.size(3)),
      dtype_code(key), c10::cuda::getCurrentCUDAStream());
  TORCH_CHECK(err == cudaSuccess, "llmlab_reshape_and_cache: ", cudaGetErrorString(err));
}

torch::Tensor paged_attention_decode(torch::Tensor query, torch::Tensor key_cache,
                                     torch::Tensor value_cache, torch::Tensor block_tables,
                                     torch::Tensor seq_lens, double scale, double k_scale,
                                     double v_scale) {
  check_cuda_contiguous(query, "query");
  check_cuda_contiguous(key_cache, "key_cache");
  check_cuda_contiguous(value_cache, "value_cache");
  check_cuda_contiguous(block_tables, "block_tables");
  check_cuda_contiguous(seq_lens, "seq_lens");
  TORCH_CHECK(block_tables.scalar_type() == torch::kInt32, "block_tables must be int32");
  TORCH_CHECK(seq_lens.scalar_type() == torch::kInt32, "seq_lens must be int32");
  TORCH_CHECK(is_fp8(key_cache) || query.scalar_type() == key_cache.scalar_type(),
              "query and cache dtypes differ");
  TORCH_CHECK(query.size(2) <= LLMLAB_MAX_HEAD_DIM, "head_dim ", query.size(2), " > ",
              LLMLAB_MAX_HEAD_DIM);
  const c10::cuda::CUDAGuard guard(query.device());
  auto out = torch::empty_like(query);  // [num_seqs, num_heads, head_dim]
  if (is_fp8(key_cache)) {
    const cudaError_t err = llmlab_paged_attention_decode_fp8(
        out.data_ptr(), query.data_ptr(), key_cache.data_ptr(), value_cache.data_ptr(),
        block_tables.data_ptr<int32_t>(), seq_lens.data_ptr<int32_t>(),
        static_cast<int>(query.size(0)), static_cast<int>(query.size(1)),
        static_cast<int>(key_cache.size(2)), static_cast<int>(query.size(2)),
        static_cast<int>(key_cache.size(1)), static_cast<int>(block_tables.size(1)),
        static_cast<float>(scale), dtype_code(query), static_cast<float>(k_scale),
        static_cast<float>(v_scale), c10::cuda::getCurrentCUDAStream());
    TORCH_CHECK(err == cudaSuccess, "llmlab_paged_attention_decode_fp8: ",
                cudaGetErrorString(err));
    return out;
  }
  const cudaError_t err = llmlab_paged_attention_decode(
      out.data_ptr(), query.data_ptr(), key_cache.data_ptr(), value_cache.data_ptr(),
      block_tables.data_ptr<int32_t>(), seq_lens.data_ptr<int32_t>(),
      static_cast<int>(query.size(0)), static_cast<int>(query.size(1)),
      static_cast<int>(key_cache.size(2)), static_cast<int>(query.size(2)),
      static_cast<int>(key_cache.size(1)), static_cast<int>(block_tables.size(1)),
      static_cast<float>(scale), dtype_code(query), c10::cuda::getCurrentCUDAStream());
  TORCH_CHECK(err == cudaSuccess, "llmlab_paged_attention_decode: ", cudaGetErrorString(err));
  return out;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "llmlab CUDA kernels: reshape_and_cache and paged decode attention (NHD cache)";
  m.def("reshape_and_cache", &reshape_and_cache,
        "Write key/value [num_tokens, kv_heads, d] into the paged cache at slot_mapping "
        "(an fp8 cache: value / scale)",
        pybind11::arg("key"), pybind11::arg("value"), pybind11::arg("key_cache"),
        pybind11::arg("value_cache"), pybind11::arg("slot_mapping"),
        pybind11::arg("k_scale") = 1.0, pybind11::arg("v_scale") = 1.0);
  m.def("paged_attention_decode", &paged_attention_decode,
        "Paged decode attention: query [num_seqs, heads, d] -> [num_seqs, heads, d]",
        pybind11::arg("query"), pybind11::arg("key_cache"), pybind11::arg("value_cache"),
        pybind11::arg("block_tables"), pybind11::arg("seq_lens"), pybind11::arg("scale"),
        pybind11::arg("k_scale") = 1.0, pybind11::arg("v_scale") = 1.0);
}
