"""Triton kernels for the paged KV cache and the decoder layer's elementwise steps (imported
only by `llmlab.ops.triton_backend`, which `llmlab.ops.fused` loads them through).

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
def _online_softmax_tile(
    q,
    acc,
    m_i,
    l_i,
    n0,
    end,
    q_pos,
    table,
    k_cache_ptr,
    v_cache_ptr,
    kv_head,
    d,
    d_mask,
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
    """Fold keys/values n0 .. n0 + BLOCK_N - 1 (those below `end`), read through the block
    table, into the running softmax of the query rows `q`: max `m_i`, sum `l_i`, output `acc`
    (flash attention's online softmax, in base 2: qk_scale includes log2 e). With CAUSAL, row r
    sees only keys at positions <= q_pos[r] (decode passes any tensor: its one row per head
    sees every key below `end`). Returns the updated (acc, m_i, l_i)."""
    n = n0 + tl.arange(0, BLOCK_N)  # [BLOCK_N] logical positions
    n_mask = n < end
    block = tl.load(table + n // BLOCK_SIZE, mask=n_mask, other=0).to(tl.int64)
    slot = block * BLOCK_SIZE + n % BLOCK_SIZE
    kv_offs = (slot * NUM_KV_HEADS + kv_head) * HEAD_DIM  # [BLOCK_N]
    # Masked loads never read unused slots, so whatever they hold (NaN) cannot leak in.
    k = tl.load(
        k_cache_ptr + kv_offs[None, :] + d[:, None], mask=d_mask[:, None] & n_mask[None, :], other=0
    )  # [BLOCK_D, BLOCK_N]
    if FP8:  # the cache holds e4m3 bytes of value / scale
        k = _fp8_e4m3_to_f32(k) * k_scale
    elif UPCAST:
        k = k.to(tl.float32)
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
    v = tl.load(
        v_cache_ptr + kv_offs[:, None] + d[None, :], mask=n_mask[:, None] & d_mask[None, :], other=0
    )  # [BLOCK_N, BLOCK_D]
    if FP8:
        v = _fp8_e4m3_to_f32(v) * v_scale
    elif UPCAST:
        v = v.to(tl.float32)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision="ieee")
    return acc, m_new, l_i


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
    seq_len = tl.load(seq_lens_ptr + seq)
    if SPLIT:
        start = part * PARTITION
        end = tl.minimum(seq_len, start + PARTITION)
    else:
        start = 0
        end = seq_len

    g = tl.arange(0, BLOCK_G)
    d = tl.arange(0, BLOCK_D)
    g_mask = g < GROUP
    d_mask = d < HEAD_DIM
    head = kv_head * GROUP + g  # [BLOCK_G] query heads of this KV head
    q_offs = (seq.to(tl.int64) * NUM_HEADS + head)[:, None] * HEAD_DIM + d[None, :]
    q = tl.load(q_ptr + q_offs, mask=g_mask[:, None] & d_mask[None, :], other=0.0)
    if UPCAST:
        q = q.to(tl.float32)

    # -1e30 rather than -inf keeps exp2(m_old - m_new) finite for empty partitions.
    m_i = tl.full([BLOCK_G], -1e30, dtype=tl.float32)
    l_i = tl.zeros([BLOCK_G], dtype=tl.float32)
    acc = tl.zeros([BLOCK_G, BLOCK_D], dtype=tl.float32)
    table = block_tables_ptr + seq.to(tl.int64) * max_blocks_per_seq
    for n0 in range(start, end, BLOCK_N):
        acc, m_i, l_i = _online_softmax_tile(
            q,
            acc,
            m_i,
            l_i,
            n0,
            end,
            g,
            table,
            k_cache_ptr,
            v_cache_ptr,
            kv_head,
            d,
            d_mask,
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

    row_mask = g_mask[:, None] & d_mask[None, :]
    if SPLIT:
        # partials: acc [num_seqs, num_heads, NUM_PARTITIONS, HEAD_DIM] fp32, m/l
        # [num_seqs, num_heads, NUM_PARTITIONS] fp32.
        ml_offs = (seq.to(tl.int64) * NUM_HEADS + head) * NUM_PARTITIONS + part  # [BLOCK_G]
        tl.store(part_m_ptr + ml_offs, m_i, mask=g_mask)
        tl.store(part_l_ptr + ml_offs, l_i, mask=g_mask)
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
    kv_head = head // GROUP
    q_start = tl.load(cu_seqlens_q_ptr + seq)
    q_len = tl.load(cu_seqlens_q_ptr + seq + 1) - q_start
    seq_len = tl.load(seq_lens_ptr + seq)
    context = seq_len - q_len

    i = m_blk * BLOCK_M + tl.arange(0, BLOCK_M)  # [BLOCK_M] rows inside the sequence
    d = tl.arange(0, BLOCK_D)
    row_mask = i < q_len
    d_mask = d < HEAD_DIM
    q_pos = context + i  # [BLOCK_M] absolute positions
    q_offs = ((q_start + i).to(tl.int64) * NUM_HEADS + head)[:, None] * HEAD_DIM + d[None, :]
    q = tl.load(q_ptr + q_offs, mask=row_mask[:, None] & d_mask[None, :], other=0.0)
    if UPCAST:
        q = q.to(tl.float32)

    # The last row of this tile sees up to position context + min(m_blk*BLOCK_M+BLOCK_M, q_len)
    # - 1; a tile past the sequence's end does no work (its rows are not stored).
    last = tl.minimum(m_blk * BLOCK_M + BLOCK_M, q_len)
    end = tl.where(m_blk * BLOCK_M < q_len, context + last, 0)

    m_i = tl.full([BLOCK_M], -1e30, dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    table = block_tables_ptr + seq.to(tl.int64) * max_blocks_per_seq
    for n0 in range(0, end, BLOCK_N):
        acc, m_i, l_i = _online_softmax_tile(
            q,
            acc,
            m_i,
            l_i,
            n0,
            end,
            q_pos,
            table,
            k_cache_ptr,
            v_cache_ptr,
            kv_head,
            d,
            d_mask,
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
    tl.store(
        out_ptr + q_offs, out.to(out_ptr.dtype.element_ty), mask=row_mask[:, None] & d_mask[None, :]
    )


# ---- the decoder layer's elementwise steps (launched by `llmlab.ops.fused`) -----------------


@triton.jit
def _f32_to_fp8_e4m3(x):
    """float32 -> fp8 e4m3 bytes (uint8), saturating at +-448 and rounding to nearest even, as
    `llmlab.ops.fp8.quantize_fp8` does, with integer and float32 operations only (any GPU, and
    the interpreter). A normal value keeps 3 of its 23 mantissa bits (rounded at bit 20) and
    its exponent is rebiased from 127 to 7; below 2^-6 e4m3 counts in steps of 2^-9, and adding
    2^23 to |x| * 2^9 rounds it to that integer (nearest even) in the float32 adder."""
    x = tl.minimum(tl.maximum(x, -448.0), 448.0)
    sign = (x.to(tl.uint32, bitcast=True) >> 24) & 0x80
    a = tl.abs(x)
    bits = a.to(tl.uint32, bitcast=True)
    normal = ((bits + 0x7FFFF + ((bits >> 20) & 1)) >> 20) - (120 << 3)
    subnormal = ((a * 512.0 + 8388608.0) - 8388608.0).to(tl.uint32)
    return (sign | tl.where(a < 0.015625, subnormal, normal)).to(tl.uint8)


@triton.jit
def _round_to(x, dtype: tl.constexpr):
    """float32 `x` in `dtype`, rounded to nearest even as PyTorch rounds. Compiled,
    `x.to(tl.bfloat16)` does that already; the Triton interpreter truncates instead, so
    bfloat16 is rounded here with integer operations first (then the cast is exact): the same
    bits on a GPU, for a few integer operations more."""
    if dtype == tl.bfloat16:
        bits = x.to(tl.uint32, bitcast=True)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
        x = bits.to(tl.float32, bitcast=True)
    return x.to(dtype)


@triton.jit
def rms_norm_kernel(
    x_ptr,
    residual_ptr,
    weight_ptr,
    out_ptr,
    eps,
    HIDDEN: tl.constexpr,
    BLOCK: tl.constexpr,
    ADD_RESIDUAL: tl.constexpr,
):
    """Grid (num_tokens,): one row each. With ADD_RESIDUAL, residual += x first (rounded to the
    model's dtype and stored back, as the readable model's `x + a` is) and the norm reads that
    sum. The norm rounds to the model's dtype before the weight, as `llmlab.model.RMSNorm`."""
    row = tl.program_id(0).to(tl.int64) * HIDDEN
    offs = tl.arange(0, BLOCK)
    mask = offs < HIDDEN
    x = tl.load(x_ptr + row + offs, mask=mask, other=0.0)
    if ADD_RESIDUAL:
        r = tl.load(residual_ptr + row + offs, mask=mask, other=0.0)
        x = _round_to(x.to(tl.float32) + r.to(tl.float32), r.dtype)
        tl.store(residual_ptr + row + offs, x, mask=mask)
    xf = x.to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(xf * xf, axis=0) / HIDDEN + eps)
    normed = _round_to(xf * rstd, x.dtype).to(tl.float32)
    w = tl.load(weight_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row + offs, _round_to(normed * w, out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _rotate_half(ptr, heads, i, mask, cos, sin, HEAD_DIM: tl.constexpr):
    """Load rows `heads` [BLOCK_H] of head_dim numbers at `ptr` and rotate each pair (x_i,
    x_{i + d/2}) by its angle (Hugging Face's "rotate half" layout, `llmlab.model.apply_rope`),
    in float32. Returns the two rotated halves, each [BLOCK_H, BLOCK_HALF]."""
    offs = heads[:, None] * HEAD_DIM + i[None, :]
    x1 = tl.load(ptr + offs, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(ptr + offs + HEAD_DIM // 2, mask=mask, other=0.0).to(tl.float32)
    return x1 * cos - x2 * sin, x2 * cos + x1 * sin


@triton.jit
def rotary_cache_kernel(
    qkv_ptr,
    positions_ptr,
    cos_sin_ptr,
    q_out_ptr,
    key_cache_ptr,
    value_cache_ptr,
    slot_ptr,
    k_inv_scale,
    v_inv_scale,
    NUM_HEADS: tl.constexpr,
    NUM_KV_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_KV: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
    BLOCK_D: tl.constexpr,
    FP8: tl.constexpr,
):
    """Grid (num_tokens,). A token's row of the merged projection is [q heads | k heads |
    v heads], each head_dim wide. Its q heads are rotated into q_out [T, H, D]; its k heads are
    rotated and, with its v heads, written into the cache at the token's slot (slot -1: not
    written). cos_sin [max_positions, D] holds cos in its first half, sin in its second (vLLM's
    `cos_sin_cache`). FP8: the cache holds e4m3 bytes of k * k_inv_scale, v * v_inv_scale."""
    token = tl.program_id(0).to(tl.int64)
    half = HEAD_DIM // 2
    row = qkv_ptr + token * (NUM_HEADS + 2 * NUM_KV_HEADS) * HEAD_DIM
    i = tl.arange(0, BLOCK_HALF)
    i_mask = i < half
    angles = cos_sin_ptr + tl.load(positions_ptr + token) * HEAD_DIM
    cos = tl.load(angles + i, mask=i_mask, other=0.0)[None, :]  # [1, BLOCK_HALF] fp32
    sin = tl.load(angles + half + i, mask=i_mask, other=0.0)[None, :]

    h = tl.arange(0, BLOCK_H)
    q_mask = (h < NUM_HEADS)[:, None] & i_mask[None, :]
    q1, q2 = _rotate_half(row, h, i, q_mask, cos, sin, HEAD_DIM)  # [BLOCK_H, BLOCK_HALF] x2
    q_out = q_out_ptr + token * NUM_HEADS * HEAD_DIM + h[:, None] * HEAD_DIM + i[None, :]
    tl.store(q_out, _round_to(q1, q_out_ptr.dtype.element_ty), mask=q_mask)
    tl.store(q_out + half, _round_to(q2, q_out_ptr.dtype.element_ty), mask=q_mask)

    slot = tl.load(slot_ptr + token)  # int64; -1: do not cache
    kh = tl.arange(0, BLOCK_KV)
    kv_rows = (kh < tl.where(slot >= 0, NUM_KV_HEADS, 0))[:, None]  # no rows when slot is -1
    k_mask = kv_rows & i_mask[None, :]
    k1, k2 = _rotate_half(row + NUM_HEADS * HEAD_DIM, kh, i, k_mask, cos, sin, HEAD_DIM)
    d = tl.arange(0, BLOCK_D)
    v_mask = kv_rows & (d < HEAD_DIM)[None, :]
    v_offs = (NUM_HEADS + NUM_KV_HEADS) * HEAD_DIM + kh[:, None] * HEAD_DIM + d[None, :]
    v = tl.load(row + v_offs, mask=v_mask, other=0.0)  # [BLOCK_KV, BLOCK_D]
    k_dst = key_cache_ptr + slot * NUM_KV_HEADS * HEAD_DIM + kh[:, None] * HEAD_DIM + i[None, :]
    v_dst = value_cache_ptr + slot * NUM_KV_HEADS * HEAD_DIM + kh[:, None] * HEAD_DIM + d[None, :]
    if FP8:
        k1 = _f32_to_fp8_e4m3(k1 * k_inv_scale)
        k2 = _f32_to_fp8_e4m3(k2 * k_inv_scale)
        v = _f32_to_fp8_e4m3(v.to(tl.float32) * v_inv_scale)
    else:
        k1 = _round_to(k1, key_cache_ptr.dtype.element_ty)
        k2 = _round_to(k2, key_cache_ptr.dtype.element_ty)
    tl.store(k_dst, k1, mask=k_mask)
    tl.store(k_dst + half, k2, mask=k_mask)
    tl.store(v_dst, v, mask=v_mask)


@triton.jit
def silu_and_mul_kernel(x_ptr, out_ptr, INTER: tl.constexpr, BLOCK: tl.constexpr):
    """Grid (num_tokens, cdiv(INTER, BLOCK)): out = silu(gate) * up, a row of x being
    [gate | up], each INTER wide. silu is rounded to the model's dtype before the product,
    as the readable `F.silu(gate) * up` rounds it."""
    token = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < INTER
    gate = tl.load(x_ptr + token * 2 * INTER + offs, mask=mask, other=0.0)
    up = tl.load(x_ptr + token * 2 * INTER + INTER + offs, mask=mask, other=0.0)
    g = gate.to(tl.float32)
    silu = _round_to(g / (1.0 + tl.exp(-g)), gate.dtype).to(tl.float32)
    out = _round_to(silu * up.to(tl.float32), out_ptr.dtype.element_ty)
    tl.store(out_ptr + token * INTER + offs, out, mask=mask)
