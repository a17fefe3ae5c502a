"""Triton kernels of a decoder layer's elementwise steps: RMSNorm (with the residual add),
rotary embedding fused with the KV-cache write, and SiLU x up (launched by `llmlab.ops.fused`,
imported through `llmlab.ops.triton_backend`, which settles the interpreter switch first, as
for `_triton_kernels`).

Every kernel computes in float32 and rounds its result to the output dtype as PyTorch does
(`_round_to`), so the fused layer gives the readable model's bits where the tests compare them.
"""

from __future__ import annotations

import triton
import triton.language as tl


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
