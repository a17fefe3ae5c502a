"""Chapter 10's build exercise, its cases: traces drawn by hypothesis, the package's metrics of
each, and the hint that names the first metric the student's function gets wrong and why."""

from __future__ import annotations

import math
from typing import Any

from llmlab.analysis import metrics
from llmlab.course.build.core import (
    Counterexample,
    Raised,
)
from llmlab.course.check.catalog import catalog
from llmlab.course.check.core import (
    clauses,
    listed,
)

M = catalog("ch10")

# ----------------------------------------------------------------- build: metrics from a raw trace

# The build exercise: the student's function (named so in the notebook) computes the serving
# metrics from a raw trace; `python -m llmlab check ch10` runs it on the notebook's definitions.
BUILDS = {"ch10.metrics_from_trace": "my_metrics"}
DRIVER = "llmlab.course.build.ch10"
MAX_EXAMPLES = 50
METRIC_NAMES = ("ttft", "tpot", "itl", "e2el")
STAT_NAMES = ("mean", "median", "p99")


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
