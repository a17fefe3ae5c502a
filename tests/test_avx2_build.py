"""The C kernels as a laptop's x86 CPU without AVX-512 builds and runs them: compiled for
`-march=haswell` (AVX2 and FMA: `kernels/cpu_vec.h`'s vectors are then 8 floats, not 16) and
capped to AVX2 (`LLMLAB_ISA_CAP`), on this CPU, in a subprocess with a library cache of its own.
The CPU kernel tests of test_ops (paged attention against its reference over a grid and on random
mixed batches, the decode attention, the layer kernels, argmax) and the AVX2 tiles' tests of
test_quantization run there: the same references, the other build."""

from __future__ import annotations

import os
import platform
import re
import subprocess
import sys
from pathlib import Path

import pytest

from llmlab.ops import cpu_library, cpu_matmul

ROOT = Path(__file__).resolve().parents[1]
SELECTED = (
    "cpu_matches_reference or cpu_random_mixed or cpu_decode_attention_equals "
    "or cpu_layer_kernels or cpu_argmax or avx2"
)


def _haswell_compiler(tmp_path: Path) -> Path:
    """A compiler command that builds for Haswell whatever flags it is given (the last -march
    wins), or a skip where this machine cannot run such a build."""
    cc = cpu_library._compiler()
    if platform.machine() not in ("x86_64", "AMD64") or cc is None:
        pytest.skip("needs an x86-64 machine and a C compiler")
    if not cpu_library.available()[0] or "avx2" not in cpu_matmul.isa():
        pytest.skip("this CPU runs no AVX2 kernels")
    wrapper = tmp_path / "cc"
    wrapper.write_text(f'#!/bin/sh\nexec "{cc}" "$@" -march=haswell\n')
    wrapper.chmod(0o755)
    return wrapper


@pytest.mark.slow
def test_the_cpu_kernels_built_for_an_avx2_cpu_pass_their_tests(tmp_path):
    wrapper = _haswell_compiler(tmp_path)
    macros = subprocess.run(
        [str(wrapper), *cpu_library.FLAGS[:2], "-dM", "-E", str(ROOT / "kernels/cpu_vec.h")],
        capture_output=True,
        text=True,
    )
    assert macros.returncode == 0, macros.stderr
    assert "#define VW 8\n" in macros.stdout  # the build under test is the 8-float one
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env.update(CC=str(wrapper), LLMLAB_CACHE=str(tmp_path / "cache"), LLMLAB_ISA_CAP="avx2")
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist"]
        + ["tests/test_ops.py", "tests/test_quantization.py", "-k", SELECTED],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    passed = re.search(r"(\d+) passed", run.stdout)
    assert passed and int(passed[1]) >= 100 and " failed" not in run.stdout, run.stdout[-500:]
    built = list((tmp_path / "cache" / "cpu_kernels").glob("*/libllmlab_cpu.so"))
    assert len(built) == 1, built  # one library, built with the wrapper
