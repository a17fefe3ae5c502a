"""The numbers behind speculative decoding (chapter 14).

- `verify_step_seconds(model, ids, context, num_tokens)`: one forward over `num_tokens` new
  tokens after `context - num_tokens` cached ones, measured: the cost of a verify step of
  k = num_tokens - 1 drafts, against the one-token decode step (num_tokens = 1).
- `chi_square_sf(observed, expected)`: the chi-square test's p-value, for checking that a
  sampler keeps a distribution (the engine's tests and chapter 14's checker use it).
- `expected_tokens_per_step(acceptance, k)`: the tokens a verify step yields on average when
  each draft token is accepted with probability `acceptance`, independently, and the step stops
  at the first rejection (it always yields one token of the target's own).
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from llmlab.kvcache import ContiguousKVCache
from llmlab.utils import best_of


@torch.inference_mode()
def verify_step_seconds(
    model: Any, ids: Sequence[int], context: int, num_tokens: int, repeats: int = 3
) -> float:
    """Seconds of one forward over `num_tokens` new tokens with `context - num_tokens` tokens
    already cached (measured, best of `repeats`); the logits of every new position are
    computed, as a verify step needs them."""
    if not 1 <= num_tokens <= context <= len(ids):
        raise ValueError(
            f"need 1 <= num_tokens <= context <= len(ids); got num_tokens={num_tokens}, "
            f"context={context}, len(ids)={len(ids)}"
        )
    cached = context - num_tokens
    cache = ContiguousKVCache(model.config, batch_size=1, max_len=context)
    if cached:
        model(torch.tensor(list(ids[:cached])), cache.positions([cached]), cache.context([cached]))
        cache.advance([cached])

    def step() -> None:
        new = torch.tensor(list(ids[cached:context]))
        h = model(new, cache.positions([num_tokens]), cache.context([num_tokens]))
        model.compute_logits(h)

    return best_of(step, repeats)


def expected_tokens_per_step(acceptance: float, k: int) -> float:
    """1 + a + a² + … + a^k: the mean tokens a verify step of `k` drafts yields when each is
    accepted with probability a, until the first rejection."""
    if not 0 <= acceptance <= 1:
        raise ValueError(f"acceptance must be in [0, 1], got {acceptance!r}")
    if k < 0 or int(k) != k:
        raise ValueError(f"k must be an int >= 0, got {k!r}")
    return float(sum(acceptance**i for i in range(int(k) + 1)))


def chi_square_sf(observed: Sequence[float], expected: Sequence[float]) -> float:
    """The probability that a chi-square statistic this large or larger arises by chance when
    `observed` counts are drawn from the `expected` ones (cells with expected 0 must be empty;
    0.0 when one is not). Computed in float64."""
    cells = [(float(o), float(e)) for o, e in zip(observed, expected) if e > 0]
    if any(o > 0 for o, e in zip(observed, expected) if e <= 0):
        return 0.0
    stat = sum((o - e) ** 2 / e for o, e in cells)
    df = len(cells) - 1
    if df < 1:
        return 1.0
    half = lambda x: torch.tensor(x / 2.0, dtype=torch.float64)  # noqa: E731
    return float(torch.special.gammaincc(half(df), half(stat)))
