"""`PagedKV`: what one paged-attention call reads, the arguments every backend shares.

The four backends (and the public ops in front of them) read the same things: one layer's key
and value caches, the block tables, the sequence lengths, the query offsets of a prefill, and
the scales of an fp8 cache. They travel together as one frozen dataclass, so each backend has
one entry, `paged_attention(query, kv, scale)`, for decode and prefill alike, and one cache
write, `reshape_and_cache(key, value, kv, slot_mapping)`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class PagedKV:
    """The paged K/V that one attention call reads: a layer's caches, the step's block tables,
    lengths and query offsets, and the fp8 scales. `llmlab.ops` builds it once its arguments
    are checked (from a public op's arguments, or `AttentionMetadata.paged_kv` for a layer of a
    step), and every backend's `paged_attention(query, kv, scale)` takes it, decode and prefill
    alike, as each of vLLM's attention backends takes one `attn_metadata`.

    key_cache, value_cache  [num_blocks, block_size, num_kv_heads, head_dim]
    block_tables  [S, max_blocks] int32  physical block ids of each sequence, in order
    seq_lens      [S]     int32  cached context + new tokens of each sequence
    cu_seqlens_q  [S + 1] int32  query offsets (prefill: sequence s owns query rows
                                 cu_seqlens_q[s] : cu_seqlens_q[s + 1]); None for decode, one
                                 query row per sequence, at its last position
    k_scale, v_scale  an fp8 cache's scales (stored = value / scale); 1.0 for a float cache

    A backend's `reshape_and_cache(key, value, kv, slot_mapping)` writes into the same caches
    and reads only them and the scales (block_tables and seq_lens may be None there).
    """

    key_cache: torch.Tensor
    value_cache: torch.Tensor
    block_tables: torch.Tensor | None = None
    seq_lens: torch.Tensor | None = None
    cu_seqlens_q: torch.Tensor | None = None
    k_scale: float = 1.0
    v_scale: float = 1.0

    @property
    def is_decode(self) -> bool:
        """One query row per sequence (no `cu_seqlens_q`): the decode kernels apply."""
        return self.cu_seqlens_q is None

    def query_offsets(self) -> torch.Tensor:
        """`cu_seqlens_q`, or for decode [0, 1, ..., S] (one query row per sequence)."""
        if self.cu_seqlens_q is not None:
            return self.cu_seqlens_q
        num_seqs = self.seq_lens.shape[0]
        return torch.arange(num_seqs + 1, dtype=torch.int32, device=self.seq_lens.device)

    def tensors(self) -> dict[str, torch.Tensor]:
        """The tensors by argument name (for the device checks' messages)."""
        names = ("key_cache", "value_cache", "block_tables", "seq_lens", "cu_seqlens_q")
        return {n: getattr(self, n) for n in names if getattr(self, n) is not None}
