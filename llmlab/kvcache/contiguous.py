"""The contiguous KV cache of chapter 04: every sequence reserves `max_len` slots up front.

It uses the same layout as the paged cache, `[num_blocks, block_size, kv_heads, head_dim]` per
layer, with one block per sequence and `block_size = max_len`. So the model's attention seam is
the same; only the bookkeeping differs. What it costs: memory for `max_len` tokens per sequence
whether the sequence uses them or not (chapter 11 measures that waste).
"""

from __future__ import annotations

import torch

from llmlab.config import ModelConfig
from llmlab.ops.metadata import AttentionMetadata


class ContiguousKVCache:
    """K/V for `batch_size` sequences of up to `max_len` tokens each, for every layer."""

    def __init__(
        self,
        config: ModelConfig,
        batch_size: int,
        max_len: int,
        dtype: torch.dtype = torch.float32,
        device: str | torch.device = "cpu",
    ):
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if not 1 <= max_len <= config.max_position_embeddings:
            raise ValueError(
                f"max_len must be in [1, {config.max_position_embeddings}] "
                f"(the model's max_position_embeddings), got {max_len}"
            )
        self.config = config
        self.batch_size = batch_size
        self.max_len = max_len
        shape = (batch_size, max_len, config.num_key_value_heads, config.head_dim)
        # kv_caches[layer] = (key_cache, value_cache), each [batch, max_len, kv_heads, head_dim]
        self.kv_caches = [
            (
                torch.zeros(shape, dtype=dtype, device=device),
                torch.zeros(shape, dtype=dtype, device=device),
            )
            for _ in range(config.num_hidden_layers)
        ]
        self.lengths = [0] * batch_size  # tokens stored per sequence

    @property
    def nbytes(self) -> int:
        """Bytes reserved: 2 (K and V) × layers × batch × max_len × kv_heads × head_dim × dtype bytes."""
        return sum(k.nbytes + v.nbytes for k, v in self.kv_caches)

    def used_bytes(self) -> int:
        """Bytes holding real tokens (the rest of the reservation is waste)."""
        per_token = self.nbytes // (self.batch_size * self.max_len)
        return per_token * sum(self.lengths)

    def context(self, num_new: list[int], backend: str = "torch"):
        """The `AttentionMetadata` for appending `num_new[s]` tokens to each sequence s.

        Call `advance(num_new)` after the forward to record the new lengths.
        """
        if len(num_new) != self.batch_size:
            raise ValueError(
                f"num_new must have one entry per sequence ({self.batch_size}), got {len(num_new)}"
            )
        for s, n in enumerate(num_new):
            if n < 0 or self.lengths[s] + n > self.max_len:
                raise ValueError(
                    f"sequence {s} would hold {self.lengths[s] + n} tokens; "
                    f"the cache holds max_len={self.max_len}"
                )
        device = self.kv_caches[0][0].device
        starts = torch.tensor(self.lengths, dtype=torch.int64)
        new = torch.tensor(num_new, dtype=torch.int64)
        seq = torch.repeat_interleave(
            torch.arange(self.batch_size), new
        )  # [T] sequence of each token
        first = torch.repeat_interleave(
            torch.cumsum(new, 0) - new, new
        )  # [T] first flat index of its seq
        offset = torch.arange(int(new.sum())) - first + starts[seq]  # [T] position in its seq
        cu = torch.zeros(self.batch_size + 1, dtype=torch.int32)
        cu[1:] = torch.cumsum(new, 0)
        return AttentionMetadata(
            cu_seqlens_q=cu.to(device),
            seq_lens=(starts + new).to(torch.int32).to(device),
            slot_mapping=(seq * self.max_len + offset).to(device),
            block_tables=torch.arange(self.batch_size, dtype=torch.int32, device=device).unsqueeze(
                1
            ),
            kv_caches=self.kv_caches,
            max_query_len=int(new.max()),
            backend=backend,
        )

    def positions(self, num_new: list[int]) -> torch.Tensor:
        """Positions [T] of the tokens `context(num_new)` appends."""
        return torch.cat(
            [torch.arange(self.lengths[s], self.lengths[s] + n) for s, n in enumerate(num_new)]
        )

    def advance(self, num_new: list[int]) -> None:
        for s, n in enumerate(num_new):
            self.lengths[s] += n
