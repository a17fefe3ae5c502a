"""Which kernel multiplies a batch by float32 or bf16 weights on this CPU: measured once, then
remembered.

A decode step at batch 64 multiplies 64 rows by every weight: arithmetic, not streaming. Two
kernels can do it, and which is faster depends on the machine:

- llmlab's packed matmul (`kernels/cpu_gemm.c`, on weights packed once at load, float32 sums
  and outputs): float32 FMAs on float32 weights (AVX-512), `vdpbf16ps` on bf16 ones (AVX-512
  BF16);
- oneDNN's matmul (`torch.ops.mkldnn._linear_pointwise` on a weight reordered once by
  `_reorder_linear_weight`), which for bf16 uses AMX tiles on the Intel Xeons that have them
  and rounds its output to bf16.

On a 2-core AMD EPYC (Zen 4: AVX-512 BF16, no AMX) the two were within 5 % of each other on one
thread for bf16 ([64 x 576] x [576 x 3072]: llmlab 1.03 ms, oneDNN 1.05 ms) and on a warm
float32 weight; on a CPU with AMX oneDNN's bf16 tiles can do several times more. Where the
weights stream from memory, as a decode step's do, llmlab's float32 matmul asks for the next
panel while it computes and oneDNN's does not: the batch-64 matmuls of SmolLM2-135M took 82-83
ms against 91-92 ms per step. So nothing is assumed, as for the OpenMP wait policy
(`llmlab.openmp`): `choice(dtype)` times both on a layer's four matmuls at batch 64, in
alternating rounds, on copies of the weights that stream from memory (`COLD_BYTES`), the first
time a model of that weight dtype is prepared on a machine, and saves the result in llmlab's
cache (`cpu_matmul.json`), keyed by the dtype, the CPU, the threads, torch's version and the
kernel library's build (a changed kernel is measured again). oneDNN is chosen only when it wins
every round by more than `MARGIN`. int8 weights always run llmlab's (oneDNN has no weight-only
int8 matmul that is faster here). `matmul_kernel` says in words which kernels run each weight
dtype here (`doctor`, the benches).
"""

from __future__ import annotations

import functools
import itertools
import json
import time

import torch

from llmlab.i18n import tr
from llmlab.ops import cpu_library, cpu_matmul

ROWS = 64  # a batch-64 decode step
SHAPES = ((576, 960), (576, 576), (576, 3072), (1536, 576))  # in, out: a SmolLM2-135M layer's
# q/k/v, o, gate/up and down projections, one "call" of the measurement
MARGIN = 0.05  # oneDNN must win every round by more than this fraction
ROUNDS = 2
CHOICES = ("llmlab", "onednn")
DTYPES = (torch.float32, torch.bfloat16)  # the weight dtypes a choice is measured for
FILE = "cpu_matmul.json"
# each kernel is timed on copies of the layer's weights that together outsize a CPU's
# last-level cache, a different copy each call, so every multiply streams its weight from
# memory as a decode step's do. On a 2-core Zen 4, float32: on one warm [576 x 3072] weight
# oneDNN and ours were within 5 % and the winner changed from run to run; a layer's four
# streamed from memory took ours 2.42-2.48 ms, oneDNN 2.50-2.52 (bf16 1.22-1.26 and 1.38-1.39)
COLD_BYTES = 64 << 20


def _path():
    from llmlab.paths import cache_dir

    return cache_dir() / FILE


@functools.cache
def _kernel_build() -> str:
    """The C library's build id (a hash of its sources, compiler and CPU), once per process."""
    cc = cpu_library._compiler()
    return cpu_library.library_path(cc).parent.name if cc else "no compiler"


def machine_key(threads: int | None = None) -> str:
    """The machine as the choice depends on it: CPU, CPUs usable, torch, threads, kernel build."""
    from llmlab.openmp import machine_key as cpu_key

    threads = threads or torch.get_num_threads()
    return f"{cpu_key()}; torch {torch.__version__}; {threads} threads; kernels {_kernel_build()}"


def entry_key(dtype: torch.dtype, threads: int | None = None) -> str:
    """The saved choice's key: the weight dtype, then `machine_key`."""
    return f"{_dtype_name(dtype)} weights; {machine_key(threads)}"


def _dtype_name(dtype: torch.dtype) -> str:
    if dtype not in DTYPES:
        raise ValueError(f"dtype: got {dtype}, expected one of {DTYPES}")
    return str(dtype).removeprefix("torch.")


def onednn_bf16() -> tuple:
    """oneDNN's (linear, reorder) where this PyTorch has them with bf16 support, else (None,)*2."""
    mkldnn = torch.ops.mkldnn
    linear = getattr(mkldnn, "_linear_pointwise", None)
    reorder = getattr(mkldnn, "_reorder_linear_weight", None)
    if not torch.backends.mkldnn.is_available() or linear is None or reorder is None:
        return None, None
    if not torch.ops.mkldnn._is_mkldnn_bf16_supported():
        return None, None
    return linear, reorder


def _best_ms(fn, calls: int = 10, repeats: int = 5) -> float:
    fn()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - t0) / calls)
    return best * 1e3


def measure(dtype: torch.dtype = torch.bfloat16, rounds: int = ROUNDS) -> dict:
    """Time both batch kernels for weights of `dtype` on a layer's matmuls (`ROWS` rows by each
    of `SHAPES`) in alternating rounds: {"choice", "ms": {name: [...]}}. Only the kernels that
    run here are timed; with one, it is the choice without a race."""
    _dtype_name(dtype)
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")
    gen = torch.Generator().manual_seed(0)
    xs = [torch.randn(ROWS, k, generator=gen) for k, _ in SHAPES]  # [rows, in]
    weights = [(torch.randn(n, k, generator=gen) * k**-0.5).to(dtype) for k, n in SHAPES]
    layer_bytes = sum(w.numel() * w.element_size() for w in weights)
    copies = -(-COLD_BYTES // layer_bytes)  # layers of weights, each call the next

    def cycling(prepare, multiply):
        layers = itertools.cycle([[prepare(w) for w in weights] for _ in range(copies)])
        return lambda: [multiply(x, p, w.shape[0]) for x, p, w in zip(xs, next(layers), weights)]

    kernels = {}
    if all(cpu_matmul.packed_weight_applies(w) for w in weights):
        kernels["llmlab"] = cycling(cpu_matmul.pack_weight, cpu_matmul.packed_gemm)
    if dtype == torch.float32 and cpu_matmul.onednn_available():
        kernels["onednn"] = cycling(
            cpu_matmul.onednn_pack, lambda x, b, _: cpu_matmul.onednn_linear(x, b)
        )
    linear, reorder = onednn_bf16() if dtype == torch.bfloat16 else (None, None)
    if linear is not None:
        kernels["onednn"] = cycling(
            lambda w: reorder(w, ROWS),
            lambda x, b, _: linear(x.bfloat16(), b, None, "none", [], "").float(),
        )
    ms: dict[str, list[float]] = {name: [] for name in kernels}
    if len(kernels) == 2:
        for r in range(rounds):
            for name in CHOICES if r % 2 == 0 else CHOICES[::-1]:
                ms[name].append(round(_best_ms(kernels[name]), 4))
        wins = all(d < (1 - MARGIN) * o for d, o in zip(ms["onednn"], ms["llmlab"]))
        choice = "onednn" if wins else "llmlab"
    else:
        choice = next(iter(kernels), "none")
    shapes = [[ROWS, k, n] for k, n in SHAPES]
    return {"shapes": shapes, "choice": choice, "ms": ms, "date": time.strftime("%F %T")}


def _saved() -> dict:
    try:
        data = json.loads(_path().read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


_chosen: dict[tuple[str, str], str] = {}  # (cache file, entry key) -> choice, this process


def choice(dtype: torch.dtype = torch.bfloat16, save: bool = True) -> str:
    """The faster batch matmul for weights of `dtype` (float32 or bf16) on this machine,
    "llmlab" or "onednn" (measured the first time, then read from the cache), or "none" where
    neither runs here."""
    key = entry_key(dtype)
    memo = (str(_path()), key)
    if memo not in _chosen:
        _chosen[memo] = _load_or_measure(key, dtype, save)
    return _chosen[memo]


def _load_or_measure(key: str, dtype: torch.dtype, save: bool) -> str:
    data = _saved()
    entry = data.get(key)
    if not (isinstance(entry, dict) and entry.get("choice") in (*CHOICES, "none")):
        entry = measure(dtype)
        if save:  # this dtype's entries on this machine for other kernel builds are stale
            machine = key.rsplit("; kernels ", 1)[0]
            data = {k: v for k, v in data.items() if k.rsplit("; kernels ", 1)[0] != machine}
            data[key] = entry
            path = _path()
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f"{path.name}.tmp")
            tmp.write_text(json.dumps(data, indent=1))
            tmp.replace(path)
    return entry["choice"]


def matmul_kernel(weight_dtype: torch.dtype) -> str:
    """Which kernels multiply by a weight of this dtype here (for `doctor` and the benches)."""
    have = cpu_matmul.isa()  # (a call into the C library: once)
    avx2_only = "avx2" in have and "avx512_bf16" not in have
    if weight_dtype == torch.bfloat16:
        if avx2_only and choice(torch.bfloat16) == "llmlab":
            return tr(
                "bf16: AVX2 FMAs on packed blocks, widened in registers (x float32), from one row",
                "bf16：打包分块上的 AVX2 FMA，在寄存器里扩展（x 保持 float32），从一行起",
            )
        if "avx512_bf16" not in have:
            return tr(
                "bf16: widened to float32 in the kernel (no AVX-512 BF16 here)",
                "bf16：在 kernel 里扩展成 float32（这里没有 AVX-512 BF16）",
            )
        if choice(torch.bfloat16) == "onednn":
            return tr(
                "bf16: AVX-512 BF16 (vdpbf16ps, x rounded to bf16); batches: oneDNN bf16",
                "bf16：AVX-512 BF16（vdpbf16ps，x 舍入为 bf16）；更大 batch：oneDNN bf16",
            )
        return tr(
            "bf16: AVX-512 BF16 (vdpbf16ps, x rounded to bf16) on packed blocks, from one row",
            "bf16：AVX-512 BF16（vdpbf16ps，x 舍入为 bf16），从 1 行起都用打包的分块",
        )
    if weight_dtype == torch.int8:
        if "avx512_bf16" in have and "avx512_vnni" in have:
            return tr(
                "int8: AVX-512 VNNI (vpdpwssd on each row of x rounded to int16) on packed "
                "blocks, 1-127 rows; from 128 rows widened to bf16, vdpbf16ps on x rounded to "
                "bf16; per-channel scale",
                "int8：1-127 行用 AVX-512 VNNI（对每行舍入为 int16 的 x 用 vpdpwssd，打包的分块）；"
                "128 行起扩展成 bf16，对舍入为 bf16 的 x 用 vdpbf16ps；每个输出通道一个缩放因子",
            )
        if avx2_only:
            return tr(
                "int8: AVX2 vpmaddwd on each row of x rounded to int16, on packed blocks, at "
                "every row count; per-channel scale",
                "int8：在任意行数下对每行舍入为 int16 的 x 用 AVX2 vpmaddwd（打包的分块）；"
                "每个输出通道一个缩放因子",
            )
        if "avx512_bf16" in have:
            return tr(
                "int8: vpmaddwd on each row of x rounded to int16, on packed blocks, 1-127 rows; "
                "from 128 rows widened to bf16, vdpbf16ps on x rounded to bf16; per-channel scale",
                "int8：1-127 行对每行舍入为 int16 的 x 用 vpmaddwd（打包的分块）；128 行起扩展成 "
                "bf16，对舍入为 bf16 的 x 用 vdpbf16ps；每个输出通道一个缩放因子",
            )
        return (
            tr(
                "int8: AVX-512 widening (vpmovsxbd), per-channel scale",
                "int8：AVX-512 扩展（vpmovsxbd），每个输出通道一个缩放因子",
            )
            if "avx512" in have
            else tr(
                "int8: widened to float32 in the kernel (portable), per-channel scale",
                "int8：在 kernel 里扩展成 float32（可移植），每个输出通道一个缩放因子",
            )
        )
    if choice(torch.float32) == "llmlab" and "avx512" not in have:
        return tr(
            "float32: AVX2 FMAs on packed blocks, from one row",
            "float32：打包分块上的 AVX2 FMA，从一行起",
        )
    if choice(torch.float32) == "llmlab":
        return tr(
            "float32: AVX-512 FMAs on packed blocks, from one row",
            "float32：打包分块上的 AVX-512 FMA，从一行起",
        )
    return tr(
        "float32: GEMV (batch 1), oneDNN (batches)",
        "float32：GEMV（batch 1），oneDNN（更大 batch）",
    )
