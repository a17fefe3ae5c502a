"""Self-checks of chapter 03 (generation): forwards per generated token (the seed's self-check
question 1, counted), tokens processed without a cache, top-p by hand, temperature."""
from __future__ import annotations

from typing import Any

import torch

from llmlab.check.core import CheckResult, NOT_ANSWERED, check_number, not_yet, passed, report

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
    ], default_hint="each forward ends in one sampled token; count the tokens you need.")


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
    ], default_hint="forward k (k = 0, 1, ...) sees the prompt plus the k tokens generated so far; add them up.")


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


def temperature_prob(answer: Any) -> CheckResult:
    """Probability of token 0 for logits TEMP_LOGITS at temperature TEMPERATURE."""
    x = torch.tensor(TEMP_LOGITS)
    expected = float((x / TEMPERATURE).softmax(0)[0])
    return check_number("ch03.temperature_prob", answer, expected, rel=1e-3, mistakes=[
        (float(x.softmax(0)[0]), "that is temperature 1: divide the logits by the temperature first."),
        (float((x * TEMPERATURE).softmax(0)[0]), "you multiplied by the temperature; divide by it."),
        (float((x.softmax(0) / TEMPERATURE)[0]), "divide the logits, not the probabilities, then softmax."),
    ], default_hint="softmax(logits / temperature), then read entry 0.")
