"""The "torch" backend: paged attention in plain PyTorch, the engine's CPU path.

Strategy (no Python loop over tokens):

1. Plan once per forward. The sequences of a step are split into *groups* of similar length
   (a small dynamic programme over their block counts, trading padding against the fixed cost
   of one more group), because every sequence of a group is padded to the group's longest:
   one 600-token sequence among thirty 100-token ones would otherwise make every row 600 long.
   The plan depends only on `block_tables` and `seq_lens`, which every layer shares, so it is
   computed for the first layer and reused by the others.
2. Gather each group's K/V out of the paged cache, whole blocks at a time (`index_select`), into
   a padded batch `[n, num_blocks * block_size, num_kv_heads, head_dim]`. The batch lives in a
   workspace buffer that is reused from layer to layer and step to step: writing into memory
   already touched is several times faster on a CPU than into a freshly allocated tensor.
3. Zero the gathered slots at or past each sequence's length (only those rows, not the whole
   batch): `0 * NaN` is NaN, so a NaN left in an unused cache slot would otherwise leak through
   the masked softmax.
4. GQA without copying K/V: the `group = num_heads // num_kv_heads` query heads that share a KV
   head are stacked as extra query rows, so `scaled_dot_product_attention` sees
   `[n, num_kv_heads, group * q_len, head_dim]` against `[n, num_kv_heads, kv_len, head_dim]`,
   with a boolean mask (key position < seq_len, and for prefill also <= the query's position).
5. Half-precision inputs are upcast to fp32, so the softmax is computed in fp32; the output is
   cast back to the query dtype.

Arguments are validated by `llmlab.ops` before these functions are called.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from llmlab.ops._memo import LastValues

# A group costs a handful of fixed-size operations (gathers, fills, one attention call) whatever
# its size; in padded key slots that is about this many (measured on a 2-core CPU).
GROUP_COST_SLOTS = 1024


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


# ---- planning: which sequences are attended together, and what to gather -------------------

@dataclass
class _Group:
    """Sequences attended as one padded batch."""

    rows: torch.Tensor           # [n] int64: which sequences (indices into the call's sequences)
    blocks: torch.Tensor         # [n * num_blk] int64: cache blocks to gather (unused -> 0)
    invalid: torch.Tensor        # [k] int64: gathered slots at or past their sequence's length
    valid: torch.Tensor          # [n, num_blk * block_size] bool: key slot < seq_len
    seq_lens: torch.Tensor       # [n] int64
    num_blk: int
    query_rows: torch.Tensor | None = None   # decode: rows of the one-token queries it serves
    # first block when the group's blocks are consecutive cache blocks, in order, every slot
    # valid: the padded batch is then a view of the cache and needs no gather
    view_start: int | None = None

    @property
    def n(self) -> int:
        return self.rows.shape[0]


def _make_group(rows: torch.Tensor, block_tables: torch.Tensor, seq_lens: torch.Tensor,
                block_size: int) -> _Group:
    lens = seq_lens[rows].long()                                         # [n]
    num_blk = max(1, -(-int(lens.max()) // block_size))
    bt = block_tables[rows, :num_blk].long()                             # [n, num_blk]
    used = (lens + block_size - 1) // block_size                          # [n]
    bt = torch.where(torch.arange(num_blk, device=bt.device)[None, :] < used[:, None], bt, 0)
    pos = torch.arange(num_blk * block_size, device=bt.device)
    valid = pos[None, :] < lens[:, None]                                  # [n, num_blk * bs]
    invalid = torch.nonzero(~valid.reshape(-1)).flatten()
    blocks = bt.reshape(-1)
    view_start = None
    if invalid.numel() == 0:
        first = int(blocks[0])
        if bool((blocks == torch.arange(first, first + blocks.numel(), device=bt.device)).all()):
            view_start = first
    return _Group(rows, blocks, invalid, valid, lens, num_blk, view_start=view_start)


def _split_by_length(lens: list[int], block_size: int) -> list[list[int]]:
    """Partition sequence indices into groups, minimising padded slots + GROUP_COST_SLOTS each.

    Groups are contiguous runs of the sequences sorted by block count; a dynamic programme over
    the distinct block counts (at most max_len / block_size of them) finds the best cut.
    """
    blocks = [-(-n // block_size) for n in lens]
    values = sorted(set(blocks))                                          # distinct block counts
    count = {v: 0 for v in values}
    for b in blocks:
        count[b] += 1
    D = len(values)
    best = [0.0] + [float("inf")] * D       # best[j]: cost of the first j distinct values
    cut = [0] * (D + 1)
    for j in range(1, D + 1):
        width = values[j - 1] * block_size  # a group ending at value j pads to this many slots
        members = 0
        for i in range(j, 0, -1):           # group = values i..j
            members += count[values[i - 1]]
            cost = best[i - 1] + members * width + GROUP_COST_SLOTS
            if cost < best[j]:
                best[j], cut[j] = cost, i - 1
    groups_of_values = []
    j = D
    while j > 0:
        groups_of_values.append(set(values[cut[j]:j]))
        j = cut[j]
    return [[s for s, b in enumerate(blocks) if b in vs] for vs in reversed(groups_of_values)]


@dataclass
class _Plan:
    decode: list[_Group]                 # one-token sequences
    prefill: list[tuple[_Group, torch.Tensor, torch.Tensor]]  # (group, starts [n], q_lens [n])
    decode_rows: torch.Tensor | None     # [m] flat token index of each one-token sequence


_PLANS = LastValues()


def _plan(block_tables: torch.Tensor, seq_lens: torch.Tensor, block_size: int,
          cu_seqlens_q: torch.Tensor | None) -> _Plan:
    """The grouping for these sequences, built once per step: every layer passes the same
    metadata, and the memo (`llmlab.ops._memo`) compares its values."""
    plan = _PLANS.get((block_size,), block_tables, seq_lens, cu_seqlens_q)
    if plan is None:
        plan = _build_plan(block_tables, seq_lens, block_size, cu_seqlens_q)
        _PLANS.put((block_size,), (block_tables, seq_lens, cu_seqlens_q), plan)
    return plan


def _build_plan(block_tables, seq_lens, block_size, cu_seqlens_q) -> _Plan:
    device = block_tables.device
    lens = seq_lens.tolist()
    if cu_seqlens_q is None:             # decode: every sequence brings one token
        one = list(range(len(lens)))
        starts = q_lens = None
        decode_rows = None
    else:
        cu = cu_seqlens_q.tolist()
        starts = cu[:-1]
        q_lens = [b - a for a, b in zip(cu[:-1], cu[1:])]
        one = [s for s, q in enumerate(q_lens) if q == 1]
        decode_rows = torch.tensor([starts[s] for s in one], dtype=torch.long, device=device)
    decode = []
    for members in _split_by_length([lens[s] for s in one], block_size) if one else []:
        rows = torch.tensor([one[i] for i in members], dtype=torch.long, device=device)
        g = _make_group(rows, block_tables, seq_lens, block_size)
        g.query_rows = torch.tensor(members, dtype=torch.long, device=device)
        decode.append(g)
    prefill = []
    if q_lens is not None:
        multi = [s for s, q in enumerate(q_lens) if q > 1]
        if multi:
            padded = len(multi) * max(q_lens[s] for s in multi) * max(lens[s] for s in multi)
            real = sum(q_lens[s] * lens[s] for s in multi)
            # one padded call when padding wastes at most half the work, else one per sequence
            subsets = [multi] if padded <= 2 * real + 4096 else [[s] for s in multi]
            for sub in subsets:
                rows = torch.tensor(sub, dtype=torch.long, device=device)
                g = _make_group(rows, block_tables, seq_lens, block_size)
                prefill.append((g, torch.tensor([starts[s] for s in sub], device=device),
                                torch.tensor([q_lens[s] for s in sub], device=device)))
    return _Plan(decode, prefill, decode_rows)


# ---- gathering and attending ---------------------------------------------------------------

_workspace: dict[tuple, torch.Tensor] = {}


def _buffer(which: str, numel: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A reusable flat buffer of at least `numel` elements (grown, never shrunk)."""
    key = (which, dtype, device)
    buf = _workspace.get(key)
    if buf is None or buf.numel() < numel:
        # a normal tensor even when first needed inside inference mode (the engine's forward):
        # an inference tensor could not be written later by a call outside that mode
        with torch.inference_mode(False):
            buf = torch.empty(max(numel, 1), dtype=dtype, device=device)
        _workspace[key] = buf
    return buf[:numel]


def _gather(cache: torch.Tensor, g: _Group, which: str) -> torch.Tensor:
    """The group's K or V, `[n, num_blk * block_size, kv_heads, head_dim]`, zero past each length.

    Written into a workspace buffer: valid until the next `_gather` with the same `which`. When
    the group's blocks already lie in the cache in that order, a view of the cache (read only).
    """
    _, block_size, num_kv_heads, head_dim = cache.shape
    n_blocks = g.blocks.shape[0]
    if g.view_start is not None:         # e.g. a contiguous cache, every sequence full
        return cache[g.view_start:g.view_start + n_blocks].view(
            g.n, g.num_blk * block_size, num_kv_heads, head_dim)
    out = _buffer(which, n_blocks * block_size * num_kv_heads * head_dim, cache.dtype,
                  cache.device).view(n_blocks, block_size, num_kv_heads, head_dim)
    torch.index_select(cache, 0, g.blocks, out=out)
    if g.invalid.numel():
        out.view(-1, num_kv_heads * head_dim).index_fill_(0, g.invalid, 0)
    return out.view(g.n, g.num_blk * block_size, num_kv_heads, head_dim)


def gather_kv(cache: torch.Tensor, block_tables: torch.Tensor, seq_lens: torch.Tensor,
              max_len: int) -> torch.Tensor:
    """Gather `[num_seqs, max_len, num_kv_heads, head_dim]` from a paged cache (a new tensor).

    Positions at or past a sequence's length are zero (whatever the cache holds there), and
    block-table entries a sequence does not use are never dereferenced.
    """
    num_seqs = block_tables.shape[0]
    _, block_size, num_kv_heads, head_dim = cache.shape
    if num_seqs == 0:
        return cache.new_zeros(0, max_len, num_kv_heads, head_dim)
    rows = torch.arange(num_seqs, device=cache.device)
    g = _make_group(rows, block_tables, seq_lens.clamp(max=max_len), block_size)
    kv = _gather(cache, g, "gather_kv").clone()
    width = kv.shape[1]
    if width < max_len:
        kv = torch.cat([kv, kv.new_zeros(num_seqs, max_len - width, num_kv_heads, head_dim)], 1)
    return kv[:, :max_len]


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor,
            scale: float) -> torch.Tensor:
    """Masked GQA attention on a padded batch.

    q: [n, q_len, num_heads, head_dim]; k, v: [n, kv_len, num_kv_heads, head_dim];
    mask: [n, q_len, kv_len] bool (True = may attend), or None when every query may see every
    key. Returns [n, q_len, num_heads, head_dim] in q's dtype. Every row of `mask` must allow
    at least one key.
    """
    n, q_len, num_heads, head_dim = q.shape
    kv_len, num_kv_heads = k.shape[1], k.shape[2]
    group = num_heads // num_kv_heads
    out_dtype = q.dtype
    qf = q.float().view(n, q_len, num_kv_heads, group, head_dim)
    qf = qf.permute(0, 2, 3, 1, 4).reshape(n, num_kv_heads, group * q_len, head_dim)
    kf = k.float().permute(0, 2, 1, 3)  # [n, num_kv_heads, kv_len, head_dim]
    vf = v.float().permute(0, 2, 1, 3)
    m = None
    if mask is not None:             # None: every query sees every key (saves the mask's cost)
        m = mask[:, None, None].expand(n, 1, group, q_len, kv_len).reshape(
            n, 1, group * q_len, kv_len)
    o = F.scaled_dot_product_attention(qf, kf, vf, attn_mask=m, scale=scale)
    # o: [n, num_kv_heads, group * q_len, head_dim]
    o = o.view(n, num_kv_heads, group, q_len, head_dim).permute(0, 3, 1, 2, 4)
    return o.reshape(n, q_len, num_heads, head_dim).to(out_dtype)


def _decode_groups(query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                   groups: list[_Group], scale: float, out: torch.Tensor) -> None:
    """query [m, heads, d] of one-token sequences -> out [m, heads, d], group by group."""
    for g in groups:
        k = _gather(key_cache, g, "k")
        v = _gather(value_cache, g, "v")
        q = query if len(groups) == 1 else query.index_select(0, g.query_rows)
        mask = g.valid[:, None, :] if g.invalid.numel() else None      # all valid: no mask
        o = _attend(q[:, None], k, v, mask, scale)[:, 0]                # [n, heads, d]
        if len(groups) == 1:
            out.copy_(o)
        else:
            out.index_copy_(0, g.query_rows, o)


def paged_attention_decode(query: torch.Tensor, key_cache: torch.Tensor,
                           value_cache: torch.Tensor, block_tables: torch.Tensor,
                           seq_lens: torch.Tensor, scale: float) -> torch.Tensor:
    """One query token per sequence against its whole cached context.

    query: [num_seqs, num_heads, head_dim] -> [num_seqs, num_heads, head_dim].
    """
    out = torch.empty_like(query)
    if query.shape[0] == 0:
        return out
    plan = _plan(block_tables, seq_lens, key_cache.shape[1], None)
    _decode_groups(query, key_cache, value_cache, plan.decode, scale, out)
    return out


def _prefill_padded(query, key_cache, value_cache, g: _Group, starts, q_lens, scale,
                    out) -> None:
    """Attend the group's sequences (q_len > 1) as one padded batch; write their rows of `out`."""
    device = query.device
    max_q = int(q_lens.max())
    i = torch.arange(max_q, device=device)
    q_valid = i[None, :] < q_lens[:, None]  # [n, max_q]
    tok = (starts[:, None] + i[None, :]).clamp(max=query.shape[0] - 1)  # [n, max_q]
    q = query[tok]  # [n, max_q, num_heads, head_dim]
    k = _gather(key_cache, g, "k")  # [n, kv_len, kv_heads, d]
    v = _gather(value_cache, g, "v")
    q_pos = (g.seq_lens - q_lens)[:, None] + i[None, :]  # [n, max_q] absolute positions
    k_pos = torch.arange(k.shape[1], device=device)
    # Padded query rows (i >= q_len) have q_pos >= seq_len, so they still see key 0 and never
    # produce an all-masked row; they are dropped below.
    mask = (k_pos[None, None, :] <= q_pos[:, :, None]) & g.valid[:, None, :]
    o = _attend(q, k, v, mask, scale)  # [n, max_q, num_heads, head_dim]
    out[tok[q_valid]] = o[q_valid]


def paged_attention_prefill(query: torch.Tensor, key_cache: torch.Tensor,
                            value_cache: torch.Tensor, block_tables: torch.Tensor,
                            cu_seqlens_q: torch.Tensor, seq_lens: torch.Tensor,
                            scale: float) -> torch.Tensor:
    """Varlen causal attention of new tokens over cached context plus themselves.

    query: [num_tokens, num_heads, head_dim], sequences back to back as given by
    `cu_seqlens_q` -> [num_tokens, num_heads, head_dim].

    One-token sequences (decodes riding along in a chunked-prefill step) take the decode path,
    grouped by length. Longer ones are attended as one padded batch when padding wastes at most
    half the work; otherwise each runs alone, so a long prompt does not pad short ones.
    """
    out = torch.empty_like(query)
    if query.shape[0] == 0:
        return out
    plan = _plan(block_tables, seq_lens, key_cache.shape[1], cu_seqlens_q)
    if plan.decode:
        rows = plan.decode_rows
        q1 = query.index_select(0, rows)
        o1 = torch.empty_like(q1)
        _decode_groups(q1, key_cache, value_cache, plan.decode, scale, o1)
        out.index_copy_(0, rows, o1)
    for g, starts, q_lens in plan.prefill:
        _prefill_padded(query, key_cache, value_cache, g, starts, q_lens, scale, out)
    return out
