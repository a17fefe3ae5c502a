"""The "cpu" backend: paged attention in C (`kernels/cpu_attention.c`), reading K/V in place;
the elementwise steps of a decoder layer in C (`kernels/cpu_layer.c`); and the one-row GEMV
(`kernels/cpu_gemv.c`) that the engine's CPU fast path (`llmlab.model.cpu`) runs.

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

The C files include no torch header: on first use they are compiled with the system C compiler
(`cc -O3 -march=native -fopenmp`, under a second) into `$LLMLAB_CACHE/cpu_kernels/<hash>/`
(default `~/.cache/llmlab`), keyed by the source, the compiler and this CPU, never into the
repository; later processes reuse the library. It is loaded with ctypes and called with raw
pointers. OpenMP runs in the runtime PyTorch already loaded (the same `libgomp.so.1`), so
`torch.set_num_threads` governs it too.

The C attention takes float32 queries over a float32 or fp8 (e4m3, with per-layer scales) cache,
`head_dim` 16, 32, 64, 128 or 256 and up to 16 query heads per KV head; other dtypes and shapes
run the torch backend's code on the same (CPU) tensors. The matmuls of `kernels/cpu_quant.c`
(`qgemm`) take bf16 weights, or int8 weights with per-row scales, and choose their instruction
set at run time (`isa`, `set_isa_cap`). Without a C
compiler `available()` says why and the ops raise a RuntimeError; `llmlab.ops.available_backends()`
lists "cpu" only where it can run.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch

from llmlab.i18n import tr
from llmlab.ops import torch_backend
from llmlab.ops.fp8 import quantize_fp8
from llmlab.paths import cache_dir

KERNELS_DIR = Path(__file__).resolve().parents[2] / "kernels"
# one library: attention and cache writes, a decoder layer's elementwise steps, the fused
# one-token layer and the one-row GEMV (`llmlab.model.cpu`, the engine's CPU fast path)
SOURCES = (
    KERNELS_DIR / "cpu_attention.c",
    KERNELS_DIR / "cpu_layer.c",
    KERNELS_DIR / "cpu_gemv.c",
    KERNELS_DIR / "cpu_quant.c",
)
HEADERS = (KERNELS_DIR / "cpu_vec.h", KERNELS_DIR / "cpu_kernels.h")  # included by every source
FLAGS = ("-O3", "-march=native", "-fopenmp", "-fPIC", "-shared", "-std=gnu99")
# tried in order when a compiler refuses a flag (Apple's clang has no -fopenmp: the kernels then
# run on one thread; some ARM compilers want -mcpu=native)
FALLBACK_FLAGS = (
    FLAGS,
    ("-O3", "-march=native", "-fPIC", "-shared", "-std=gnu99", "-Wno-unknown-pragmas"),
    ("-O3", "-mcpu=native", "-fPIC", "-shared", "-std=gnu99", "-Wno-unknown-pragmas"),
    ("-O3", "-fPIC", "-shared", "-std=gnu99", "-Wno-unknown-pragmas"),
)
HEAD_DIMS = (16, 32, 64, 128, 256)  # the C kernel has one unrolled variant for each
MAX_GROUP = 16

# The library's Python entry points as ctypes sees them, in the words of `kernels/cpu_kernels.h`
# (a test parses the header and checks this table against it): "ptr" is any pointer.
_CTYPES = {
    "void": None,
    "int": ctypes.c_int,
    "i64": ctypes.c_int64,
    "f32": ctypes.c_float,
    "ptr": ctypes.c_void_p,
}
SIGNATURES: dict[str, tuple[str, tuple[str, ...]]] = {
    "llmlab_paged_attention": (
        "int",
        (
            "ptr",
            "i64",
            "i64",
            "ptr",
            "ptr",
            "ptr",
            "i64",
            "ptr",
            "ptr",
            "i64",
            "i64",
            "i64",
            "i64",
            "i64",
            "f32",
            "i64",
            "f32",
            "f32",
            "ptr",
        ),
    ),
    "llmlab_reshape_and_cache": (
        "void",
        ("ptr", "ptr", "i64", "i64", "ptr", "ptr", "ptr", "i64", "i64", "i64"),
    ),
    "llmlab_rms_norm": (
        "void",
        ("ptr", "i64", "ptr", "i64", "ptr", "ptr", "ptr", "i64", "i64", "f32"),
    ),
    "llmlab_silu_mul": ("void", ("ptr", "i64", "ptr", "i64", "ptr", "i64", "i64")),
    "llmlab_rope": ("void", ("ptr", "i64", "ptr", "ptr", "ptr", "i64", "i64", "i64")),
    "llmlab_gemv": ("void", ("ptr", "ptr", "ptr", "ptr", "i64", "i64")),
    "llmlab_decode_layer": (
        "int",
        (
            "ptr",
            "ptr",
            "ptr",
            "ptr",
            "ptr",
            "f32",
            "ptr",
            "ptr",
            "ptr",
            "ptr",
            "ptr",
            "i64",
            "ptr",
            "ptr",
            "ptr",
            "ptr",
            "ptr",
            "ptr",
            "ptr",
            "ptr",
            "ptr",
            "ptr",
            "ptr",
            "i64",
            "i64",
            "i64",
            "i64",
            "i64",
            "i64",
            "f32",
        ),
    ),
    "llmlab_qgemm": (
        "void",
        ("ptr", "i64", "ptr", "i64", "ptr", "ptr", "ptr", "i64", "i64", "i64"),
    ),
    "llmlab_isa": ("int", ()),
    "llmlab_set_isa_cap": ("void", ("i64",)),
}

# weight types of `kernels/cpu_quant.c` (LLMLAB_W_*), by torch dtype
WEIGHT_TYPES = {torch.float32: 0, torch.bfloat16: 1, torch.int8: 2}
# instruction sets chosen at run time (LLMLAB_ISA_* of kernels/cpu_kernels.h)
ISA_FLAGS = {"avx512": 1, "avx512_bf16": 2}
FP8 = torch.float8_e4m3fn

_lib: ctypes.CDLL | None = None
_error: str | None = None


def _traced(name: str):
    """A profiler range named `name` while torch.profiler records (C calls are not operators,
    so without it a profile would not show them), else nothing."""
    if torch.autograd._profiler_enabled():
        return torch.profiler.record_function(name)
    return contextlib.nullcontext()


def _compiler() -> str | None:
    for name in (os.environ.get("CC"), "cc", "gcc", "clang"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


def _cpu_id() -> str:
    """What -march=native depends on: the CPU's model and feature flags."""
    try:
        text = Path("/proc/cpuinfo").read_text()
        lines = [ln for ln in text.splitlines() if ln.startswith(("model name", "flags"))]
        return "\n".join(sorted(set(lines)))
    except OSError:
        return platform.processor() or platform.machine()


def library_path(cc: str) -> Path:
    """Where the compiled library lives for this source, compiler and CPU."""
    version = subprocess.run([cc, "--version"], capture_output=True, text=True).stdout
    key = hashlib.sha256(
        "\0".join(
            [
                *(f.read_text() for f in SOURCES + HEADERS),
                cc,
                version,
                repr(FALLBACK_FLAGS),
                _cpu_id(),
            ]
        ).encode()
    ).hexdigest()[:16]
    return cache_dir() / "cpu_kernels" / key / "libllmlab_cpu.so"


def _build() -> ctypes.CDLL:
    missing = [str(f) for f in SOURCES + HEADERS if not f.is_file()]
    if missing:
        raise RuntimeError(
            f"{missing} not found; the 'cpu' backend needs the repository "
            "checkout (pip install -e .)"
        )
    cc = _compiler()
    if cc is None:
        raise RuntimeError(
            "the 'cpu' backend compiles kernels/cpu_attention.c on first use and "
            "found no C compiler (cc, gcc or clang; or set CC)"
        )
    path = library_path(cc)
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        # build beside the target and rename: concurrent processes never load a partial file
        fd, tmp = tempfile.mkstemp(suffix=".so", dir=path.parent)
        os.close(fd)
        for flags in FALLBACK_FLAGS:
            cmd = [cc, *flags, "-o", tmp, *map(str, SOURCES), "-lm"]
            done = subprocess.run(cmd, capture_output=True, text=True)
            if done.returncode == 0:
                break
        else:
            os.unlink(tmp)
            raise RuntimeError(
                f"compiling the 'cpu' backend failed ({' '.join(cmd)}):\n{done.stderr.strip()}"
            )
        os.replace(tmp, path)
    lib = ctypes.CDLL(str(path))
    for name, (restype, argtypes) in SIGNATURES.items():
        fn = getattr(lib, name)
        fn.restype = _CTYPES[restype]
        fn.argtypes = [_CTYPES[a] for a in argtypes]
    return lib


def load_library() -> ctypes.CDLL:
    """Compile (first time) and load the C kernels; RuntimeError saying why if that fails."""
    global _lib, _error
    if _lib is None:
        if _error is not None:
            raise RuntimeError(_error)
        try:
            _lib = _build()
        except (RuntimeError, OSError) as e:
            _error = str(e)
            raise RuntimeError(_error) from None
    return _lib


def available() -> tuple[bool, str]:
    """(True, "") when the C kernels can be built and loaded here, else (False, why)."""
    try:
        load_library()
        return True, ""
    except RuntimeError as e:
        return False, str(e)


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
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
) -> None:
    """Write key/value `[num_tokens, num_kv_heads, head_dim]` into the cache at `slot_mapping`
    (an fp8 cache: key / k_scale, value / v_scale, rounded by PyTorch, copied by C)."""
    lib = _kernel_for(key, key_cache)
    if lib is None:
        torch_backend.reshape_and_cache(
            key, value, key_cache, value_cache, slot_mapping, k_scale, v_scale
        )
        return
    if key_cache.dtype == FP8:
        key, value = quantize_fp8(key, k_scale), quantize_fp8(value, v_scale)
    row = key.shape[1] * key.shape[2]
    with _traced("llmlab_cpu::reshape_and_cache"):
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


def _attention(
    query,
    key_cache,
    value_cache,
    block_tables,
    cu_seqlens_q,
    seq_lens,
    scale,
    k_scale=1.0,
    v_scale=1.0,
):
    lib = _kernel_for(query, key_cache)
    if lib is None:
        return torch_backend.paged_attention_prefill(
            query,
            key_cache,
            value_cache,
            block_tables,
            cu_seqlens_q,
            seq_lens,
            scale,
            k_scale,
            v_scale,
        )
    num_tokens, num_heads, head_dim = query.shape
    out = torch.empty_like(query)
    with _traced("llmlab_cpu::paged_attention"):
        rc = lib.llmlab_paged_attention(
            query.data_ptr(),
            num_heads * head_dim,
            head_dim,
            key_cache.data_ptr(),
            value_cache.data_ptr(),
            block_tables.data_ptr(),
            block_tables.shape[1],
            cu_seqlens_q.data_ptr(),
            seq_lens.data_ptr(),
            seq_lens.shape[0],
            num_heads,
            key_cache.shape[2],
            head_dim,
            key_cache.shape[1],
            scale,
            int(key_cache.dtype == FP8),
            k_scale,
            v_scale,
            out.data_ptr(),
        )
    if rc != 0:
        raise RuntimeError("cpu_attention.c refused the shapes (head_dim or GQA group too large)")
    return out


def paged_attention_decode(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
) -> torch.Tensor:
    """Decode: one query per sequence, [num_seqs, num_heads, head_dim]."""
    cu = torch.arange(query.shape[0] + 1, dtype=torch.int32)  # one new token per sequence
    return _attention(
        query, key_cache, value_cache, block_tables, cu, seq_lens, scale, k_scale, v_scale
    )


def paged_attention_prefill(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
) -> torch.Tensor:
    """Causal varlen prefill over cached context plus the new tokens."""
    return _attention(
        query, key_cache, value_cache, block_tables, cu_seqlens_q, seq_lens, scale, k_scale, v_scale
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
    with _traced("llmlab_cpu::rms_norm"):
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
    with _traced("llmlab_cpu::silu_mul"):
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
    with _traced("llmlab_cpu::rope"):
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
        matrices = ("w_qkv", "w_o", "w_gate_up", "w_down")
        for name, (t, shape) in expected.items():
            want = wdtype if name in matrices else torch.float32
            if (
                tuple(t.shape) != shape
                or t.dtype != want
                or t.device.type != "cpu"
                or not t.is_contiguous()
            ):
                raise ValueError(
                    f"decode layer: {name} is {tuple(t.shape)} {t.dtype} on "
                    f"{t.device}, expected contiguous {want} {shape} on the CPU"
                )
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
        self.scratch_size = hidden + 3 * qw + 2 * kw + 3 * inter
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
    with _traced("llmlab_cpu::decode_layer"):
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


def gemv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """`x [1, K] @ weight[N, K]ᵀ (+ bias [N])` -> [1, N]: float32, contiguous, on a CPU,
    K % 16 == 0 (the caller, `llmlab.model.cpu.CpuLinear`, checks)."""
    lib = load_library()
    out = torch.empty(1, weight.shape[0], dtype=x.dtype)
    with _traced("llmlab_cpu::gemv"):
        lib.llmlab_gemv(
            x.data_ptr(),
            weight.data_ptr(),
            None if bias is None else bias.data_ptr(),
            out.data_ptr(),
            weight.shape[0],
            weight.shape[1],
        )
    return out


def qgemm(
    x: torch.Tensor,
    weight: torch.Tensor,
    scales: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """`x [T, K] @ weight[N, K]ᵀ (· scales [N]) (+ bias [N])` -> float32 [T, N], with `weight`
    in bfloat16 or int8 (then `scales`, per output row) widened inside the kernel
    (`kernels/cpu_quant.c`); one row runs the GEMV, more the tiled GEMM. x float32 with
    contiguous rows, K % 16 == 0 (the caller, `llmlab.model.cpu.CpuLinear`, checks)."""
    lib = load_library()
    T, K = x.shape
    out = torch.empty(T, weight.shape[0], dtype=torch.float32)
    with _traced("llmlab_cpu::qgemm"):
        lib.llmlab_qgemm(
            x.data_ptr(),
            x.stride(0),
            weight.data_ptr(),
            WEIGHT_TYPES[weight.dtype],
            None if scales is None else scales.data_ptr(),
            None if bias is None else bias.data_ptr(),
            out.data_ptr(),
            T,
            weight.shape[0],
            K,
        )
    return out


def isa() -> list[str]:
    """The instruction sets the C kernels use on this CPU (checked at run time through cpuid,
    under the cap of `set_isa_cap`): names of `ISA_FLAGS`."""
    have = load_library().llmlab_isa()
    return [name for name, bit in ISA_FLAGS.items() if have & bit]


def set_isa_cap(names: list[str] | None) -> None:
    """Let the C kernels use at most `names` (of `ISA_FLAGS`), whatever this CPU has; None lifts
    the cap. How a test runs the fallback kernels on a CPU that has the fast instructions."""
    if names is not None:
        unknown = [n for n in names if n not in ISA_FLAGS]
        if unknown:
            raise ValueError(f"names: got {unknown}, expected names from {list(ISA_FLAGS)}")
    cap = -1 if names is None else sum(ISA_FLAGS[n] for n in names)
    load_library().llmlab_set_isa_cap(cap)


def matmul_kernel(weight_dtype: torch.dtype) -> str:
    """Which kernel multiplies by a weight of this dtype here (for `doctor` and the benches)."""
    if weight_dtype == torch.bfloat16:
        return (
            "bf16: AVX-512 BF16 (vdpbf16ps)"
            if "avx512_bf16" in isa()
            else tr(
                "bf16: widened to float32 in the kernel (no AVX-512 BF16 here)",
                "bf16：在 kernel 里扩展成 float32（这里没有 AVX-512 BF16）",
            )
        )
    if weight_dtype == torch.int8:
        return (
            tr(
                "int8: AVX-512 widening (vpmovsxbd), per-channel scale",
                "int8：AVX-512 扩展（vpmovsxbd），每个输出通道一个缩放因子",
            )
            if "avx512" in isa()
            else tr(
                "int8: widened to float32 in the kernel (portable), per-channel scale",
                "int8：在 kernel 里扩展成 float32（可移植），每个输出通道一个缩放因子",
            )
        )
    return tr(
        "float32: GEMV (batch 1), oneDNN (batches)",
        "float32：GEMV（batch 1），oneDNN（更大 batch）",
    )
