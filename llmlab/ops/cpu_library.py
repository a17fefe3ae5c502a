"""The CPU kernel library: `kernels/cpu_*.c` compiled on first use and loaded with ctypes.

The C files include no torch header: on first use they are compiled with the system C compiler
(`cc -O3 -march=native -fopenmp`, under a second) into `$LLMLAB_CACHE/cpu_kernels/<hash>/`
(default `~/.cache/llmlab`), keyed by the source, the compiler and this CPU, never into the
repository; later processes reuse the library. It is loaded with ctypes and called with raw
pointers, with the signatures of `SIGNATURES` (a test checks them against
`kernels/cpu_kernels.h`). OpenMP runs in the runtime PyTorch already loaded (the same
`libgomp.so.1`), so `torch.set_num_threads` governs it too. Without a C compiler `available()`
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
    "llmlab_pack_weight": ("void", ("ptr", "i64", "i64", "i64", "ptr")),
    "llmlab_packed_gemm": (
        "int",
        ("ptr", "i64", "ptr", "i64", "ptr", "ptr", "ptr", "i64", "i64", "i64"),
    ),
    "llmlab_time_layer_phases": ("void", ("ptr",)),
    "llmlab_isa": ("int", ()),
    "llmlab_set_isa_cap": ("void", ("i64",)),
}

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
