"""Chapter 10's build exercise, the serving metrics from a raw trace: the notebook's solution
passes (drawn traces, then plugged into `summarize(..., metrics_fn=...)` on a real run, with the
measured line); slips beside the planted ones (tests/test_planted_bugs.py) are named; the injection
point is used by `summarize` and checked for shape; the grader's sandbox gives the same verdicts."""

from __future__ import annotations

import contextlib
import io
import runpy
from pathlib import Path

import nbformat
import pytest
from planted import ch10 as ch10_planted

from llmlab import i18n
from llmlab.analysis import metrics
from llmlab.course.build import ch10 as build10
from llmlab.course.build import drive
from llmlab.course.check import ch10
from llmlab.course.check.core import NOT_ANSWERED
from llmlab.course.instructor import answers
from llmlab.course.instructor.recheck import SandboxedFunction
from llmlab.course.instructor.student import student_notebook

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK = ROOT / "notebooks" / "10-metrics.ipynb"
SKELETON_ID = "b10-skeleton"


def _skeleton(student: bool = False) -> str:
    nb = nbformat.read(NOTEBOOK, as_version=4)
    if student:
        nb, _ = student_notebook(nb)
    return next(c.source for c in nb.cells if c.id == SKELETON_ID)


SOLUTION = _skeleton()
# a bug of tests/planted/ch10.py, run here through the grader's sandbox
TTFT_FROM_SCHEDULED = ch10_planted.EXERCISES[0].bug("ttft_from_scheduled").source
# a recorded trace written down by hand: queueing, a chunk of two tokens, a one-token request
# and a failed one
TRACE = [
    {"sent": 0.0, "scheduled": 0.01, "chunks": [(0.2, 1), (0.3, 1), (0.45, 1)], "ok": True},
    {"sent": 0.05, "scheduled": 0.05, "chunks": [(0.3, 1)], "ok": True},
    {"sent": 0.1, "scheduled": 0.2, "chunks": [(0.4, 1), (0.5, 2), (0.7, 1)], "ok": True},
    {"sent": 0.2, "scheduled": 0.25, "chunks": [(0.6, 1)], "ok": False},
]
SLO = {"ttft": 0.3, "tpot": 0.1}


def _load(tmp_path: Path, source: str, name: str = "my_metrics"):
    """The function as a notebook defines it: in `__main__`, its source readable."""
    path = tmp_path / f"{abs(hash(source))}.py"
    path.write_text(source, encoding="utf-8")
    return runpy.run_path(str(path), run_name="__main__")[name]


def _check(fn, **kwargs):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        result = ch10.metrics_from_trace(fn, **kwargs)
    assert out.getvalue().strip() == result.line()
    return result


pytestmark = pytest.mark.usefixtures("first_try")  # each test: a first try, in English


@pytest.fixture
def zh():
    i18n.set_language("zh")
    yield
    i18n.set_language("en")


# --------------------------------------------------------------------------- the checker


def test_the_solution_passes_and_the_pass_line_measures_both(tmp_path):
    fn = _load(tmp_path, SOLUTION)
    result = _check(fn, trace=TRACE, slo=SLO, duration=0.8)
    assert result.passed, result.message
    msg = result.message
    assert "50 drawn traces" in msg and "the chapter's recorded run (3 requests, 7 chunks)" in msg
    assert "Measured: yours TTFT p50 250.0 ms" in msg and "the package's TTFT p50 250.0 ms" in msg
    assert msg.count("goodput 1.25 req/s") == 2
    assert "about the same time, within the noise of 5 alternating rounds" in msg or (
        "× its time (the fastest of 5 alternating rounds each)" in msg
    )


def test_the_brief_case_one_token_given_a_tpot(tmp_path):
    broken = SOLUTION.replace("(e - f) / (n - 1) if n > 1 else None", "(e - f) / max(n - 1, 1)")
    result = _check(_load(tmp_path, broken), trace=TRACE, slo=SLO, duration=0.8)
    assert result.message == (
        "1 request, sent at 0 s, scheduled at 0 s, chunks at 0.1 s (1 token) — your TPOT is "
        "0 s, the package's None: with one output token there is no inter-token time: the "
        "package leaves this request out of TPOT (None)."
    )


def test_failed_requests_and_pooled_itl_are_caught_too(tmp_path):
    counted = SOLUTION.replace(
        'done = [r for r in trace if r["ok"]]', 'done = [r for r in trace if r["chunks"]]'
    )
    result = _check(_load(tmp_path, counted), trace=TRACE, slo=SLO, duration=0.8)
    assert "B (failed)" in result.message and "a failed request counts nowhere" in result.message
    averaged = SOLUTION.replace(
        '"itl": stats([g for gaps in itl for g in gaps])',
        '"itl": stats([sum(g) / len(g) for g in itl if g])',
    )
    result = _check(_load(tmp_path, averaged), trace=TRACE, slo=SLO, duration=0.8)
    assert "ITL's statistics pool every gap of every request" in result.message


def test_the_untouched_skeleton_and_odd_answers_are_not_yet(tmp_path):
    assert _check(None).message == NOT_ANSWERED
    assert _check(_load(tmp_path, _skeleton(student=True))).message == NOT_ANSWERED
    assert "answer with your function my_metrics" in _check(3).message
    raises = SOLUTION.replace('    done = [r for r in trace if r["ok"]]', '    done = trace[5]')
    result = _check(_load(tmp_path, raises))
    assert not result.passed and "your function raised IndexError" in result.message


# --------------------------------------------------------------------------- the injection point


def test_summarize_uses_the_metrics_function_on_the_whole_trace():
    calls = []

    def doubled(trace, slo, duration):
        calls.append((trace, slo, duration))
        ts = [metrics.timeline_of(r) for r in trace if r["ok"]]
        return {
            "ttft": [2 * t.ttft for t in ts],
            "tpot": [t.tpot for t in ts],
            "itl": [t.itls for t in ts],
            "e2el": [t.e2el for t in ts],
            "goodput": 7.0,
        }

    plain = metrics.summarize(TRACE, duration=0.8, slo=SLO)
    plugged = metrics.summarize(TRACE, duration=0.8, slo=SLO, metrics_fn=doubled)
    assert len(calls) == 1 and calls[0] == (TRACE, SLO, 0.8)  # failed record included
    assert plugged.ttft.mean == pytest.approx(2 * plain.ttft.mean)
    assert plugged.tpot == plain.tpot and plugged.itl == plain.itl and plugged.e2el == plain.e2el
    assert plugged.goodput == 7.0 and plain.goodput == pytest.approx(1 / 0.8)
    assert plain.num_requests == 3  # the failed request is left out, as vLLM's client does


def test_summarize_refuses_a_metrics_function_of_the_wrong_shape():
    with pytest.raises(ValueError, match="metrics_fn must return a dict"):
        metrics.summarize(TRACE, slo=SLO, metrics_fn=lambda *a: None)
    short = {"ttft": [0.1], "tpot": [None], "itl": [[]], "e2el": [0.1], "goodput": 1.0}
    with pytest.raises(
        ValueError,
        match=r"metrics_fn's 'ttft' must be a list with one entry per successful request \(3\)",
    ):
        metrics.summarize(TRACE, slo=SLO, metrics_fn=lambda *a: short)


def test_trace_of_makes_chunks_of_tokens_stamped_together():
    spec = metrics.Timeline(0.0, (0.2, 0.3, 0.3, 0.3, 0.5), first_scheduled_time=0.1)
    client = metrics.Timeline(1.0, (1.2, 1.4), num_tokens=5)
    assert metrics.trace_of([spec, client]) == [
        {"sent": 0.0, "scheduled": 0.1, "chunks": [(0.2, 1), (0.3, 3), (0.5, 1)], "ok": True},
        {"sent": 1.0, "scheduled": None, "chunks": [(1.2, 1), (1.4, 4)], "ok": True},
    ]
    back = metrics.timeline_of(metrics.trace_of([client])[0])
    assert back.num_output_tokens == 5 and back.tpot == pytest.approx(client.tpot)
    with pytest.raises(ValueError, match="exactly the keys"):
        metrics.trace_of([{"sent": 0.0}])
    with pytest.raises(ValueError, match="failed request"):
        metrics.timeline_of(TRACE[3])


def test_the_drivers_hand_back_plain_data(tmp_path):
    import numpy as np

    def numpy_metrics(trace, slo, duration):
        return {"ttft": np.array([0.1]), "goodput": np.float64(2.0), "x": object()}

    got = build10.observe(numpy_metrics, TRACE, SLO, 0.8)
    assert got["ttft"] == [0.1] and type(got["goodput"]) is float and isinstance(got["x"], str)
    fn = _load(tmp_path, SOLUTION)
    plugged = drive(fn, "llmlab.course.build.ch10:plugged_in", TRACE, SLO, 0.8)
    expected = build10.summary_numbers(metrics.summarize(TRACE, duration=0.8, slo=SLO))
    assert all(plugged["summary"][k] == pytest.approx(v) for k, v in expected.items())
    assert build10.seconds(fn, TRACE, SLO, 0.8) > 0
    answers.encode(plugged)  # plain: the sandbox can send it back


# --------------------------------------------------------------------------- the grader


@pytest.mark.slow
def test_through_the_graders_sandbox_the_solution_passes_and_a_bug_fails(tmp_path):
    verdicts = {}
    for bug, source in ((None, SOLUTION), ("ttft_from_scheduled", TTFT_FROM_SCHEDULED)):
        spec = answers.encode(_load(tmp_path, source))["__function__"]
        stand_in = SandboxedFunction(spec, timeout_s=60)
        try:
            verdicts[bug] = _check(stand_in, trace=TRACE, slo=SLO, duration=0.8)
        finally:
            stand_in.close()
    assert verdicts[None].passed, verdicts[None].message
    assert not verdicts["ttft_from_scheduled"].passed
    assert "first scheduled it" in verdicts["ttft_from_scheduled"].message


# --------------------------------------------------------------------------- a real run of SmolLM2


@pytest.fixture(scope="module")
def real_trace():
    return ch10.metrics_build._record_trace()


@pytest.mark.slow
@pytest.mark.model
def test_plugged_into_a_real_run_the_numbers_equal_the_packages(tmp_path, real_trace):
    fn = _load(tmp_path, SOLUTION)
    done = [r for r in real_trace if r["ok"]]
    assert len(done) == len(ch10.RECORD_TOKENS)
    assert [sum(k for _, k in r["chunks"]) for r in done] == list(ch10.RECORD_TOKENS)
    duration = max(r["chunks"][-1][0] for r in done) - min(r["sent"] for r in done)
    slo = {"ttft": 1.0, "tpot": 0.2}
    plugged = drive(fn, "llmlab.course.build.ch10:plugged_in", real_trace, slo, duration)
    ours = build10.summary_numbers(metrics.summarize(real_trace, duration=duration, slo=slo))
    assert all(plugged["summary"][k] == pytest.approx(v) for k, v in ours.items())
    assert plugged["summary"]["tpot"][0] == len(done) - 1  # the one-token request has no TPOT
    result = _check(fn, trace=real_trace, slo=slo, duration=duration)
    assert result.passed and "(4 requests, " in result.message, result.message
