"""llmlab: a runnable course on how LLM inference engines such as vLLM work.

`from llmlab import LLM, SamplingParams` gives the engine's public API (vLLM's names).
Submodules are imported on first use so that `import llmlab` stays fast.
"""

from __future__ import annotations

import importlib
import os

# How OpenMP threads wait between operations: sleep, or spin briefly first, whichever a probe
# measured faster on this machine (`llmlab.openmp`); set before torch is first imported, as the
# OpenMP runtime reads it once. Whoever sets OMP_WAIT_POLICY or GOMP_SPINCOUNT decides instead.
from llmlab import openmp as _openmp  # noqa: E402

_openmp.SOURCE = _openmp.apply()
# Without an NVIDIA GPU, Triton kernels run through its interpreter. The switch must be set
# before anything imports triton (transformers can, when the model loads), so it lives here.
if not os.path.exists("/proc/driver/nvidia") and not os.path.exists("/dev/nvidiactl"):
    os.environ.setdefault("TRITON_INTERPRET", "1")


__version__ = "0.1.0"

_LAZY = {
    "SamplingParams": "llmlab.sampling",
    "LLM": "llmlab.engine",
    "LLMEngine": "llmlab.engine",
    "RequestOutput": "llmlab.engine",
    "set_language": "llmlab.i18n",
    "language": "llmlab.i18n",
    "tr": "llmlab.i18n",
    "say": "llmlab.i18n",
    "say_table": "llmlab.i18n",
    "notebook_text": "llmlab.i18n",
}
_SUBMODULES = {
    "analysis",
    "bench",
    "config",
    "course",
    "engine",
    "i18n",
    "kvcache",
    "model",
    "ops",
    "parallel",
    "paths",
    "sampling",
    "serve",
    "spec_decode",
    "tokenizer",
    "tools",
    "utils",
    "worker",
}
# DESIGN.md's public API names three analysis modules at the top (`from llmlab import costs,
# hardware, roofline`); they live in `llmlab.analysis`
_ANALYSIS = {"costs", "hardware", "roofline"}


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    if name in _SUBMODULES:
        return importlib.import_module(f"llmlab.{name}")
    if name in _ANALYSIS:
        return importlib.import_module(f"llmlab.analysis.{name}")
    raise AttributeError(f"module 'llmlab' has no attribute {name!r}")


__all__ = [
    "LLM",
    "LLMEngine",
    "RequestOutput",
    "SamplingParams",
    "set_language",
    "language",
    "tr",
    "say",
    "say_table",
    "notebook_text",
    "__version__",
]
