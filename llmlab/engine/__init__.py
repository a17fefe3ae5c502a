"""The engine loop and its entry point: `LLMEngine` (one step: schedule, run the model, update,
outputs), `LLM` (vLLM: `vllm/v1/engine/`, `vllm/entrypoints/llm.py`), the detokenizer, and
`generate`, the plain loops of chapters 03 and 04 that the engine replaces. `Request` and
`Scheduler` live in `llmlab.core`; they are importable from here too, as the public API says.

The names below are imported on first use, so that `import llmlab.engine` stays cheap."""

from __future__ import annotations

import importlib

_WHERE = {
    "LLM": "llmlab.engine.llm",
    "LLMEngine": "llmlab.engine.llm_engine",
    "CompletionOutput": "llmlab.engine.outputs",
    "RequestOutput": "llmlab.engine.outputs",
    "Request": "llmlab.core.request",
    "RequestMetrics": "llmlab.core.request",
    "RequestStatus": "llmlab.core.request",
    "Scheduler": "llmlab.core.scheduler",
    "SchedulerOutput": "llmlab.core.scheduler",
    "EngineConfig": "llmlab.config.engine",
    "ModelRunner": "llmlab.worker.model_runner",
}
__all__ = sorted(_WHERE)


def __getattr__(name: str):
    if name in _WHERE:
        return getattr(importlib.import_module(_WHERE[name]), name)
    raise AttributeError(f"module 'llmlab.engine' has no attribute {name!r}")
