"""Self-checks of chapter 03 (generation): forwards per generated token, tokens processed without
a cache, top-p by hand and as a function you write, temperature, and what top-p keeps at two temperatures (found with the
sampling explorer)."""
from __future__ import annotations

from functools import lru_cache
from typing import Any

import torch

from llmlab.check.core import (CheckResult, ExerciseInfo, NOT_ANSWERED, as_number, check_number, not_yet,
                               passed, record_expected, report, staged)

PROMPT_LEN, NEW_TOKENS = 20, 100
SAMPLING_LOGITS = [3.0, 2.0, 1.0, 0.5, 0.0, -1.0]   # token ids 0..5
TOP_P = 0.8
TEMPERATURE = 0.5
TEMP_LOGITS = [2.0, 1.0, 0.0]


def forwards(answer: Any) -> CheckResult:
    """How many forward passes does the model run to generate NEW_TOKENS tokens from a
    PROMPT_LEN-token prompt (no stop token; with or without a cache, the count is the same)?"""
    expected = NEW_TOKENS
    return check_number("ch03.forwards", answer, expected, rel=1e-9, mistakes=[
        (PROMPT_LEN + NEW_TOKENS, "the prompt is not fed one token per forward: one forward "
                                  "takes the whole prompt at once."),
        (NEW_TOKENS - 1, "the first new token also needs a forward: the one over the prompt "
                         "(prefill) produces it."),
        (NEW_TOKENS + 1, "no extra forward for the prompt alone: the forward over the prompt "
                         "already yields the first new token."),
        (1, "a forward yields one next token only; the next one depends on it."),
    ], default_hint="not the number of forwards: think about what one forward hands back.",
       formula="Each forward ends in one sampled token; count the tokens you need.")


def tokens_processed_no_cache(answer: Any) -> CheckResult:
    """Without a KV cache, how many token positions go through the model in total while
    generating NEW_TOKENS tokens from a PROMPT_LEN-token prompt?"""
    n, p = NEW_TOKENS, PROMPT_LEN
    expected = sum(p + i for i in range(n))
    return check_number("ch03.tokens_processed_no_cache", answer, expected, rel=1e-9, mistakes=[
        (p + n, "that is the final length; without a cache every forward re-reads the whole "
                "sequence so far."),
        (sum(p + i for i in range(n + 1)), "one step too many: the last token is sampled, never fed "
                                          "back in."),
        (sum(p + i for i in range(1, n + 1)), "the first forward sees the prompt only; the sequence "
                                             "grows by one token per forward after that."),
        (n * (p + n), "not every forward sees the final length: the sequence grows one token per forward."),
    ], default_hint="not the total: think about how long the sequence is at each forward.",
       formula="Forward k (k = 0, 1, ...) sees the prompt plus the k tokens generated so far; add them up.")


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
        return report(not_yet(ex, NOT_ANSWERED))
    try:
        got = {int(a) for a in answer}
    except (TypeError, ValueError):
        return report(not_yet(ex, "answer with a set of token ids (ints), e.g. {4, 5}."))
    expected = _kept(SAMPLING_LOGITS, TOP_P)
    for token_id in sorted(expected):
        record_expected(ex, token_id)
    if got == expected:
        return report(passed(ex))
    order = sorted(range(len(SAMPLING_LOGITS)), key=lambda i: -SAMPLING_LOGITS[i])
    top_n = set(order[:len(got)])
    if got != top_n:
        return report(not_yet(ex, "the nucleus is always the most likely tokens first; your set skips "
                                  "a more likely token."))
    if len(got) < len(expected):
        return report(not_yet(ex, "one short: the token whose probability pushes the running sum past "
                                  "top_p is kept (the nucleus is the smallest set that reaches top_p)."))
    return report(not_yet(ex, "too many: stop as soon as the running sum of probabilities reaches top_p."))


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
    cases.append((torch.tensor([0.9, 0.05, 0.05], dtype=torch.float64), 0.5))   # the top token alone
    return cases


def _nucleus(probs: torch.Tensor, top_p: float) -> set[int]:
    from llmlab.sampling import apply_top_k_top_p

    out = apply_top_k_top_p(probs.log()[None], torch.tensor([probs.numel()]), torch.tensor([top_p]))
    return {i for i, v in enumerate(out[0].tolist()) if v != float("-inf")}


def top_p_function(fn: Any) -> CheckResult:
    """Write the nucleus yourself: fn(probs, top_p) takes a 1-D tensor of probabilities (summing to
    1) and top_p in (0, 1), and returns the set of token ids in the nucleus (the smallest set of
    most likely tokens whose probabilities sum to at least top_p)."""
    ex = "ch03.top_p_function"
    if fn is None:
        return report(not_yet(ex, NOT_ANSWERED))
    if not callable(fn):
        return report(not_yet(ex, f"expected a function, got {type(fn).__name__}."))
    then = ("Sort the ids by probability, largest first; walk down the list adding probabilities, "
            "and keep each token whose probability mass *before* it is still below top_p.")
    for probs, p in _top_p_cases():
        want = _nucleus(probs, p)
        try:
            got = fn(probs.clone(), p)
            got = {int(i) for i in (got.tolist() if hasattr(got, "tolist") else got)}
        except Exception as e:  # the learner's code: report, never crash the notebook
            return report(not_yet(ex, f"your function raised {type(e).__name__}: {e}"))
        if got == want:
            continue
        order = probs.argsort(descending=True).tolist()
        if got == set(order[:len(want) - 1]):
            first = ("one short: you stop before the token whose probability carries the sum past "
                     "top_p; the nucleus includes it.")
        elif got == set(order[:len(want) + 1]):
            first = "one too many: the token after the one that reaches top_p is not in the nucleus."
        elif got == set(range(len(got))) and got != set(order[:len(got)]):
            first = ("you walked the ids in index order; the nucleus takes the most likely tokens "
                     "first, whatever their ids.")
        elif len(got) == len(want):
            first = "the right number of tokens, but not the most likely ones."
        else:
            first = f"wrong nucleus for a vector of {probs.numel()} probabilities with top_p={p}."
        return report(not_yet(ex, staged(ex, first, then)))
    return report(passed(ex, "correct: that is the nucleus llmlab.sampling and vLLM's sampler keep."))


def temperature_prob(answer: Any) -> CheckResult:
    """Probability of token 0 for logits TEMP_LOGITS at temperature TEMPERATURE."""
    x = torch.tensor(TEMP_LOGITS)
    expected = float((x / TEMPERATURE).softmax(0)[0])
    return check_number("ch03.temperature_prob", answer, expected, rel=1e-3, mistakes=[
        (float(x.softmax(0)[0]), "that is temperature 1: divide the logits by the temperature first."),
        (float((x * TEMPERATURE).softmax(0)[0]), "you multiplied by the temperature; divide by it."),
        (float((x.softmax(0) / TEMPERATURE)[0]), "divide the logits, not the probabilities, then softmax."),
    ], default_hint="not the probability at this temperature: check each step and its order.",
       formula="Softmax(logits / temperature), then read entry 0.")


# ----------------------------------------------------------------------------- the sampling explorer

EXPLORER_PROMPT = "My favourite fruit is the"
EXPLORER_TOP_P = 0.9
EXPLORER_TEMPERATURES = (1.0, 0.5)


@lru_cache(maxsize=1)
def _explorer_logits():
    from llmlab.model import load_model
    from llmlab.widgets.sampling import prompt_logits

    model, tok = load_model("smollm2-135m")
    return prompt_logits(EXPLORER_PROMPT, model, tok)


def samplable_counts() -> dict[float, int]:
    """How many tokens can be sampled after EXPLORER_PROMPT with top-p EXPLORER_TOP_P, at each of
    EXPLORER_TEMPERATURES (the real model; what the explorer's summary line shows)."""
    from llmlab.widgets.sampling import next_token_distribution

    logits = _explorer_logits()
    return {t: next_token_distribution(logits, t, -1, EXPLORER_TOP_P).num_kept
            for t in EXPLORER_TEMPERATURES}


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
        return report(not_yet(ex, NOT_ANSWERED))
    got = {as_number(k): as_number(v) for k, v in answer.items()} if isinstance(answer, dict) else {}
    if set(got) != set(want) or any(v is None for v in got.values()):
        keys = ", ".join(f"{t:g}" for t in EXPLORER_TEMPERATURES)
        return report(not_yet(ex, f"answer a dict from each temperature ({keys}) to a count of tokens."))
    hi, lo = max(want), min(want)
    if all(_close_count(got[t], want[t]) for t in want):
        return report(passed(ex, "correct: at the lower temperature the distribution is sharper, "
                                 "so fewer tokens are needed to reach the same top_p."))
    if _close_count(got[hi], want[lo]) and _close_count(got[lo], want[hi]):
        return report(not_yet(ex, "the two counts are the wrong way round: which temperature "
                                  "makes the distribution sharper?"))
    if got[hi] == got[lo]:
        return report(not_yet(ex, staged(ex, "the counts differ between the two temperatures: "
                                             "did you move the temperature slider between readings?",
                                         "Temperature is applied before top-p, so it changes how "
                                         "many tokens the nucleus needs.")))
    return report(not_yet(ex, staged(ex, "at least one count is off: set top_p first, then read the "
                                         "line above the chart at each temperature.",
                                     "Keep top_k at -1 (off) and the prompt unchanged; the line "
                                     "reads 'tokens that can be sampled: N'.")))


EXERCISES: dict[str, ExerciseInfo] = {
    "forwards": ExerciseInfo("reasoning", mistakes=("one forward per prompt token",
                                                    "first token not counted",
                                                    "an extra forward for the prompt alone")),
    "tokens_processed_no_cache": ExerciseInfo("reasoning", mistakes=("final length only",
                                                                     "last token fed back",
                                                                     "every forward at the final length")),
    "top_p_kept": ExerciseInfo("plug-in", mistakes=("a more likely token skipped",
                                                    "the token that crosses top_p left out",
                                                    "kept past top_p")),
    "top_p_function": ExerciseInfo("reasoning", mistakes=("the crossing token left out",
                                                          "one token past top_p kept",
                                                          "ids walked in index order, not by probability")),
    "temperature_prob": ExerciseInfo("plug-in", mistakes=("temperature 1", "multiplied by T",
                                                          "probabilities divided instead of logits")),
    "samplable_tokens": ExerciseInfo("plug-in", mistakes=("temperatures swapped",
                                                          "temperature not changed between readings")),
}
