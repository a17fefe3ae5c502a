"""The generation loops of chapters 03 and 04, one request at a time.

`generate_no_cache` recomputes every token's K and V at every step (one full forward over the
whole sequence per new token). `generate_with_cache` keeps them in a `ContiguousKVCache`: the
prompt is run once (prefill), then each step feeds one token (decode). Both give the same tokens;
only the work differs, and chapter 04 times both.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace

import torch

from llmlab.core.request import Request
from llmlab.kvcache import ContiguousKVCache
from llmlab.model.llama import LlamaModel
from llmlab.sampling import SamplingParams, make_generator, sample


@dataclass
class GenerationResult:
    token_ids: list[int]  # the new tokens only
    step_times: list[float] = field(default_factory=list)  # seconds per generated token
    num_forwards: int = 0
    tokens_processed: int = 0  # tokens fed through the model in all


def _check_args(model: LlamaModel, prompt_ids: list[int], max_new_tokens: int) -> None:
    if len(prompt_ids) == 0:
        raise ValueError("prompt_ids must hold at least one token")
    vocab = model.config.vocab_size
    bad = [t for t in prompt_ids if not 0 <= int(t) < vocab]
    if bad:
        raise ValueError(f"prompt_ids must be in [0, {vocab - 1}]; got {bad[:5]}")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")


def _eos_ids(model: LlamaModel) -> frozenset[int]:
    eos = model.config.eos_token_id
    return frozenset(eos if isinstance(eos, list) else [] if eos is None else [eos])


def _generate(
    model: LlamaModel,
    prompt_ids: list[int],
    max_new_tokens: int,
    params: SamplingParams | None,
    forward,
    feed_whole_sequence: bool,
) -> GenerationResult:
    """The loop both versions share: forward → sample → append, until EOS or max_new_tokens.

    `forward(tokens)` returns the logits [1, vocab] for the next token after feeding `tokens`:
    the whole sequence each step without a cache, only the newest token with one. When to stop
    and what may not be sampled yet (EOS and stop tokens before `min_tokens`) are the engine's
    own rules: the loop keeps a `Request` and asks it, so `LLM` and this loop agree.
    """
    params = params or SamplingParams(temperature=0.0)
    _check_args(model, prompt_ids, max_new_tokens)
    params = replace(
        params, max_tokens=max_new_tokens, min_tokens=min(params.min_tokens, max_new_tokens)
    )
    req = Request("loop", list(prompt_ids), params, arrival_time=0.0, eos_token_ids=_eos_ids(model))
    gen = make_generator(params.seed)
    result = GenerationResult(token_ids=req.output_token_ids)
    feed = list(prompt_ids)  # step 1 feeds the prompt
    while True:
        t0 = time.perf_counter()
        logits = forward(feed)  # [1, vocab]
        banned = req.banned_token_ids()
        if banned:
            logits = logits.clone()
            logits[0, list(banned)] = float("-inf")
        token = int(sample(logits, [params], [gen])[0])
        result.step_times.append(time.perf_counter() - t0)
        result.num_forwards += 1
        result.tokens_processed += len(feed)
        req.append_output_token(token)
        feed = feed + [token] if feed_whole_sequence else [token]
        if req.check_stop() is not None:
            return result


def generate_no_cache(
    model: LlamaModel,
    prompt_ids: list[int],
    max_new_tokens: int = 32,
    params: SamplingParams | None = None,
    backend: str = "torch",
) -> GenerationResult:
    """Naive loop: each new token costs a forward over the *whole* sequence so far."""

    def forward(ids: list[int]) -> torch.Tensor:
        return model.logits_for(ids, backend=backend, last_only=True)  # [1, vocab]

    return _generate(model, prompt_ids, max_new_tokens, params, forward, feed_whole_sequence=True)


def generate_with_cache(
    model: LlamaModel,
    prompt_ids: list[int],
    max_new_tokens: int = 32,
    params: SamplingParams | None = None,
    backend: str = "torch",
) -> GenerationResult:
    """Prefill the prompt once into a KV cache, then decode one token per forward."""
    cache = ContiguousKVCache(
        model.config,
        batch_size=1,
        max_len=max(1, len(prompt_ids) + max_new_tokens),
        dtype=model.dtype,
        device=model.device,
    )

    def forward(new_ids: list[int]) -> torch.Tensor:
        n = [len(new_ids)]
        ctx = cache.context(n, backend=backend)
        hidden = model(
            torch.tensor(new_ids, device=model.device), cache.positions(n).to(model.device), ctx
        )
        cache.advance(n)
        return model.compute_logits(hidden[-1:])  # [1, vocab]

    return _generate(model, prompt_ids, max_new_tokens, params, forward, feed_whole_sequence=False)
