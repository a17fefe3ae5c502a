"""Self-checks of chapter 10 (serving metrics): TPOT of one request, mean TPOT when a request has
a single token, TTLT from TTFT and TPOT, goodput under an SLO, and the seed's self-check
question 4 (which metric matters for chat, batch jobs, code completion)."""
from __future__ import annotations

from typing import Any

from llmlab import metrics
from llmlab.check.core import (CheckResult, as_number, check_dict_keys, check_number, not_yet,
                               passed, report)

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
    ], default_hint="TPOT = (E2EL − TTFT) / (n − 1).")


def mean_tpot(answer: Any) -> CheckResult:
    """Mean TPOT (s) over the requests in MEAN_TIMELINES (arrival, token times), the way
    `llmlab.metrics.summarize` and vLLM's benchmark client compute it."""
    ts = [metrics.Timeline(a, tok) for a, tok in MEAN_TIMELINES]
    defined = [t.tpot for t in ts if t.tpot is not None]
    expected = sum(defined) / len(defined)
    ex = "ch10.mean_tpot"
    if answer is not None and as_number(answer) is None and isinstance(answer, float):
        return report(not_yet(ex, "NaN is not a mean: a request without a second token has no "
                                  "TPOT and is left out."))
    itls = [g for t in ts for g in t.itls]
    return check_number(ex, answer, expected, rel=1e-3, mistakes=[
        (sum(defined) / len(ts), "you counted the one-token request as TPOT 0; it has no TPOT "
                                 "at all and is left out of the mean."),
        (sum(itls) / len(itls), "that pools every gap (that is the mean ITL); TPOT is one value "
                                "per request, then averaged over requests."),
    ], default_hint="compute each request's TPOT = (E2EL − TTFT)/(n − 1) where it exists, then average.")


def ttlt(answer: Any) -> CheckResult:
    """TTFT = TTLT_TTFT s, TPOT = TTLT_TPOT s, TTLT_N output tokens. Time to the last token (s)?"""
    expected = TTLT_TTFT + (TTLT_N - 1) * TTLT_TPOT
    return check_number("ch10.ttlt", answer, expected, rel=1e-4, mistakes=[
        (TTLT_TTFT + TTLT_N * TTLT_TPOT, "the first token is covered by TTFT; only n − 1 tokens follow it."),
        (TTLT_N * TTLT_TPOT, "add the wait for the first token (TTFT)."),
        ((TTLT_N - 1) * TTLT_TPOT, "add the wait for the first token (TTFT)."),
        (expected * 1e3, "give seconds, not milliseconds."),
    ], default_hint="TTLT ≈ TTFT + (n − 1) · TPOT.")


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
    ], default_hint="for each request check TTFT ≤ target and TPOT ≤ target, count, divide by the duration.")


Q4_KEYS = ("chat", "batch_jobs", "code_completion")
Q4_METRICS = ("ttft", "tpot", "throughput", "e2el")
# several answers are defensible; each set holds the ones a good answer may name first
Q4_ACCEPT = {"chat": {"ttft", "tpot"}, "batch_jobs": {"throughput"},
             "code_completion": {"ttft", "e2el"}}
Q4_HINTS = {
    "chat": "a person watches the screen while the reply streams in: which waits do they feel?",
    "batch_jobs": "nobody watches an offline job token by token; what decides its cost is how "
                  "much work finishes per GPU-hour.",
    "code_completion": "a completion is short and only useful if it shows up, whole, before the "
                       "programmer types on; which wait is that?",
}


def seed_q4(answer: Any) -> CheckResult:
    """The seed's question 4. Answer a dict mapping each of Q4_KEYS to the metric that matters
    most, one of Q4_METRICS ("ttft", "tpot", "throughput", "e2el")."""
    ex = "ch10.seed_q4"
    missing = check_dict_keys(ex, answer, Q4_KEYS)
    if missing is not None:
        return missing
    problems = []
    for key in Q4_KEYS:
        value = str(answer[key]).strip().lower()
        if value not in Q4_METRICS:
            problems.append(f"{key}: choose one of {list(Q4_METRICS)}.")
        elif value not in Q4_ACCEPT[key]:
            problems.append(f"{key}: {Q4_HINTS[key]}")
    if problems:
        return report(not_yet(ex, " ".join(problems)))
    return report(passed(ex, "right: optimise for one or two targets per product; they pull in "
                             "different directions (a bigger batch raises throughput and TPOT)."))
