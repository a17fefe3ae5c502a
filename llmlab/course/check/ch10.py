"""Self-checks of chapter 10 (serving metrics): TPOT of one request, mean TPOT when a request has
a single token, TTLT from TTFT and TPOT, goodput under an SLO, what burstiness does to arrivals
(the arrival explorer's task), the largest batch an H100 can run under a TPOT target (the serving
explorer's task), cost per million tokens, the source chapter's self-check question 4 (which
metric matters for chat, batch jobs, code completion), and the build exercise: the metrics
computed from a raw trace by the student's own function (`metrics_from_trace`)."""

from __future__ import annotations

import copy
import math
import time
from typing import Any

from llmlab.analysis import costs, metrics, roofline
from llmlab.config import PRESETS
from llmlab.course.build import ch10 as build10
from llmlab.course.build.core import (
    TIMING_ROUNDS,
    Counterexample,
    Raised,
    Timing,
    alternating_rounds,
    drive,
    find_counterexample,
)
from llmlab.course.check.catalog import catalog
from llmlab.course.check.core import (
    NOT_ANSWERED,
    CheckResult,
    ExerciseInfo,
    as_number,
    check_matching,
    check_number,
    clauses,
    earlier_names,
    labelled,
    listed,
    not_yet,
    passed,
    record_expected,
    refuse_package_piece,
    report,
    staged,
)
from llmlab.i18n import Bilingual

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


def tpot(answer: Any) -> CheckResult:
    """A request arrives at TPOT_ARRIVAL and its tokens come at TPOT_TOKENS (s). Its TPOT, in s?"""
    t = metrics.Timeline(TPOT_ARRIVAL, TPOT_TOKENS)
    n = t.num_output_tokens
    return check_number(
        "ch10.tpot",
        answer,
        t.tpot,
        rel=1e-3,
        mistakes=[
            (t.e2el / n, M("tpot.spreads_whole_latency")),
            ((t.e2el - t.ttft) / n, M("tpot.after_first_token")),
            (t.e2el / (n - 1), M("tpot.subtract_ttft_first")),
            (t.tpot * 1e3, M("tpot.give_seconds_milliseconds")),
        ],
        default_hint=M("tpot.default_hint"),
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
        return report(not_yet(ex, M("mean_tpot.nan_mean_request")))
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


def ttlt(answer: Any) -> CheckResult:
    """TTFT = TTLT_TTFT s, TPOT = TTLT_TPOT s, TTLT_N output tokens. Time to the last token (s)?"""
    expected = TTLT_TTFT + (TTLT_N - 1) * TTLT_TPOT
    return check_number(
        "ch10.ttlt",
        answer,
        expected,
        rel=1e-4,
        mistakes=[
            (TTLT_TTFT + TTLT_N * TTLT_TPOT, M("ttlt.first_token_covered")),
            (TTLT_N * TTLT_TPOT, M("ttlt.add_wait_first")),
            ((TTLT_N - 1) * TTLT_TPOT, M("ttlt.add_wait_first")),
            (expected * 1e3, M("tpot.give_seconds_milliseconds")),
        ],
        default_hint=M("ttlt.default_hint"),
        formula="TTLT ≈ TTFT + (n − 1) · TPOT.",
    )


def goodput(answer: Any) -> CheckResult:
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
    return check_number(
        "ch10.goodput",
        answer,
        s.goodput,
        rel=1e-3,
        mistakes=[
            (s.request_throughput, M("goodput.throughput_all_requests")),
            (strict, M("goodput.token_request_no")),
            (only_ttft.goodput, M("goodput.check_tpot_target")),
            (only_tpot.goodput, M("goodput.check_ttft_target")),
            (s.num_good, M("goodput.goodput_rate_divide")),
        ],
        default_hint=M("goodput.default_hint"),
        formula=M("goodput.formula"),
    )


# ----------------------------------------------------------------- the arrival explorer's task

# Statements about two arrival streams at the same rate, burstiness 0.2 and burstiness 5 (keys
# in a fixed shuffled order; the notebook lists them in this order).
BURSTINESS_STATEMENTS_EN = {
    "fewer_per_second": "at 0.2, fewer requests arrive per second on average",
    "short_gaps": "at 0.2, many more gaps are shorter than a tenth of the mean gap",
    "poisson": "burstiness 5 is what vLLM's benchmark client calls Poisson arrivals",
    "same_mean_gap": "the mean gap between arrivals is about the same at both",
    "ttft_tail": "sent to the same server, the 0.2 stream will likely show the higher p99 TTFT",
    "more_throughput": "over a long run, the 0.2 stream gets more requests/s out of the server",
    "less_spread": "at 5, the gaps vary less than Poisson gaps do",
}
# the statements in Chinese, the notebook prints them through BURSTINESS_STATEMENTS
BURSTINESS_STATEMENTS_ZH = {
    "fewer_per_second": "burstiness 为 0.2 时，平均每秒到达请求更少",
    "short_gaps": "burstiness 为 0.2 时，短于平均间隔十分之一的间隔多得多",
    "poisson": "burstiness 为 5，就是 vLLM 基准测试客户端所说的泊松到达",
    "same_mean_gap": "两种设置下，相邻到达平均间隔差不多",
    "ttft_tail": "发给同一台服务器时，0.2 那股请求流多半会有更高 p99 TTFT",
    "more_throughput": "长期来看，0.2 那股请求流能从服务器拿到更多 requests/s",
    "less_spread": "burstiness 为 5 时，间隔波动比泊松过程小",
}
# shown in the language in use; the keys are what the student answers with
BURSTINESS_STATEMENTS = Bilingual(BURSTINESS_STATEMENTS_EN, BURSTINESS_STATEMENTS_ZH)
BURSTINESS_TRUE = frozenset({"short_gaps", "same_mean_gap", "ttft_tail", "less_spread"})
# (English, Chinese) for each false statement, and for each true one a student may miss
BURSTINESS_WHY_WRONG = {
    "fewer_per_second": M.key("burstiness_why_wrong.fewer_per_second"),
    "poisson": M.key("burstiness_why_wrong.poisson"),
    "more_throughput": M.key("burstiness_why_wrong.more_throughput"),
}
BURSTINESS_MISSED = {
    "short_gaps": M.key("burstiness_missed.short_gaps"),
    "same_mean_gap": M.key("burstiness_missed.same_mean_gap"),
    "ttft_tail": M.key("burstiness_missed.ttft_tail"),
    "less_spread": M.key("burstiness_missed.less_spread"),
}


def burstiness(answer: Any) -> CheckResult:
    """The set of keys of BURSTINESS_STATEMENTS that are true (same rate, burstiness 0.2 vs 5)."""
    ex = "ch10.burstiness"
    if answer is None:
        return report(not_yet(ex, NOT_ANSWERED))
    items = [answer] if isinstance(answer, str) else answer
    if not isinstance(items, (list, tuple, set, frozenset)):
        return report(not_yet(ex, M("burstiness.answer_set_keys")))
    got = {str(a).strip().lower() for a in items}
    unknown = got - set(BURSTINESS_STATEMENTS)
    if unknown:
        return report(
            not_yet(
                ex,
                M(
                    "burstiness.choose_keys_burstiness",
                    burstiness_statements=list(BURSTINESS_STATEMENTS),
                    unknown=sorted(unknown),
                ),
            )
        )
    wrong = sorted(got - BURSTINESS_TRUE)
    if wrong:
        parts = []
        for k in wrong:
            why = M(BURSTINESS_WHY_WRONG[k])
            parts.append(labelled(k, why))
        return report(not_yet(ex, " ".join(parts)))
    missed = [k for k in BURSTINESS_STATEMENTS if k in BURSTINESS_TRUE - got]
    if missed:
        first = M("burstiness.everything_chose_holds", n_missed=len(missed))
        return report(
            not_yet(ex, staged(ex, first, " ".join(M(BURSTINESS_MISSED[k]) for k in missed)))
        )
    return report(passed(ex, M("burstiness.right_burstiness_keeps")))


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
        return report(not_yet(ex, NOT_ANSWERED))
    x = as_number(answer)
    if x is None or x != int(x) or x < 1:
        return report(not_yet(ex, M("largest_batch_under_slo.answer_whole_number", answer=answer)))
    b = int(x)
    if b == expected:
        return report(passed(ex, M("largest_batch_under_slo.right_past_batch")))
    kv = costs.kv_bytes(PRESETS[SLO_MODEL], SLO_CONTEXT, SLO_DTYPE_BYTES)
    if b > expected:
        hint = M("largest_batch_under_slo.batch_step_takes")
        more = M("largest_batch_under_slo.each_extra_sequence", kv=kv / 1000000.0)
    else:
        hint = M("largest_batch_under_slo.larger_batch_still")
        more = M("largest_batch_under_slo.while_memory_bound")
    return report(not_yet(ex, staged(ex, hint, more)))


# ----------------------------------------------------------------- break-even throughput

COST_PRICE_PER_HOUR = 3.1  # US$ per hour for the card (a made-up quote)
COST_SELL_PER_MILLION = 0.25  # US$ charged per million output tokens (made up too)


def break_even_tokens_per_s(answer: Any) -> CheckResult:
    """The output tokens per second a card rented at COST_PRICE_PER_HOUR must sustain, busy all
    hour, for a million tokens to cost exactly COST_SELL_PER_MILLION (the price it sells them at)."""
    expected = COST_PRICE_PER_HOUR / COST_SELL_PER_MILLION * 1e6 / 3600
    return check_number(
        "ch10.break_even_tokens_per_s",
        answer,
        expected,
        rel=1e-2,
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
        default_hint=M("break_even_tokens_per_s.default_hint"),
        formula=M("break_even_tokens_per_s.formula"),
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
Q4_HINTS = {  # (English, Chinese)
    "chat": M.key("q4_hints.chat"),
    "batch_jobs": M.key("q4_hints.batch_jobs"),
    "code_completion": M.key("q4_hints.code_completion"),
}
Q4_WHY_WRONG = {
    "gpu_util": M.key("q4_why_wrong.gpu_util"),
}


def source_q4(answer: Any) -> CheckResult:
    """The source chapter's question 4. Answer a dict mapping each of Q4_KEYS to the metric that
    matters most, one of Q4_METRICS."""
    return check_matching(
        "ch10.source_q4",
        answer,
        Q4_ACCEPT,
        choices=Q4_METRICS,
        hints={key: M(pair) for key, pair in Q4_HINTS.items()},
        why_wrong={key: M(pair) for key, pair in Q4_WHY_WRONG.items()},
        success=M("source_q4.success"),
    )


EXERCISES: dict[str, ExerciseInfo] = {
    "tpot": ExerciseInfo(
        "plug-in",
        (
            "whole latency over n tokens",
            "n gaps instead of n − 1",
            "TTFT not subtracted",
            "milliseconds",
        ),
    ),
    "mean_tpot": ExerciseInfo(
        "plug-in",
        (
            "one-token request counted as TPOT 0",
            "NaN for the one-token request",
            "pooled gaps (mean ITL)",
        ),
    ),
    "ttlt": ExerciseInfo("plug-in", ("n gaps instead of n − 1", "TTFT left out", "milliseconds")),
    "goodput": ExerciseInfo(
        "plug-in",
        (
            "throughput of all requests",
            "one-token request failing TPOT",
            "one target only",
            "a count, not a rate",
        ),
    ),
    "burstiness": ExerciseInfo(
        "reasoning",
        (
            "burstiness changes the rate",
            "bursty arrivals raise long-run throughput",
            "which burstiness is Poisson",
        ),
    ),
    "largest_batch_under_slo": ExerciseInfo(
        "reasoning", ("batch past the TPOT target", "batch below the largest one that meets it")
    ),
    "break_even_tokens_per_s": ExerciseInfo(
        "reasoning",
        (
            "tokens per hour",
            "minutes vs seconds",
            "upside down",
            "per token instead of per million",
        ),
    ),
    "source_q4": ExerciseInfo(
        "reasoning",
        ("throughput for chat", "GPU utilisation as a target", "TTFT for batch jobs"),
        source_question=4,
    ),
    "metrics_from_trace": ExerciseInfo(
        "reasoning",
        (
            "TPOT over n instead of n − 1",
            "a TPOT for a one-token request",
            "ITL per token instead of per chunk",
            "TTFT from scheduling instead of sending",
            "goodput counting any target met",
            "failed requests counted",
            "TPOT or ITL statistics over the wrong values",
            "goodput as a count, not a rate",
        ),
    ),
}


# ----------------------------------------------------------------- build: metrics from a raw trace

# The build exercise: the student's function (named so in the notebook) computes the serving
# metrics from a raw trace; `python -m llmlab check ch10` runs it on the notebook's definitions.
BUILDS = {"ch10.metrics_from_trace": "my_metrics"}
DRIVER = "llmlab.course.build.ch10"
MAX_EXAMPLES = 50
METRIC_NAMES = ("ttft", "tpot", "itl", "e2el")
STAT_NAMES = ("mean", "median", "p99")
# the first trace the student's function sees: untouched, the skeleton returns only None
PROBE = {
    "trace": [{"sent": 0.0, "scheduled": 0.0, "chunks": [(0.1, 1), (0.2, 1)], "ok": True}],
    "slo": {"ttft": 0.5},
    "duration": 0.2,
}
# a run of SmolLM2 recorded by the checker itself when the notebook's run is not given
RECORD_PROMPTS = ("Hello!", "What is a KV cache?", "Tell me a short story.", "Name three colours.")
RECORD_TOKENS = (1, 6, 4, 8)
RECORD_ARRIVALS = (0.0, 0.0, 0.05, 0.1)


def _cases() -> Any:
    """Hypothesis strategy of {"trace", "slo", "duration"}: one to four requests with times in
    tenths of a second, some queueing, chunks of one to three tokens, one-token and failed
    requests; an SLO of one to three targets; the duration from first send to last chunk."""
    import itertools

    from hypothesis import assume
    from hypothesis import strategies as st

    @st.composite
    def request(draw: Any) -> dict:
        sent, queue, first = (draw(st.integers(lo, hi)) for lo, hi in ((0, 5), (0, 3), (1, 4)))
        gaps = draw(st.lists(st.integers(1, 4), max_size=4))
        tokens = draw(st.lists(st.integers(1, 3), min_size=len(gaps) + 1, max_size=len(gaps) + 1))
        ok = draw(st.integers(0, 4)) != 4  # one request in five fails
        times = itertools.accumulate([sent + queue + first, *gaps])
        chunks = [(t / 10, k) for t, k in zip(times, tokens)]
        if not ok:  # it broke off after some of its chunks (maybe none)
            chunks = chunks[: draw(st.integers(0, len(chunks)))]
        return {"sent": sent / 10, "scheduled": (sent + queue) / 10, "chunks": chunks, "ok": ok}

    @st.composite
    def case(draw: Any) -> dict:
        trace = draw(st.lists(request(), min_size=1, max_size=4))
        done = [r for r in trace if r["ok"]]
        assume(done)
        keys = draw(
            st.lists(st.sampled_from(metrics.SLO_KEYS), min_size=1, max_size=3, unique=True)
        )
        slo = {k: draw(st.integers(1, 10)) / 10 for k in keys}
        last = max(r["chunks"][-1][0] for r in done)
        return {
            "trace": trace,
            "slo": slo,
            "duration": round(last - min(r["sent"] for r in done), 9),
        }

    return case()


def _package(case: dict) -> dict:
    """The package's answer for a case, in the shape the student's function returns."""
    ts = [metrics.timeline_of(r) for r in case["trace"] if r["ok"]]
    s = metrics.summarize(ts, duration=case["duration"], slo=case["slo"])

    def three(stats: metrics.Stats) -> list | None:
        return None if stats.count == 0 else [stats.mean, stats.median, stats.p99]

    return {
        "ttft": [t.ttft for t in ts],
        "tpot": [t.tpot for t in ts],
        "itl": [t.itls for t in ts],
        "e2el": [t.e2el for t in ts],
        "stats": {m: three(getattr(s, m)) for m in METRIC_NAMES},
        "goodput": s.goodput,
    }


def _number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _same(a: Any, b: Any) -> bool:
    """Equal within float tolerance (numbers), element by element (lists), else identical."""
    if b is None or a is None:
        return a is None and b is None
    if _number(b):
        return _number(a) and math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-9)
    if isinstance(b, (list, tuple)):
        return (
            isinstance(a, (list, tuple))
            and len(a) == len(b)
            and all(_same(x, y) for x, y in zip(a, b))
        )
    return a == b


def _difference(got: Any, expected: dict) -> tuple | None:
    """The first place where the student's result differs from the package's, or None:
    ("raised",), ("type",), ("length", metric), ("request", metric, i), ("stats", metric, stat)
    (stat None: the shape), ("goodput",). Per request first, then statistics, then goodput."""
    if isinstance(got, Raised):
        return ("raised",)
    if not isinstance(got, dict):
        return ("type",)
    for m in METRIC_NAMES:
        if not isinstance(got.get(m), list) or len(got[m]) != len(expected[m]):
            return ("length", m)
    for i in range(len(expected["ttft"])):
        for m in METRIC_NAMES:
            if not _same(got[m][i], expected[m][i]):
                return ("request", m, i)
    stats = got.get("stats")
    for m in METRIC_NAMES:
        g = stats.get(m) if isinstance(stats, dict) else "?"
        e = expected["stats"][m]
        if e is None or not isinstance(g, list) or len(g) != 3:
            if not _same(g, e):
                return ("stats", m, None)
            continue
        for j, name in enumerate(STAT_NAMES):
            if not _same(g[j], e[j]):
                return ("stats", m, name)
    if not _same(got.get("goodput"), expected["goodput"]):
        return ("goodput",)
    return None


def _s(x: Any) -> str:
    """A number of seconds (or a list of them) as the hint shows it: 0.30000000000000004 -> 0.3."""
    if _number(x):
        return f"{round(x, 6):g}"
    if isinstance(x, (list, tuple)):
        return "[" + ", ".join(_s(v) for v in x) + "]"
    return repr(x)


def _sec(x: Any) -> str:
    """`_s` with the unit, where there is a value: "0.1 s", "[0.1, 0.2] s", "None"."""
    return (
        repr(x) if x is None or not (_number(x) or isinstance(x, (list, tuple))) else f"{_s(x)} s"
    )


def _plural(k: int, one: str, many: str) -> str:
    """The catalog text `one` (for k == 1) or `many`, filled with k: "1 token", "3 tokens"."""
    key = one if k == 1 else many
    return M(key, k=k)


def _tokens(k: int) -> str:
    return _plural(k, M.key("count.token"), M.key("count.tokens"))


def _describe_request(r: dict, label: str) -> str:
    chunks = listed(M("describe_request.chunk", t=_s(t), tokens=_tokens(k)) for t, k in r["chunks"])
    if label and not r["ok"]:
        head = M("describe_request.head_failed", label=label)
    elif label:
        head = M("describe_request.head", label=label)
    else:
        head = M("describe_request.failed") if not r["ok"] else ""
    return M(
        "describe_request.times",
        head=head,
        sent=_s(r["sent"]),
        scheduled=_s(r["scheduled"]),
        chunks=chunks or M("describe_request.no_chunks"),
    )


def _describe_case(case: dict, with_slo: bool) -> str:
    """The drawn trace in a sentence (requests named A, B, ...; with the SLO and duration)."""
    trace = case["trace"]
    if len(trace) == 1:
        text = M("describe_case.one_request", request=_describe_request(trace[0], ""))
    else:
        parts = [_describe_request(r, "ABCD"[i]) for i, r in enumerate(trace)]
        text = M("describe_case.n_trace_requests", n_trace=len(trace)) + clauses(parts)
    if with_slo:
        slo = listed(f"{k.upper()} ≤ {_s(v)} s" for k, v in case["slo"].items())
        text += M("describe_case.slo_slo_duration", slo=slo, duration=_s(case["duration"]))
    return text


def _request_hint(case: dict, metric: str, i: int, g: Any, e: Any) -> str:
    """Why request i's `metric` differs: the broken step, named where it can be recognised."""
    done = [j for j, r in enumerate(case["trace"]) if r["ok"]]
    r = case["trace"][done[i]]
    name = "ABCD"[done[i]] if len(case["trace"]) > 1 else ""
    times = [t for t, _ in r["chunks"]]
    n, c = sum(k for _, k in r["chunks"]), len(times)
    ttft, e2el, sent, sched = times[0] - r["sent"], times[-1] - r["sent"], r["sent"], r["scheduled"]
    if name:
        what = M(
            "request_hint.yours_of", metric=metric.upper(), name=name, got=_sec(g), expected=_sec(e)
        )
    else:
        what = M("request_hint.yours", metric=metric.upper(), got=_sec(g), expected=_sec(e))
    close = lambda a, b: _number(a) and math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-9)  # noqa: E731
    if metric in ("ttft", "e2el") and sched != sent and close(g, (e + sent) - sched):
        why = M(
            "request_hint.measured_when_engine",
            sched=_s(sched),
            upper=metric.upper(),
            sent=_s(sent),
        )
    elif metric in ("ttft", "e2el"):
        why = M("request_hint.ttft_rule") if metric == "ttft" else M("request_hint.e2el_rule")
    elif metric == "tpot" and e is None:
        why = M("request_hint.output_token_there")
    elif metric == "tpot" and g is None:
        why = M("request_hint.n_output_tokens", n=n)
    elif metric == "tpot" and close(g, (e2el - ttft) / n):
        why = M("request_hint.divided_n_n", n=n, value=n - 1)
    elif metric == "tpot" and c != n and c > 1 and close(g, (e2el - ttft) / (c - 1)):
        why = M("request_hint.divided_gaps_between", c=c, n=n - 1)
    elif metric == "tpot":
        why = M("request_hint.tpot_e2el_ttft")
    elif isinstance(g, list) and len(g) == n - 1 != c - 1:
        chunks = _plural(c, M.key("count.chunk"), M.key("count.chunks"))
        gaps = _plural(c - 1, M.key("count.gap"), M.key("count.gaps"))
        why = M("request_hint.gap_per_token", chunks=chunks, gaps=gaps)
    else:
        why = M("request_hint.itl_list_gaps")
    return M("hint.what_why", what=what, why=why)


def _goodput_hint(case: dict, g: Any, e: float) -> str:
    """Why the goodput differs: any target instead of every one, a count, one token failing TPOT."""
    ts = [metrics.timeline_of(r) for r in case["trace"] if r["ok"]]
    slo, duration = case["slo"], case["duration"]
    values = [{"ttft": t.ttft, "tpot": t.tpot, "e2el": t.e2el} for t in ts]
    meets = [[v[k] is None or v[k] <= x for k, x in slo.items()] for v in values]
    strict = [all(v[k] is not None and v[k] <= x for k, x in slo.items()) for v in values]
    num_good = sum(all(m) for m in meets)
    close = lambda a, b: _number(a) and math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-9)  # noqa: E731
    what = M("goodput_hint.goodput_g_requests", g=_s(g), e=_s(e))
    if close(g, sum(any(m) for m in meets) / duration):
        why = M("goodput_hint.request_counts_only")
    elif close(g, num_good) and num_good != e:
        why = M("goodput_hint.goodput_rate_divide")
    elif close(g, sum(strict) / duration):
        why = M("goodput_hint.request_output_token")
    else:
        why = M("goodput_hint.goodput_successful_requests")
    return M("hint.what_why", what=what, why=why)


def _stats_hint(case: dict, metric: str, stat: str | None, got: dict, e: Any) -> str:
    stats = got.get("stats")
    g = stats.get(metric) if isinstance(stats, dict) else None
    if stat is None:
        what = M("stats_hint.stats_upper_g", upper=metric.upper(), g=_s(g), e=_s(e))
        why = M("stats_hint.stats_maps_each")
    else:
        what = M(
            "stats_hint.upper_stat_g",
            upper=metric.upper(),
            stat=stat,
            g=_s(g[STAT_NAMES.index(stat)]),
            e=_s(e[STAT_NAMES.index(stat)]),
        )
        why = {
            "itl": M("stats_hint.itl_s_statistics"),
            "tpot": M("stats_hint.tpot_s_statistics"),
        }.get(metric, M("stats_hint.upper_s_statistics", upper=metric.upper()))
    return M("hint.what_why", what=what, why=why)


def _build_hint(cex: Counterexample) -> str:
    """The shrunk trace and the first metric on which the student's function differs."""
    case, got, expected = cex.case, cex.got, cex.expected
    diff = _difference(got, expected)
    where = _describe_case(case, with_slo=diff is not None and diff[0] == "goodput")
    kind = diff[0] if diff else "raised"
    if kind == "raised" and any(not r["ok"] for r in case["trace"]):
        # shrinking kept the failed request: the error needs it
        what = M("build_hint.raised_on_failed", error=got.error, message=got.message)
    elif kind == "raised":
        what = M("build_hint.function_raised_error", error=got.error, message=got.message)
    elif kind == "type":
        what = M("build_hint.function_returned_got", got_type=type(got).__name__)
    elif kind == "length":
        m, g = diff[1], got.get(diff[1])
        n_ok = len(expected[m])
        if isinstance(g, list) and len(g) == len(case["trace"]) != n_ok:
            what = M("build_hint.m_r_n", m=m, n_g=len(g), n_ok=n_ok)
        else:
            what = M("build_hint.m_r_g", m=m, g=_s(g), n_ok=n_ok)
    elif kind == "request":
        m, i = diff[1], diff[2]
        what = _request_hint(case, m, i, got[m][i], expected[m][i])
        return M("build_hint.where_what", where=where, what=what)
    elif kind == "stats":
        what = _stats_hint(case, diff[1], diff[2], got, expected["stats"][diff[1]])
        return M("build_hint.where_what", where=where, what=what)
    else:
        what = _goodput_hint(case, got.get("goodput"), expected["goodput"])
        return M("build_hint.where_what", where=where, what=what)
    return M("build_hint.where_what_stop", where=where, what=what)


def _real_run(
    trace: Any, slo: Any, duration: Any
) -> tuple[list[dict], dict[str, float], float, bool]:
    """(trace, slo, duration, recorded here) of a real run: the notebook's when it gives a usable
    one, else a few requests of SmolLM2 recorded now through the engine's streaming timestamps."""
    here = False
    try:
        trace = metrics.trace_of(trace)
        done = [r for r in trace if r["ok"]]
        if len(done) < 2:
            raise ValueError("too few requests")
        metrics.summarize(trace)
    except (TypeError, ValueError, AttributeError, KeyError, IndexError):
        trace, here = _record_trace(), True
        done = [r for r in trace if r["ok"]]
    try:
        slo = metrics._check_slo(slo)
    except (TypeError, ValueError):
        slo = None
    if not slo:
        s = metrics.summarize(trace)
        slo = {"ttft": 2 * s.ttft.median} | ({"tpot": 2 * s.tpot.median} if s.tpot.count else {})
    if not (_number(duration) and duration > 0):
        last = max(r["chunks"][-1][0] for r in done)
        duration = last - min(r["sent"] for r in done)
    return trace, slo, float(duration), here


def _record_trace() -> list[dict]:
    """A few requests of SmolLM2 through the engine (one with a single output token), arriving
    close together, as a raw trace."""
    from llmlab import LLM, SamplingParams

    llm = LLM("smollm2-135m", max_model_len=256, max_num_seqs=8, seed=0)
    tok = llm.get_tokenizer()
    prompts = [tok.encode(p) for p in RECORD_PROMPTS]
    params = [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True) for n in RECORD_TOKENS]
    outs, _ = metrics.run_with_arrivals(llm.llm_engine, prompts, params, RECORD_ARRIVALS)
    return metrics.trace_of(outs)


def _ms(x: Any) -> str:
    return "—" if x is None else f"{x * 1e3:.1f} ms"


def _measured(numbers: dict, own: dict | None) -> str:
    """p50 / p99 of TTFT and TPOT and the goodput, from summary numbers ([count, mean, median,
    p90, p99]) or from a function's own "stats" ((mean, median, p99))."""
    if own is not None:
        stats = own.get("stats") or {}
        p = {m: tuple((stats.get(m) or [None] * 3)[1:3]) for m in ("ttft", "tpot")}
        goodput = own.get("goodput")
    else:
        p = {m: (numbers[m][2], numbers[m][4]) for m in ("ttft", "tpot")}
        goodput = numbers["goodput"]
    return M(
        "measured.line",
        ttft_p50=_ms(p["ttft"][0]),
        ttft_p99=_ms(p["ttft"][1]),
        tpot_p50=_ms(p["tpot"][0]),
        tpot_p99=_ms(p["tpot"][1]),
        goodput=goodput,
    )


def metrics_from_trace(
    answer: Any, trace: Any = None, slo: Any = None, duration: Any = None
) -> CheckResult:
    """Build exercise: `answer` is the student's `my_metrics(trace, slo, duration)`, which
    returns TTFT, TPOT, ITL, E2EL per successful request, their statistics and the goodput,
    with vLLM's definitions. Checked on traces drawn with hypothesis against the package's
    metrics (the smallest disagreeing trace in the hint), then plugged into the chapter's report
    (`metrics.summarize(..., metrics_fn=answer)`) on a real run: `trace`, `slo`, `duration`
    from the chapter's benchmark, else SmolLM2 recorded here. The pass line measures both."""
    ex = "ch10.metrics_from_trace"
    if answer is None:
        return report(not_yet(ex, NOT_ANSWERED))
    refused = refuse_package_piece(ex, answer)
    if refused is not None:
        return refused
    if not callable(answer):
        return report(
            not_yet(
                ex, M("metrics_from_trace.answer_function_my", answer_type=type(answer).__name__)
            )
        )

    def observe(case: dict) -> Any:
        return drive(answer, f"{DRIVER}:observe", case["trace"], case["slo"], case["duration"])

    try:
        first = observe(PROBE)
    except TimeoutError as e:
        return report(not_yet(ex, M("metrics_from_trace.function_e", e=e)))
    except Exception:  # the property check below shows the error on the smallest trace
        first = ...
    if first is None or (isinstance(first, dict) and all(v is None for v in first.values())):
        return report(not_yet(ex, NOT_ANSWERED))
    cex = find_counterexample(
        _cases(),
        observe,
        _package,
        max_examples=MAX_EXAMPLES,
        compare=lambda got, expected: _difference(got, expected) is None,
    )
    if cex is not None:
        return report(not_yet(ex, _build_hint(cex)))
    return report(_plugged_in(ex, answer, *_real_run(trace, slo, duration)))


def _mismatch(theirs: dict, ours_numbers: dict, expected_own: dict) -> list[str]:
    """The numbers on which the report made with the student's function, or the function's own
    "stats" and "goodput", differ from the package's."""
    mismatch = [
        m for m in (*METRIC_NAMES, "goodput") if not _same(theirs["summary"][m], ours_numbers[m])
    ]
    own_stats = (theirs["own"] or {}).get("stats")
    if not isinstance(own_stats, dict) or not all(
        _same(own_stats.get(m), expected_own["stats"][m]) for m in METRIC_NAMES
    ):
        mismatch.append("stats")
    if not _same((theirs["own"] or {}).get("goodput"), expected_own["goodput"]):
        mismatch.append("goodput")
    return sorted(set(mismatch))


def _plugged_in(
    ex: str, answer: Any, real: list, real_slo: dict, real_duration: float, here: bool
) -> CheckResult:
    """The student's function plugged into the chapter's report on a real run: its numbers
    against the package's, then (equal) both measured, the times in alternating rounds."""
    ours_numbers = build10.summary_numbers(
        metrics.summarize(real, duration=real_duration, slo=real_slo)
    )
    try:
        theirs = drive(answer, f"{DRIVER}:plugged_in", real, real_slo, real_duration)
    except Exception as e:  # the student's function, or summarize refusing what it returned
        return not_yet(
            ex, M("metrics_from_trace.plugged_into_chapter", e_type=type(e).__name__, e=e)
        )
    expected_own = _package({"trace": real, "slo": real_slo, "duration": real_duration})
    mismatch = _mismatch(theirs, ours_numbers, expected_own)
    n_ok = sum(r["ok"] for r in real)
    source = (
        M("metrics_from_trace.run_smollm2_recorded")
        if here
        else M("metrics_from_trace.chapter_s_recorded")
    )
    if mismatch:
        return not_yet(
            ex,
            M(
                "metrics_from_trace.right_small_drawn",
                source=source,
                n_ok=n_ok,
                names=", ".join(mismatch),
                measured=_measured(theirs['summary'], None),
                measured_2=_measured(ours_numbers, None),
            ),
        )
    timing = _timing(answer, real, real_slo, real_duration)
    return passed(
        ex,
        M(
            "metrics_from_trace.equal_package_s",
            max_examples=MAX_EXAMPLES,
            source=source,
            n_ok=n_ok,
            chunks=sum(len(r["chunks"]) for r in real if r["ok"]),
            measured=_measured({}, theirs['own']),
            seconds=timing.mine * 1000.0,
            measured_2=_measured(ours_numbers, None),
            ours_seconds=timing.package * 1000.0,
            timing=_timing_text(timing),
        ),
    )


def _timing(answer: Any, trace: list, slo: dict, duration: float) -> Timing:
    """The student's function against the package's `summarize` on the same trace, timed in
    alternating rounds (one call each, the copies made outside the clock)."""

    def package() -> float:
        fresh = copy.deepcopy(trace)
        start = time.perf_counter()
        metrics.summarize(fresh, duration=duration, slo=slo)
        return time.perf_counter() - start

    return alternating_rounds(
        lambda: drive(answer, f"{DRIVER}:seconds", trace, slo, duration), package
    )


def _timing_text(timing: Timing) -> str:
    if timing.same:
        return M("timing.same", rounds=TIMING_ROUNDS)
    return M("timing.ratio", ratio=timing.ratio, rounds=TIMING_ROUNDS)


# notebooks handed out before the source chapter's questions were renamed call seed_q4
__getattr__ = earlier_names(globals(), {"seed_q4": "source_q4"})
