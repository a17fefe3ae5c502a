"""Self-checks of chapter 03 (generation): forwards per generated token, tokens processed without
a cache, top-p by hand and as a function you write, temperature, and what top-p keeps at two temperatures (found with the
sampling explorer)."""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import torch

from llmlab.course.check.build_guard import check_cases
from llmlab.course.check.catalog import catalog
from llmlab.course.check.core import (
    NOT_ANSWERED,
    CheckResult,
    as_number,
    not_yet,
    passed,
    record_expected,
    staged,
)
from llmlab.course.check.question import Expected, numeric

M = catalog("ch03")

PROMPT_LEN, NEW_TOKENS = 20, 100
# exercise 1 states the lengths before and after, so the count it asks for is never printed
TOTAL_LEN = PROMPT_LEN + NEW_TOKENS
SAMPLING_LOGITS = [3.0, 2.0, 1.0, 0.5, 0.0, -1.0]  # token ids 0..5
TOP_P = 0.8
TEMPERATURE = 0.5
TEMP_LOGITS = [2.0, 1.0, 0.0]


@numeric(rel=1e-9)
def forwards() -> Expected:
    """How many forward passes does the model run while a PROMPT_LEN-token prompt grows to
    TOTAL_LEN tokens (no stop token; with or without a cache, the count is the same)?"""
    expected = NEW_TOKENS
    return Expected(
        expected,
        mistakes=[
            (PROMPT_LEN + NEW_TOKENS, M("forwards.prompt_per_token")),
            (NEW_TOKENS - 1, M("forwards.first_token_free")),
            (NEW_TOKENS + 1, M("forwards.extra_prefill")),
            (1, M("forwards.several_per_forward")),
        ],
    )


@numeric(rel=1e-9)
def tokens_processed_no_cache() -> Expected:
    """Without a KV cache, how many token positions go through the model in total while
    generating NEW_TOKENS tokens from a PROMPT_LEN-token prompt?"""
    n, p = NEW_TOKENS, PROMPT_LEN
    expected = sum(p + i for i in range(n))
    return Expected(
        expected,
        mistakes=[
            (p + n, M("tokens_processed_no_cache.final_length")),
            (sum(p + i for i in range(n + 1)), M("tokens_processed_no_cache.one_step_too_many")),
            (sum(p + i for i in range(1, n + 1)), M("tokens_processed_no_cache.prompt_only")),
            (n * (p + n), M("tokens_processed_no_cache.final_length_each")),
        ],
    )


def _kept(logits: list[float], top_p: float) -> set[int]:
    from llmlab.sampling import apply_top_k_top_p

    x = torch.tensor([logits])
    out = apply_top_k_top_p(x, torch.tensor([len(logits)]), torch.tensor([top_p]))
    return {i for i, v in enumerate(out[0].tolist()) if v != float("-inf")}


def top_p_kept(answer: Any) -> CheckResult:
    """With top-p = TOP_P on SAMPLING_LOGITS (temperature 1), which token ids stay in the nucleus?
    Answer with a set of ints."""
    ex = "ch03.top_p_kept"
    if answer is None:
        return not_yet(ex, NOT_ANSWERED)
    try:
        got = {int(a) for a in answer}
    except (TypeError, ValueError):
        return not_yet(ex, M("top_p_kept.not_a_set"))
    expected = _kept(SAMPLING_LOGITS, TOP_P)
    for token_id in sorted(expected):
        record_expected(ex, token_id)
    if got == expected:
        return passed(ex)
    order = sorted(range(len(SAMPLING_LOGITS)), key=lambda i: -SAMPLING_LOGITS[i])
    top_n = set(order[: len(got)])
    if got != top_n:
        return not_yet(ex, M("top_p_kept.skips_likely"))
    if len(got) < len(expected):
        return not_yet(ex, M("top_p_kept.one_short"))
    return not_yet(ex, M("top_p_kept.too_many"))


def _top_p_cases() -> list[tuple[torch.Tensor, float]]:
    """Probability vectors and top_p values with no running sum within 1e-3 of top_p (so float
    rounding cannot move the edge of the nucleus), the ids shuffled so that id order != rank."""
    g = torch.Generator().manual_seed(3)
    cases = []
    for size, p in ((6, 0.8), (10, 0.5), (50, 0.9), (8, 0.3), (200, 0.95), (5, 0.999)):
        while True:
            probs = torch.rand(size, generator=g, dtype=torch.float64) ** 3
            probs = probs / probs.sum()
            running = probs.sort(descending=True).values.cumsum(0)
            if (running - p).abs().min() > 1e-3:
                break
        cases.append((probs, p))
    cases.append((torch.tensor([0.9, 0.05, 0.05], dtype=torch.float64), 0.5))  # the top token alone
    return cases


def _nucleus(probs: torch.Tensor, top_p: float) -> set[int]:
    from llmlab.sampling import apply_top_k_top_p

    out = apply_top_k_top_p(probs.log()[None], torch.tensor([probs.numel()]), torch.tensor([top_p]))
    return {i for i, v in enumerate(out[0].tolist()) if v != float("-inf")}


def top_p_function(fn: Any) -> CheckResult:
    """Write the nucleus yourself: fn(probs, top_p) takes a 1-D tensor of probabilities (summing to
    1) and top_p in (0, 1), and returns the set of token ids in the nucleus (the smallest set of
    most likely tokens whose probabilities sum to at least top_p)."""
    return check_cases(
        "ch03.top_p_function",
        fn,
        _top_p_cases(),
        call=_nucleus_of,
        judge=_top_p_mistake,
        hint=M("top_p_function.not_a_function", got_type=type(fn).__name__),
        raised=lambda case, error_type, error: M(
            "top_p_function.raised", error_type=error_type, error=error
        ),
        success=M("top_p_function.success"),
    )


def _nucleus_of(fn: Any, case: tuple[torch.Tensor, float]) -> set[int]:
    """The student's nucleus for the case (probs, top_p), as a set of ints."""
    probs, p = case
    got = fn(probs.clone(), p)
    return {int(i) for i in (got.tolist() if hasattr(got, "tolist") else got)}


def _top_p_mistake(case: tuple[torch.Tensor, float], got: set[int]) -> str | None:
    """The hint for `got`, the student's nucleus of the case (probs, top_p); None when it is the
    package's."""
    probs, p = case
    want = _nucleus(probs, p)
    if got == want:
        return None
    order = probs.argsort(descending=True).tolist()
    if got == set(order[: len(want) - 1]):
        first = M("top_p_function.one_short")
    elif got == set(order[: len(want) + 1]):
        first = M("top_p_function.one_too_many")
    elif got == set(range(len(got))) and got != set(order[: len(got)]):
        first = M("top_p_function.index_order")
    elif len(got) == len(want):
        first = M("top_p_function.wrong_tokens")
    else:
        first = M("top_p_function.wrong_nucleus", size=probs.numel(), p=p)
    return staged("ch03.top_p_function", first, M("top_p_function.then"))


@numeric(rel=1e-3)
def temperature_prob() -> Expected:
    """Probability of token 0 for logits TEMP_LOGITS at temperature TEMPERATURE."""
    x = torch.tensor(TEMP_LOGITS)
    expected = float((x / TEMPERATURE).softmax(0)[0])
    return Expected(
        expected,
        mistakes=[
            (float(x.softmax(0)[0]), M("temperature_prob.temperature_1")),
            (float((x * TEMPERATURE).softmax(0)[0]), M("temperature_prob.multiplied")),
            (float((x.softmax(0) / TEMPERATURE)[0]), M("temperature_prob.divided_probabilities")),
        ],
    )


# ----------------------------------------------------------------------------- the sampling explorer

EXPLORER_PROMPT = "My favourite fruit is the"
EXPLORER_TOP_P = 0.9
EXPLORER_TEMPERATURES = (1.0, 0.5)


@lru_cache(maxsize=1)
def _explorer_logits():
    from llmlab.analysis.distribution import prompt_logits
    from llmlab.model import load_model

    model, tok = load_model("smollm2-135m")
    return prompt_logits(EXPLORER_PROMPT, model, tok)


def samplable_counts() -> dict[float, int]:
    """How many tokens can be sampled after EXPLORER_PROMPT with top-p EXPLORER_TOP_P, at each of
    EXPLORER_TEMPERATURES (the real model; what the explorer's summary line shows)."""
    from llmlab.analysis.distribution import next_token_distribution

    logits = _explorer_logits()
    return {
        t: next_token_distribution(logits, t, -1, EXPLORER_TOP_P).num_kept
        for t in EXPLORER_TEMPERATURES
    }


def _close_count(got: float, want: int) -> bool:
    # float rounding of the running sum can move the nucleus edge by a token between machines
    return abs(got - want) <= max(1, 0.02 * want)


def samplable_tokens(answer: Any) -> CheckResult:
    """With the sampling explorer on EXPLORER_PROMPT and top_p = EXPLORER_TOP_P: how many tokens
    can be sampled at each temperature of EXPLORER_TEMPERATURES? A dict {temperature: count}."""
    ex = "ch03.samplable_tokens"
    want = samplable_counts()
    for count in want.values():
        record_expected(ex, count)
    if answer is None:
        return not_yet(ex, NOT_ANSWERED)
    got = (
        {as_number(k): as_number(v) for k, v in answer.items()} if isinstance(answer, dict) else {}
    )
    if set(got) != set(want) or any(v is None for v in got.values()):
        keys = ", ".join(f"{t:g}" for t in EXPLORER_TEMPERATURES)
        return not_yet(ex, M("samplable_tokens.missing_keys", keys=keys))
    hi, lo = max(want), min(want)
    if all(_close_count(got[t], want[t]) for t in want):
        return passed(ex, M("samplable_tokens.success"))
    if _close_count(got[hi], want[lo]) and _close_count(got[lo], want[hi]):
        return not_yet(ex, M("samplable_tokens.swapped"))
    if got[hi] == got[lo]:
        return not_yet(
            ex,
            staged(
                ex,
                M("samplable_tokens.differ"),
                M("samplable_tokens.differ_then"),
            ),
        )
    return not_yet(
        ex,
        staged(ex, M("samplable_tokens.default_hint"), M("samplable_tokens.then")),
    )


EXERCISES = M.exercises()  # kind, source question, mistakes: the catalog's "exercises"
