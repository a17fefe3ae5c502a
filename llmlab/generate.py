"""The generation loops of chapters 03 and 04, one request at a time.

`generate_no_cache` recomputes every token's K and V at every step (one full forward over the
whole sequence per new token). `generate_with_cache` keeps them in a `ContiguousKVCache`: the
prompt is run once (prefill), then each step feeds one token (decode). Both give the same tokens;
only the work differs, and chapter 04 times both.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from llmlab.kvcache import ContiguousKVCache
from llmlab.model import LlamaModel
from llmlab.sampling import SamplingParams, make_generator, sample


@dataclass
class GenerationResult:
    token_ids: list[int]                                   # the new tokens only
    step_times: list[float] = field(default_factory=list)  # seconds per generated token
    num_forwards: int = 0
    tokens_processed: int = 0                              # tokens fed through the model in all


def _check_args(model: LlamaModel, prompt_ids: list[int], max_new_tokens: int) -> None:
    if len(prompt_ids) == 0:
        raise ValueError("prompt_ids must hold at least one token")
    vocab = model.config.vocab_size
    bad = [t for t in prompt_ids if not 0 <= int(t) < vocab]
    if bad:
        raise ValueError(f"prompt_ids must be in [0, {vocab - 1}]; got {bad[:5]}")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")


def _stop_ids(model: LlamaModel, params: SamplingParams) -> set[int]:
    if params.ignore_eos:
        return set(params.stop_token_ids or [])
    eos = model.config.eos_token_id
    eos = set(eos if isinstance(eos, list) else [] if eos is None else [eos])
    return eos | set(params.stop_token_ids or [])


def _generate(model: LlamaModel, prompt_ids: list[int], max_new_tokens: int,
              params: SamplingParams | None, forward, feed_whole_sequence: bool) -> GenerationResult:
    """The loop both versions share: forward → sample → append, until EOS or max_new_tokens.

    `forward(tokens)` returns the logits [1, vocab] for the next token after feeding `tokens`:
    the whole sequence each step without a cache, only the newest token with one.
    """
    params = params or SamplingParams(temperature=0.0)
    _check_args(model, prompt_ids, max_new_tokens)
    gen = make_generator(params.seed)
    stops = _stop_ids(model, params)
    result = GenerationResult(token_ids=[])
    feed = list(prompt_ids)                                               # step 1 feeds the prompt
    for _ in range(max_new_tokens):
        t0 = time.perf_counter()
        token = int(sample(forward(feed), [params], [gen])[0])
        result.step_times.append(time.perf_counter() - t0)
        result.num_forwards += 1
        result.tokens_processed += len(feed)
        result.token_ids.append(token)
        feed = feed + [token] if feed_whole_sequence else [token]
        if token in stops and len(result.token_ids) >= params.min_tokens:
            break
    return result


def generate_no_cache(model: LlamaModel, prompt_ids: list[int], max_new_tokens: int = 32,
                      params: SamplingParams | None = None, backend: str = "torch") -> GenerationResult:
    """Naive loop: each new token costs a forward over the *whole* sequence so far."""
    def forward(ids: list[int]) -> torch.Tensor:
        return model.logits_for(ids, backend=backend, last_only=True)      # [1, vocab]

    return _generate(model, prompt_ids, max_new_tokens, params, forward, feed_whole_sequence=True)


def generate_with_cache(model: LlamaModel, prompt_ids: list[int], max_new_tokens: int = 32,
                        params: SamplingParams | None = None, backend: str = "torch") -> GenerationResult:
    """Prefill the prompt once into a KV cache, then decode one token per forward."""
    cache = ContiguousKVCache(model.config, batch_size=1, max_len=max(1, len(prompt_ids) + max_new_tokens),
                              dtype=model.dtype, device=model.device)

    def forward(new_ids: list[int]) -> torch.Tensor:
        n = [len(new_ids)]
        ctx = cache.context(n, backend=backend)
        hidden = model(torch.tensor(new_ids, device=model.device), cache.positions(n).to(model.device), ctx)
        cache.advance(n)
        return model.compute_logits(hidden[-1:])                          # [1, vocab]

    return _generate(model, prompt_ids, max_new_tokens, params, forward, feed_whole_sequence=False)
