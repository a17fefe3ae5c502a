"""The "triton" backend: launchers for the kernels in `llmlab.ops._triton_kernels`.

Compiled or interpreted:

- With a CUDA GPU the kernels are compiled and take CUDA tensors.
- Without one, this module sets `TRITON_INTERPRET=1` (unless the variable is already set)
  *before* it first imports triton, and the kernels run through Triton's interpreter on CPU
  tensors, in NumPy, one program at a time. That is how the course runs Triton on a laptop and
  how CI checks the kernels; it is slow (seconds per call) and never a performance path.
  Triton decides between the two when a kernel is defined, so the choice is made once per
  process: to force the interpreter on a GPU machine, export TRITON_INTERPRET=1 before start.

Import of triton is lazy (first call), so `import llmlab.ops` never pays for it.

The launchers check nothing: `llmlab.ops` checks the arguments (shapes, dtypes, devices, with
`check_device` below for what Triton needs) before it calls them, and an engine step's layers
call them on metadata checked once per step (`llmlab.ops.attention`, `llmlab.ops.paged_attention`):
no checks per layer, and nothing that waits for the GPU (the prefill grid is sized by the host's
`max_query_len`).
"""

from __future__ import annotations

import importlib
import math
import os
from types import ModuleType

import torch

from llmlab.ops import _checks
from llmlab.ops.paged_kv import PagedKV
from llmlab.utils import cdiv

_LOG2E = 1.4426950408889634
# Split-K decode: context positions per partition (a multiple of every BLOCK_N used below).
DEFAULT_PARTITION_SIZE = 512
_kernels: dict[str, ModuleType] = {}


def interpreting() -> bool:
    """True when the kernels run through the Triton interpreter (CPU tensors)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def _load(module: str = "_triton_kernels") -> ModuleType:
    """Import a kernel module of `llmlab.ops` once (the attention kernels by default; the fused
    layer's are `_triton_layer_kernels`), switching the interpreter on first when there is no
    GPU."""
    if module not in _kernels:
        if not torch.cuda.is_available():
            os.environ.setdefault("TRITON_INTERPRET", "1")
        _kernels[module] = importlib.import_module(f"llmlab.ops.{module}")
    return _kernels[module]


def check_device(tensors: dict[str, torch.Tensor]) -> None:
    _load()  # settles the interpreter switch before it is read below
    want_cuda = not interpreting()
    for name, t in tensors.items():
        if want_cuda and t.device.type != "cuda":
            raise ValueError(
                f"{name}.device: got {t.device}, expected a CUDA tensor: Triton is compiling "
                "for the GPU in this process (set TRITON_INTERPRET=1 before start to run CPU "
                "tensors through the interpreter)"
            )
        if not want_cuda and t.device.type != "cpu":
            raise ValueError(
                f"{name}.device: got {t.device}, expected a CPU tensor: Triton "
                "runs through its interpreter in this process (TRITON_INTERPRET=1)"
            )


def _pow2_at_least_16(n: int) -> int:
    return max(16, triton_next_power_of_2(n))


def triton_next_power_of_2(n: int) -> int:
    """Smallest power of two >= n (n >= 1)."""
    return 1 << max(0, (int(n) - 1).bit_length())


def _tiles(head_dim: int) -> tuple[int, int]:
    """(BLOCK_N, BLOCK_M): context tokens per tile, query rows per prefill tile."""
    if interpreting():
        return 32, 16  # fewer, larger NumPy ops per program; still dot-sized on a GPU
    return (64, 64) if head_dim <= 64 else (32, 64)


def _fp8(cache: torch.Tensor) -> bool:
    return cache.dtype == torch.float8_e4m3fn


def _as_bytes(cache: torch.Tensor) -> torch.Tensor:
    """An fp8 cache as the uint8 tensor the kernels read (they widen e4m3 themselves)."""
    return cache.view(torch.uint8) if _fp8(cache) else cache


def reshape_and_cache(
    key: torch.Tensor, value: torch.Tensor, kv: PagedKV, slot_mapping: torch.Tensor
) -> None:
    """Triton `reshape_and_cache`: one program per token; slot -1 is skipped. An fp8 cache
    gets key / k_scale and value / v_scale, rounded to e4m3 by PyTorch, copied as bytes."""
    k = _load()
    num_tokens = key.shape[0]
    if num_tokens == 0:
        return
    key_cache, value_cache = kv.key_cache, kv.value_cache
    row = key_cache.shape[2] * key_cache.shape[3]  # num_kv_heads * head_dim
    if _fp8(key_cache):
        from llmlab.ops.fp8 import quantize_fp8

        key = quantize_fp8(key, kv.k_scale).view(torch.uint8)
        value = quantize_fp8(value, kv.v_scale).view(torch.uint8)
        key_cache, value_cache = _as_bytes(key_cache), _as_bytes(value_cache)
    k.reshape_and_cache_kernel[(num_tokens,)](
        key, value, key_cache, value_cache, slot_mapping, ROW=row, BLOCK=triton_next_power_of_2(row)
    )


def num_partitions_for(max_context: int, partition_size: int) -> int:
    """Partitions needed to cover `max_context` positions."""
    return max(1, math.ceil(max_context / partition_size))


def _partition_size(query: torch.Tensor, num_kv_heads: int, max_context: int) -> int:
    """Split-K on a GPU when there are fewer (sequence, KV head) programs than SMs and the
    context may span more than one partition; never in the interpreter. From host-known
    values only: the batch, the block table's width, the SM count."""
    if interpreting():
        return 0
    sms = torch.cuda.get_device_properties(query.device).multi_processor_count
    few = query.shape[0] * num_kv_heads < sms
    return DEFAULT_PARTITION_SIZE if few and max_context > DEFAULT_PARTITION_SIZE else 0


def paged_attention(
    query: torch.Tensor,
    kv: PagedKV,
    scale: float,
    *,
    max_query_len: int | None = None,
    partition_size: int | None = None,
) -> torch.Tensor:
    """Triton paged attention, query [num_tokens, num_heads, head_dim] -> the same shape: the
    decode kernel when `kv` has no query offsets (one query per sequence), else the varlen
    causal prefill kernel, whose grid `max_query_len` sizes (required there: the most new
    tokens of any sequence, a host int, so nothing here waits for the GPU).

    partition_size (decode): None picks automatically (split-K on a GPU when there are fewer
    (sequence, KV head) programs than SMs and the block table spans more than one partition;
    never in the interpreter); 0 forces a single pass; a positive multiple of 32 forces
    split-K with that many context positions per partition.
    """
    k = _load()
    if kv.is_decode:
        _checks.check_partition_size(partition_size)
        return _decode(k, query, kv, float(scale) * _LOG2E, partition_size)
    return _prefill(k, query, kv, float(scale) * _LOG2E, max_query_len)


def _kernel_sizes(query: torch.Tensor, kv: PagedKV) -> dict:
    """The compile-time sizes both attention kernels take."""
    _, num_heads, head_dim = query.shape
    _, block_size, num_kv_heads, _ = kv.key_cache.shape
    return dict(
        NUM_HEADS=num_heads,
        NUM_KV_HEADS=num_kv_heads,
        GROUP=num_heads // num_kv_heads,
        HEAD_DIM=head_dim,
        BLOCK_SIZE=block_size,
        BLOCK_D=_pow2_at_least_16(head_dim),
        UPCAST=interpreting() or _fp8(kv.key_cache),
        FP8=_fp8(kv.key_cache),
    )


def _decode(
    k: ModuleType, query: torch.Tensor, kv: PagedKV, scale_log2: float, partition_size: int | None
) -> torch.Tensor:
    """The decode kernel (split-K, then `merge_partitions_kernel`, when partitioned)."""
    num_seqs, num_heads, head_dim = query.shape
    _, block_size, num_kv_heads, _ = kv.key_cache.shape
    out = torch.empty_like(query)
    if num_seqs == 0:
        return out
    block_n, _ = _tiles(head_dim)
    max_blocks = kv.block_tables.shape[1]
    # Upper bound on the context from the table's width: no device-to-host sync needed.
    max_context = max_blocks * block_size
    if partition_size is None:
        partition_size = _partition_size(query, num_kv_heads, max_context)
    split = partition_size > 0
    num_parts = num_partitions_for(max_context, partition_size) if split else 1
    sizes = dict(
        _kernel_sizes(query, kv),
        BLOCK_G=_pow2_at_least_16(num_heads // num_kv_heads),
        BLOCK_N=min(block_n, partition_size) if split else block_n,
        PARTITION=partition_size if split else 1 << 30,
        NUM_PARTITIONS=num_parts,
        SPLIT=split,
    )
    args = (scale_log2, float(kv.k_scale), float(kv.v_scale), max_blocks)
    caches = (_as_bytes(kv.key_cache), _as_bytes(kv.value_cache), kv.block_tables, kv.seq_lens)
    grid = (num_seqs, num_kv_heads, num_parts)
    if not split:
        k.paged_decode_kernel[grid](query, *caches, out, out, out, *args, **sizes)
        return out
    part_acc = torch.empty(
        (num_seqs, num_heads, num_parts, head_dim), dtype=torch.float32, device=query.device
    )
    part_m = torch.empty((num_seqs, num_heads, num_parts), dtype=torch.float32, device=query.device)
    part_l = torch.empty_like(part_m)
    k.paged_decode_kernel[grid](query, *caches, part_acc, part_m, part_l, *args, **sizes)
    k.merge_partitions_kernel[(num_seqs * num_heads,)](
        part_acc,
        part_m,
        part_l,
        out,
        NUM_PARTITIONS=num_parts,
        HEAD_DIM=head_dim,
        BLOCK_P=triton_next_power_of_2(num_parts),
        BLOCK_D=_pow2_at_least_16(head_dim),
    )
    return out


def _prefill(
    k: ModuleType, query: torch.Tensor, kv: PagedKV, scale_log2: float, max_query_len: int
) -> torch.Tensor:
    """The varlen causal prefill kernel: one program per (query tile, sequence, head)."""
    num_tokens, num_heads, head_dim = query.shape
    out = torch.empty_like(query)
    num_seqs = kv.seq_lens.shape[0]
    if num_tokens == 0 or num_seqs == 0 or max_query_len == 0:
        return out
    block_n, block_m = _tiles(head_dim)
    grid = (cdiv(max_query_len, block_m), num_seqs, num_heads)
    k.paged_prefill_kernel[grid](
        query,
        _as_bytes(kv.key_cache),
        _as_bytes(kv.value_cache),
        kv.block_tables,
        kv.seq_lens,
        kv.cu_seqlens_q,
        out,
        scale_log2,
        float(kv.k_scale),
        float(kv.v_scale),
        kv.block_tables.shape[1],
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        **_kernel_sizes(query, kv),
    )
    return out
