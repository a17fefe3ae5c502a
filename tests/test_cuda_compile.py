"""Compile every CUDA source in kernels/ with nvcc for sm_80 and sm_90 (compile only).

The .cu files include no torch headers (their C launcher API is in kernels/llmlab_kernels.h),
so nvcc builds them standalone on a machine without a GPU (seconds for most; about 75 s of CPU
for paged_attention.cu's 48 kernels, two architectures at once). Warnings are errors.
The torch glue (kernels/binding.cpp) needs torch's CUDA headers and is built by
`llmlab.ops.cuda_backend` on a GPU machine instead.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

KERNELS = Path(__file__).resolve().parents[1] / "kernels"
CU_FILES = sorted(KERNELS.glob("*.cu"))
ARCH_FLAGS = ["-gencode", "arch=compute_80,code=sm_80", "-gencode", "arch=compute_90,code=sm_90"]


def find_nvcc() -> str | None:
    """nvcc on PATH, else under $CUDA_HOME or /usr/local/cuda."""
    found = shutil.which("nvcc")
    if found:
        return found
    for root in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if root and (Path(root) / "bin" / "nvcc").is_file():
            return str(Path(root) / "bin" / "nvcc")
    return None


NVCC = find_nvcc()


def test_kernels_directory_has_the_expected_sources():
    names = {p.name for p in CU_FILES}
    assert {"cache_kernels.cu", "paged_attention.cu"} <= names, f"found {sorted(names)}"
    assert (KERNELS / "binding.cpp").is_file()
    for cu in CU_FILES:
        assert "torch/" not in cu.read_text(), f"{cu.name} includes a torch header"


@pytest.mark.nvcc
@pytest.mark.skipif(NVCC is None, reason="nvcc not found on PATH, $CUDA_HOME or /usr/local/cuda")
@pytest.mark.parametrize("source", CU_FILES, ids=[p.name for p in CU_FILES])
def test_cuda_source_compiles_for_sm80_and_sm90(source, tmp_path):
    cmd = [
        NVCC,
        "-c",
        str(source),
        "-o",
        str(tmp_path / (source.stem + ".o")),
        "-I",
        str(KERNELS),
        *ARCH_FLAGS,
        "--threads",  # the two architectures side by side (paged_attention.cu: ~75 s of CPU)
        "2",
        "-O3",
        "-Werror",
        "all-warnings",
        "-Xcompiler",
        "-Wall",
    ]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, (
        f"nvcc failed on {source.name} (exit {result.returncode}):\n{result.stderr[-4000:]}"
    )
    assert (tmp_path / (source.stem + ".o")).stat().st_size > 0
