"""The "torch" backend: paged attention in plain PyTorch, written to be read.

`paged_attention` is the whole idea in a dozen lines: for each sequence, gather its
keys and values out of the cache block by block (`gather_kv`: the block table says which
physical block holds positions 0..15, 16..31, ...), then attend as in the Transformer paper,
softmax(q kᵀ / √d + causal mask) v (`attend`), each query head reading the KV head of its GQA
group. Decode is the same with one query per sequence. This is what `llmlab.ops` runs for
`backend="torch"`, and what every other backend is checked against (with `llmlab.ops.reference`).

Below it, `grouped_attention` is an optimisation of the same computation that an engine on
the "torch" backend runs each layer (`llmlab.ops.attention`): instead of one sequence at a
time, sequences of similar length are padded into one batch and attended by one
`scaled_dot_product_attention` call. The grouping is planned once per step and kept in the
step's metadata. The tests check it against the readable functions.

Arguments are validated by `llmlab.ops` before these functions are called.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from llmlab.ops.fp8 import FP8_DTYPE, dequantize_fp8, quantize_fp8
from llmlab.utils import cdiv

if TYPE_CHECKING:
    from llmlab.ops.metadata import AttentionMetadata
    from llmlab.ops.paged_kv import PagedKV


def reshape_and_cache(
    key: torch.Tensor, value: torch.Tensor, kv: PagedKV, slot_mapping: torch.Tensor
) -> None:
    """Write key/value `[num_tokens, num_kv_heads, head_dim]` into the cache at `slot_mapping`.
    An fp8 cache stores key / k_scale and value / v_scale (vLLM's fp8 KV write)."""
    key_cache, value_cache = kv.key_cache, kv.value_cache
    if key_cache.dtype == FP8_DTYPE:  # PyTorch copies fp8 rows as bytes
        key = quantize_fp8(key, kv.k_scale).view(torch.uint8)
        value = quantize_fp8(value, kv.v_scale).view(torch.uint8)
        key_cache, value_cache = key_cache.view(torch.uint8), value_cache.view(torch.uint8)
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


def gather_kv(cache: torch.Tensor, block_table: torch.Tensor, seq_len: int) -> torch.Tensor:
    """One sequence's keys (or values) in position order, `[seq_len, num_kv_heads, head_dim]`:
    its blocks one after another, cut at its length (slots past it are never read)."""
    block_size = cache.shape[1]
    blocks = cache[block_table[: cdiv(seq_len, block_size)].long()]  # [n_blk, block_size, kvh, d]
    return blocks.reshape(-1, *cache.shape[2:])[:seq_len]


def attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    scale: float,
    first_pos: int,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
) -> torch.Tensor:
    """softmax(q kᵀ · scale + causal mask) v for one sequence, in float32.

    q [n, num_heads, d]: queries at positions first_pos .. first_pos + n - 1;
    k, v [L, num_kv_heads, d]: positions 0 .. L - 1 (fp8: k · k_scale, v · v_scale).
    Returns [n, num_heads, d] in q's dtype.
    """
    group = q.shape[1] // k.shape[1]
    k = dequantize_fp8(k, k_scale) if k.dtype == FP8_DTYPE else k.float()
    v = dequantize_fp8(v, v_scale) if v.dtype == FP8_DTYPE else v.float()
    k = k.repeat_interleave(group, dim=1)  # [L, num_heads, d] (GQA)
    v = v.repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q.float(), k) * scale  # [num_heads, n, L]
    q_pos = first_pos + torch.arange(q.shape[0], device=q.device)[:, None]  # [n, 1]
    k_pos = torch.arange(k.shape[0], device=q.device)[None, :]  # [1, L]
    scores = scores.masked_fill(k_pos > q_pos, float("-inf"))  # a query sees no later key
    probs = scores.softmax(dim=-1)  # [num_heads, n, L]
    return torch.einsum("hqk,khd->qhd", probs, v).to(q.dtype)  # [n, num_heads, d]


def paged_attention(query: torch.Tensor, kv: PagedKV, scale: float) -> torch.Tensor:
    """Varlen causal attention, one sequence at a time: query [num_tokens, num_heads, d] ->
    [num_tokens, num_heads, d]. Sequence s's queries are rows cu_seqlens_q[s]:cu_seqlens_q[s+1]
    (decode: row s alone) and sit at the last positions of its seq_lens[s] tokens."""
    out = torch.empty_like(query)
    cu = kv.query_offsets().tolist()
    for s, seq_len in enumerate(kv.seq_lens.tolist()):
        q = query[cu[s] : cu[s + 1]]  # [n, num_heads, d]
        k = gather_kv(kv.key_cache, kv.block_tables[s], seq_len)  # [seq_len, kvh, d]
        v = gather_kv(kv.value_cache, kv.block_tables[s], seq_len)
        first_pos = seq_len - q.shape[0]
        out[cu[s] : cu[s + 1]] = attend(q, k, v, scale, first_pos, kv.k_scale, kv.v_scale)
    return out


# ---- an optimisation of the above: sequences grouped by length -------------------------------
#
# 1. Plan once per step: the sequences are split into groups of similar length (a small dynamic
#    programme over their block counts, trading padding against the fixed cost of one more
#    group), because every sequence of a group is padded to the group's longest.
# 2. Gather each group's K/V whole blocks at a time (`index_select`) into a padded batch
#    `[n, num_blocks * block_size, num_kv_heads, head_dim]`, in a buffer kept for the step.
# 3. Zero the gathered slots at or past each sequence's length: `0 * NaN` is NaN, so a NaN left
#    in an unused cache slot would otherwise leak through the masked softmax.
# 4. GQA without copying K/V: the query heads that share a KV head are stacked as extra query
#    rows, so `scaled_dot_product_attention` sees `[n, num_kv_heads, group * q_len, head_dim]`.

# A group costs a handful of fixed-size operations (gathers, fills, one attention call) whatever
# its size; in padded key slots that is about this many (measured on a 2-core CPU).
GROUP_COST_SLOTS = 1024


@dataclass
class _Group:
    """Sequences attended as one padded batch."""

    rows: torch.Tensor  # [n] int64: which sequences (indices into the call's sequences)
    blocks: torch.Tensor  # [n * num_blk] int64: cache blocks to gather (unused -> 0)
    invalid: torch.Tensor  # [k] int64: gathered slots at or past their sequence's length
    valid: torch.Tensor  # [n, num_blk * block_size] bool: key slot < seq_len
    seq_lens: torch.Tensor  # [n] int64
    num_blk: int
    query_rows: torch.Tensor | None = None  # decode: rows of the one-token queries it serves
    # first block when the group's blocks are consecutive cache blocks, in order, every slot
    # valid: the padded batch is then a view of the cache and needs no gather
    view_start: int | None = None

    @property
    def n(self) -> int:
        return self.rows.shape[0]


def _make_group(
    rows: torch.Tensor, block_tables: torch.Tensor, seq_lens: torch.Tensor, block_size: int
) -> _Group:
    lens = seq_lens[rows].long()  # [n]
    num_blk = max(1, cdiv(int(lens.max()), block_size))
    bt = block_tables[rows, :num_blk].long()  # [n, num_blk]
    used = (lens + block_size - 1) // block_size  # [n]
    bt = torch.where(torch.arange(num_blk, device=bt.device)[None, :] < used[:, None], bt, 0)
    pos = torch.arange(num_blk * block_size, device=bt.device)
    valid = pos[None, :] < lens[:, None]  # [n, num_blk * bs]
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
    blocks = [cdiv(n, block_size) for n in lens]
    values = sorted(set(blocks))  # distinct block counts
    count = {v: 0 for v in values}
    for b in blocks:
        count[b] += 1
    D = len(values)
    best = [0.0] + [float("inf")] * D  # best[j]: cost of the first j distinct values
    cut = [0] * (D + 1)
    for j in range(1, D + 1):
        width = values[j - 1] * block_size  # a group ending at value j pads to this many slots
        members = 0
        for i in range(j, 0, -1):  # group = values i..j
            members += count[values[i - 1]]
            cost = best[i - 1] + members * width + GROUP_COST_SLOTS
            if cost < best[j]:
                best[j], cut[j] = cost, i - 1
    groups_of_values = []
    j = D
    while j > 0:
        groups_of_values.append(set(values[cut[j] : j]))
        j = cut[j]
    return [[s for s, b in enumerate(blocks) if b in vs] for vs in reversed(groups_of_values)]


@dataclass
class _Plan:
    decode: list[_Group]  # one-token sequences
    prefill: list[tuple[_Group, torch.Tensor, torch.Tensor]]  # (group, starts [n], q_lens [n])
    decode_rows: torch.Tensor | None  # [m] flat token index of each one-token sequence


def _build_plan(block_tables, seq_lens, block_size, cu_seqlens_q) -> _Plan:
    device = block_tables.device
    lens = seq_lens.tolist()
    if cu_seqlens_q is None:  # decode: every sequence brings one token
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
                prefill.append(
                    (
                        g,
                        torch.tensor([starts[s] for s in sub], device=device),
                        torch.tensor([q_lens[s] for s in sub], device=device),
                    )
                )
    return _Plan(decode, prefill, decode_rows)


# ---- gathering and attending ---------------------------------------------------------------


def _gather(cache: torch.Tensor, g: _Group, out: torch.Tensor) -> torch.Tensor:
    """The group's K or V, `[n, num_blk * block_size, kv_heads, head_dim]`, zero past each length,
    written into `out` (a flat buffer of at least that many elements). When the group's blocks
    already lie in the cache in that order, a view of the cache instead (read only)."""
    _, block_size, num_kv_heads, head_dim = cache.shape
    n_blocks = g.blocks.shape[0]
    if g.view_start is not None:  # e.g. a contiguous cache, every sequence full
        return cache[g.view_start : g.view_start + n_blocks].view(
            g.n, g.num_blk * block_size, num_kv_heads, head_dim
        )
    out = out[: n_blocks * block_size * num_kv_heads * head_dim].view(
        n_blocks, block_size, num_kv_heads, head_dim
    )
    torch.index_select(cache, 0, g.blocks, out=out)
    if g.invalid.numel():  # (fp8 through its bytes: 0x00 is +0.0)
        rows = out.view(-1, num_kv_heads * head_dim)
        (rows.view(torch.uint8) if rows.dtype == FP8_DTYPE else rows).index_fill_(0, g.invalid, 0)
    return out.view(g.n, g.num_blk * block_size, num_kv_heads, head_dim)


def _attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor,
    scale: float,
    kv_scales: tuple[float, float] = (1.0, 1.0),
) -> torch.Tensor:
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
    if k.dtype == FP8_DTYPE:  # the fp8 cache read back: stored · scale
        k, v = dequantize_fp8(k, kv_scales[0]), dequantize_fp8(v, kv_scales[1])
    kf = k.float().permute(0, 2, 1, 3)  # [n, num_kv_heads, kv_len, head_dim]
    vf = v.float().permute(0, 2, 1, 3)
    m = None
    if mask is not None:  # None: every query sees every key (saves the mask's cost)
        m = (
            mask[:, None, None]
            .expand(n, 1, group, q_len, kv_len)
            .reshape(n, 1, group * q_len, kv_len)
        )
    o = F.scaled_dot_product_attention(qf, kf, vf, attn_mask=m, scale=scale)
    # o: [n, num_kv_heads, group * q_len, head_dim]
    o = o.view(n, num_kv_heads, group, q_len, head_dim).permute(0, 3, 1, 2, 4)
    return o.reshape(n, q_len, num_heads, head_dim).to(out_dtype)


def _decode_groups(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    groups: list[_Group],
    scale: float,
    out: torch.Tensor,
    buffers: tuple[torch.Tensor, torch.Tensor],
    kv_scales: tuple[float, float] = (1.0, 1.0),
) -> None:
    """query [m, heads, d] of one-token sequences -> out [m, heads, d], group by group."""
    for g in groups:
        k = _gather(key_cache, g, buffers[0])
        v = _gather(value_cache, g, buffers[1])
        q = query if len(groups) == 1 else query.index_select(0, g.query_rows)
        mask = g.valid[:, None, :] if g.invalid.numel() else None  # all valid: no mask
        o = _attend(q[:, None], k, v, mask, scale, kv_scales)[:, 0]  # [n, heads, d]
        if len(groups) == 1:
            out.copy_(o)
        else:
            out.index_copy_(0, g.query_rows, o)


def _prefill_padded(
    query,
    key_cache,
    value_cache,
    g: _Group,
    starts,
    q_lens,
    scale,
    out,
    buffers,
    kv_scales=(1.0, 1.0),
) -> None:
    """Attend the group's sequences (q_len > 1) as one padded batch; write their rows of `out`."""
    device = query.device
    max_q = int(q_lens.max())
    i = torch.arange(max_q, device=device)
    q_valid = i[None, :] < q_lens[:, None]  # [n, max_q]
    tok = (starts[:, None] + i[None, :]).clamp(max=query.shape[0] - 1)  # [n, max_q]
    q = query[tok]  # [n, max_q, num_heads, head_dim]
    k = _gather(key_cache, g, buffers[0])  # [n, kv_len, kv_heads, d]
    v = _gather(value_cache, g, buffers[1])
    q_pos = (g.seq_lens - q_lens)[:, None] + i[None, :]  # [n, max_q] absolute positions
    k_pos = torch.arange(k.shape[1], device=device)
    # Padded query rows (i >= q_len) have q_pos >= seq_len, so they still see key 0 and never
    # produce an all-masked row; they are dropped below.
    mask = (k_pos[None, None, :] <= q_pos[:, :, None]) & g.valid[:, None, :]
    o = _attend(q, k, v, mask, scale, kv_scales)  # [n, max_q, num_heads, head_dim]
    out[tok[q_valid]] = o[q_valid]


def _step_plan(md: AttentionMetadata, key_cache: torch.Tensor):
    """The step's grouping and gather buffers, planned on the step's first layer and kept in its
    metadata for the others (every layer of a step has the same sequences)."""
    state = md.backend_state
    if "plan" not in state:
        block_size = key_cache.shape[1]
        cu = None if md.is_decode_only else md.cu_seqlens_q
        plan = _build_plan(md.block_tables, md.seq_lens, block_size, cu)
        groups = plan.decode + [g for g, _, _ in plan.prefill]
        numel = (
            max((g.blocks.shape[0] for g in groups), default=0)
            * block_size
            * key_cache.shape[2]
            * key_cache.shape[3]
        )
        buffers = tuple(
            torch.empty(max(numel, 1), dtype=key_cache.dtype, device=key_cache.device)
            for _ in range(2)
        )
        state["plan"] = (plan, buffers)
    return state["plan"]


def grouped_attention(
    query: torch.Tensor, kv: PagedKV, md: AttentionMetadata, scale: float
) -> torch.Tensor:
    """`paged_attention`'s result for the step `md` describes (`kv`: a layer's
    `md.paged_kv(layer)`), with sequences of similar length attended together.
    query [num_tokens, num_heads, d] -> [num_tokens, num_heads, d].

    One-token sequences (decodes, also those riding along in a chunked-prefill step) are grouped
    by length. Longer ones are attended as one padded batch when padding wastes at most half
    the work; otherwise each runs alone, so a long prompt does not pad short ones.
    """
    out = torch.empty_like(query)
    if query.shape[0] == 0:
        return out
    key_cache, value_cache, kv_scales = kv.key_cache, kv.value_cache, (kv.k_scale, kv.v_scale)
    plan, buffers = _step_plan(md, key_cache)
    if plan.decode:
        if plan.decode_rows is None:  # a decode-only step: every row is one sequence
            _decode_groups(
                query, key_cache, value_cache, plan.decode, scale, out, buffers, kv_scales
            )
        else:
            rows = plan.decode_rows
            q1 = query.index_select(0, rows)
            o1 = torch.empty_like(q1)
            _decode_groups(q1, key_cache, value_cache, plan.decode, scale, o1, buffers, kv_scales)
            out.index_copy_(0, rows, o1)
    for g, starts, q_lens in plan.prefill:
        _prefill_padded(
            query, key_cache, value_cache, g, starts, q_lens, scale, out, buffers, kv_scales
        )
    return out
