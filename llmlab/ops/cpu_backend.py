"""The "cpu" backend: paged attention in C (`kernels/cpu_attention.c`), reading K/V in place;
the elementwise steps of a decoder layer in C (`kernels/cpu_layer.c`); and the fused one-token
decoder layer that the engine's CPU fast path (`llmlab.model.cpu`) runs. The library they live
in is built and loaded by `llmlab.ops.cpu_library`; the matmuls are `llmlab.ops.cpu_matmul`.

The "torch" backend copies every sequence's K/V out of its blocks into a padded batch, each
layer of each step, before `scaled_dot_product_attention` reads it again; at a batch of 128
decodes that copy and SDPA's per-(sequence, head) overhead are a third of the step. This backend
walks each sequence's block table and reads the K/V rows where they are, as vLLM's CPU backend
and its CUDA kernels do. One C function serves decode and (chunked) prefill. With this backend
the engine's fast path also runs each layer's norms, rotary embedding and SwiGLU product in C
(`rms_norm`, `rope`, `silu_mul` below; `llmlab.model.cpu.CpuDecoderLayer`): at batch 1 those
~55 small PyTorch calls per layer cost as much as a third of the matmuls. A step of one token of
one sequence goes further: each layer is one C call (`decode_layer`, the same kernels inside
one OpenMP region, like a CUDA graph replays a decode step's kernels on a GPU).

The C attention takes float32 queries over a float32 or fp8 (e4m3, with per-layer scales) cache,
`head_dim` 16, 32, 64, 128 or 256 and up to 16 query heads per KV head; other dtypes and shapes
run the torch backend's code on the same (CPU) tensors. Without a C compiler `available()`
says why and the ops raise a RuntimeError; `llmlab.ops.available_backends()` lists "cpu" only
where it can run.
"""

from __future__ import annotations

import contextlib
import ctypes

import torch

from llmlab.ops import torch_backend
from llmlab.ops.cpu_library import available, load_library, traced  # noqa: F401 (the backend's)
from llmlab.ops.cpu_matmul import WEIGHT_TYPES
from llmlab.ops.fp8 import quantize_fp8
from llmlab.ops.paged_kv import PagedKV

HEAD_DIMS = (16, 32, 64, 128, 256)  # the C kernel has one unrolled variant for each
MAX_GROUP = 16
FP8 = torch.float8_e4m3fn


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


# ---- a whole decoder layer for one token (kernels/cpu_layer.c, llmlab_decode_layer) ----------


def decode_layer_applies(heads: int, kv_heads: int, head_dim: int, hidden: int, inter: int) -> bool:
    """Whether `llmlab_decode_layer` takes a layer of these sizes (its attention kernel's head
    sizes and GQA groups, 16-float rows)."""
    return (
        hidden % 16 == 0
        and inter % 16 == 0
        and head_dim in HEAD_DIMS
        and heads % kv_heads == 0
        and heads // kv_heads <= MAX_GROUP
    )


def _check_layer_tensors(expected: dict, wdtype: torch.dtype) -> None:
    """ValueError naming the first of `expected` ({name: (tensor, shape)}) that is not a
    contiguous CPU tensor of that shape, in `wdtype` (the four matrices) or float32 (the rest)."""
    matrices = ("w_qkv", "w_o", "w_gate_up", "w_down")
    for name, (t, shape) in expected.items():
        want = wdtype if name in matrices else torch.float32
        fits = tuple(t.shape) == shape and t.dtype == want and t.device.type == "cpu"
        if not (fits and t.is_contiguous()):
            raise ValueError(
                f"decode layer: {name} is {tuple(t.shape)} {t.dtype} on "
                f"{t.device}, expected contiguous {want} {shape} on the CPU"
            )


class DecodeLayerPlan:
    """A decoder layer's weights, checked once, as `decode_layer` passes them to C: the
    tensors (kept alive here) and their pointers. Build it again when a weight changes."""

    def __init__(
        self,
        ln1: torch.Tensor,
        ln2: torch.Tensor,
        eps: float,
        w_qkv: torch.Tensor,
        b_qkv: torch.Tensor | None,
        w_o: torch.Tensor,
        w_gate_up: torch.Tensor,
        w_down: torch.Tensor,
        heads: int,
        kv_heads: int,
        head_dim: int,
        scale: float,
        weight_scales: tuple[torch.Tensor, ...] | None = None,
    ):
        """The four matrices in float32, bfloat16, or int8 with `weight_scales` (float32 scales
        per output row of w_qkv, w_o, w_gate_up, w_down)."""
        hidden, inter = ln1.numel(), w_down.shape[-1]
        wdtype = w_qkv.dtype
        if wdtype not in WEIGHT_TYPES or (wdtype == torch.int8) != (weight_scales is not None):
            raise ValueError(
                f"decode layer: weights are {wdtype}, expected one of "
                f"{tuple(WEIGHT_TYPES)} (int8 with weight_scales, others without)"
            )
        qw, kw = heads * head_dim, kv_heads * head_dim
        expected = {
            "ln1": (ln1, (hidden,)),
            "ln2": (ln2, (hidden,)),
            "w_qkv": (w_qkv, (qw + 2 * kw, hidden)),
            "w_o": (w_o, (hidden, qw)),
            "w_gate_up": (w_gate_up, (2 * inter, hidden)),
            "w_down": (w_down, (hidden, inter)),
        }
        if b_qkv is not None:
            expected["b_qkv"] = (b_qkv, (qw + 2 * kw,))
        if weight_scales is not None:
            for name, t in zip(("s_qkv", "s_o", "s_gate_up", "s_down"), weight_scales):
                expected[name] = (t, (expected["w" + name[1:]][1][0],))
        _check_layer_tensors(expected, wdtype)
        if not decode_layer_applies(heads, kv_heads, head_dim, hidden, inter):
            raise ValueError(
                f"decode layer: hidden {hidden} and intermediate {inter} must be "
                f"multiples of 16, head_dim {head_dim} one of {HEAD_DIMS}, heads "
                f"{heads} a multiple of kv_heads {kv_heads} (at most {MAX_GROUP}x)"
            )
        self.tensors = (ln1, ln2, w_qkv, b_qkv, w_o, w_gate_up, w_down, weight_scales)
        self.hidden, self.heads, self.kv_heads, self.head_dim, self.inter = (
            hidden,
            heads,
            kv_heads,
            head_dim,
            inter,
        )
        self.scratch_size = 3 * qw + 2 * kw + 3 * inter
        scale_ptrs = (
            (None,) * 4 if weight_scales is None else tuple(t.data_ptr() for t in weight_scales)
        )
        self.weights = (
            ln1.data_ptr(),
            ln2.data_ptr(),
            eps,
            w_qkv.data_ptr(),
            None if b_qkv is None else b_qkv.data_ptr(),
            w_o.data_ptr(),
            w_gate_up.data_ptr(),
            w_down.data_ptr(),
            WEIGHT_TYPES[wdtype],
            *scale_ptrs,
        )
        self.dims = (hidden, heads, kv_heads, head_dim, inter, scale)


def decode_layer(
    plan: DecodeLayerPlan,
    x: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
) -> torch.Tensor:
    """One decoder layer for one new token, x [1, hidden] -> [1, hidden] (a new tensor), in one
    C call (`llmlab_decode_layer`); writes the token's K/V into its cache slot. The step's
    metadata (slot_mapping [1], block_tables [1, W], seq_lens [1]) and the caches are NOT
    checked here: they were checked once for the step when its `AttentionMetadata` was built,
    and `llmlab.model.cpu` checks that the caches fit the plan's heads."""
    lib = load_library()
    if x.shape != (1, plan.hidden) or not x.is_contiguous() or x.dtype != torch.float32:
        raise ValueError(
            f"decode_layer: x must be contiguous float32 [1, {plan.hidden}], "
            f"got {tuple(x.shape)} {x.dtype}"
        )
    half = (1, plan.head_dim // 2)
    if not all(
        c.shape == half and c.dtype == torch.float32 and c.is_contiguous() for c in (cos, sin)
    ):
        raise ValueError(
            f"decode_layer: cos, sin must be contiguous float32 {list(half)}, got "
            f"{tuple(cos.shape)} {cos.dtype} and {tuple(sin.shape)} {sin.dtype}"
        )
    out = torch.empty(1, plan.hidden, dtype=torch.float32)
    scratch = torch.empty(plan.scratch_size, dtype=torch.float32)
    with traced("llmlab_cpu::decode_layer"):
        rc = lib.llmlab_decode_layer(
            x.data_ptr(),
            out.data_ptr(),
            scratch.data_ptr(),
            *plan.weights,
            cos.data_ptr(),
            sin.data_ptr(),
            key_cache.data_ptr(),
            value_cache.data_ptr(),
            slot_mapping.data_ptr(),
            block_tables.data_ptr(),
            seq_lens.data_ptr(),
            key_cache.shape[1],
            *plan.dims,
        )
    if rc != 0:
        raise RuntimeError("cpu_layer.c refused head_dim for the decode layer")
    return out


# the phases of `llmlab_decode_layer` as `timed_layer_phases` splits it (kernels/cpu_layer.c):
# each ends at a barrier (all threads done), timed by the calling thread
LAYER_PHASES = (
    "region start",  # the call until its thread is inside the OpenMP region
    "norm + qkv",  # RMSNorm (each thread) and the q/k/v GEMV
    "rope + attention",  # per KV head: RoPE, K/V into the cache, attention
    "o_proj",  # x + W_o a
    "norm + gate_up",  # RMSNorm (each thread) and the gate/up GEMV
    "silu x up",
    "down_proj",  # x + W_down h
    "region end",  # the last barrier until the call returns
)


@contextlib.contextmanager
def timed_layer_phases():
    """Seconds spent in each of `LAYER_PHASES`, summed over every fused decode layer run inside
    the block: yields a float64 tensor [len(LAYER_PHASES)] that the C code adds to (zero it to
    start again). How `bench decode_profile` splits its "layers" part."""
    seconds = torch.zeros(len(LAYER_PHASES), dtype=torch.float64)
    lib = load_library()
    lib.llmlab_time_layer_phases(seconds.data_ptr())
    try:
        yield seconds
    finally:
        lib.llmlab_time_layer_phases(None)
