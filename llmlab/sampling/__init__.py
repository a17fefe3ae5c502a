"""Sampling: a request's parameters, the sampler, the logits processors, rejection sampling for
speculative decoding and the grammars of structured output (vLLM: `vllm/sampling_params.py`,
`vllm/v1/sample/`, `vllm/v1/structured_output/`).

- `params`: `SamplingParams` and `Logprob`;
- `penalties`: `apply_logits_processors` (logit bias; presence, frequency, repetition penalties);
- `sampler`: `sample`, `apply_top_k_top_p`, `make_generator` (seeded, per request, per device);
- `rejection_sampler`: greedy verification and Leviathan/Chen rejection sampling;
- `structured_output`: grammars (xgrammar), their compiled cache and per-request matchers.
"""

from llmlab.sampling.params import MAX_LOGPROBS, SAMPLING_EPS, Logprob, SamplingParams
from llmlab.sampling.penalties import apply_logits_processors
from llmlab.sampling.sampler import (
    apply_top_k_top_p,
    check_generators,
    make_generator,
    sample,
)

__all__ = [
    "MAX_LOGPROBS",
    "SAMPLING_EPS",
    "Logprob",
    "SamplingParams",
    "apply_logits_processors",
    "apply_top_k_top_p",
    "check_generators",
    "make_generator",
    "sample",
]
