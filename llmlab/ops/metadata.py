"""Attention metadata: where the sequences of a flat batch start and end, and where their K/V live.

An engine hands its model one flat batch per step: the new tokens of every sequence laid end
to end. Every attention layer of that step needs the same description of the batch, so it is
built once per step (vLLM's attention metadata builders, `vllm/v1/attention/backends/`),
checked once when it is built, and then passed to every layer. The per-layer call,
`llmlab.ops.attention`, checks only the tensors that layer brings (q, k, v).

A backend may keep per-step work of its own in `backend_state` (the "torch" backend keeps the
grouping of sequences it plans on the first layer there); the metadata is thrown away after
the step, and that state with it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from llmlab.ops import _checks
from llmlab.ops.paged_kv import PagedKV


@dataclass(frozen=True)
class AttentionMetadata:
    """One step's attention metadata (checked against the caches when built: do not modify its
    tensors afterwards).

    cu_seqlens_q  [S + 1] int32  query (new token) offsets: sequence s owns tokens
                                 cu_seqlens_q[s] : cu_seqlens_q[s + 1] of the flat batch
    seq_lens      [S]     int32  cached context + new tokens of each sequence
    slot_mapping  [T]     int64  cache slot (block_id * block_size + offset) of each new token
    block_tables  [S, max_blocks] int32  physical block ids of each sequence, in order
    kv_caches     per layer (key_cache, value_cache), each [num_blocks, block_size, kv_heads, head_dim]
    max_query_len the most new tokens any sequence brings (1: a decode-only step)
    backend       the attention backend every layer runs ("torch", "triton", "cuda", "cpu")
    kv_scales     per layer (k_scale, v_scale) of an fp8 cache (stored = value / scale); None
                  for a cache in a float dtype
    """

    cu_seqlens_q: torch.Tensor
    seq_lens: torch.Tensor
    slot_mapping: torch.Tensor
    block_tables: torch.Tensor
    kv_caches: list[tuple[torch.Tensor, torch.Tensor]]
    max_query_len: int
    backend: str = "torch"
    kv_scales: list[tuple[float, float]] | None = None
    backend_state: dict = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        _checks.check_backend_name(self.backend)
        _checks.check_metadata(
            self.cu_seqlens_q,
            self.seq_lens,
            self.slot_mapping,
            self.block_tables,
            self.kv_caches,
            self.max_query_len,
        )
        _checks.check_kv_scales(self.kv_scales, self.kv_caches)
        check_backend_device(self.backend, {"kv_caches": self.kv_caches[0][0]})

    def scales(self, layer: int) -> tuple[float, float]:
        """(k_scale, v_scale) of layer `layer`'s cache: (1.0, 1.0) for a float cache."""
        return (1.0, 1.0) if self.kv_scales is None else self.kv_scales[layer]

    def paged_kv(self, layer: int) -> PagedKV:
        """What layer `layer`'s attention reads: its caches and scales with the step's tables
        (no query offsets in a decode-only step, so the backends run their decode kernels)."""
        key_cache, value_cache = self.kv_caches[layer]
        cu_seqlens_q = None if self.is_decode_only else self.cu_seqlens_q
        return PagedKV(
            key_cache,
            value_cache,
            self.block_tables,
            self.seq_lens,
            cu_seqlens_q,
            *self.scales(layer),
        )

    @property
    def is_decode_only(self) -> bool:
        """Every sequence brings exactly one new token: the decode kernel applies."""
        return self.max_query_len == 1

    @property
    def num_tokens(self) -> int:
        return self.slot_mapping.shape[0]

    @property
    def num_seqs(self) -> int:
        return self.seq_lens.shape[0]


def check_backend_device(backend: str, tensors: dict[str, torch.Tensor]) -> None:
    """The device the "triton" and "cuda" kernels need (CUDA tensors; CPU ones where Triton runs
    through its interpreter). The other backends run on the tensors' own device."""
    if backend == "triton":
        from llmlab.ops import triton_backend

        triton_backend.check_device(tensors)
    elif backend == "cuda":
        from llmlab.ops import cuda_backend

        cuda_backend.check_device(tensors)


def single_sequence_metadata(
    kv_caches,
    num_cached: int,
    num_new: int,
    max_len: int,
    backend: str = "torch",
    block_id: int = 0,
    kv_scales: list[tuple[float, float]] | None = None,
) -> AttentionMetadata:
    """Metadata for one sequence stored contiguously in block `block_id` (block_size = max_len)."""
    device = kv_caches[0][0].device
    start = block_id * max_len + num_cached
    return AttentionMetadata(
        cu_seqlens_q=torch.tensor([0, num_new], dtype=torch.int32, device=device),
        seq_lens=torch.tensor([num_cached + num_new], dtype=torch.int32, device=device),
        slot_mapping=torch.arange(start, start + num_new, dtype=torch.int64, device=device),
        block_tables=torch.tensor([[block_id]], dtype=torch.int32, device=device),
        kv_caches=kv_caches,
        max_query_len=num_new,
        backend=backend,
        kv_scales=kv_scales,
    )
