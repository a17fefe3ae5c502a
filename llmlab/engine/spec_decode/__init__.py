"""Speculative decoding: propose k tokens cheaply, verify them in one target forward.

vLLM keeps this in `vllm/v1/spec_decode/` (the proposers) and `vllm/v1/sample/rejection_sampler.py`
(the verification); llmlab mirrors that split:

- `SpeculativeConfig` (defined in `llmlab.engine_config`, beside `EngineConfig`):
  `LLM(..., speculative_config={"method": "ngram", ...})`, vLLM's names;
- `ngram_proposer.NgramProposer`: prompt lookup (the next tokens after an earlier occurrence of
  the context's last n tokens);
- `draft_model.EarlyExitProposer`: the target's own first n layers and its LM head as the draft
  (self-speculative), writing its K/V into the target's cache, which the verify step rewrites;
- `rejection_sampler`: greedy verification and Leviathan/Chen rejection sampling, which keeps the
  target's distribution exactly;
- `scheduler.SpecDecodeScheduler`, `model_runner.SpecDecodeModelRunner`, `engine.spec_step`:
  the second path an engine with a speculative config runs, chosen once when it is built.
"""

from llmlab.engine.spec_decode.metrics import SpecDecodingStats
from llmlab.engine.spec_decode.rejection_sampler import greedy_verify, rejection_sample
from llmlab.engine_config import SpeculativeConfig

__all__ = ["SpeculativeConfig", "SpecDecodingStats", "greedy_verify", "rejection_sample"]
