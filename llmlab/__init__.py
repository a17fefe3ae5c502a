"""llmlab: a runnable course on how LLM inference engines such as vLLM work.

`from llmlab import LLM, SamplingParams` gives the engine's public API (vLLM's names).
Submodules are imported on first use so that `import llmlab` stays fast.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import os
import sys

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
    "ops",
    "model",
    "kvcache",
    "engine",
    "engine_config",
    "tokenizer",
    "config",
    "sampling",
    "bench",
    "weights",
    "request",
    "paths",
    "serve",
    "i18n",
    "generate",
    "parallel",
    "analysis",
    "course",
    "tools",
    "structured_output",
    "detokenizer",
}

# The package is in three layers (docs/design.md): the engine here, `llmlab.analysis`, and
# `llmlab.course` with `llmlab.tools` beside it. The modules that moved into those folders keep
# their earlier names, which the notebooks and outside code use: `llmlab.costs` is
# `llmlab.analysis.costs`, `llmlab.check.ch04` is `llmlab.course.check.ch04`.
MOVED = {
    "costs": "analysis.costs",
    "roofline": "analysis.roofline",
    "hardware": "analysis.hardware",
    "sim": "analysis.sim",
    "metrics": "analysis.metrics",
    "parallel.cost": "analysis.parallel_cost",
    "check": "course.check",
    "widgets": "course.widgets",
    "figures": "course.figures",
    "instructor": "course.instructor",
    "lang": "course.lang",
    "glossary": "course.glossary",
    "notebook_runner": "course.notebook_runner",
    "offline_html": "course.offline_html",
    "session": "course.session",
    "doctor": "tools.doctor",
    "vllm_bridge": "tools.vllm_bridge",
    "vllm_worker": "tools.vllm_worker",
}


class _MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports `llmlab.<old name>[.sub]` as the module at its new place (one module object,
    two names)."""

    @staticmethod
    def _target(name: str) -> str | None:
        if not name.startswith("llmlab."):
            return None
        rest = name[len("llmlab.") :]
        for old, new in MOVED.items():
            if rest == old or rest.startswith(old + "."):
                return "llmlab." + new + rest[len(old) :]
        return None

    def find_spec(self, name, path=None, target=None):
        new = self._target(name)
        return None if new is None else importlib.util.spec_from_loader(name, self)

    def create_module(self, spec):
        return importlib.import_module(self._target(spec.name))

    def exec_module(self, module):
        pass


sys.meta_path.insert(0, _MovedModules())


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    if name in _SUBMODULES or name in MOVED:
        return importlib.import_module(f"llmlab.{name}")
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
