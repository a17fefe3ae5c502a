"""Paged-attention ops with a `backend=` switch: "torch", "triton", "cuda", "cpu".

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

- "torch": plain PyTorch, written to be read (gather a sequence's blocks, softmax(QKᵀ/√d)V with
  a causal mask); every backend is checked against it. Any device.
- "triton": Triton kernels. Compiled on CUDA tensors; on CPU tensors they run through the Triton
  interpreter, which the backend switches on (TRITON_INTERPRET=1) before it first imports
  triton when no CUDA GPU is available. The interpreter is for learning and tests, not speed.
- "cuda": CUDA C++ from `kernels/`, built with torch.utils.cpp_extension on first use (build
  directory under $LLMLAB_CACHE, default ~/.cache/llmlab). Needs a CUDA GPU and CUDA tensors;
  decode and prefill run one kernel.
- "cpu": C from `kernels/cpu_attention.c` (OpenMP, compiled with the system C compiler on first
  use, loaded with ctypes): reads K/V in place through the block table, no gather, no padding.
  The fastest path on a CPU; float32 (other dtypes run the torch code). CPU tensors only.

All backends return the same values (fp32 within 1e-5). The arguments are checked here, once,
before any backend runs (see `llmlab.ops._checks`), and handed on as one `PagedKV`
(`llmlab.ops.paged_kv`: caches, block tables, lengths, query offsets, fp8 scales): each backend
has one entry, `paged_attention(query, kv, scale)`, for decode (no query offsets) and prefill,
and checks nothing. "triton" and "cuda" also take `partition_size` (split context, see their
modules), and the Triton prefill the host's `max_query_len`, which sizes its grid, so no
launcher waits for the GPU.

A model layer calls `attention(q, k, v, metadata, layer)`: the step's `AttentionMetadata`
(`llmlab.ops.metadata`) was checked once when it was built, so each layer's call checks only
its own q, k and v, then writes k and v into the cache and attends, as a vLLM attention
backend's `forward` does. A layer that wrote its keys itself (the fused rotary + cache kernel
of `llmlab.model.gpu`) calls `paged_attention(q, metadata, layer, scale)`, which checks
nothing: an engine step checks its arguments once, not once per layer.
"""

from __future__ import annotations

import importlib.util
from types import ModuleType

import torch

from llmlab.ops import _checks, torch_backend
from llmlab.ops._checks import BACKENDS
from llmlab.ops.metadata import (
    AttentionMetadata,
    check_backend_device,
    single_sequence_metadata,
)
from llmlab.ops.paged_kv import PagedKV

# the backends that read an fp8 (e4m3) KV cache (every one: "cuda" needs a GPU to test it)
FP8_BACKENDS = ("torch", "cpu", "triton", "cuda")
# the backends that split a context into partitions (`partition_size`), and the one whose
# prefill grid is sized by the host's `max_query_len`
_SPLIT_CONTEXT = ("triton", "cuda")
_GRID_SIZED = ("triton",)

__all__ = [
    "BACKENDS",
    "AttentionMetadata",
    "attention",
    "available_backends",
    "backend_available",
    "paged_attention",
    "paged_attention_decode",
    "paged_attention_prefill",
    "reshape_and_cache",
    "single_sequence_metadata",
]


def available_backends() -> list[str]:
    """The backends that can run on this machine ("torch" always; "triton" when the package is
    installed, compiled on a GPU or interpreted on CPU; "cuda" with a CUDA GPU and nvcc-capable
    torch; "cpu" where a C compiler builds `kernels/cpu_attention.c`)."""
    return [name for name in BACKENDS if backend_available(name)[0]]


def backend_available(backend: str) -> tuple[bool, str]:
    """(True, "") when `backend` can run here, else (False, why). Only "cpu" compiles anything
    (its C kernels, on first use): asking about another backend never does."""
    _checks.check_backend_name(backend)
    if backend == "torch":
        return True, ""
    if backend == "triton":
        found = importlib.util.find_spec("triton") is not None
        return found, "" if found else "the triton package is not installed"
    if backend == "cuda":
        found = torch.cuda.is_available() and torch.version.cuda is not None
        return found, "" if found else "no CUDA GPU (or a torch build without CUDA)"
    from llmlab.ops import cpu_backend

    return cpu_backend.available()


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


def _kv_scales(
    backend: str, key_cache: torch.Tensor, k_scale: float, v_scale: float
) -> tuple[float, float]:
    """The (k_scale, v_scale) a backend reads: an fp8 cache's, checked; (1.0, 1.0) for a float
    cache, which takes none."""
    if key_cache.dtype != torch.float8_e4m3fn:
        return 1.0, 1.0
    if backend not in FP8_BACKENDS:
        raise ValueError(
            f"backend: got {backend!r} for an fp8 KV cache, expected one of "
            f"{FP8_BACKENDS} (the backends that read an fp8 cache)"
        )
    for name, v in (("k_scale", k_scale), ("v_scale", v_scale)):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
            raise ValueError(f"{name}: got {v!r}, expected a positive float")
    return float(k_scale), float(v_scale)


def _checked_backend(
    backend: str, tensors: dict[str, torch.Tensor], query: torch.Tensor | None = None
) -> ModuleType:
    """The backend's module, once the tensors are on the device it needs (and, for "cuda", an
    attention `query` within its kernel's head_dim and GQA limits)."""
    impl = _backend(backend)
    check_backend_device(backend, tensors)
    if backend == "cuda" and query is not None:
        impl.check_kernel_shape(query, tensors["key_cache"])
    return impl


def _attend(backend: str, query: torch.Tensor, kv: PagedKV, scale: float, sizes: dict):
    """Run `backend`'s attention on checked arguments, once its device needs are met."""
    impl = _checked_backend(backend, {"query": query, **kv.tensors()}, query)
    return impl.paged_attention(query, kv, float(scale), **sizes)


def _launch_sizes(
    backend: str,
    partition_size: int | None,
    splits: tuple[str, ...],
    max_query_len: int | None = None,
) -> dict:
    """The launch sizes a backend's launcher takes: `partition_size`, when given, for the
    backends in `splits` (those that split this call's context; its value is checked where it is
    used: the Triton decode launcher, `plan_attention`); a prefill's `max_query_len` for those
    whose grid it sizes; none for "torch" and "cpu"."""
    if partition_size is not None and backend not in splits:
        raise ValueError(
            f"partition_size: got {partition_size!r} for backend {backend!r}, expected None "
            f"(only {' and '.join(map(repr, splits))} split the context here)"
        )
    sizes = {} if partition_size is None else {"partition_size": partition_size}
    if max_query_len is not None and backend in _GRID_SIZED:
        sizes["max_query_len"] = max_query_len
    return sizes


def reshape_and_cache(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    backend: str = "torch",
    k_scale: float = 1.0,
    v_scale: float = 1.0,
) -> None:
    """Write new keys/values into the paged cache, in place.

    key, value: [num_tokens, num_kv_heads, head_dim]; slot_mapping: [num_tokens] int64 with
    slot = block_id * block_size + offset; a slot of -1 is skipped (nothing written). An fp8
    cache (float8_e4m3fn) stores key / k_scale and value / v_scale.
    """
    _checks.check_backend_name(backend)
    _checks.check_reshape_and_cache(key, value, key_cache, value_cache, slot_mapping)
    k_scale, v_scale = _kv_scales(backend, key_cache, k_scale, v_scale)
    kv = PagedKV(key_cache, value_cache, k_scale=k_scale, v_scale=v_scale)  # a write: no tables
    tensors = {"key": key, "value": value, **kv.tensors(), "slot_mapping": slot_mapping}
    _checked_backend(backend, tensors).reshape_and_cache(key, value, kv, slot_mapping)


def paged_attention_decode(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    backend: str = "torch",
    k_scale: float = 1.0,
    v_scale: float = 1.0,
    *,
    partition_size: int | None = None,
) -> torch.Tensor:
    """Attention of one new token per sequence over its cached keys/values.

    query: [num_seqs, num_heads, head_dim]; block_tables: [num_seqs, max_blocks] int32;
    seq_lens: [num_seqs] int32 (tokens in the cache, including the new one) ->
    [num_seqs, num_heads, head_dim] in query's dtype. `partition_size` ("triton", "cuda"):
    None chooses, 0 forces one pass, a multiple of 32 splits the context into partitions.
    """
    _checks.check_backend_name(backend)
    _checks.check_attention(query, key_cache, value_cache, block_tables, seq_lens, scale)
    scales = _kv_scales(backend, key_cache, k_scale, v_scale)
    kv = PagedKV(key_cache, value_cache, block_tables, seq_lens, None, *scales)
    return _attend(
        backend, query, kv, scale, _launch_sizes(backend, partition_size, _SPLIT_CONTEXT)
    )


def paged_attention_prefill(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    backend: str = "torch",
    k_scale: float = 1.0,
    v_scale: float = 1.0,
    *,
    max_query_len: int | None = None,
    partition_size: int | None = None,
) -> torch.Tensor:
    """Causal varlen attention of new tokens over cached context plus themselves.

    query: [num_tokens, num_heads, head_dim], sequences back to back; cu_seqlens_q:
    [num_seqs + 1] int32 offsets into query; seq_lens: [num_seqs] int32 = context + new tokens.
    The new tokens' keys/values must already be in the cache (call `reshape_and_cache` first).
    Serves plain prefill, chunked prefill and prefix-cache hits. Returns
    [num_tokens, num_heads, head_dim] in query's dtype. `max_query_len`: the most new tokens of
    any sequence (None: found without waiting for the GPU); `partition_size` ("cuda") as for
    decode.
    """
    _checks.check_backend_name(backend)
    max_query_len = _checks.check_attention(
        query, key_cache, value_cache, block_tables, seq_lens, scale, cu_seqlens_q, max_query_len
    )
    scales = _kv_scales(backend, key_cache, k_scale, v_scale)
    kv = PagedKV(key_cache, value_cache, block_tables, seq_lens, cu_seqlens_q, *scales)
    sizes = _launch_sizes(backend, partition_size, ("cuda",), max_query_len)
    return _attend(backend, query, kv, scale, sizes)


def attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    metadata: AttentionMetadata,
    layer: int,
    scale: float,
) -> torch.Tensor:
    """One layer's attention in an engine step: write this step's `key`, `value`
    `[num_tokens, num_kv_heads, head_dim]` into layer `layer`'s cache, then attend `query`
    `[num_tokens, num_heads, head_dim]` over everything cached -> `[num_tokens, num_heads, head_dim]`.

    `metadata` (checked when it was built) says where each sequence's tokens go and which blocks
    it reads; only the tensors of this layer are checked here.
    """
    kv = metadata.paged_kv(layer)
    _checks.check_layer_qkv(query, key, value, kv.key_cache, metadata.num_tokens)
    _backend(metadata.backend).reshape_and_cache(key, value, kv, metadata.slot_mapping)
    return _attend_step(query, kv, metadata, scale)


def paged_attention(
    query: torch.Tensor, metadata: AttentionMetadata, layer: int, scale: float
) -> torch.Tensor:
    """Attend `query` `[num_tokens, num_heads, head_dim]` over layer `layer`'s cache, whose keys
    and values for this step are already written (by `attention`, or by the fused layer of
    `llmlab.model.gpu`, which writes them with its rotary kernel) -> `[num_tokens, num_heads,
    head_dim]`: the decode kernel when every sequence brings one token, else the prefill one.

    Nothing is checked here, and nothing waits for the GPU on "triton" and "cuda": the metadata
    was checked when it was built, the caller's query is its own (a layer's shapes are fixed
    with its weights), and the Triton prefill's grid comes from the host's
    `metadata.max_query_len`, as in a vLLM attention backend's `forward`.
    """
    return _attend_step(query, metadata.paged_kv(layer), metadata, scale)


def _attend_step(
    query: torch.Tensor, kv: PagedKV, metadata: AttentionMetadata, scale: float
) -> torch.Tensor:
    """A step's attention on one layer's `kv` (`metadata.paged_kv(layer)`): unchecked."""
    backend = metadata.backend
    if backend == "torch":
        # the readable path's engine speed-up: sequences of similar length attended together
        return torch_backend.grouped_attention(query, kv, metadata, scale)
    grid = backend in _GRID_SIZED and not kv.is_decode
    sizes = {"max_query_len": metadata.max_query_len} if grid else {}
    return _backend(backend).paged_attention(query, kv, scale, **sizes)
