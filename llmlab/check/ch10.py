"""Self-checks of chapter 10 (serving metrics): TPOT of one request, mean TPOT when a request has
a single token, TTLT from TTFT and TPOT, goodput under an SLO, what burstiness does to arrivals
(the arrival explorer's task), the largest batch an H100 can run under a TPOT target (the
serving explorer's task), cost per million tokens, and the seed's self-check question 4 (which
metric matters for chat, batch jobs, code completion)."""
from __future__ import annotations

from typing import Any

from llmlab import costs, metrics, roofline
from llmlab.check.core import (CheckResult, ExerciseInfo, as_number, check_matching, check_number,
                               not_yet, passed, record_expected, report, staged, NOT_ANSWERED)
from llmlab.config import PRESETS

# one request: arrives at 0 s, its 5 tokens come at these times (s)
TPOT_ARRIVAL, TPOT_TOKENS = 0.0, (0.8, 1.0, 1.3, 1.5, 1.9)

# three requests (arrival, token times): the last has one output token
MEAN_TIMELINES = ((0.0, (0.3, 0.35, 0.40, 0.45)),
                  (0.1, (0.5, 0.6, 0.7)),
                  (0.2, (0.9,)))

TTLT_TTFT, TTLT_TPOT, TTLT_N = 0.2, 0.05, 101

# goodput: these requests over GOODPUT_DURATION seconds, with this SLO
GOODPUT_TIMELINES = ((0.0, (0.2, 0.28, 0.36)), (0.5, (1.4, 1.45)), (1.0, (1.1, 1.6, 2.1)),
                     (1.5, (1.7,)), (2.0, (2.3, 2.35, 2.4, 2.45)), (2.1, (2.2, 2.5, 2.8)))
GOODPUT_SLO = {"ttft": 0.5, "tpot": 0.1}
GOODPUT_DURATION = 3.0


def tpot(answer: Any) -> CheckResult:
    """A request arrives at TPOT_ARRIVAL and its tokens come at TPOT_TOKENS (s). Its TPOT, in s?"""
    t = metrics.Timeline(TPOT_ARRIVAL, TPOT_TOKENS)
    n = t.num_output_tokens
    return check_number("ch10.tpot", answer, t.tpot, rel=1e-3, mistakes=[
        (t.e2el / n, "that spreads the whole latency, first-token wait included, over every token; "
                     "TPOT starts after the first token."),
        ((t.e2el - t.ttft) / n, "after the first token there are n − 1 gaps, not n."),
        (t.e2el / (n - 1), "subtract the TTFT first: the wait for the first token is not a gap between tokens."),
        (t.tpot * 1e3, "give seconds, not milliseconds."),
    ], default_hint="TPOT is the mean gap between tokens after the first one; check which times "
                    "you subtracted and how many gaps you divided by.",
        formula="TPOT = (E2EL − TTFT) / (n − 1).")


def mean_tpot(answer: Any) -> CheckResult:
    """Mean TPOT (s) over the requests in MEAN_TIMELINES (arrival, token times), the way
    `llmlab.metrics.summarize` and vLLM's benchmark client compute it."""
    ts = [metrics.Timeline(a, tok) for a, tok in MEAN_TIMELINES]
    defined = [t.tpot for t in ts if t.tpot is not None]
    expected = sum(defined) / len(defined)
    ex = "ch10.mean_tpot"
    if answer is not None and as_number(answer) is None and isinstance(answer, float):
        record_expected(ex, expected)
        return report(not_yet(ex, "NaN is not a mean: a request without a second token has no "
                                  "TPOT and is left out."))
    itls = [g for t in ts for g in t.itls]
    return check_number(ex, answer, expected, rel=1e-3, mistakes=[
        (sum(defined) / len(ts), "you counted the one-token request as TPOT 0; it has no TPOT "
                                 "at all and is left out of the mean."),
        (sum(itls) / len(itls), "that pools every gap (that is the mean ITL); TPOT is one value "
                                "per request, then averaged over requests."),
    ], default_hint="work request by request: one TPOT each (where it exists), then the mean.",
        formula="Each TPOT = (E2EL − TTFT)/(n − 1), for requests with n ≥ 2; average those.")


def ttlt(answer: Any) -> CheckResult:
    """TTFT = TTLT_TTFT s, TPOT = TTLT_TPOT s, TTLT_N output tokens. Time to the last token (s)?"""
    expected = TTLT_TTFT + (TTLT_N - 1) * TTLT_TPOT
    return check_number("ch10.ttlt", answer, expected, rel=1e-4, mistakes=[
        (TTLT_TTFT + TTLT_N * TTLT_TPOT, "the first token is covered by TTFT; only n − 1 tokens follow it."),
        (TTLT_N * TTLT_TPOT, "add the wait for the first token (TTFT)."),
        ((TTLT_N - 1) * TTLT_TPOT, "add the wait for the first token (TTFT)."),
        (expected * 1e3, "give seconds, not milliseconds."),
    ], default_hint="picture the timeline: one wait until the first token, then the gaps after it.",
        formula="TTLT ≈ TTFT + (n − 1) · TPOT.")


def goodput(answer: Any) -> CheckResult:
    """Goodput (requests/s) of GOODPUT_TIMELINES over GOODPUT_DURATION s under GOODPUT_SLO (s):
    a request counts when it meets every target; a request with one token has no TPOT to break."""
    ts = [metrics.Timeline(a, tok) for a, tok in GOODPUT_TIMELINES]
    s = metrics.summarize(ts, duration=GOODPUT_DURATION, slo=GOODPUT_SLO)
    strict = sum(1 for t in ts if t.ttft <= GOODPUT_SLO["ttft"] and t.tpot is not None
                 and t.tpot <= GOODPUT_SLO["tpot"]) / GOODPUT_DURATION
    only_ttft = metrics.summarize(ts, duration=GOODPUT_DURATION, slo={"ttft": GOODPUT_SLO["ttft"]})
    only_tpot = metrics.summarize(ts, duration=GOODPUT_DURATION, slo={"tpot": GOODPUT_SLO["tpot"]})
    return check_number("ch10.goodput", answer, s.goodput, rel=1e-3, mistakes=[
        (s.request_throughput, "that is the throughput of all requests; goodput counts only those "
                               "that met the SLO."),
        (strict, "the one-token request has no TPOT, so it cannot miss the TPOT target."),
        (only_ttft.goodput, "check the TPOT target too: a request must meet every target."),
        (only_tpot.goodput, "check the TTFT target too: a request must meet every target."),
        (s.num_good, "goodput is a rate: divide the good requests by the duration."),
    ], default_hint="go request by request against both targets; count only those that meet both.",
        formula="Goodput = (requests with TTFT ≤ target and TPOT ≤ target) / duration.")


# ----------------------------------------------------------------- the arrival explorer's task

# Statements about two arrival streams at the same rate, burstiness 0.2 and burstiness 5 (keys
# in a fixed shuffled order; the notebook lists them in this order).
BURSTINESS_STATEMENTS = {
    "fewer_per_second": "at 0.2, fewer requests arrive per second on average",
    "short_gaps": "at 0.2, many more gaps are shorter than a tenth of the mean gap",
    "poisson": "burstiness 5 is what vLLM's benchmark client calls Poisson arrivals",
    "same_mean_gap": "the mean gap between arrivals is about the same at both",
    "ttft_tail": "sent to the same server, the 0.2 stream will likely show the higher p99 TTFT",
    "more_throughput": "over a long run, the 0.2 stream gets more requests/s out of the server",
    "less_spread": "at 5, the gaps vary less than Poisson gaps do",
}
BURSTINESS_TRUE = frozenset({"short_gaps", "same_mean_gap", "ttft_tail", "less_spread"})
BURSTINESS_WHY_WRONG = {
    "fewer_per_second": "burstiness reshapes the gaps, not the rate: compare the mean gap the "
                        "explorer prints at both settings.",
    "poisson": "Poisson gaps are exponential, which is a single burstiness value: find the one "
               "at which the explorer prints a CV of 1.",
    "more_throughput": "below capacity the server finishes what is offered: over a long run both "
                       "streams deliver the offered rate; clumps change who waits, not how much "
                       "gets done.",
}
BURSTINESS_MISSED = {
    "short_gaps": "Look at the gap histogram near zero at both settings.",
    "same_mean_gap": "Compare the mean gap the explorer prints at both settings.",
    "ttft_tail": "Think of what a clump of requests arriving together does to the last of them: "
                 "it waits behind the others' prefills.",
    "less_spread": "Compare the CV of the gaps at 5 with Poisson's (burstiness 1).",
}


def burstiness(answer: Any) -> CheckResult:
    """The set of keys of BURSTINESS_STATEMENTS that are true (same rate, burstiness 0.2 vs 5)."""
    ex = "ch10.burstiness"
    if answer is None:
        return report(not_yet(ex, NOT_ANSWERED))
    items = [answer] if isinstance(answer, str) else answer
    if not isinstance(items, (list, tuple, set, frozenset)):
        return report(not_yet(ex, "answer a set of keys of ch10.BURSTINESS_STATEMENTS."))
    got = {str(a).strip().lower() for a in items}
    unknown = got - set(BURSTINESS_STATEMENTS)
    if unknown:
        return report(not_yet(ex, f"choose keys from {list(BURSTINESS_STATEMENTS)}; got {sorted(unknown)}."))
    wrong = sorted(got - BURSTINESS_TRUE)
    if wrong:
        return report(not_yet(ex, " ".join(f"{k}: {BURSTINESS_WHY_WRONG[k]}" for k in wrong)))
    missed = [k for k in BURSTINESS_STATEMENTS if k in BURSTINESS_TRUE - got]
    if missed:
        first = f"everything you chose holds, but {len(missed)} more statement(s) hold too."
        return report(not_yet(ex, staged(ex, first, " ".join(BURSTINESS_MISSED[k] for k in missed))))
    return report(passed(ex, "right: burstiness keeps the rate and moves the gaps; clumps are "
                             "what a TTFT tail is made of."))


# ----------------------------------------------------------------- the serving explorer's task

SLO_MODEL, SLO_HARDWARE, SLO_CONTEXT, SLO_TPOT = "llama-3-8b", "H100-SXM", 2048, 0.012
SLO_DTYPE_BYTES = 2


def _tpot_floor(batch: int) -> float:
    return roofline.decode_step_floor(PRESETS[SLO_MODEL], SLO_HARDWARE, batch, SLO_CONTEXT,
                                      SLO_DTYPE_BYTES)


def _largest_batch() -> int:
    """The largest batch whose decode-step floor (the TPOT of every request in it) stays within
    SLO_TPOT, for SLO_MODEL on SLO_HARDWARE at SLO_CONTEXT tokens of context each."""
    lo, hi = 1, 1
    while _tpot_floor(hi * 2) <= SLO_TPOT:
        hi *= 2
    hi *= 2
    while hi - lo > 1:      # invariant: floor(lo) within the target, floor(hi) over it
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if _tpot_floor(mid) <= SLO_TPOT else (lo, mid)
    return lo


def largest_batch_under_slo(answer: Any) -> CheckResult:
    """The largest batch (sequences decoded together) of SLO_MODEL on SLO_HARDWARE, BF16, each
    sequence at SLO_CONTEXT tokens of context, whose TPOT stays within SLO_TPOT seconds."""
    ex = "ch10.largest_batch_under_slo"
    expected = _largest_batch()
    record_expected(ex, expected)
    if answer is None:
        return report(not_yet(ex, NOT_ANSWERED))
    x = as_number(answer)
    if x is None or x != int(x) or x < 1:
        return report(not_yet(ex, f"answer a whole number of sequences, got {answer!r}."))
    b = int(x)
    if b == expected:
        return report(passed(ex, "right: past this batch every user's tokens come slower than the "
                                 "target; below it the card sits partly idle and each token "
                                 "costs more."))
    kv = costs.kv_bytes(PRESETS[SLO_MODEL], SLO_CONTEXT, SLO_DTYPE_BYTES)
    if b > expected:
        hint = ("at that batch the step takes longer than the TPOT target: every request in the "
                "batch gets its tokens that much slower. Check the context length and target you set.")
        more = (f"Each extra sequence adds its own KV cache ({kv / 1e6:.0f} MB at this context) "
                "to the bytes every step reads.")
    else:
        hint = ("a larger batch still meets the target; each step would then serve more users for "
                "about the same time, so every token would cost less.")
        more = ("While memory-bound, step time ≈ (weight bytes + batch × KV bytes per sequence) / "
                "memory bandwidth; find where it reaches the target.")
    return report(not_yet(ex, staged(ex, hint, more)))


# ----------------------------------------------------------------- cost per million tokens

COST_PRICE_PER_HOUR = 3.1       # US$ per hour for the card (a made-up quote)
COST_TOKENS_PER_S = 21500       # output tokens/s the deployment sustains


def cost_per_million(answer: Any) -> CheckResult:
    """US$ per million output tokens for a card rented at COST_PRICE_PER_HOUR that sustains
    COST_TOKENS_PER_S output tokens per second, busy all hour."""
    per_hour = COST_TOKENS_PER_S * 3600
    expected = COST_PRICE_PER_HOUR / per_hour * 1e6
    return check_number("ch10.cost_per_million", answer, expected, rel=1e-2, mistakes=[
        (COST_PRICE_PER_HOUR / COST_TOKENS_PER_S * 1e6, "the price is per hour and the throughput per "
                                                        "second: bring them to the same unit of time."),
        (COST_PRICE_PER_HOUR / (COST_TOKENS_PER_S * 60) * 1e6, "an hour has more than 60 seconds."),
        (per_hour / COST_PRICE_PER_HOUR / 1e6, "that is tokens per dollar (in millions); the "
                                               "question asks dollars per million tokens."),
        (per_hour / COST_PRICE_PER_HOUR, "that is tokens per dollar; the question asks dollars per "
                                         "million tokens."),
    ], default_hint="count the tokens the card turns out in the hour you pay for, then share the "
                    "hour's price among them.",
        formula="US$ per million = price per hour / (tokens per second × seconds per hour) × 10⁶.")


# ----------------------------------------------------------------- the seed's question 4

Q4_KEYS = ("chat", "batch_jobs", "code_completion")
# the options, in a fixed order that does not line up with the keys
Q4_METRICS = ("gpu_util", "e2el", "tpot", "throughput", "ttft")
# several answers are defensible; each set holds the ones a good answer may name first
Q4_ACCEPT = {"chat": frozenset({"ttft", "tpot"}), "batch_jobs": frozenset({"throughput"}),
             "code_completion": frozenset({"ttft", "e2el"})}
Q4_HINTS = {
    "chat": "a person watches the screen while the reply streams in: which waits do they feel?",
    "batch_jobs": "nobody watches an offline job token by token; what decides its cost is how "
                  "much work finishes per GPU-hour.",
    "code_completion": "a completion is short and only useful if it shows up, whole, before the "
                       "programmer types on; which wait is that?",
}
Q4_WHY_WRONG = {
    "gpu_util": "utilisation says the GPU is busy, not that it turns out useful work fast: a "
                "memory-bound decode at batch 1 keeps it busy reading weights while producing "
                "few tokens. It is a platform gauge, not a product's target.",
}


def seed_q4(answer: Any) -> CheckResult:
    """The seed's question 4. Answer a dict mapping each of Q4_KEYS to the metric that matters
    most, one of Q4_METRICS."""
    return check_matching("ch10.seed_q4", answer, Q4_ACCEPT, choices=Q4_METRICS, hints=Q4_HINTS,
                          why_wrong=Q4_WHY_WRONG,
                          success="right: optimise for one or two targets per product; they pull "
                                  "in different directions (a bigger batch raises throughput and "
                                  "TPOT).")


EXERCISES: dict[str, ExerciseInfo] = {
    "tpot": ExerciseInfo("plug-in", ("whole latency over n tokens", "n gaps instead of n − 1",
                                     "TTFT not subtracted", "milliseconds")),
    "mean_tpot": ExerciseInfo("plug-in", ("one-token request counted as TPOT 0",
                                          "NaN for the one-token request", "pooled gaps (mean ITL)")),
    "ttlt": ExerciseInfo("plug-in", ("n gaps instead of n − 1", "TTFT left out", "milliseconds")),
    "goodput": ExerciseInfo("plug-in", ("throughput of all requests", "one-token request failing TPOT",
                                        "one target only", "a count, not a rate")),
    "burstiness": ExerciseInfo("reasoning", ("burstiness changes the rate",
                                             "bursty arrivals raise long-run throughput",
                                             "which burstiness is Poisson")),
    "largest_batch_under_slo": ExerciseInfo("reasoning", ("batch past the TPOT target",
                                                          "batch below the largest one that meets it")),
    "cost_per_million": ExerciseInfo("plug-in", ("hours vs seconds", "minutes vs seconds",
                                                 "tokens per dollar instead of dollars per token")),
    "seed_q4": ExerciseInfo("reasoning", ("throughput for chat", "GPU utilisation as a target",
                                          "TTFT for batch jobs"), seed=4),
}
