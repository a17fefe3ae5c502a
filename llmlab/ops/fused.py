"""Fused Triton kernels of a decoder layer: launchers for `llmlab.ops._triton_layer_kernels`.

A readable layer (`llmlab.model.DecoderLayer`) spends dozens of small PyTorch kernels on its
elementwise steps: RMSNorm is 6-8 of them, RoPE on q and k 14, the residual adds and SwiGLU a
few more. On a GPU each costs a launch of a few microseconds while it moves a few kilobytes,
so a decode step is bound by the host. The fast path of `llmlab.model.gpu` runs each of these
steps as one kernel, as vLLM's custom ops do (`vllm/model_executor/layers/layernorm.py`,
`rotary_embedding/base.py`, `activation.py`; their CUDA in `csrc/layernorm_kernels.cu`,
`csrc/pos_encoding_kernels.cu`, `csrc/activation_kernels.cu`):

- `rms_norm(x, weight, eps)`: the first layer's input norm.
- `fused_add_rms_norm(x, residual, weight, eps)`: residual += x, then x = rmsnorm(residual) *
  weight, both in place (vLLM's op of that name); every other norm of the stack.
- `rotary_embedding_and_cache(qkv, positions, cos_sin_cache, key_cache, value_cache,
  slot_mapping)`: RoPE on the q and k of the merged projection, and the rotated k with v
  written into their cache slots (vLLM's `rotary_embedding` followed by
  `reshape_and_cache_flash`, here one kernel); the fp8 e4m3 cache too.
- `silu_and_mul(x)`: silu(gate) * up of the merged gate/up projection (vLLM's op).

Each public launcher checks its arguments (names, shapes, dtypes, devices) and then calls its
unchecked inner twin (`_rms_norm`, ...), which the fused layer calls directly once a step's
inputs were checked. The kernels compile for CUDA tensors and run through the Triton
interpreter on CPU tensors, as `llmlab.ops.triton_backend` decides.
"""

from __future__ import annotations

import torch

from llmlab.ops import _checks
from llmlab.ops.paged_kv import PagedKV
from llmlab.ops.triton_backend import _load, check_device, interpreting, triton_next_power_of_2

FLOAT_DTYPES = _checks.FLOAT_DTYPES
_ELEMENTWISE_BLOCK = 1024  # columns per program of silu_and_mul


def _num_warps(block: int) -> int:
    """Warps for a program of `block` elements: about 256 elements per warp, 1 to 8 warps."""
    return max(1, min(8, block // 256))


# ---- RMSNorm ---------------------------------------------------------------------------------


def _check_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> None:
    _checks._check_tensor("x", x, 2, FLOAT_DTYPES, "[num_tokens, hidden]")
    _checks._check_tensor("weight", weight, 1, (x.dtype,), "[hidden] in x's dtype")
    if weight.shape[0] != x.shape[1]:
        _checks._fail("weight", f"shape {tuple(weight.shape)}", f"[hidden={x.shape[1]}] as x")
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not eps > 0:
        _checks._fail("eps", eps, "a positive float (the model's rms_norm_eps)")
    _checks._check_same_device([("x", x), ("weight", weight)])
    check_device({"x": x, "weight": weight})


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x [T, hidden] -> x / sqrt(mean(x^2) + eps) * weight, a new tensor in x's dtype."""
    _check_norm(x, weight, eps)
    return _rms_norm(x, weight, eps)


def fused_add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> None:
    """In place: residual += x, then x = rmsnorm(residual) * weight. x, residual [T, hidden]."""
    _check_norm(x, weight, eps)
    _checks._check_tensor("residual", residual, 2, (x.dtype,), "[num_tokens, hidden] as x")
    if residual.shape != x.shape:
        _checks._fail("residual", f"shape {tuple(residual.shape)}", f"x's {tuple(x.shape)}")
    _checks._check_same_device([("x", x), ("residual", residual)])
    _fused_add_rms_norm(x, residual, weight, eps)


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    out = torch.empty_like(x)  # [T, hidden]
    _launch_norm(x, x, weight, out, eps, add_residual=False)
    return out


def _fused_add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> None:
    _launch_norm(x, residual, weight, x, eps, add_residual=True)


def _launch_norm(x, residual, weight, out, eps: float, add_residual: bool) -> None:
    num_tokens, hidden = x.shape
    if num_tokens == 0:
        return
    block = triton_next_power_of_2(hidden)
    _load("_triton_layer_kernels").rms_norm_kernel[(num_tokens,)](
        x,
        residual,
        weight,
        out,
        float(eps),
        HIDDEN=hidden,
        BLOCK=block,
        ADD_RESIDUAL=add_residual,
        num_warps=_num_warps(block),
    )


# ---- rotary embedding fused with the KV-cache write -----------------------------------------


def rotary_embedding_and_cache(
    qkv: torch.Tensor,
    positions: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
) -> torch.Tensor:
    """Rotate the q and k heads of the merged projection `qkv` [T, (H + 2 KVH) * D] by their
    tokens' `positions` [T] (angles from `cos_sin_cache` [max_positions, D]: cos, then sin),
    write the rotated k and the v into `key_cache`, `value_cache` at `slot_mapping` [T]
    (slot -1: not written; an fp8 cache stores k / k_scale, v / v_scale), and return the
    rotated q [T, H, D]. KVH and D are the cache's; H follows from qkv's width."""
    _check_rotary(qkv, positions, cos_sin_cache, key_cache, value_cache, slot_mapping)
    check_device(
        {
            "qkv": qkv,
            "positions": positions,
            "cos_sin_cache": cos_sin_cache,
            "key_cache": key_cache,
            "value_cache": value_cache,
            "slot_mapping": slot_mapping,
        }
    )
    for name, v in (("k_scale", k_scale), ("v_scale", v_scale)):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
            _checks._fail(name, repr(v), "a positive float")
    kv = PagedKV(key_cache, value_cache, k_scale=k_scale, v_scale=v_scale)
    return _rotary_embedding_and_cache(qkv, positions, cos_sin_cache, kv, slot_mapping)


def _check_rotary(qkv, positions, cos_sin_cache, key_cache, value_cache, slot_mapping) -> None:
    num_blocks, block_size, num_kv_heads, head_dim = _checks.check_cache(key_cache, value_cache)
    _checks._check_tensor("qkv", qkv, 2, FLOAT_DTYPES, "[num_tokens, (H + 2 KVH) * head_dim]")
    heads = qkv.shape[1] // head_dim - 2 * num_kv_heads  # [q heads | k heads | v heads]
    if qkv.shape[1] % head_dim or heads < 1 or heads % num_kv_heads:
        _checks._fail(
            "qkv",
            f"shape {tuple(qkv.shape)}",
            f"[num_tokens, (num_heads + 2 * {num_kv_heads}) * {head_dim}] to match key_cache, "
            f"num_heads a positive multiple of num_kv_heads={num_kv_heads}",
        )
    if head_dim % 2:
        _checks._fail("key_cache", f"head_dim={head_dim}", "an even head_dim (RoPE rotates pairs)")
    _checks._check_new_dtype("qkv", qkv, key_cache)
    num_tokens = qkv.shape[0]
    for name, t in (("positions", positions), ("slot_mapping", slot_mapping)):
        _checks._check_tensor(name, t, 1, (torch.int64,), f"[num_tokens={num_tokens}] of int64")
        if t.shape[0] != num_tokens:
            _checks._fail(name, f"shape {tuple(t.shape)}", f"[num_tokens={num_tokens}] as qkv")
    _checks._check_tensor(
        "cos_sin_cache", cos_sin_cache, 2, (torch.float32,), "[max_positions, head_dim] float32"
    )
    if cos_sin_cache.shape[1] != head_dim:
        _checks._fail(
            "cos_sin_cache", f"shape {tuple(cos_sin_cache.shape)}", f"[max_positions, {head_dim}]"
        )
    _checks._check_same_device(
        [("qkv", qkv), ("positions", positions), ("cos_sin_cache", cos_sin_cache)]
        + [("key_cache", key_cache), ("slot_mapping", slot_mapping)]
    )
    _checks._check_slot_values(slot_mapping, num_blocks * block_size)
    if positions.device.type == "cpu" and num_tokens > 0:
        lo, hi = int(positions.min()), int(positions.max())
        if lo < 0 or hi >= cos_sin_cache.shape[0]:
            _checks._fail(
                "positions",
                f"a position {lo if lo < 0 else hi}",
                f"positions in [0, {cos_sin_cache.shape[0]}) = the rows of cos_sin_cache",
            )


def _rotary_embedding_and_cache(
    qkv: torch.Tensor,
    positions: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    kv: PagedKV,
    slot_mapping: torch.Tensor,
) -> torch.Tensor:
    """The fused layer's call: the cache and its scales as one layer's `PagedKV`, which the
    backends' cache write takes too."""
    key_cache, value_cache = kv.key_cache, kv.value_cache
    num_tokens = qkv.shape[0]
    _, _, num_kv_heads, head_dim = key_cache.shape
    num_heads = qkv.shape[1] // head_dim - 2 * num_kv_heads
    q = torch.empty((num_tokens, num_heads, head_dim), dtype=qkv.dtype, device=qkv.device)
    if num_tokens == 0:
        return q
    fp8 = key_cache.dtype == torch.float8_e4m3fn
    if fp8:  # the kernel writes the e4m3 bytes itself
        key_cache, value_cache = key_cache.view(torch.uint8), value_cache.view(torch.uint8)
    _load("_triton_layer_kernels").rotary_cache_kernel[(num_tokens,)](
        qkv,
        positions,
        cos_sin_cache,
        q,
        key_cache,
        value_cache,
        slot_mapping,
        1.0 / float(kv.k_scale),
        1.0 / float(kv.v_scale),
        NUM_HEADS=num_heads,
        NUM_KV_HEADS=num_kv_heads,
        HEAD_DIM=head_dim,
        BLOCK_H=triton_next_power_of_2(num_heads),
        BLOCK_KV=triton_next_power_of_2(num_kv_heads),
        BLOCK_HALF=triton_next_power_of_2(head_dim // 2),
        BLOCK_D=triton_next_power_of_2(head_dim),
        FP8=fp8,
        num_warps=_num_warps(num_heads * head_dim),
    )
    return q  # [T, H, D]


# ---- SiLU x up --------------------------------------------------------------------------------


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """x [T, 2 * I] = [gate | up] -> silu(gate) * up [T, I] in x's dtype."""
    _checks._check_tensor("x", x, 2, FLOAT_DTYPES, "[num_tokens, 2 * intermediate]")
    if x.shape[1] % 2:
        _checks._fail("x", f"shape {tuple(x.shape)}", "an even width: [gate | up]")
    check_device({"x": x})
    return _silu_and_mul(x)


def _silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    num_tokens, width = x.shape
    inter = width // 2
    out = torch.empty((num_tokens, inter), dtype=x.dtype, device=x.device)
    if num_tokens == 0:
        return out
    # the interpreter runs a program per NumPy call: one program per row is fastest there
    block = triton_next_power_of_2(inter) if interpreting() else _ELEMENTWISE_BLOCK
    grid = (num_tokens, -(-inter // block))
    _load("_triton_layer_kernels").silu_and_mul_kernel[grid](
        x, out, INTER=inter, BLOCK=block, num_warps=_num_warps(min(block, inter))
    )
    return out  # [T, I]
