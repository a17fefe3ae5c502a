"""Side-by-side benchmarks: `python -m llmlab bench NAME` runs `llmlab.bench.NAME.main`."""

import argparse


def benchmarks() -> dict[str, str]:
    """Every benchmark (a module here with a `main`) and the first line of its docstring, read
    from the source without importing it (some import torch or vLLM's bridge)."""
    import ast
    from pathlib import Path

    found = {}
    for path in sorted(Path(__file__).parent.glob("*.py")):
        if path.stem.startswith("_"):
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        if any(isinstance(n, ast.FunctionDef) and n.name == "main" for n in tree.body):
            doc = (ast.get_docstring(tree) or "").strip().splitlines()
            line = doc[0] if doc else ""
            # "`python -m llmlab bench x`: what it does" -> "what it does"
            found[path.stem] = line.split("`: ", 1)[-1].rstrip(".")
    return found


def default_attention_backend(model) -> str:
    """The backend the benchmarks give our engine: what `LLM(model)` picks by default (the
    fastest here: "cpu", the C fast path, where a C compiler builds it, else "torch")."""
    from llmlab.engine.builder import resolve_attention_backend

    return resolve_attention_backend(None, model)


def bench_parser(name: str, description: str) -> argparse.ArgumentParser:
    """The argument parser of `python -m llmlab bench NAME`, its `--help` opening with
    `description` (the module's docstring, or its first paragraph) laid out as written."""
    import argparse

    return argparse.ArgumentParser(
        prog=f"python -m llmlab bench {name}",
        description=description,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )


# The options several benchmarks take, each meaning the same wherever it stands: its argparse
# keywords and the opening of its help. `add_option` adds one with the bench's own default.
OPTIONS = {
    "--json": dict(help="output path"),
    "--fast": dict(action="store_true", default=False, help="a small workload"),
    "--device": dict(help="cpu, cuda or cuda:N (default: cuda if any)"),
    "--model": dict(help="model name"),
    "--shape": dict(
        help="random weights of this shape instead of a model: a preset of data/models.json "
        "(smollm2-135m, smollm2-1.7b, ...) or 'tiny'; no model file needed"
    ),
    "--threads": dict(type=int, help="torch (and OpenMP) threads"),
    "--attention": dict(help="llmlab's attention backend"),
    "--batches": dict(help="batch sizes, comma-separated"),
}


def add_option(
    ap: argparse.ArgumentParser, name: str, default=None, note: str = "", **keywords
) -> None:
    """Add the shared option `name` (`OPTIONS`) to `ap` with this bench's `default`; `note`, what
    the bench says of it besides (its default, what it covers here), follows the help in
    parentheses; `keywords` are the bench's own (`choices`)."""
    spec = {"default": default, **OPTIONS[name], **keywords}
    if note:
        spec["help"] = f"{spec['help']} ({note})"
    ap.add_argument(name, **spec)


def chat_prompt_ids(tokenizer) -> list[list[int]]:
    """The prompts of data/prompts.json, each as a user turn through `tokenizer`'s chat template
    (with the assistant's turn opened), as token ids: the prompts every workload draws from."""
    import json

    from llmlab.paths import DATA_DIR

    prompts = json.loads((DATA_DIR / "prompts.json").read_text())["prompts"]
    return [
        tokenizer.encode(
            tokenizer.apply_chat_template(
                [{"role": "user", "content": p["text"]}], add_generation_prompt=True, tokenize=False
            )
        )
        for p in prompts
    ]


def prefix_agreement(ref: list[int], got: list[int]) -> int:
    """How many of `ref`'s tokens `got` reproduces before the first difference."""
    n = 0
    for a, b in zip(ref, got):
        if a != b:
            break
        n += 1
    return n


def write_report(report: dict, path, default=None) -> None:
    """Write a benchmark's results as JSON to `path` (folders made as needed) and say where."""
    import json
    from pathlib import Path

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2, default=default))
    print(f"wrote {path}")


def bench_device(device: str | None):
    """The torch device a benchmark runs on: `device` ("cpu", "cuda", "cuda:N"), or for None
    the GPU where there is one, else the CPU. A bad name, or a GPU asked for where there is
    none, is a ValueError naming `--device`."""
    import torch

    from llmlab.config.engine import check_device, resolve_device

    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        check_device(device)
    except ValueError:
        raise ValueError(f"--device must be cpu, cuda or cuda:N, got {device!r}") from None
    return resolve_device(device, None, option="--device")


def device_info(device) -> dict:
    """What the figures were measured on: the CPU, and the card with its CUDA and Triton
    versions where `device` is a GPU."""
    import importlib.metadata as md
    import os
    import platform

    import torch

    from llmlab.utils import cpu_name

    def version(pkg: str) -> str | None:
        try:
            return md.version(pkg)
        except md.PackageNotFoundError:
            return None

    info = {
        "device": str(device),
        "cpu": cpu_name(),
        "cores": os.cpu_count(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "transformers": version("transformers"),
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info.update(
            gpu=props.name,
            gpu_memory_bytes=props.total_memory,
            cuda=torch.version.cuda,
            triton=version("triton"),
        )
    return info


def machine_info(device=None) -> dict:
    """The machine (`llmlab.bench.device_info`: the card too on a GPU), torch's threads, the
    load and the OpenMP settings."""
    import os

    import torch

    return {
        **device_info(device or torch.device("cpu")),
        "threads": torch.get_num_threads(),
        "load_average_1min": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
        "gomp_spincount": os.environ.get("GOMP_SPINCOUNT"),
    }


def device_line(info: dict) -> str:
    """One line naming the machine of `device_info`: the card first where there is one."""
    versions = f"torch {info['torch']}, transformers {info['transformers']}"
    if "gpu" in info:
        return (
            f"{info['gpu']} ({info['gpu_memory_bytes'] / 2**30:.0f} GiB), {versions}, "
            f"CUDA {info['cuda']}, Triton {info['triton']}; host {info['cpu']}"
        )
    return f"{info['cpu']}, {info['cores']} cores, {versions}"


def free_memory(device) -> None:
    """On a GPU: collect dropped engines now and give the cached blocks back, so one system's
    KV pool does not crowd the next one's. Nothing on a CPU (a collection there costs half a
    second with transformers loaded, and freed memory goes back to malloc anyway)."""
    import gc

    import torch

    if device.type == "cuda":
        gc.collect()
        torch.cuda.empty_cache()


def model_or_shape(model: str | None, shape: str | None) -> tuple[str | None, str | None]:
    """A benchmark's `--model` and `--shape` (random weights of a preset's shape, or "tiny"):
    at most one of them, smollm2-135m when neither is given. ValueError naming the option."""
    from llmlab.config import PRESETS

    if model is not None and shape is not None:
        raise ValueError(f"give --model or --shape, not both (got {model!r} and {shape!r})")
    if shape is not None and shape != "tiny" and shape not in PRESETS:
        raise ValueError(f"--shape: unknown {shape!r}; choose from {sorted(PRESETS)} or 'tiny'")
    return (model or "smollm2-135m", None) if shape is None else (None, shape)


def random_weights(shape: str, dtype=None, device="cpu"):
    """A model of `shape` (a preset's name, or "tiny" for `tiny_config()`) with random weights
    (`llmlab.model.random_model`, seed 0), float32 unless `dtype` says otherwise."""
    import torch

    from llmlab.config import tiny_config
    from llmlab.model import random_model

    cfg = tiny_config() if shape == "tiny" else shape
    return random_model(cfg, seed=0, dtype=dtype or torch.float32, device=device)
