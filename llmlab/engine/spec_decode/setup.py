"""Building the speculative path of an `LLMEngine` (its scheduler and model runner)."""

from __future__ import annotations

from typing import Any

from llmlab.engine.spec_decode.model_runner import SpecDecodeModelRunner
from llmlab.engine.spec_decode.ngram_proposer import NgramProposer
from llmlab.engine.spec_decode.scheduler import SpecDecodeScheduler
from llmlab.engine_config import SpeculativeConfig
from llmlab.model import LlamaModel


def default_draft_num_layers(model: LlamaModel) -> int:
    """A quarter of the target's layers (at least 1)."""
    return max(1, model.config.num_hidden_layers // 4)


def build_spec_decode(
    spec: SpeculativeConfig,
    model: LlamaModel,
    kv_cache_manager: Any,
    scheduler_kwargs: dict,
    runner_args: tuple,
    runner_kwargs: dict,
) -> tuple[SpecDecodeScheduler, SpecDecodeModelRunner]:
    if spec.method == "ngram":
        proposer, draft_layers = NgramProposer(spec.prompt_lookup_min, spec.prompt_lookup_max), None
    else:
        proposer = None
        draft_layers = spec.draft_num_layers or default_draft_num_layers(model)
        total = model.config.num_hidden_layers
        if not 1 <= draft_layers < total:
            raise ValueError(
                f"speculative_config['draft_num_layers'] must be in [1, {total - 1}] "
                f"(the target has {total} layers), got {draft_layers}"
            )
    scheduler = SpecDecodeScheduler(
        kv_cache_manager,
        num_speculative_tokens=spec.num_speculative_tokens,
        proposer=proposer,
        **scheduler_kwargs,
    )
    runner = SpecDecodeModelRunner(*runner_args, draft_num_layers=draft_layers, **runner_kwargs)
    return scheduler, runner
