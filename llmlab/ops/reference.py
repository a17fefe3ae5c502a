"""A dense, deliberately simple reference for the paged attention ops (tests only).

Loops over sequences, heads and positions, looks up every slot through the block table by
hand, and computes in float64. Every backend is checked against these functions; they are slow
on purpose and never used by the engine.
"""

from __future__ import annotations

import torch


def reference_reshape_and_cache(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Write token t's key/value into slot `slot_mapping[t]`, skipping slot -1."""
    block_size = key_cache.shape[1]
    for t, slot in enumerate(slot_mapping.tolist()):
        if slot == -1:
            continue
        block, offset = divmod(slot, block_size)
        key_cache[block, offset] = key[t]
        value_cache[block, offset] = value[t]


def _read_context(cache: torch.Tensor, block_table: list[int], seq_len: int) -> torch.Tensor:
    """Positions 0..seq_len-1 of one sequence: [seq_len, num_kv_heads, head_dim] float64."""
    block_size = cache.shape[1]
    rows = [cache[block_table[p // block_size], p % block_size] for p in range(seq_len)]
    return torch.stack(rows).double() if rows else cache.new_zeros((0, *cache.shape[2:])).double()


def _attend_one(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, scale: float
) -> torch.Tensor:
    """q: [head_dim]; keys, values: [n, head_dim] -> [head_dim], plain softmax in float64."""
    scores = (keys @ q.double()) * scale  # [n]
    weights = torch.exp(scores - scores.max())  # [n]; subtracting the max changes nothing
    return (weights / weights.sum()) @ values  # [head_dim]


def reference_paged_attention_prefill(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """Causal varlen attention: query i of sequence s sits at position seq_len - q_len + i.

    Returns float64 on the CPU, [num_tokens, num_heads, head_dim], so a comparison measures the
    backend's error alone.
    """
    num_heads = query.shape[1]
    num_kv_heads = key_cache.shape[2]
    group = num_heads // num_kv_heads
    out = torch.zeros(query.shape, dtype=torch.float64)
    cu = cu_seqlens_q.tolist()
    for s, seq_len in enumerate(seq_lens.tolist()):
        table = block_tables[s].tolist()
        keys = _read_context(key_cache.cpu(), table, seq_len)  # [seq_len, kv_heads, d]
        values = _read_context(value_cache.cpu(), table, seq_len)
        q_len = cu[s + 1] - cu[s]
        for i in range(q_len):
            pos = seq_len - q_len + i
            for h in range(num_heads):
                kv_h = h // group
                out[cu[s] + i, h] = _attend_one(
                    query[cu[s] + i, h].cpu(), keys[: pos + 1, kv_h], values[: pos + 1, kv_h], scale
                )
    return out


def reference_paged_attention_decode(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """Decode = prefill with one query token per sequence, at the last position."""
    num_seqs = query.shape[0]
    cu = torch.arange(num_seqs + 1, dtype=torch.int32)
    return reference_paged_attention_prefill(
        query, key_cache, value_cache, block_tables, cu, seq_lens, scale
    )
