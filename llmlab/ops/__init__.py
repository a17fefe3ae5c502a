"""Paged-attention ops with a `backend=` switch: "torch", "triton", "cuda", "cpu"; and `linear`, the
matmul every projection of the model runs (see `llmlab.ops.matmul`).

Layouts (NHD, as in vLLM's Triton attention and FlashAttention):

- `key_cache, value_cache`: [num_blocks, block_size, num_kv_heads, head_dim]
- `key, value`: [num_tokens, num_kv_heads, head_dim]; `slot_mapping`: [num_tokens] int64,
  slot = block_id * block_size + offset, slot -1 = do not write.
- decode: `query` [num_seqs, num_heads, head_dim], `block_tables` [num_seqs, max_blocks] int32,
  `seq_lens` [num_seqs] int32 -> [num_seqs, num_heads, head_dim].
- prefill: `query` [num_tokens, num_heads, head_dim] (sequences back to back),
  `cu_seqlens_q` [num_seqs + 1] int32, `seq_lens` [num_seqs] int32 = context + new tokens;
  query i of a sequence sits at position seq_len - q_len + i and sees keys up to it.
- GQA: query head h reads KV head h // (num_heads // num_kv_heads).

Backends:

- "torch": plain PyTorch, vectorised; the engine's CPU path. Any device.
- "triton": Triton kernels. Compiled on CUDA tensors; on CPU tensors they run through the Triton
  interpreter, which the backend switches on (TRITON_INTERPRET=1) before it first imports
  triton when no CUDA GPU is available. The interpreter is for learning and tests, not speed.
- "cuda": CUDA C++ from `kernels/`, built with torch.utils.cpp_extension on first use (build
  directory under $LLMLAB_CACHE, default ~/.cache/llmlab). Needs a CUDA GPU and CUDA tensors;
  `paged_attention_prefill` on this backend runs the torch implementation on the GPU tensors.
- "cpu": C from `kernels/cpu_attention.c` (OpenMP, compiled with the system C compiler on first
  use, loaded with ctypes): reads K/V in place through the block table, no gather, no padding.
  The fastest path on a CPU; float32 (other dtypes run the torch code). CPU tensors only.

All backends take the same arguments and return the same values (fp32 within 1e-5). Arguments
are checked here, once, before any backend runs (see `llmlab.ops._checks`).
"""

from __future__ import annotations

import importlib.util
from types import ModuleType

import torch

from llmlab.ops import _checks, torch_backend
from llmlab.ops.matmul import (MATMUL_BACKENDS, linear, linear_split, matmul_backend,
                               set_matmul_backend, use_matmul)

BACKENDS = ("torch", "triton", "cuda", "cpu")

__all__ = [
    "BACKENDS",
    "MATMUL_BACKENDS",
    "available_backends",
    "linear",
    "linear_split",
    "matmul_backend",
    "paged_attention_decode",
    "paged_attention_prefill",
    "reshape_and_cache",
    "set_matmul_backend",
    "use_matmul",
]


def available_backends() -> list[str]:
    """The backends that can run on this machine ("torch" always; "triton" when the package is
    installed, compiled on a GPU or interpreted on CPU; "cuda" with a CUDA GPU and nvcc-capable
    torch; "cpu" where a C compiler builds `kernels/cpu_attention.c`)."""
    found = ["torch"]
    if importlib.util.find_spec("triton") is not None:
        found.append("triton")
    if torch.cuda.is_available() and torch.version.cuda is not None:
        found.append("cuda")
    from llmlab.ops import cpu_backend
    if cpu_backend.available()[0]:
        found.append("cpu")
    return found


def _backend(backend: str) -> ModuleType:
    if backend == "torch":
        return torch_backend
    if backend == "triton":
        from llmlab.ops import triton_backend
        return triton_backend
    if backend == "cuda":
        from llmlab.ops import cuda_backend
        return cuda_backend
    if backend == "cpu":
        from llmlab.ops import cpu_backend
        return cpu_backend
    raise ValueError(f"backend: got {backend!r}, expected one of {', '.join(map(repr, BACKENDS))}")


def reshape_and_cache(key: torch.Tensor, value: torch.Tensor, key_cache: torch.Tensor,
                      value_cache: torch.Tensor, slot_mapping: torch.Tensor,
                      backend: str = "torch") -> None:
    """Write new keys/values into the paged cache, in place.

    key, value: [num_tokens, num_kv_heads, head_dim]; slot_mapping: [num_tokens] int64 with
    slot = block_id * block_size + offset; a slot of -1 is skipped (nothing written).
    """
    impl = _backend(backend)
    _checks.check_reshape_and_cache(key, value, key_cache, value_cache, slot_mapping)
    impl.reshape_and_cache(key, value, key_cache, value_cache, slot_mapping)


def paged_attention_decode(query: torch.Tensor, key_cache: torch.Tensor,
                           value_cache: torch.Tensor, block_tables: torch.Tensor,
                           seq_lens: torch.Tensor, scale: float,
                           backend: str = "torch") -> torch.Tensor:
    """Attention of one new token per sequence over its cached keys/values.

    query: [num_seqs, num_heads, head_dim]; block_tables: [num_seqs, max_blocks] int32;
    seq_lens: [num_seqs] int32 (tokens in the cache, including the new one) ->
    [num_seqs, num_heads, head_dim] in query's dtype.
    """
    impl = _backend(backend)
    _checks.check_decode(query, key_cache, value_cache, block_tables, seq_lens, scale)
    return impl.paged_attention_decode(query, key_cache, value_cache, block_tables, seq_lens,
                                       float(scale))


def paged_attention_prefill(query: torch.Tensor, key_cache: torch.Tensor,
                            value_cache: torch.Tensor, block_tables: torch.Tensor,
                            cu_seqlens_q: torch.Tensor, seq_lens: torch.Tensor, scale: float,
                            backend: str = "torch") -> torch.Tensor:
    """Causal varlen attention of new tokens over cached context plus themselves.

    query: [num_tokens, num_heads, head_dim], sequences back to back; cu_seqlens_q:
    [num_seqs + 1] int32 offsets into query; seq_lens: [num_seqs] int32 = context + new tokens.
    The new tokens' keys/values must already be in the cache (call `reshape_and_cache` first).
    Serves plain prefill, chunked prefill and prefix-cache hits. Returns
    [num_tokens, num_heads, head_dim] in query's dtype.
    """
    impl = _backend(backend)
    _checks.check_prefill(query, key_cache, value_cache, block_tables, cu_seqlens_q, seq_lens,
                          scale)
    return impl.paged_attention_prefill(query, key_cache, value_cache, block_tables,
                                        cu_seqlens_q, seq_lens, float(scale))
