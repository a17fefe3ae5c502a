"""Chapter 10's questions: TPOT, mean TPOT, TTLT and goodput from timelines, the arrival
explorer's task on bursty traffic, the largest batch under a TPOT SLO, the break-even
throughput, and the source chapter's question 4; the chapter's exercises, read from its catalog."""

from __future__ import annotations

from typing import Any

from llmlab.analysis import costs, metrics, roofline
from llmlab.config import PRESETS
from llmlab.course.check.catalog import catalog
from llmlab.course.check.core import (
    NOT_ANSWERED,
    CheckResult,
    as_number,
    check_number,
    labelled,
    not_yet,
    passed,
    record_expected,
    staged,
)
from llmlab.course.check.question import Expected, matching, numeric

M = catalog("ch10")

# one request: arrives at 0 s, its 5 tokens come at these times (s)
TPOT_ARRIVAL, TPOT_TOKENS = 0.0, (0.8, 1.0, 1.3, 1.5, 1.9)

# three requests (arrival, token times): the last has one output token
MEAN_TIMELINES = ((0.0, (0.3, 0.35, 0.40, 0.45)), (0.1, (0.5, 0.6, 0.7)), (0.2, (0.9,)))

TTLT_TTFT, TTLT_TPOT, TTLT_N = 0.3, 0.05, 101

# goodput: these requests over GOODPUT_DURATION seconds, with this SLO
GOODPUT_TIMELINES = (
    (0.0, (0.2, 0.28, 0.36)),
    (0.5, (1.4, 1.45)),
    (1.0, (1.1, 1.6, 2.1)),
    (1.5, (1.7,)),
    (2.0, (2.3, 2.35, 2.4, 2.45)),
    (2.1, (2.2, 2.5, 2.8)),
)
GOODPUT_SLO = {"ttft": 0.5, "tpot": 0.1}
GOODPUT_DURATION = 3.0


@numeric(rel=1e-3)
def tpot() -> Expected:
    """A request arrives at TPOT_ARRIVAL and its tokens come at TPOT_TOKENS (s). Its TPOT, in s?"""
    t = metrics.Timeline(TPOT_ARRIVAL, TPOT_TOKENS)
    n = t.num_output_tokens
    return Expected(
        t.tpot,
        mistakes=[
            (t.e2el / n, M("tpot.spreads_whole_latency")),
            ((t.e2el - t.ttft) / n, M("tpot.after_first_token")),
            (t.e2el / (n - 1), M("tpot.subtract_ttft_first")),
            (t.tpot * 1e3, M("tpot.give_seconds_milliseconds")),
        ],
        formula="TPOT = (E2EL − TTFT) / (n − 1).",
    )


def mean_tpot(answer: Any) -> CheckResult:
    """Mean TPOT (s) over the requests in MEAN_TIMELINES (arrival, token times), the way
    `llmlab.analysis.metrics.summarize` and vLLM's benchmark client compute it."""
    ts = [metrics.Timeline(a, tok) for a, tok in MEAN_TIMELINES]
    defined = [t.tpot for t in ts if t.tpot is not None]
    expected = sum(defined) / len(defined)
    ex = "ch10.mean_tpot"
    if answer is not None and as_number(answer) is None and isinstance(answer, float):
        record_expected(ex, expected)
        return not_yet(ex, M("mean_tpot.nan_mean_request"))
    itls = [g for t in ts for g in t.itls]
    return check_number(
        ex,
        answer,
        expected,
        rel=1e-3,
        mistakes=[
            (sum(defined) / len(ts), M("mean_tpot.counted_token_request")),
            (sum(itls) / len(itls), M("mean_tpot.pools_every_gap")),
        ],
        default_hint=M("mean_tpot.default_hint"),
        formula=M("mean_tpot.formula"),
    )


@numeric(rel=1e-4)
def ttlt() -> Expected:
    """TTFT = TTLT_TTFT s, TPOT = TTLT_TPOT s, TTLT_N output tokens. Time to the last token (s)?"""
    expected = TTLT_TTFT + (TTLT_N - 1) * TTLT_TPOT
    return Expected(
        expected,
        mistakes=[
            (TTLT_TTFT + TTLT_N * TTLT_TPOT, M("ttlt.first_token_covered")),
            (TTLT_N * TTLT_TPOT, M("ttlt.add_wait_first")),
            ((TTLT_N - 1) * TTLT_TPOT, M("ttlt.add_wait_first")),
            (expected * 1e3, M("tpot.give_seconds_milliseconds")),
        ],
        formula="TTLT ≈ TTFT + (n − 1) · TPOT.",
    )


@numeric(rel=1e-3)
def goodput() -> Expected:
    """Goodput (requests/s) of GOODPUT_TIMELINES over GOODPUT_DURATION s under GOODPUT_SLO (s):
    a request counts when it meets every target; a request with one token has no TPOT to break."""
    ts = [metrics.Timeline(a, tok) for a, tok in GOODPUT_TIMELINES]
    s = metrics.summarize(ts, duration=GOODPUT_DURATION, slo=GOODPUT_SLO)
    strict = (
        sum(
            1
            for t in ts
            if t.ttft <= GOODPUT_SLO["ttft"]
            and t.tpot is not None
            and t.tpot <= GOODPUT_SLO["tpot"]
        )
        / GOODPUT_DURATION
    )
    only_ttft = metrics.summarize(ts, duration=GOODPUT_DURATION, slo={"ttft": GOODPUT_SLO["ttft"]})
    only_tpot = metrics.summarize(ts, duration=GOODPUT_DURATION, slo={"tpot": GOODPUT_SLO["tpot"]})
    return Expected(
        s.goodput,
        mistakes=[
            (s.request_throughput, M("goodput.throughput_all_requests")),
            (strict, M("goodput.token_request_no")),
            (only_ttft.goodput, M("goodput.check_tpot_target")),
            (only_tpot.goodput, M("goodput.check_ttft_target")),
            (s.num_good, M("goodput.goodput_rate_divide")),
        ],
    )


# ----------------------------------------------------------------- the arrival explorer's task

# Statements about two arrival streams at the same rate, burstiness 0.2 and burstiness 5, shown
# in the language in use; the keys are what the student answers with, in a fixed shuffled order
# (the notebook lists them in this order).
BURSTINESS_STATEMENTS = M.texts(
    "burstiness_statements",
    (
        "fewer_per_second",
        "short_gaps",
        "poisson",
        "same_mean_gap",
        "ttft_tail",
        "more_throughput",
        "less_spread",
    ),
)
BURSTINESS_TRUE = frozenset({"short_gaps", "same_mean_gap", "ttft_tail", "less_spread"})
# the hint for each false statement, and for each true one a student may miss
BURSTINESS_WHY_WRONG = M.texts(
    "burstiness_why_wrong", ("fewer_per_second", "poisson", "more_throughput")
)
BURSTINESS_MISSED = M.texts(
    "burstiness_missed", ("short_gaps", "same_mean_gap", "ttft_tail", "less_spread")
)


def burstiness(answer: Any) -> CheckResult:
    """The set of keys of BURSTINESS_STATEMENTS that are true (same rate, burstiness 0.2 vs 5)."""
    ex = "ch10.burstiness"
    if answer is None:
        return not_yet(ex, NOT_ANSWERED)
    items = [answer] if isinstance(answer, str) else answer
    if not isinstance(items, (list, tuple, set, frozenset)):
        return not_yet(ex, M("burstiness.answer_set_keys"))
    got = {str(a).strip().lower() for a in items}
    unknown = got - set(BURSTINESS_STATEMENTS)
    if unknown:
        return not_yet(
            ex,
            M(
                "burstiness.choose_keys_burstiness",
                burstiness_statements=list(BURSTINESS_STATEMENTS),
                unknown=sorted(unknown),
            ),
        )
    wrong = sorted(got - BURSTINESS_TRUE)
    if wrong:
        parts = []
        for k in wrong:
            why = BURSTINESS_WHY_WRONG[k]
            parts.append(labelled(k, why))
        return not_yet(ex, " ".join(parts))
    missed = [k for k in BURSTINESS_STATEMENTS if k in BURSTINESS_TRUE - got]
    if missed:
        first = M("burstiness.everything_chose_holds", n_missed=len(missed))
        return not_yet(ex, staged(ex, first, " ".join(BURSTINESS_MISSED[k] for k in missed)))
    return passed(ex, M("burstiness.right_burstiness_keeps"))


# ----------------------------------------------------------------- the serving explorer's task

SLO_MODEL, SLO_HARDWARE, SLO_CONTEXT, SLO_TPOT = "llama-3-8b", "H100-SXM", 2048, 0.012
SLO_DTYPE_BYTES = 2


def _tpot_floor(batch: int) -> float:
    return roofline.decode_step_floor(
        PRESETS[SLO_MODEL], SLO_HARDWARE, batch, SLO_CONTEXT, SLO_DTYPE_BYTES
    )


def _largest_batch() -> int:
    """The largest batch whose decode-step floor (the TPOT of every request in it) stays within
    SLO_TPOT, for SLO_MODEL on SLO_HARDWARE at SLO_CONTEXT tokens of context each."""
    lo, hi = 1, 1
    while _tpot_floor(hi * 2) <= SLO_TPOT:
        hi *= 2
    hi *= 2
    while hi - lo > 1:  # invariant: floor(lo) within the target, floor(hi) over it
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
        return not_yet(ex, NOT_ANSWERED)
    x = as_number(answer)
    if x is None or x != int(x) or x < 1:
        return not_yet(ex, M("largest_batch_under_slo.answer_whole_number", answer=answer))
    b = int(x)
    if b == expected:
        return passed(ex, M("largest_batch_under_slo.right_past_batch"))
    kv = costs.kv_bytes(PRESETS[SLO_MODEL], SLO_CONTEXT, SLO_DTYPE_BYTES)
    if b > expected:
        hint = M("largest_batch_under_slo.batch_step_takes")
        more = M("largest_batch_under_slo.each_extra_sequence", kv=kv / 1000000.0)
    else:
        hint = M("largest_batch_under_slo.larger_batch_still")
        more = M("largest_batch_under_slo.while_memory_bound")
    return not_yet(ex, staged(ex, hint, more))


# ----------------------------------------------------------------- break-even throughput

COST_PRICE_PER_HOUR = 3.1  # US$ per hour for the card (a made-up quote)
COST_SELL_PER_MILLION = 0.25  # US$ charged per million output tokens (made up too)


@numeric(rel=1e-2)
def break_even_tokens_per_s() -> Expected:
    """The output tokens per second a card rented at COST_PRICE_PER_HOUR must sustain, busy all
    hour, for a million tokens to cost exactly COST_SELL_PER_MILLION (the price it sells them at)."""
    expected = COST_PRICE_PER_HOUR / COST_SELL_PER_MILLION * 1e6 / 3600
    return Expected(
        expected,
        mistakes=[
            (expected * 3600, M("break_even_tokens_per_s.tokens_per_hour")),
            (expected * 60, M("break_even_tokens_per_s.hour_more_seconds")),
            (
                COST_SELL_PER_MILLION / COST_PRICE_PER_HOUR * 1e6 / 3600,
                M("break_even_tokens_per_s.upside_down_dearer"),
            ),
            (
                COST_PRICE_PER_HOUR / COST_SELL_PER_MILLION / 3600,
                M("break_even_tokens_per_s.selling_price_per"),
            ),
        ],
    )


# ----------------------------------------------------------------- the source chapter's question 4

Q4_KEYS = ("chat", "batch_jobs", "code_completion")
# the options, in a fixed order that does not line up with the keys
Q4_METRICS = M.choices(
    "q4_metric",
    ("gpu_util", "e2el", "tpot", "throughput", "ttft"),
)
# several answers are defensible; each set holds the ones a good answer may name first
Q4_ACCEPT = {
    "chat": frozenset({"ttft", "tpot"}),
    "batch_jobs": frozenset({"throughput"}),
    "code_completion": frozenset({"ttft", "e2el"}),
}
Q4_HINTS = M.texts("q4_hints", ("chat", "batch_jobs", "code_completion"))
Q4_WHY_WRONG = M.texts("q4_why_wrong", ("gpu_util",))


@matching(Q4_METRICS, Q4_HINTS, Q4_WHY_WRONG)
def source_q4() -> dict:
    """The source chapter's question 4. Answer a dict mapping each of Q4_KEYS to the metric that
    matters most, one of Q4_METRICS."""
    return Q4_ACCEPT


EXERCISES = M.exercises()  # kind, source question, mistakes: the catalog's "exercises"
