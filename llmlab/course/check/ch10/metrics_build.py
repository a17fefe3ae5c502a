"""Chapter 10's build exercise, checked: the student's metrics function on drawn traces, on a
real run of the engine, and plugged into the serving benchmark's report."""

from __future__ import annotations

import copy
import time
from typing import Any

from llmlab.analysis import metrics
from llmlab.course.build import ch10 as build10
from llmlab.course.build.core import (
    TIMING_ROUNDS,
    Timing,
    alternating_rounds,
    drive,
    find_counterexample,
)
from llmlab.course.check.build_guard import refuse_build_answer
from llmlab.course.check.catalog import catalog
from llmlab.course.check.ch10.trace_cases import (
    DRIVER,
    MAX_EXAMPLES,
    METRIC_NAMES,
    _build_hint,
    _cases,
    _difference,
    _number,
    _package,
    _same,
)
from llmlab.course.check.core import (
    NOT_ANSWERED,
    CheckResult,
    not_yet,
    passed,
)

M = catalog("ch10")

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
    hint = M("metrics_from_trace.answer_function_my", answer_type=type(answer).__name__)
    refused = refuse_build_answer(ex, answer, hint=hint)
    if refused is not None:
        return refused

    def observe(case: dict) -> Any:
        return drive(answer, f"{DRIVER}:observe", case["trace"], case["slo"], case["duration"])

    try:
        first = observe(PROBE)
    except TimeoutError as e:
        return not_yet(ex, M("metrics_from_trace.function_e", e=e))
    except Exception:  # the property check below shows the error on the smallest trace
        first = ...
    if first is None or (isinstance(first, dict) and all(v is None for v in first.values())):
        return not_yet(ex, NOT_ANSWERED)
    cex = find_counterexample(
        _cases(),
        observe,
        _package,
        max_examples=MAX_EXAMPLES,
        compare=lambda got, expected: _difference(got, expected) is None,
    )
    if cex is not None:
        return not_yet(ex, _build_hint(cex))
    return _plugged_in(ex, answer, *_real_run(trace, slo, duration))


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
