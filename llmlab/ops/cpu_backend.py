"""The "cpu" backend: paged attention in C (`kernels/cpu_attention.c`), reading K/V in place;
and the elementwise steps of a decoder layer in C (`kernels/cpu_layer.c`), which the engine's
CPU fast path (`llmlab.model.cpu`) runs. The library they live
in is built and loaded by `llmlab.ops.cpu_library`; the matmuls are `llmlab.ops.cpu_matmul`.

The "torch" backend copies every sequence's K/V out of its blocks into a padded batch, each
layer of each step, before `scaled_dot_product_attention` reads it again; at a batch of 128
decodes that copy and SDPA's per-(sequence, head) overhead are a third of the step. This backend
walks each sequence's block table and reads the K/V rows where they are, as vLLM's CPU backend
and its CUDA kernels do. One C function serves decode and (chunked) prefill. With this backend
the engine's fast path also runs each layer's norms, rotary embedding and SwiGLU product in C
(`rms_norm`, `rope`, `silu_mul` below; `llmlab.model.cpu.CpuDecoderLayer`): at batch 1 those
~55 small PyTorch calls per layer cost as much as a third of the matmuls. A step of one token of
one sequence goes further: all its layers are one C call (`llmlab.ops.cpu_decode`, the same
kernels inside one OpenMP region, like a CUDA graph replays a decode step's kernels on a GPU).

The C attention takes float32 queries over a float32 or fp8 (e4m3, with per-layer scales) cache,
`head_dim` 16, 32, 64, 128 or 256 and up to 16 query heads per KV head; other dtypes and shapes
run the torch backend's code on the same (CPU) tensors. Without a C compiler `available()`
says why and the ops raise a RuntimeError; `llmlab.ops.available_backends()` lists "cpu" only
where it can run.
"""

from __future__ import annotations

import ctypes

import torch

from llmlab.ops import torch_backend
from llmlab.ops.cpu_library import available, load_library, traced  # noqa: F401 (the backend's)
from llmlab.ops.fp8 import quantize_fp8
from llmlab.ops.paged_kv import PagedKV

HEAD_DIMS = (16, 32, 64, 128, 256)  # the C kernel has one unrolled variant for each
MAX_GROUP = 16
FP8 = torch.float8_e4m3fn


def attention_sizes_apply(heads: int, kv_heads: int, head_dim: int) -> bool:
    """Whether the C attention has a variant for `head_dim` and takes this GQA group (heads a
    multiple of kv_heads, at most MAX_GROUP query heads per KV head)."""
    return head_dim in HEAD_DIMS and heads % kv_heads == 0 and heads // kv_heads <= MAX_GROUP


def _kernel_for(query: torch.Tensor, key_cache: torch.Tensor) -> ctypes.CDLL | None:
    """The C library when it serves these tensors; None when the torch implementation must."""
    for name, t in (("query", query), ("key_cache", key_cache)):
        if t.device.type != "cpu":
            raise RuntimeError(
                f"backend='cpu' runs on CPU tensors; {name} is on {t.device}. "
                "Use backend='torch', 'triton' or 'cuda'."
            )
    group = query.shape[1] // key_cache.shape[2]
    if (
        query.dtype != torch.float32
        or key_cache.dtype not in (torch.float32, FP8)
        or query.shape[2] not in HEAD_DIMS
        or group > MAX_GROUP
    ):
        return None
    return load_library()


def reshape_and_cache(
    key: torch.Tensor, value: torch.Tensor, kv: PagedKV, slot_mapping: torch.Tensor
) -> None:
    """Write key/value `[num_tokens, num_kv_heads, head_dim]` into the cache at `slot_mapping`
    (an fp8 cache: key / k_scale, value / v_scale, rounded by PyTorch, copied by C)."""
    lib = _kernel_for(key, kv.key_cache)
    if lib is None:
        torch_backend.reshape_and_cache(key, value, kv, slot_mapping)
        return
    key_cache, value_cache = kv.key_cache, kv.value_cache
    if key_cache.dtype == FP8:
        key, value = quantize_fp8(key, kv.k_scale), quantize_fp8(value, kv.v_scale)
    row = key.shape[1] * key.shape[2]
    with traced("llmlab_cpu::reshape_and_cache"):
        lib.llmlab_reshape_and_cache(
            key.data_ptr(),
            value.data_ptr(),
            key.stride(0),
            value.stride(0),
            key_cache.data_ptr(),
            value_cache.data_ptr(),
            slot_mapping.data_ptr(),
            key.shape[0],
            row,
            key_cache.element_size(),
        )


def paged_attention(query: torch.Tensor, kv: PagedKV, scale: float) -> torch.Tensor:
    """Causal varlen attention over cached context plus the new tokens, decode (one query per
    sequence) or prefill: query [num_tokens, num_heads, head_dim] -> the same shape."""
    lib = _kernel_for(query, kv.key_cache)
    if lib is None:
        return torch_backend.paged_attention(query, kv, scale)
    num_tokens, num_heads, head_dim = query.shape
    key_cache = kv.key_cache
    cu_seqlens_q = kv.query_offsets()  # held here: C reads it through its pointer
    out = torch.empty_like(query)
    with traced("llmlab_cpu::paged_attention"):
        rc = lib.llmlab_paged_attention(
            query.data_ptr(),
            num_heads * head_dim,
            head_dim,
            key_cache.data_ptr(),
            kv.value_cache.data_ptr(),
            kv.block_tables.data_ptr(),
            kv.block_tables.shape[1],
            cu_seqlens_q.data_ptr(),
            kv.seq_lens.data_ptr(),
            kv.seq_lens.shape[0],
            num_heads,
            key_cache.shape[2],
            head_dim,
            key_cache.shape[1],
            scale,
            int(key_cache.dtype == FP8),
            kv.k_scale,
            kv.v_scale,
            out.data_ptr(),
        )
    if rc != 0:
        raise RuntimeError("cpu_attention.c refused the shapes (head_dim or GQA group too large)")
    return out


def decode_attention(
    qkv: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    kv: PagedKV,
    slot_mapping: torch.Tensor,
    heads: int,
    scale: float,
) -> torch.Tensor:
    """A decode step's attention from its stacked q/k/v rows in one C call (kernels/cpu_layer.c):
    RoPE of q and k, k and v into their cache slots, attention -> [S, heads, head_dim]. The same
    operations and results as `rope` (twice), `reshape_and_cache` and `paged_attention`, one
    work unit per (sequence, KV head) instead of four calls and their copies.

    qkv [S, (heads + 2 * kv_heads) * head_dim] float32 (rows may be strided): one new token per
    sequence of `kv` (a decode step: S == len(kv.seq_lens)); cos, sin [S, head_dim / 2];
    slot_mapping [S]; float32 caches, head_dim one of HEAD_DIMS, heads / kv_heads at most
    MAX_GROUP. The tables, lengths and slots are the step's metadata, checked when it was built
    (`llmlab.ops.metadata`), and are not checked again here."""
    _check_decode_attention(qkv, cos, sin, kv, slot_mapping, heads)
    key_cache, value_cache = kv.key_cache, kv.value_cache
    num_seqs, kv_heads, d = qkv.shape[0], key_cache.shape[2], key_cache.shape[3]
    q = torch.empty(num_seqs, heads * d, dtype=torch.float32)  # the rotated queries
    out = torch.empty(num_seqs, heads, d, dtype=torch.float32)
    with traced("llmlab_cpu::decode_attention"):
        rc = load_library().llmlab_decode_attention(
            qkv.data_ptr(),
            qkv.stride(0),
            cos.data_ptr(),
            sin.data_ptr(),
            slot_mapping.data_ptr(),
            kv.block_tables.data_ptr(),
            kv.block_tables.stride(0),
            kv.seq_lens.data_ptr(),
            num_seqs,
            key_cache.data_ptr(),
            value_cache.data_ptr(),
            key_cache.shape[1],
            heads,
            kv_heads,
            d,
            scale,
            q.data_ptr(),
            out.data_ptr(),
        )
    if rc != 0:
        raise RuntimeError("cpu_layer.c refused the decode attention's head_dim or GQA group")
    return out


def _check_decode_attention(qkv, cos, sin, kv: PagedKV, slot_mapping, heads: int) -> None:
    """ValueError naming the first of `decode_attention`'s arguments it cannot take (shapes,
    dtypes and layout only: no value of the step's metadata is read)."""
    key_cache, value_cache = kv.key_cache, kv.value_cache
    kv_heads, d = key_cache.shape[2], key_cache.shape[3]
    if not (
        all(
            t.dtype == torch.float32 and t.device.type == "cpu" and t.is_contiguous()
            for t in (key_cache, value_cache)
        )
        and attention_sizes_apply(heads, kv_heads, d)
        and kv.cu_seqlens_q is None
        and kv.block_tables is not None
        and kv.seq_lens is not None
    ):
        raise ValueError(
            f"decode_attention: kv: needs contiguous float32 CPU caches, head_dim in {HEAD_DIMS}, "
            f"heads {heads} a multiple of kv_heads {kv_heads} (at most {MAX_GROUP}x) and a "
            f"decode step's tables; got {key_cache.dtype} caches, head_dim {d}"
        )
    num_seqs = kv.seq_lens.shape[0]
    if not (_rows_ok(qkv, (heads + 2 * kv_heads) * d) and qkv.shape[0] == num_seqs):
        raise ValueError(
            f"decode_attention: qkv {tuple(qkv.shape)} {qkv.dtype} must be float32 "
            f"[{num_seqs}, {(heads + 2 * kv_heads) * d}] with contiguous rows, one per sequence"
        )
    if slot_mapping.shape != (num_seqs,) or slot_mapping.dtype != torch.int64:
        raise ValueError(
            f"decode_attention: slot_mapping must be int64 [{num_seqs}], got "
            f"{tuple(slot_mapping.shape)} {slot_mapping.dtype}"
        )
    half = (num_seqs, d // 2)
    if not all(
        tuple(c.shape) == half and c.dtype == torch.float32 and c.is_contiguous()
        for c in (cos, sin)
    ):
        raise ValueError(
            f"decode_attention: cos, sin must be contiguous float32 {list(half)}, got "
            f"{tuple(cos.shape)} {cos.dtype} and {tuple(sin.shape)} {sin.dtype}"
        )


# ---- a decoder layer's elementwise steps (kernels/cpu_layer.c) ------------------------------


def _rows_ok(t: torch.Tensor, width: int) -> bool:
    """A float32 CPU matrix [T, width] whose rows are contiguous (any row stride)."""
    return (
        t.dtype == torch.float32
        and t.device.type == "cpu"
        and t.dim() == 2
        and t.shape[1] == width
        and (t.stride(1) == 1 or width == 1)
    )


def rms_norm(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None
):
    """RMSNorm of `x` [T, D] -> [T, D]; with `residual`, of `x + residual`, returning
    (normed, x + residual) as vLLM's fused_add_rms_norm does. D % 16 == 0."""
    lib = load_library()
    t, d = x.shape
    if not (
        _rows_ok(x, d)
        and d % 16 == 0
        and weight.is_contiguous()
        and weight.dtype == torch.float32
        and weight.numel() == d
        and (residual is None or (_rows_ok(residual, d) and residual.shape[0] == t))
    ):
        raise ValueError(
            f"rms_norm: x {tuple(x.shape)} must be float32 [T, D] with contiguous "
            "rows and D % 16 == 0; weight float32 [D]; residual like x"
        )
    out = torch.empty(t, d, dtype=x.dtype)
    total = torch.empty(t, d, dtype=x.dtype) if residual is not None else None
    with traced("llmlab_cpu::rms_norm"):
        lib.llmlab_rms_norm(
            x.data_ptr(),
            x.stride(0),
            None if residual is None else residual.data_ptr(),
            0 if residual is None else residual.stride(0),
            weight.data_ptr(),
            None if total is None else total.data_ptr(),
            out.data_ptr(),
            t,
            d,
            eps,
        )
    return out if residual is None else (out, total)


def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up for [T, I] matrices (rows may be strided views), I % 16 == 0."""
    lib = load_library()
    t, i = gate.shape
    if not (_rows_ok(gate, i) and _rows_ok(up, i) and up.shape[0] == t and i % 16 == 0):
        raise ValueError(
            f"silu_mul: gate {tuple(gate.shape)} and up {tuple(up.shape)} must be "
            "float32 [T, I] with contiguous rows and I % 16 == 0"
        )
    out = torch.empty(t, i, dtype=gate.dtype)
    with traced("llmlab_cpu::silu_mul"):
        lib.llmlab_silu_mul(
            gate.data_ptr(), gate.stride(0), up.data_ptr(), up.stride(0), out.data_ptr(), t, i
        )
    return out


def rope(x: torch.Tensor, heads: int, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding of `x` [T, heads * D] (rows may be strided) with cos, sin [T, D/2]
    -> contiguous [T, heads, D] (`llmlab.model.apply_rope`'s math)."""
    lib = load_library()
    t, width = x.shape
    d = width // heads
    if not (
        _rows_ok(x, width)
        and width == heads * d
        and d % 2 == 0
        and all(c.is_contiguous() and c.dtype == torch.float32 for c in (cos, sin))
        and tuple(cos.shape) == (t, d // 2) == tuple(sin.shape)
    ):
        raise ValueError(
            f"rope: x {tuple(x.shape)}, cos {tuple(cos.shape)}: expected float32 "
            f"[T, heads * D] and [T, D/2]"
        )
    out = torch.empty(t, heads, d, dtype=x.dtype)
    with traced("llmlab_cpu::rope"):
        lib.llmlab_rope(
            x.data_ptr(), x.stride(0), cos.data_ptr(), sin.data_ptr(), out.data_ptr(), t, heads, d
        )
    return out


# ---- greedy sampling's argmax (kernels/cpu_sample.c) -----------------------------------------


def argmax_applies(logits: torch.Tensor) -> bool:
    """Whether `argmax_rows` takes these logits: float32 [B, V], V >= 1, contiguous rows, CPU."""
    return logits.dim() == 2 and logits.shape[1] >= 1 and _rows_ok(logits, logits.shape[1])


def argmax_rows(logits: torch.Tensor) -> torch.Tensor:
    """Each row's argmax of float32 logits [B, V] (rows may be strided) -> [B] int64: what
    `logits.argmax(dim=-1)` gives (the first of equal maxima; a row's first NaN where it holds
    one), 16 lanes at a time instead of one element (on a 2-core Zen 4, 49,152-token rows:
    44 against 10 us for one row, 2.1 against 0.21 ms for 64)."""
    if not argmax_applies(logits):
        raise ValueError(
            f"argmax_rows: logits {tuple(logits.shape)} {logits.dtype} on {logits.device}: "
            "expected float32 [B, V] with V >= 1 and contiguous rows, on the CPU"
        )
    out = torch.empty(logits.shape[0], dtype=torch.int64)
    with traced("llmlab_cpu::argmax_rows"):
        load_library().llmlab_argmax_rows(
            logits.data_ptr(), logits.stride(0), logits.shape[0], logits.shape[1], out.data_ptr()
        )
    return out
