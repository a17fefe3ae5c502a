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

// The kernel's 16-byte (fp8: 8-byte) vector loads need aligned rows: a row's offset is a
// multiple of the vector, so the cache's first element must be aligned too.
void check_aligned(const torch::Tensor& t, const char* name) {
  TORCH_CHECK(reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0, name,
              " must start at a 16-byte aligned address (a fresh tensor or a whole block)");
}

// Paged attention for a decode step (cu_seqlens_q empty: one query row per sequence) or a
// varlen step (one query row per new token). partition_size 0 walks each row's context in one
// block; otherwise num_partitions blocks per (row, KV head) write partial results that a second
// kernel merges (fp32 scratch of num_rows * num_heads * num_partitions * (head_dim + 2)).
torch::Tensor paged_attention(torch::Tensor query, torch::Tensor key_cache,
                              torch::Tensor value_cache, torch::Tensor block_tables,
                              torch::Tensor seq_lens, std::optional<torch::Tensor> cu_seqlens_q,
                              double scale, double k_scale, double v_scale,
                              int64_t partition_size, int64_t num_partitions) {
  check_cuda_contiguous(query, "query");
  check_cuda_contiguous(key_cache, "key_cache");
  check_cuda_contiguous(value_cache, "value_cache");
  check_cuda_contiguous(block_tables, "block_tables");
  check_cuda_contiguous(seq_lens, "seq_lens");
  check_aligned(key_cache, "key_cache");
  check_aligned(value_cache, "value_cache");
  TORCH_CHECK(block_tables.scalar_type() == torch::kInt32, "block_tables must be int32");
  TORCH_CHECK(seq_lens.scalar_type() == torch::kInt32, "seq_lens must be int32");
  TORCH_CHECK(is_fp8(key_cache) || query.scalar_type() == key_cache.scalar_type(),
              "query and cache dtypes differ");
  TORCH_CHECK(query.dim() == 3 && key_cache.dim() == 4 && block_tables.dim() == 2,
              "query [rows, heads, d], key_cache [blocks, block_size, kv_heads, d], "
              "block_tables [seqs, max_blocks] expected");
  const int64_t num_seqs = seq_lens.size(0);
  if (cu_seqlens_q.has_value()) {
    check_cuda_contiguous(*cu_seqlens_q, "cu_seqlens_q");
    TORCH_CHECK(cu_seqlens_q->scalar_type() == torch::kInt32, "cu_seqlens_q must be int32");
    TORCH_CHECK(cu_seqlens_q->size(0) == num_seqs + 1, "cu_seqlens_q must have num_seqs + 1 "
                "entries");
  } else {
    TORCH_CHECK(query.size(0) == num_seqs, "decode: one query row per sequence");
  }
  TORCH_CHECK(num_partitions >= 1 && partition_size >= 0, "partition_size ", partition_size,
              ", num_partitions ", num_partitions);
  const c10::cuda::CUDAGuard guard(query.device());
  auto out = torch::empty_like(query);  // [num_rows, num_heads, head_dim]
  if (query.size(0) == 0 || num_seqs == 0) return out;
  const int64_t num_rows = query.size(0);
  const int64_t num_heads = query.size(1);
  const int64_t head_dim = query.size(2);
  torch::Tensor partial_acc, partial_max, partial_sum;
  if (num_partitions > 1) {
    const auto f32 = query.options().dtype(torch::kFloat32);
    partial_acc = torch::empty({num_rows, num_heads, num_partitions, head_dim}, f32);
    partial_max = torch::empty({num_rows, num_heads, num_partitions}, f32);
    partial_sum = torch::empty({num_rows, num_heads, num_partitions}, f32);
  }
  LlmlabPagedAttention args{};
  args.out = out.data_ptr();
  args.query = query.data_ptr();
  args.key_cache = key_cache.data_ptr();
  args.value_cache = value_cache.data_ptr();
  args.block_tables = block_tables.data_ptr<int32_t>();
  args.seq_lens = seq_lens.data_ptr<int32_t>();
  args.cu_seqlens_q = cu_seqlens_q.has_value() ? cu_seqlens_q->data_ptr<int32_t>() : nullptr;
  args.partial_acc = num_partitions > 1 ? partial_acc.data_ptr<float>() : nullptr;
  args.partial_max = num_partitions > 1 ? partial_max.data_ptr<float>() : nullptr;
  args.partial_sum = num_partitions > 1 ? partial_sum.data_ptr<float>() : nullptr;
  args.num_rows = static_cast<int>(num_rows);
  args.num_seqs = static_cast<int>(num_seqs);
  args.num_heads = static_cast<int>(num_heads);
  args.num_kv_heads = static_cast<int>(key_cache.size(2));
  args.head_dim = static_cast<int>(head_dim);
  args.block_size = static_cast<int>(key_cache.size(1));
  args.max_blocks_per_seq = static_cast<int>(block_tables.size(1));
  args.partition_size = static_cast<int>(partition_size);
  args.num_partitions = static_cast<int>(num_partitions);
  args.dtype = dtype_code(query);
  args.cache_fp8 = is_fp8(key_cache) ? 1 : 0;
  args.scale = static_cast<float>(scale);
  args.k_scale = static_cast<float>(k_scale);
  args.v_scale = static_cast<float>(v_scale);
  const cudaError_t err = llmlab_paged_attention(&args, c10::cuda::getCurrentCUDAStream());
  TORCH_CHECK(err == cudaSuccess, "llmlab_paged_attention: ", cudaGetErrorString(err),
              " (num_heads ", num_heads, ", num_kv_heads ", args.num_kv_heads, ", head_dim ",
              head_dim, ", partition_size ", partition_size, ", num_partitions ",
              num_partitions, ")");
  return out;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "llmlab CUDA kernels: reshape_and_cache and paged attention (NHD cache)";
  m.def("reshape_and_cache", &reshape_and_cache,
        "Write key/value [num_tokens, kv_heads, d] into the paged cache at slot_mapping "
        "(an fp8 cache: value / scale)",
        pybind11::arg("key"), pybind11::arg("value"), pybind11::arg("key_cache"),
        pybind11::arg("value_cache"), pybind11::arg("slot_mapping"),
        pybind11::arg("k_scale") = 1.0, pybind11::arg("v_scale") = 1.0);
  m.def("paged_attention", &paged_attention,
        "Paged attention: query [rows, heads, d] -> [rows, heads, d]; decode when cu_seqlens_q "
        "is None (one row per sequence), varlen otherwise; partition_size 0 = one pass",
        pybind11::arg("query"), pybind11::arg("key_cache"), pybind11::arg("value_cache"),
        pybind11::arg("block_tables"), pybind11::arg("seq_lens"), pybind11::arg("cu_seqlens_q"),
        pybind11::arg("scale"), pybind11::arg("k_scale"), pybind11::arg("v_scale"),
        pybind11::arg("partition_size"), pybind11::arg("num_partitions"));
}
