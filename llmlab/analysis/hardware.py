"""Hardware: datasheet presets from `data/hardware.json` and measurements of this machine.

A `Hardware` holds the two numbers the roofline needs (memory bandwidth in bytes/s, peak
FLOP/s per dtype) and the sizes of the memory hierarchy. `PRESETS` are the datasheet figures
(plus "H100-SXM-source", the source chapter's round 1000 TFLOPS / 3 TB/s); `this_machine()`
measures the computer the notebook runs on, CPU or GPU:

- `measure_bandwidth()` streams a buffer several times larger than the last-level cache;
- `measure_matmul_flops()` times a large square matmul (the faster of MKL and oneDNN on a CPU);
- `memory_mountain()` reads working sets from a few KB to hundreds of MB, where each cache
  level shows as a step down in bandwidth.

Each takes a few seconds with `LLMLAB_FAST=1`. Chapter 06's figures draw them
(`llmlab.course.figures.ch06`).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from llmlab.analysis.timing import (
    best_linear_time,
    best_time,
    matmul_libraries,
    resolve_device,
    thread_counts,
    using_threads,
)
from llmlab.i18n import Bilingual, tr
from llmlab.model import huge_pages as model_huge_pages
from llmlab.paths import DATA_DIR  # noqa: E402
from llmlab.utils import cpu_name  # noqa: F401 (part of this module's API)

DTYPES = ("fp32", "tf32", "bf16", "fp16", "fp8", "int8")
_TORCH_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def _fast() -> bool:
    return os.environ.get("LLMLAB_FAST") == "1"


@dataclass(frozen=True)
class Hardware:
    """One device: bandwidth (bytes/s), dense peak FLOP/s per dtype, and its memory sizes (bytes)."""

    name: str
    mem_bw: float  # bytes/s, main memory (HBM / GDDR / DRAM)
    peak_flops: dict[str, float]  # dtype -> dense FLOP/s, e.g. {"bf16": 989.4e12}
    mem_size: float  # bytes of main memory
    l2_size: float | None = None  # bytes (on a CPU: the L2 of all cores together)
    smem_per_sm: float | None = None  # bytes of on-chip SRAM per SM (CPU: L1d per core)
    num_sms: int | None = None  # SMs (CPU: cores)
    interconnect: dict[str, float] = field(default_factory=dict)  # link -> bytes/s
    sources: Mapping[str, str] = field(default_factory=dict)  # field -> where it comes from
    kind: str = "gpu"  # "gpu" or "cpu"
    measured: bool = False  # True for `this_machine()`
    hierarchy: list[Mapping] = field(default_factory=list)  # levels for chapter 06's chart
    extra: dict[str, Any] = field(default_factory=dict)  # e.g. the copy bandwidth

    def __post_init__(self) -> None:
        if not (isinstance(self.mem_bw, (int, float)) and self.mem_bw > 0):
            raise ValueError(
                f"Hardware.mem_bw must be a positive number of bytes/s, got {self.mem_bw!r}"
            )
        if not self.peak_flops:
            raise ValueError("Hardware.peak_flops needs at least one dtype, e.g. {'fp32': 1e12}")
        for dtype, value in self.peak_flops.items():
            if dtype not in DTYPES:
                raise ValueError(
                    f"Hardware.peak_flops has unknown dtype {dtype!r}; allowed: {DTYPES}"
                )
            if not (isinstance(value, (int, float)) and value > 0):
                raise ValueError(
                    f"Hardware.peak_flops[{dtype!r}] must be a positive FLOP/s, got {value!r}"
                )

    def flops(self, dtype: str = "bf16") -> float:
        """Dense peak FLOP/s for `dtype`; a ValueError lists the dtypes this device has."""
        if dtype not in self.peak_flops:
            raise ValueError(
                f"dtype={dtype!r} has no peak on {self.name}; available: {sorted(self.peak_flops)}"
            )
        return self.peak_flops[dtype]

    def replace(self, **changes: Any) -> "Hardware":
        return dataclasses.replace(self, **changes)


def _bilingual(en: dict, zh: dict | None) -> Mapping:
    """`en` as it is, or, where the data gives the Chinese of some of its texts, a mapping that
    shows them in the language in use (the others as they are)."""
    return Bilingual(en, {**en, **zh}) if zh else en


def _load_presets() -> dict[str, Hardware]:
    raw = json.loads((DATA_DIR / "hardware.json").read_text(encoding="utf-8"))
    presets: dict[str, Hardware] = {}
    for key, entry in raw["presets"].items():
        entry = dict(entry)
        entry["sources"] = _bilingual(entry.get("sources", {}), entry.pop("sources_zh", None))
        entry["hierarchy"] = [
            _bilingual({k: v for k, v in level.items() if k != "zh"}, level.get("zh"))
            for level in entry.get("hierarchy", [])
        ]
        presets[key] = Hardware(name=key, **entry)
    return presets


PRESETS: dict[str, Hardware] = _load_presets()


def get_hardware(name: str) -> Hardware:
    """A preset by name, e.g. `get_hardware("H100-SXM")`."""
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(
            tr(
                f"unknown hardware preset {name!r}; known: {sorted(PRESETS)}",
                f"没有名为 {name!r} 的硬件预设。已有预设：{sorted(PRESETS)}",
            )
        ) from None


# ----------------------------------------------------------------------------- measuring


def last_level_cache_bytes() -> int:
    """The largest CPU cache on this machine in bytes (from sysfs; 32 MiB when unknown)."""
    return max((c["size"] for c in cpu_caches()), default=0) or 32 * 1024**2


def cpu_caches() -> list[dict]:
    """This CPU's caches as [{"level", "type", "size" (bytes)}] from sysfs (empty where unknown)."""
    out = []
    base = Path("/sys/devices/system/cpu/cpu0/cache")
    for index in sorted(base.glob("index*")):
        try:
            level = int((index / "level").read_text())
            kind = (index / "type").read_text().strip()
            text = (index / "size").read_text().strip()
        except (OSError, ValueError):
            continue
        mult = {"K": 1024, "M": 1024**2, "G": 1024**3}.get(text[-1:], 1)
        digits = text[:-1] if text[-1:] in "KMG" else text
        if digits.isdigit():
            out.append({"level": level, "type": kind, "size": int(digits) * mult})
    return out


def measure_bandwidth(
    device: str | None = "cpu",
    nbytes: int | None = None,
    kind: str = "read",
    repeats: int | None = None,
    threads: int | None = None,
    huge_pages: bool = False,
) -> float:
    """Streaming bandwidth of main memory in bytes/s, measured here.

    kind="read": sum a buffer (bytes read / time) — what a decode step does with the weights.
    kind="copy": copy one buffer into another, counting bytes read + bytes written.
    `nbytes` defaults to 4-8× the last-level cache on a CPU (so the cache cannot help) and 1 GiB
    on a GPU; with LLMLAB_FAST=1, at most 256 MiB on a CPU (a cloud CPU can report a shared
    last-level cache of hundreds of MiB: 4× its 480 MiB took 2.5 s to read and 5 s to copy with
    2 cores, and 128 MiB-1 GiB buffers read at the same rate there). The fastest of `repeats`
    runs is kept. With `threads=None` on a CPU both all threads and one thread are tried and the
    faster is kept. `huge_pages=True` (CPU) reads a buffer on 2 MB pages, as the CPU fast path's
    weights are (`llmlab.model.huge_pages`): where the kernel gives none, a plain buffer.
    """
    if kind not in ("read", "copy"):
        raise ValueError(f"kind={kind!r}; allowed: 'read', 'copy'")
    dev = resolve_device(device)
    if nbytes is None:
        nbytes = (
            (256 if _fast() else 1024) * 1024**2
            if dev.type == "cuda"
            else max(64 * 1024**2, (4 if _fast() else 8) * last_level_cache_bytes())
        )
        if _fast():
            nbytes = min(nbytes, 256 * 1024**2)
    if nbytes < 4096:
        raise ValueError(f"nbytes={nbytes} is too small to measure a bandwidth; use at least 4096")
    repeats = repeats or (5 if _fast() else 15)
    n = nbytes // 4
    if huge_pages and dev.type == "cpu" and model_huge_pages.huge_pages_available():
        src = model_huge_pages.huge_page_tensors([((n,), torch.float32)])[0].fill_(1.0)
    else:
        src = torch.ones(n, device=dev)  # [n] float32
    dst = torch.empty_like(src) if kind == "copy" else None
    fn = (lambda: src.sum()) if kind == "read" else (lambda: dst.copy_(src))
    moved = n * 4 if kind == "read" else 2 * n * 4
    best = float("inf")
    for count in thread_counts(dev, threads):
        with using_threads(count):
            best = min(best, best_time(fn, dev, repeats))
    return moved / best


def measure_matmul_flops(
    device: str | None = "cpu",
    dtype: str = "fp32",
    n: int | None = None,
    repeats: int | None = None,
    threads: int | None = None,
    library: str | None = None,
) -> float:
    """Matmul throughput in FLOP/s (2·n³ per n×n @ n×n), the best of a few runs.

    On a CPU only fp32 is meaningful for a peak (bf16 matmuls may be emulated); on a GPU
    "bf16" and "fp16" use the tensor cores. `library` is "aten" (torch's default, MKL on x86),
    "onednn", "cpu" (the engine's fast path), or None for the fastest on a CPU: the roof is the
    best this machine reaches, whichever library gets there.
    """
    if dtype not in _TORCH_DTYPES:
        raise ValueError(f"dtype={dtype!r}; allowed: {sorted(_TORCH_DTYPES)}")
    dev = resolve_device(device)
    libraries = matmul_libraries(dev, library)
    if n is None:
        n = (4096 if not _fast() else 2048) if dev.type == "cuda" else (1024 if _fast() else 2048)
    if n < 16:
        raise ValueError(f"n={n} is too small to measure a matmul peak; use at least 16")
    repeats = repeats or (3 if _fast() else 8)
    gen = torch.Generator(device=dev).manual_seed(0)
    a = torch.randn(n, n, device=dev, generator=gen).to(_TORCH_DTYPES[dtype])  # [n, n]
    w = torch.randn(n, n, device=dev, generator=gen).to(_TORCH_DTYPES[dtype])  # [n, n] as a weight
    return 2.0 * n**3 / best_linear_time(a, w, dev, libraries, threads, repeats)


def measure_gemv_bandwidth(
    device: str | None = "cpu",
    rows: int = 49152,
    cols: int = 576,
    repeats: int | None = None,
    threads: int | None = None,
    library: str | None = None,
) -> float:
    """Bytes/s at which a batch-1 linear layer (one row times a weight) streams its float32 weight.

    The default shape is SmolLM2's lm_head (113 MB, beyond any CPU cache). A decode step at
    batch 1 is a chain of such GEMVs, so this — not `measure_bandwidth` — is the bandwidth the
    matmul library actually reaches for decoding; the gap between the two is the library's, not
    the memory's. `library` as in `measure_matmul_flops` (None: the faster one).
    """
    if rows < 1 or cols < 1:
        raise ValueError(f"rows and cols must be >= 1, got rows={rows}, cols={cols}")
    dev = resolve_device(device)
    libraries = matmul_libraries(dev, library)
    repeats = repeats or (5 if _fast() else 10)
    gen = torch.Generator(device=dev).manual_seed(0)
    w = torch.randn(rows, cols, device=dev, generator=gen)  # [rows, cols] float32 weight
    x = torch.randn(1, cols, device=dev, generator=gen)  # [1, cols]
    return rows * cols * 4 / best_linear_time(x, w, dev, libraries, threads, repeats)


@dataclass(frozen=True)
class MountainResult:
    """Read bandwidth (bytes/s) against working-set size (bytes), measured on `device`."""

    sizes: list[int]
    bandwidths: list[float]
    device: str
    threads: int
    caches: list[dict]  # this CPU's caches (sysfs), to mark the knees on the plot


def memory_mountain(
    device: str | None = "cpu",
    sizes: list[int] | None = None,
    threads: int | None = 1,
    traffic_bytes: int | None = None,
) -> MountainResult:
    """Read bandwidth for working sets from 16 KiB to well past the last-level cache.

    Each size is read many times over in one operation (a stride-0 view repeats the same
    buffer), so the time per read is not swamped by Python's per-call overhead even for a
    buffer that fits in L1. One thread by default: the classic mountain of one core.
    """
    dev = resolve_device(device)
    if sizes is None:
        top = 256 * 1024**2 if dev.type == "cpu" else 1024**3
        sizes = []
        s = 16 * 1024
        step = 4 if _fast() else 2
        while s <= top:
            sizes.append(s)
            s *= step
    if any(s < 1024 for s in sizes):
        raise ValueError(f"sizes must be at least 1024 bytes each, got {min(sizes)}")
    traffic = traffic_bytes or ((32 if _fast() else 128) * 1024**2)
    bws = []
    with using_threads(threads):
        for size in sizes:
            n = size // 4
            buf = torch.ones(n, device=dev)  # [n] float32
            reps = max(1, traffic // size)
            view = buf.as_strided((reps, n), (0, 1))  # [reps, n], every row is the same memory
            t = best_time(lambda: view.sum(), dev, repeats=3 if _fast() else 5)
            bws.append(reps * n * 4 / t)
    used = threads if threads is not None else torch.get_num_threads()
    return MountainResult(
        list(sizes), bws, str(dev), used, cpu_caches() if dev.type == "cpu" else []
    )


def _mem_total() -> float:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return float(line.split()[1]) * 1024
    except OSError:
        pass
    return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


@functools.lru_cache(maxsize=4)
def this_machine(device: str | None = "cpu") -> Hardware:
    """A `Hardware` measured here (cached per process): name = CPU model + thread count, or the GPU name.

    mem_bw is the streaming *read* bandwidth (what a decode step does to the weights); the copy
    bandwidth is kept in `extra["copy_bw"]`. peak_flops["fp32"] is the measured matmul rate.
    """
    dev = resolve_device(device)
    read_bw = measure_bandwidth(str(dev), kind="read")
    copy_bw = measure_bandwidth(str(dev), kind="copy")
    peaks = {"fp32": measure_matmul_flops(str(dev), "fp32")}
    how = "measured here by llmlab.analysis.hardware"
    if dev.type == "cuda":
        props = torch.cuda.get_device_properties(dev)
        peaks["bf16"] = measure_matmul_flops(str(dev), "bf16")
        peaks["fp16"] = measure_matmul_flops(str(dev), "fp16")
        return Hardware(
            name=tr(f"{props.name} (measured)", f"{props.name}（实测）"),
            mem_bw=read_bw,
            peak_flops=peaks,
            mem_size=float(props.total_memory),
            l2_size=float(getattr(props, "L2_cache_size", 0)) or None,
            smem_per_sm=float(getattr(props, "shared_memory_per_multiprocessor", 0)) or None,
            num_sms=props.multi_processor_count,
            interconnect={},
            sources={
                "mem_bw": f"{how}: sum over a 256 MiB-1 GiB buffer",
                "peak_flops": f"{how}: square matmuls",
                "mem_size": "torch.cuda.get_device_properties",
            },
            kind="gpu",
            measured=True,
            extra={"copy_bw": copy_bw},
        )
    caches = cpu_caches()
    threads = torch.get_num_threads()
    ncores = os.cpu_count() or threads
    l2 = next((c["size"] for c in caches if c["level"] == 2), None)
    l1d = next((c["size"] for c in caches if c["level"] == 1 and c["type"] == "Data"), None)
    return Hardware(
        name=tr(f"{cpu_name()}, {threads} threads", f"{cpu_name()}，{threads} 个线程"),
        mem_bw=read_bw,
        peak_flops=peaks,
        mem_size=_mem_total(),
        l2_size=float(l2 * ncores) if l2 else None,
        smem_per_sm=float(l1d) if l1d else None,
        num_sms=ncores,
        interconnect={},
        sources={
            "mem_bw": f"{how}: sum over a buffer 4-8x the last-level cache, fastest run",
            "peak_flops": f"{how}: fp32 square matmul, fastest run",
            "mem_size": "/proc/meminfo",
            "l2_size": "sysfs cache sizes x cores",
        },
        kind="cpu",
        measured=True,
        extra={
            "copy_bw": copy_bw,
            "threads": threads,
            "cpu": cpu_name(),
            "caches": caches,
            "torch": torch.__version__,
        },
    )


def human_bytes(n: float) -> str:
    """`n` bytes as a figure labels them: "80 GB", "50 MB", "256 KB", "64 B"."""
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= size:
            return f"{n / size:.0f} {unit}"
    return f"{n:.0f} B"
