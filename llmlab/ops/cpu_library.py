"""The CPU kernel library: `kernels/cpu_*.c` compiled on first use and loaded with ctypes.

The C files include no torch header: on first use they are compiled with the system C compiler
(`cc -O3 -march=native -fopenmp`, under a second) into `$LLMLAB_CACHE/cpu_kernels/<hash>/`
(default `~/.cache/llmlab`), keyed by the source, the compiler and this CPU, never into the
repository; later processes reuse the library. It is loaded with ctypes and called with raw
pointers, with the signatures `kernels/cpu_kernels.h` declares (read by `python_signatures`).
OpenMP runs in the runtime PyTorch already loaded (the same `libgomp.so.1`), so `torch.set_num_threads` governs it too. Without a C compiler `available()`
says why and every kernel raises a RuntimeError.

Who calls it: `llmlab.ops.cpu_backend` (attention, a decoder layer's elementwise steps, the fused
one-token layer) and `llmlab.ops.cpu_matmul` (the matmuls on float32, bf16 and int8 weights).
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import os
import platform
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch

from llmlab.paths import cache_dir

KERNELS_DIR = Path(__file__).resolve().parents[2] / "kernels"
# one library: attention and cache writes, a decoder layer's elementwise steps, the fused
# one-token layer and the one-row GEMV (`llmlab.model.cpu`, the engine's CPU fast path)
SOURCES = (
    KERNELS_DIR / "cpu_attention.c",
    KERNELS_DIR / "cpu_layer.c",
    KERNELS_DIR / "cpu_gemv.c",
    KERNELS_DIR / "cpu_quant.c",
    KERNELS_DIR / "cpu_gemm.c",
    KERNELS_DIR / "cpu_sample.c",
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

# The C types of the header's prototypes as ctypes sees them (any pointer is a void pointer).
_CTYPES = {"void": None, "int": ctypes.c_int, "int64_t": ctypes.c_int64, "float": ctypes.c_float}
# The part of `kernels/cpu_kernels.h` that declares what Python calls.
_PYTHON_SECTION = re.compile(r"/\* called from Python \*/(.*?)/\* called from another", re.S)
_PROTOTYPE = re.compile(r"\b(int|void)\s+(llmlab_\w+)\s*\(([^)]*)\)\s*;")


def python_signatures(header: str) -> dict[str, tuple[object, list[object]]]:
    """{name: (ctypes restype, [ctypes argtypes])} of each function the header `header` declares
    under "called from Python": the header is the one place the signatures are written, and a
    type ctypes is not told about is refused rather than passed as garbage."""
    section = _PYTHON_SECTION.search(header)
    if section is None:
        raise ValueError("header: no section /* called from Python */ ... /* called from another")
    found = {}
    for ret, name, args in _PROTOTYPE.findall(section[1]):
        kinds = []
        for arg in (" ".join(a.split()) for a in args.split(",")):
            if "*" in arg:
                kinds.append(ctypes.c_void_p)
            elif arg != "void":  # f(void) takes nothing
                kind = arg.removeprefix("const ").split(" ")[0]
                if kind not in _CTYPES or kind == "void":
                    raise ValueError(f"{name}: argument {arg!r} has a type ctypes is not told of")
                kinds.append(_CTYPES[kind])
        found[name] = (_CTYPES[ret], kinds)
    return found


_lib: ctypes.CDLL | None = None
_error: str | None = None


def traced(name: str):
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
    header = (KERNELS_DIR / "cpu_kernels.h").read_text()
    for name, (restype, argtypes) in python_signatures(header).items():
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = restype, argtypes
    return lib


# instruction sets chosen at run time (LLMLAB_ISA_* of kernels/cpu_kernels.h)
ISA_FLAGS = {"avx512": 1, "avx512_bf16": 2, "avx512_vnni": 4, "avx2": 8}  # avx2: and FMA
# `LLMLAB_ISA_CAP=avx2` (names of `ISA_FLAGS`, comma-separated; empty: none): the kernels start
# capped to those instruction sets, as `cpu_matmul.set_isa_cap` caps them. How this CPU
# measures the paths of a CPU with fewer (avx2: a laptop's x86 without AVX-512).
ISA_CAP_ENV = "LLMLAB_ISA_CAP"


def isa_cap_mask(names: list[str] | None) -> int:
    """The C kernels' cap (`llmlab_set_isa_cap`) for at most `names` of `ISA_FLAGS`; -1 (no cap)
    for None. ValueError naming the unknown ones."""
    if names is None:
        return -1
    unknown = [n for n in names if n not in ISA_FLAGS]
    if unknown:
        raise ValueError(f"names: got {unknown}, expected names from {list(ISA_FLAGS)}")
    return sum(ISA_FLAGS[n] for n in set(names))


def _start_cap(lib: ctypes.CDLL) -> None:
    """Apply `$LLMLAB_ISA_CAP` where set; RuntimeError naming it and the allowed names."""
    value = os.environ.get(ISA_CAP_ENV)
    if value is None:
        return
    names = [n.strip() for n in value.split(",") if n.strip()]
    try:
        lib.llmlab_set_isa_cap(isa_cap_mask(names))
    except ValueError as e:
        raise RuntimeError(f"${ISA_CAP_ENV}={value!r}: {e}") from None


def load_library() -> ctypes.CDLL:
    """Compile (first time) and load the C kernels, capped by `$LLMLAB_ISA_CAP` where set;
    RuntimeError saying why if that fails."""
    global _lib, _error
    if _lib is None:
        if _error is not None:
            raise RuntimeError(_error)
        try:
            lib = _build()
            _start_cap(lib)
        except (RuntimeError, OSError) as e:
            _error = str(e)
            raise RuntimeError(_error) from None
        _lib = lib
    return _lib


def loaded() -> bool:
    """Whether this process has already loaded the C kernels (the fast path loads them when an
    engine starts on it): a caller that may use them without building them for its own sake,
    so that the readable path never compiles C (`llmlab.sampling.sample`'s argmax)."""
    return _lib is not None


def available() -> tuple[bool, str]:
    """(True, "") when the C kernels can be built and loaded here, else (False, why)."""
    try:
        load_library()
        return True, ""
    except RuntimeError as e:
        return False, str(e)
