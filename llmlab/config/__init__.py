"""Configuration, stated once (vLLM: `vllm/config/`): the shapes of real models
(`model`: `ModelConfig`, the presets of `data/models.json`) and the engine's settings with their
defaults and checks (`engine`: `EngineConfig`, `SpeculativeConfig`)."""

from llmlab.config.engine import (
    DEFAULT_KV_CACHE_BYTES,
    DEFAULT_MAX_MODEL_LEN,
    DTYPES,
    KV_CACHE_DTYPES,
    PRECISIONS,
    QUANTIZATIONS,
    SCHEDULER_INTERFACE,
    SCHEDULING_POLICIES,
    EngineConfig,
    SpeculativeConfig,
    check_device,
    check_scheduler_cls,
    resolve_device,
)
from llmlab.config.model import PRESETS, ModelConfig, get_config, tiny_config

__all__ = [
    "DEFAULT_KV_CACHE_BYTES",
    "DEFAULT_MAX_MODEL_LEN",
    "DTYPES",
    "KV_CACHE_DTYPES",
    "PRECISIONS",
    "PRESETS",
    "QUANTIZATIONS",
    "SCHEDULER_INTERFACE",
    "SCHEDULING_POLICIES",
    "EngineConfig",
    "ModelConfig",
    "SpeculativeConfig",
    "check_device",
    "check_scheduler_cls",
    "get_config",
    "resolve_device",
    "tiny_config",
]
