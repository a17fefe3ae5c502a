"""Drivers of chapter 10's build exercise, the serving metrics from a raw trace.

The student writes `my_metrics(trace, slo, duration)`: TTFT, TPOT, ITL and E2EL per request,
their statistics and the goodput, from what a streaming client records (see
`llmlab.analysis.metrics.trace_of`). The drivers run it and hand back plain data only:

- `observe`: the student's function on one trace (a case the checker drew);
- `plugged_in`: the chapter's report (`metrics.summarize(..., metrics_fn=...)`) computed with the
  student's function on a real recorded trace;
- `seconds`: one timed call of the student's function (a round of the checker's timing).

`summary_numbers` turns a `BenchmarkSummary` into the same plain numbers, for the checker's own
side (the package's `summarize` without the student's function).
"""

from __future__ import annotations

import copy
import time
from typing import Any, Callable

from llmlab.analysis import metrics

METRICS = ("ttft", "tpot", "itl", "e2el")


def plain(value: Any, depth: int = 0) -> Any:
    """`value` as plain data (numbers, str, None, lists, dicts with str keys); numpy numbers and
    arrays become Python ones, anything else its repr (the checker compares and shows it)."""
    if depth > 16:
        return repr(value)
    if hasattr(value, "tolist") and callable(value.tolist):  # numpy scalar or array, a tensor
        try:
            return plain(value.tolist(), depth + 1)
        except (TypeError, ValueError):
            return repr(value)
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return [plain(x, depth + 1) for x in value]
    if isinstance(value, dict):
        return {str(k): plain(v, depth + 1) for k, v in value.items()}
    return repr(value)


def observe(my_metrics: Callable[..., Any], trace: list, slo: dict, duration: float) -> Any:
    """What `my_metrics` returns on `trace` (a copy: the function may change its input)."""
    return plain(my_metrics(copy.deepcopy(trace), dict(slo), duration))


def summary_numbers(s: metrics.BenchmarkSummary) -> dict[str, Any]:
    """{metric: [count, mean, median, p90, p99]} for TTFT, TPOT, ITL, E2EL, and "goodput"."""
    out: dict[str, Any] = {}
    for name in METRICS:
        st = getattr(s, name)
        out[name] = [st.count, st.mean, st.median, st.p90, st.p99]
    out["goodput"] = s.goodput
    return out


def seconds(my_metrics: Callable[..., Any], trace: list, slo: dict, duration: float) -> float:
    """One timed call of `my_metrics` on copies of its arguments (made outside the timing): a
    round of the checker's alternating timing (`llmlab.course.build.alternating_rounds`)."""
    fresh = copy.deepcopy((trace, dict(slo), duration))
    start = time.perf_counter()
    my_metrics(*fresh)
    return time.perf_counter() - start


def plugged_in(
    my_metrics: Callable[..., Any], trace: list, slo: dict, duration: float
) -> dict[str, Any]:
    """The chapter's report with `my_metrics` plugged in: `summary` (what
    `summarize(trace, duration, slo, metrics_fn=my_metrics)` gives, as `summary_numbers`),
    `own` (the function's own "stats" and "goodput")."""
    s = metrics.summarize(trace, duration=duration, slo=slo, metrics_fn=my_metrics)
    own = plain(my_metrics(copy.deepcopy(trace), dict(slo), duration))
    own = {k: own.get(k) for k in ("stats", "goodput")} if isinstance(own, dict) else {}
    return {"summary": summary_numbers(s), "own": own}
