"""The inference engine: `Request`, `Scheduler`, `ModelRunner`, `LLMEngine`, `LLM`."""

from llmlab.engine.llm import LLM
from llmlab.engine.llm_engine import EngineConfig, LLMEngine
from llmlab.engine.model_runner import ModelRunner
from llmlab.engine.outputs import CompletionOutput, RequestOutput
from llmlab.engine.scheduler import Scheduler, SchedulerOutput
from llmlab.request import Request, RequestMetrics, RequestStatus

__all__ = [
    "LLM",
    "LLMEngine",
    "EngineConfig",
    "ModelRunner",
    "RequestOutput",
    "CompletionOutput",
    "Request",
    "RequestMetrics",
    "RequestStatus",
    "Scheduler",
    "SchedulerOutput",
]
