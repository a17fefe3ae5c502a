"""Triton kernels for the paged KV cache: the cache write and paged attention (imported only by
`llmlab.ops.triton_backend`; the decoder layer's kernels are in `_triton_layer_kernels`).

Do not import this module directly: `triton_backend` first decides whether Triton must run
through its interpreter (TRITON_INTERPRET=1, no CUDA GPU) and only then imports this file,
because `@triton.jit` picks compiled or interpreted execution when a kernel is defined.

Layouts are the NHD ones of `llmlab.ops`; every tensor is contiguous, so flat offsets are
computed from the shapes. Scores are computed in fp32 and the softmax runs in base 2
(`exp2`, scale pre-multiplied by log2(e)), as FlashAttention does. Every `tl.dot` operand is
at least 16 x 16 so the same tiles compile on a GPU.

UPCAST (set by the launcher when interpreting) converts q/k/v to fp32 before `tl.dot`: the
Triton 3.9 interpreter multiplies bf16 dot operands as raw bits (garbage), and fp32 is exact
enough for the comparison with the reference anyway. Compiled kernels keep fp16/bf16 operands
for the tensor cores (accumulating in fp32).
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def reshape_and_cache_kernel(
    key_ptr,
    value_ptr,
    key_cache_ptr,
    value_cache_ptr,
    slot_ptr,
    ROW: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """One program per token: copy its [num_kv_heads * head_dim] row into its slot."""
    token = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_ptr + token)  # int64; -1 means "do not cache"
    offs = tl.arange(0, BLOCK)
    mask = offs < tl.where(slot >= 0, ROW, 0)  # an empty row when the slot is -1
    k = tl.load(key_ptr + token * ROW + offs, mask=mask)
    v = tl.load(value_ptr + token * ROW + offs, mask=mask)
    tl.store(key_cache_ptr + slot * ROW + offs, k, mask=mask)
    tl.store(value_cache_ptr + slot * ROW + offs, v, mask=mask)


@triton.jit
def _fp8_e4m3_to_f32(u):
    """fp8 e4m3 bytes (a uint8 tensor) -> float32, with integer operations only (any GPU, and
    the interpreter): sign to bit 31, exponent and mantissa to bits 20-26, then x 2^120 moves
    the exponent bias from 127 to 7 (subnormals included; the cache holds no NaN)."""
    u = u.to(tl.uint32)
    bits = ((u & 0x80) << 24) | ((u & 0x7F) << 20)
    return bits.to(tl.float32, bitcast=True) * 1.329227995784916e36


@triton.jit
def _attend_context(
    q,
    q_pos,
    start,
    end,
    table,
    k_head_ptr,
    v_head_ptr,
    qk_scale,
    k_scale,
    v_scale,
    NUM_KV_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr,
    UPCAST: tl.constexpr,
    FP8: tl.constexpr,
):
    """The query rows `q` [rows, BLOCK_D] of one KV head attend over the context positions
    start .. end - 1 of that head (`k_head_ptr`, `v_head_ptr`: the caches' first element of
    it), read through the block table `table` BLOCK_N at a time and folded into an
    online softmax (flash attention's, in base 2: qk_scale includes log2 e). With CAUSAL, row r
    sees only keys at positions <= q_pos[r] (decode passes any tensor: its one row per head sees
    every key below `end`). Returns the unnormalised output acc [rows, BLOCK_D] and each row's
    running max m and sum l."""
    d = tl.arange(0, q.shape[1])
    d_mask = d < HEAD_DIM
    # -1e30 rather than -inf keeps exp2(m_old - m_new) finite for empty partitions.
    m_i = tl.full([q.shape[0]], -1e30, dtype=tl.float32)
    l_i = tl.zeros([q.shape[0]], dtype=tl.float32)
    acc = tl.zeros(q.shape, dtype=tl.float32)
    for n0 in range(start, end, BLOCK_N):
        n = n0 + tl.arange(0, BLOCK_N)  # [BLOCK_N] logical positions
        n_mask = n < end
        block = tl.load(table + n // BLOCK_SIZE, mask=n_mask, other=0).to(tl.int64)
        slot = block * BLOCK_SIZE + n % BLOCK_SIZE
        kv_offs = slot * (NUM_KV_HEADS * HEAD_DIM)  # [BLOCK_N] from this head's first element
        # Masked loads never read unused slots, so whatever they hold (NaN) cannot leak in.
        k_mask = d_mask[:, None] & n_mask[None, :]
        k = tl.load(k_head_ptr + kv_offs[None, :] + d[:, None], mask=k_mask, other=0)
        k = _dot_operand(k, k_scale, UPCAST, FP8)  # [BLOCK_D, BLOCK_N]
        s = tl.dot(q, k, input_precision="ieee") * qk_scale  # [rows, BLOCK_N] fp32
        if CAUSAL:
            visible = n_mask[None, :] & (n[None, :] <= q_pos[:, None])
        else:
            visible = n_mask[None, :]
        s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v_mask = n_mask[:, None] & d_mask[None, :]
        v = tl.load(v_head_ptr + kv_offs[:, None] + d[None, :], mask=v_mask, other=0)
        v = _dot_operand(v, v_scale, UPCAST, FP8)  # [BLOCK_N, BLOCK_D]
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision="ieee")
        m_i = m_new
    return acc, m_i, l_i


@triton.jit
def _dot_operand(x, scale, UPCAST: tl.constexpr, FP8: tl.constexpr):
    """A loaded q, K or V tile as `tl.dot` takes it: an fp8 cache's e4m3 bytes (of value /
    scale) back to values; fp32 when UPCAST; else as stored."""
    if FP8:
        x = _fp8_e4m3_to_f32(x) * scale
    elif UPCAST:
        x = x.to(tl.float32)
    return x


@triton.jit
def paged_decode_kernel(
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    block_tables_ptr,
    seq_lens_ptr,
    out_ptr,
    part_m_ptr,
    part_l_ptr,
    qk_scale,
    k_scale,
    v_scale,
    max_blocks_per_seq,
    NUM_HEADS: tl.constexpr,
    NUM_KV_HEADS: tl.constexpr,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_G: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PARTITION: tl.constexpr,
    NUM_PARTITIONS: tl.constexpr,
    SPLIT: tl.constexpr,
    UPCAST: tl.constexpr,
    FP8: tl.constexpr,
):
    """Grid (num_seqs, num_kv_heads, num_partitions).

    One program serves all GROUP query heads sharing one KV head (rows of a [BLOCK_G, d] query
    tile, padded to >= 16 rows for tl.dot), so each K/V tile is read once per KV head. It walks
    the context positions [part * PARTITION, min(seq_len, (part + 1) * PARTITION)) in tiles of
    BLOCK_N tokens with an online softmax. Without SPLIT there is one partition covering the
    whole sequence and the normalised output is written; with SPLIT the unnormalised
    accumulator and its running max / sum go to the partials for `merge_partitions_kernel`.
    """
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    part = tl.program_id(2)
    # without SPLIT the launcher gives one partition (part 0) of 2^30 positions: the whole context
    start = part * PARTITION
    end = tl.minimum(tl.load(seq_lens_ptr + seq), start + PARTITION)

    g = tl.arange(0, BLOCK_G)
    d = tl.arange(0, BLOCK_D)
    row_mask = (g < GROUP)[:, None] & (d < HEAD_DIM)[None, :]
    head = kv_head * GROUP + g  # [BLOCK_G] query heads of this KV head
    q_offs = (seq.to(tl.int64) * NUM_HEADS + head)[:, None] * HEAD_DIM + d[None, :]
    q = _dot_operand(tl.load(q_ptr + q_offs, mask=row_mask, other=0.0), 1.0, UPCAST, False)
    table = block_tables_ptr + seq.to(tl.int64) * max_blocks_per_seq
    acc, m_i, l_i = _attend_context(
        q,
        g,
        start,
        end,
        table,
        k_cache_ptr + kv_head * HEAD_DIM,
        v_cache_ptr + kv_head * HEAD_DIM,
        qk_scale,
        k_scale,
        v_scale,
        NUM_KV_HEADS,
        HEAD_DIM,
        BLOCK_SIZE,
        BLOCK_N,
        False,
        UPCAST,
        FP8,
    )
    if SPLIT:
        # partials: acc [num_seqs, num_heads, NUM_PARTITIONS, HEAD_DIM] fp32, m/l
        # [num_seqs, num_heads, NUM_PARTITIONS] fp32.
        ml_offs = (seq.to(tl.int64) * NUM_HEADS + head) * NUM_PARTITIONS + part  # [BLOCK_G]
        tl.store(part_m_ptr + ml_offs, m_i, mask=g < GROUP)
        tl.store(part_l_ptr + ml_offs, l_i, mask=g < GROUP)
        tl.store(out_ptr + ml_offs[:, None] * HEAD_DIM + d[None, :], acc, mask=row_mask)
    else:
        out = acc / l_i[:, None]
        tl.store(out_ptr + q_offs, out.to(out_ptr.dtype.element_ty), mask=row_mask)


@triton.jit
def merge_partitions_kernel(
    part_acc_ptr,
    part_m_ptr,
    part_l_ptr,
    out_ptr,
    NUM_PARTITIONS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_P: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    """Grid (num_seqs * num_heads,): combine the split-K partials of one (sequence, head).

    With M = max_p m_p and w_p = 2^(m_p - M): out = sum_p w_p acc_p / sum_p w_p l_p.
    Empty partitions carry m = -1e30 and l = 0, so their weight is 0.
    """
    row = tl.program_id(0).to(tl.int64)  # seq * num_heads + head
    p = tl.arange(0, BLOCK_P)
    d = tl.arange(0, BLOCK_D)
    p_mask = p < NUM_PARTITIONS
    d_mask = d < HEAD_DIM
    m = tl.load(part_m_ptr + row * NUM_PARTITIONS + p, mask=p_mask, other=-1e30)
    l = tl.load(part_l_ptr + row * NUM_PARTITIONS + p, mask=p_mask, other=0.0)
    m_max = tl.max(m, 0)
    w = tl.exp2(m - m_max)  # [BLOCK_P]
    acc = tl.load(
        part_acc_ptr + (row * NUM_PARTITIONS + p)[:, None] * HEAD_DIM + d[None, :],
        mask=p_mask[:, None] & d_mask[None, :],
        other=0.0,
    )  # [BLOCK_P, BLOCK_D]
    total = tl.sum(acc * w[:, None], 0) / tl.sum(l * w, 0)  # [BLOCK_D]
    tl.store(out_ptr + row * HEAD_DIM + d, total.to(out_ptr.dtype.element_ty), mask=d_mask)


@triton.jit
def paged_prefill_kernel(
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    block_tables_ptr,
    seq_lens_ptr,
    cu_seqlens_q_ptr,
    out_ptr,
    qk_scale,
    k_scale,
    v_scale,
    max_blocks_per_seq,
    NUM_HEADS: tl.constexpr,
    NUM_KV_HEADS: tl.constexpr,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_N: tl.constexpr,
    UPCAST: tl.constexpr,
    FP8: tl.constexpr,
):
    """Grid (cdiv(max_query_len, BLOCK_M), num_seqs, num_heads): varlen causal attention.

    A program takes BLOCK_M query rows of one head of one sequence. Row i (0-based inside the
    sequence's new tokens) sits at absolute position context + i, context = seq_len - q_len,
    and attends to cached positions 0..context + i, so the same kernel serves a fresh prompt
    (context 0), a chunk of a long prompt, and a prompt whose prefix came from the cache.
    """
    m_blk = tl.program_id(0)
    seq = tl.program_id(1)
    head = tl.program_id(2)
    q_start = tl.load(cu_seqlens_q_ptr + seq)
    q_len = tl.load(cu_seqlens_q_ptr + seq + 1) - q_start
    context = tl.load(seq_lens_ptr + seq) - q_len

    i = m_blk * BLOCK_M + tl.arange(0, BLOCK_M)  # [BLOCK_M] rows inside the sequence
    d = tl.arange(0, BLOCK_D)
    row_mask = (i < q_len)[:, None] & (d < HEAD_DIM)[None, :]
    q_offs = ((q_start + i).to(tl.int64) * NUM_HEADS + head)[:, None] * HEAD_DIM + d[None, :]
    q = _dot_operand(tl.load(q_ptr + q_offs, mask=row_mask, other=0.0), 1.0, UPCAST, False)
    # The last row of this tile sees up to position context + min(m_blk*BLOCK_M+BLOCK_M, q_len)
    # - 1; a tile past the sequence's end does no work (its rows are not stored).
    last = tl.minimum(m_blk * BLOCK_M + BLOCK_M, q_len)
    end = tl.where(m_blk * BLOCK_M < q_len, context + last, 0)
    acc, m_i, l_i = _attend_context(
        q,
        context + i,  # [BLOCK_M] the rows' absolute positions
        0,
        end,
        block_tables_ptr + seq.to(tl.int64) * max_blocks_per_seq,
        k_cache_ptr + (head // GROUP) * HEAD_DIM,  # this head's KV head
        v_cache_ptr + (head // GROUP) * HEAD_DIM,
        qk_scale,
        k_scale,
        v_scale,
        NUM_KV_HEADS,
        HEAD_DIM,
        BLOCK_SIZE,
        BLOCK_N,
        True,
        UPCAST,
        FP8,
    )
    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    tl.store(out_ptr + q_offs, out.to(out_ptr.dtype.element_ty), mask=row_mask)
