"""The "torch" backend: paged attention in plain PyTorch, the engine's CPU path.

Strategy (no Python loop over tokens):

1. Gather each sequence's K/V out of the paged cache through its block table into a padded
   batch `[num_seqs, max_len, num_kv_heads, head_dim]` (one advanced-indexing call).
2. Build a boolean mask: key position < seq_len, and for prefill also key position <= the
   query's absolute position (causal).
3. GQA without copying K/V: the `group = num_heads // num_kv_heads` query heads that share a KV
   head are stacked as extra query rows, so `scaled_dot_product_attention` sees
   `[num_seqs, num_kv_heads, group * q_len, head_dim]` against `[num_seqs, num_kv_heads,
   max_len, head_dim]`.
4. Half-precision inputs are upcast to fp32, so the softmax is computed in fp32; the output is
   cast back to the query dtype.

Cache slots past a sequence's length are zeroed after the gather: `0 * NaN` is NaN, so a NaN
left in an unused slot would otherwise leak through the masked softmax.

Arguments are validated by `llmlab.ops` before these functions are called.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def reshape_and_cache(key: torch.Tensor, value: torch.Tensor, key_cache: torch.Tensor,
                      value_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """Write key/value `[num_tokens, num_kv_heads, head_dim]` into the cache at `slot_mapping`."""
    _, _, num_kv_heads, head_dim = key_cache.shape
    flat_k = key_cache.view(-1, num_kv_heads, head_dim)  # [num_slots, num_kv_heads, head_dim]
    flat_v = value_cache.view(-1, num_kv_heads, head_dim)
    keep = slot_mapping >= 0  # [num_tokens]; slot -1 marks a token not to be cached
    if bool(keep.all()):
        flat_k.index_copy_(0, slot_mapping, key)
        flat_v.index_copy_(0, slot_mapping, value)
    else:
        slots = slot_mapping[keep]
        flat_k.index_copy_(0, slots, key[keep])
        flat_v.index_copy_(0, slots, value[keep])


def gather_kv(cache: torch.Tensor, block_tables: torch.Tensor, seq_lens: torch.Tensor,
              max_len: int) -> torch.Tensor:
    """Gather `[num_seqs, max_len, num_kv_heads, head_dim]` from a paged cache.

    Positions at or past a sequence's length are zero (whatever the cache holds there), and
    block-table entries a sequence does not use are never dereferenced.
    """
    num_seqs = block_tables.shape[0]
    _, block_size, num_kv_heads, head_dim = cache.shape
    num_blk = -(-max_len // block_size)
    bt = block_tables[:, :num_blk].long()  # [num_seqs, num_blk]
    blocks_used = (seq_lens.long() + block_size - 1) // block_size  # [num_seqs]
    blk_idx = torch.arange(num_blk, device=cache.device)
    bt = torch.where(blk_idx[None, :] < blocks_used[:, None], bt, 0)  # unused entries -> block 0
    # index_select copies whole blocks (each a contiguous [block_size, kv_heads, d] chunk); it is
    # several times faster on CPU than advanced indexing `cache[bt]`, which gives the same tensor.
    kv = cache.index_select(0, bt.reshape(-1)).view(num_seqs, num_blk, block_size, num_kv_heads,
                                                     head_dim)
    kv = kv.view(num_seqs, num_blk * block_size, num_kv_heads, head_dim)[:, :max_len]
    pos = torch.arange(max_len, device=cache.device)
    invalid = pos[None, :] >= seq_lens[:, None].long()  # [num_seqs, max_len]
    # In place on the fresh gathered copy: cheaper than torch.where's new tensor.
    return kv.masked_fill_(invalid[:, :, None, None], 0)


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor,
            scale: float) -> torch.Tensor:
    """Masked GQA attention on a padded batch.

    q: [n, q_len, num_heads, head_dim]; k, v: [n, kv_len, num_kv_heads, head_dim];
    mask: [n, q_len, kv_len] bool (True = may attend). Returns [n, q_len, num_heads, head_dim]
    in q's dtype. Every row of `mask` must allow at least one key.
    """
    n, q_len, num_heads, head_dim = q.shape
    kv_len, num_kv_heads = k.shape[1], k.shape[2]
    group = num_heads // num_kv_heads
    out_dtype = q.dtype
    qf = q.float().view(n, q_len, num_kv_heads, group, head_dim)
    qf = qf.permute(0, 2, 3, 1, 4).reshape(n, num_kv_heads, group * q_len, head_dim)
    kf = k.float().permute(0, 2, 1, 3)  # [n, num_kv_heads, kv_len, head_dim]
    vf = v.float().permute(0, 2, 1, 3)
    m = mask[:, None, None].expand(n, 1, group, q_len, kv_len).reshape(n, 1, group * q_len,
                                                                      kv_len)
    o = F.scaled_dot_product_attention(qf, kf, vf, attn_mask=m, scale=scale)
    # o: [n, num_kv_heads, group * q_len, head_dim]
    o = o.view(n, num_kv_heads, group, q_len, head_dim).permute(0, 3, 1, 2, 4)
    return o.reshape(n, q_len, num_heads, head_dim).to(out_dtype)


def paged_attention_decode(query: torch.Tensor, key_cache: torch.Tensor,
                           value_cache: torch.Tensor, block_tables: torch.Tensor,
                           seq_lens: torch.Tensor, scale: float) -> torch.Tensor:
    """One query token per sequence against its whole cached context.

    query: [num_seqs, num_heads, head_dim] -> [num_seqs, num_heads, head_dim].
    """
    num_seqs = query.shape[0]
    if num_seqs == 0:
        return torch.empty_like(query)
    max_len = int(seq_lens.max())
    k = gather_kv(key_cache, block_tables, seq_lens, max_len)  # [S, max_len, kv_heads, d]
    v = gather_kv(value_cache, block_tables, seq_lens, max_len)
    pos = torch.arange(max_len, device=query.device)
    mask = pos[None, None, :] < seq_lens.long()[:, None, None]  # [S, 1, max_len]
    return _attend(query[:, None], k, v, mask, scale)[:, 0]


def _prefill_padded(query, key_cache, value_cache, block_tables, starts, q_lens, seq_lens,
                    scale, out) -> None:
    """Attend a subset of sequences as one padded batch; write their rows of `out`."""
    n = starts.shape[0]
    device = query.device
    max_q = int(q_lens.max())
    max_len = int(seq_lens.max())
    i = torch.arange(max_q, device=device)
    q_valid = i[None, :] < q_lens[:, None]  # [n, max_q]
    tok = (starts[:, None] + i[None, :]).clamp(max=query.shape[0] - 1)  # [n, max_q]
    q = query[tok]  # [n, max_q, num_heads, head_dim]
    k = gather_kv(key_cache, block_tables, seq_lens, max_len)  # [n, max_len, kv_heads, d]
    v = gather_kv(value_cache, block_tables, seq_lens, max_len)
    q_pos = (seq_lens - q_lens)[:, None] + i[None, :]  # [n, max_q] absolute positions
    k_pos = torch.arange(max_len, device=device)
    # Padded query rows (i >= q_len) have q_pos >= seq_len, so they still see key 0 and never
    # produce an all-masked row; they are dropped below.
    mask = (k_pos[None, None, :] <= q_pos[:, :, None]) & (k_pos[None, None, :]
                                                          < seq_lens[:, None, None])
    o = _attend(q, k, v, mask, scale)  # [n, max_q, num_heads, head_dim]
    out[tok[q_valid]] = o[q_valid]


def paged_attention_prefill(query: torch.Tensor, key_cache: torch.Tensor,
                            value_cache: torch.Tensor, block_tables: torch.Tensor,
                            cu_seqlens_q: torch.Tensor, seq_lens: torch.Tensor,
                            scale: float) -> torch.Tensor:
    """Varlen causal attention of new tokens over cached context plus themselves.

    query: [num_tokens, num_heads, head_dim], sequences back to back as given by
    `cu_seqlens_q` -> [num_tokens, num_heads, head_dim].

    Sequences are attended as one padded batch when padding wastes at most half the work;
    otherwise the one-token sequences form one batch and each longer sequence runs alone, so a
    long prompt next to many decode tokens does not pad every row to its length.
    """
    out = torch.empty_like(query)
    if query.shape[0] == 0:
        return out
    cu = cu_seqlens_q.long()
    starts_all = cu[:-1]  # [num_seqs]
    q_lens_all = cu[1:] - cu[:-1]  # [num_seqs]
    lens_all = seq_lens.long()
    nonempty = q_lens_all > 0
    idx = torch.nonzero(nonempty).flatten()
    starts, q_lens, lens = starts_all[idx], q_lens_all[idx], lens_all[idx]
    bt = block_tables[idx]

    padded_work = idx.numel() * int(q_lens.max()) * int(lens.max())
    real_work = int((q_lens * lens).sum())
    if padded_work <= 2 * real_work + 4096:
        _prefill_padded(query, key_cache, value_cache, bt, starts, q_lens, lens, scale, out)
        return out
    single = q_lens == 1
    if bool(single.any()):
        _prefill_padded(query, key_cache, value_cache, bt[single], starts[single],
                        q_lens[single], lens[single], scale, out)
    for j in torch.nonzero(~single).flatten().tolist():
        _prefill_padded(query, key_cache, value_cache, bt[j:j + 1], starts[j:j + 1],
                        q_lens[j:j + 1], lens[j:j + 1], scale, out)
    return out
