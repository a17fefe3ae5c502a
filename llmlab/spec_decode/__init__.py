"""Speculative decoding: propose k tokens cheaply, verify them in one target forward.

vLLM keeps the proposers in `vllm/v1/spec_decode/` and the verification in
`vllm/v1/sample/rejection_sampler.py`; its `GPUModelRunner` holds a drafter and a rejection
sampler. llmlab does the same: the model runner (`llmlab.worker.model_runner`) holds the proposer
this module makes and verifies with `llmlab.sampling.rejection_sampler`; the scheduler
(`llmlab.core.scheduler`) gives decoding requests the slots for their drafts
(`schedule_drafts`); the engine's one step takes the several tokens a request may get.

- `SpeculativeConfig` (in `llmlab.config.engine`, beside `EngineConfig`):
  `LLM(..., speculative_config={"method": "ngram", ...})`, vLLM's names;
- `ngram_proposer.NgramProposer`: prompt lookup (the next tokens after an earlier occurrence of
  the context's last n tokens);
- `draft_model.EarlyExitProposer`: the target's own first n layers and its LM head as the draft
  (self-speculative), writing its K/V into the target's cache, which the verify step rewrites;
- `metrics.SpecDecodingStats`: drafts proposed and accepted, vLLM's counters.
"""

from __future__ import annotations

from typing import Any

from llmlab.config.engine import SpeculativeConfig
from llmlab.spec_decode.draft_model import EarlyExitProposer
from llmlab.spec_decode.metrics import SpecDecodingStats
from llmlab.spec_decode.ngram_proposer import NgramProposer

__all__ = [
    "EarlyExitProposer",
    "NgramProposer",
    "SpecDecodingStats",
    "SpeculativeConfig",
    "default_draft_num_layers",
    "make_proposer",
]


def default_draft_num_layers(num_layers: int) -> int:
    """A quarter of the target's layers (at least 1)."""
    return max(1, num_layers // 4)


def make_proposer(spec: SpeculativeConfig | None, model: Any) -> Any:
    """The proposer of `spec` for `model` (the implementation the runner computes with), or
    None without speculation. Raises ValueError naming `draft_num_layers` when it does not fit."""
    if spec is None:
        return None
    if spec.method == "ngram":
        return NgramProposer(spec.prompt_lookup_min, spec.prompt_lookup_max)
    total = model.config.num_hidden_layers
    return EarlyExitProposer(model, spec.draft_num_layers or default_draft_num_layers(total))
