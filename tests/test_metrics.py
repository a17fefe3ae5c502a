"""llmlab.analysis.metrics on hand-made timelines whose answers are worked out by hand below."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmlab.analysis import metrics
from llmlab.analysis.metrics import Timeline, arrival_times, summarize
from llmlab.core.request import RequestMetrics
from llmlab.engine.outputs import CompletionOutput, RequestOutput

# A: arrives at 0, tokens at 1.0, 1.5, 2.0, 2.5 -> TTFT 1.0, E2EL 2.5, TPOT 1.5/3 = 0.5
# B: arrives at 1.0, tokens at 1.2, 1.3       -> TTFT 0.2, E2EL 0.3, TPOT 0.1/1 = 0.1
# C: arrives at 2.0, one token at 2.4         -> TTFT 0.4, E2EL 0.4, TPOT undefined
A = Timeline(0.0, (1.0, 1.5, 2.0, 2.5), num_prompt_tokens=10)
B = Timeline(1.0, (1.2, 1.3), num_prompt_tokens=4)
C = Timeline(2.0, (2.4,), num_prompt_tokens=6)


def test_per_request_metrics_by_hand():
    assert A.ttft == pytest.approx(1.0) and A.e2el == pytest.approx(2.5)
    assert A.tpot == pytest.approx(0.5)
    assert B.tpot == pytest.approx(0.1)
    assert A.itls == pytest.approx([0.5, 0.5, 0.5])


def test_single_token_request_has_no_tpot_and_is_left_out_of_the_mean():
    assert C.tpot is None and C.itls == []
    s = summarize([A, B, C])
    assert s.tpot.count == 2
    assert s.tpot.mean == pytest.approx((0.5 + 0.1) / 2)  # not (0.5 + 0.1 + 0) / 3
    assert not math.isnan(s.tpot.mean)
    only_single = summarize([C])
    assert only_single.tpot.count == 0 and only_single.tpot.mean is None


def test_ttft_statistics_and_percentiles_by_hand():
    s = summarize([A, B, C])
    assert s.ttft.mean == pytest.approx((1.0 + 0.2 + 0.4) / 3)
    # sorted TTFTs [0.2, 0.4, 1.0]; linear interpolation at rank q/100 * (n - 1)
    assert s.ttft.median == pytest.approx(0.4)
    assert s.ttft.p90 == pytest.approx(0.4 + 0.8 * (1.0 - 0.4))
    assert s.ttft.p99 == pytest.approx(0.4 + 0.98 * (1.0 - 0.4))
    assert s.e2el.mean == pytest.approx((2.5 + 0.3 + 0.4) / 3)


def test_itl_is_pooled_over_tokens_not_averaged_per_request():
    s = summarize([A, B, C])
    # gaps: A's three 0.5 and B's one 0.1 -> pooled mean 1.6 / 4 = 0.4 (per request: 0.3)
    assert s.itl.count == 4
    assert s.itl.mean == pytest.approx(0.4)
    assert s.itl.mean != pytest.approx(s.tpot.mean)


def test_throughput_over_default_and_given_duration():
    s = summarize([A, B, C])
    assert s.duration == pytest.approx(2.5)  # first arrival 0 -> last token 2.5
    assert s.request_throughput == pytest.approx(3 / 2.5)
    assert s.total_output_tokens == 7
    assert s.output_throughput == pytest.approx(7 / 2.5)
    assert s.total_token_throughput == pytest.approx((7 + 20) / 2.5)
    s10 = summarize([A, B, C], duration=10.0)
    assert s10.request_throughput == pytest.approx(0.3)


def test_goodput_counts_requests_meeting_every_slo():
    s = summarize([A, B, C], slo={"ttft": 0.5})  # B (0.2), C (0.4) pass; A (1.0) fails
    assert s.num_good == 2 and s.goodput == pytest.approx(2 / 2.5)
    s = summarize([A, B, C], slo={"tpot": 0.2})  # A (0.5) fails; C has no TPOT: passes
    assert s.num_good == 2
    s = summarize([A, B, C], slo={"ttft": 0.3, "e2el": 0.35})  # only B
    assert s.num_good == 1
    assert summarize([A, B, C]).goodput is None


def test_ttlt_equals_ttft_plus_n_minus_one_tpot():
    for t in (A, B):
        assert t.e2el == pytest.approx(t.ttft + (t.num_output_tokens - 1) * t.tpot)


@settings(max_examples=50, deadline=None)
@given(st.floats(0, 10), st.lists(st.floats(0, 5), min_size=2, max_size=20))
def test_ttlt_identity_holds_for_any_timeline(arrival, gaps):
    times = tuple(arrival + np.cumsum(gaps))
    t = Timeline(arrival, times)
    assert t.e2el == pytest.approx(t.ttft + (t.num_output_tokens - 1) * t.tpot, abs=1e-9)
    assert sum(t.itls) == pytest.approx(t.e2el - t.ttft, abs=1e-9)


def test_engine_outputs_are_read_through_their_metrics():
    m = RequestMetrics(
        arrival_time=5.0,
        first_scheduled_time=5.1,
        first_token_time=5.5,
        token_times=[5.5, 5.7, 5.9],
        finished_time=5.9,
    )
    out = RequestOutput(
        "r0", None, [1, 2, 3], [CompletionOutput(0, "", [7, 8, 9], "length")], True, metrics=m
    )
    t = metrics.timeline_of(out)
    assert t.num_prompt_tokens == 3 and t.num_output_tokens == 3
    assert t.ttft == pytest.approx(0.5) and t.tpot == pytest.approx(0.2)
    assert t.queue_time == pytest.approx(0.1)
    assert summarize([out]).ttft.mean == pytest.approx(0.5)


def test_bad_input_raises_value_errors_naming_the_argument():
    with pytest.raises(ValueError, match="token_times"):
        Timeline(0.0, ())
    with pytest.raises(ValueError, match="non-decreasing"):
        Timeline(0.0, (2.0, 1.0))
    with pytest.raises(ValueError, match="slo key"):
        summarize([A], slo={"latency": 1.0})
    with pytest.raises(ValueError, match="duration"):
        summarize([A], duration=0)
    with pytest.raises(ValueError, match="outputs"):
        summarize([])
    with pytest.raises(ValueError, match="RequestOutput"):
        metrics.timeline_of(42)


def test_cdf_is_sorted_and_ends_at_one():
    x, y = metrics.cdf([0.3, 0.1, 0.2, None])
    assert list(x) == [0.1, 0.2, 0.3]
    assert list(y) == pytest.approx([1 / 3, 2 / 3, 1.0])


def _gap_stats(burstiness: float) -> tuple[float, float]:
    gaps = np.diff(arrival_times(20000, rate=4.0, burstiness=burstiness, seed=1))
    return gaps.mean(), gaps.std() / gaps.mean()


def test_poisson_arrivals_have_mean_gap_one_over_rate_and_unit_cv():
    mean, cv = _gap_stats(1.0)
    assert mean == pytest.approx(0.25, rel=0.03)
    assert cv == pytest.approx(1.0, rel=0.05)  # exponential gaps: std = mean


@pytest.mark.parametrize("burstiness", [0.25, 4.0])
def test_gamma_burstiness_keeps_the_rate_and_sets_the_spread(burstiness):
    mean, cv = _gap_stats(burstiness)
    assert mean == pytest.approx(0.25, rel=0.05)
    assert cv == pytest.approx(1 / math.sqrt(burstiness), rel=0.06)  # gamma: CV = 1/√shape


def test_arrivals_are_seeded_start_at_zero_and_infinite_rate_is_all_at_once():
    a = arrival_times(50, 2.0, seed=3)
    assert a[0] == 0.0 and np.all(np.diff(a) >= 0)
    assert np.array_equal(a, arrival_times(50, 2.0, seed=3))
    assert not np.array_equal(a, arrival_times(50, 2.0, seed=4))
    assert np.array_equal(arrival_times(5, math.inf), np.zeros(5))
    for kwargs, name in (({"rate": 0}, "rate"), ({"rate": 1, "burstiness": 0}, "burstiness")):
        with pytest.raises(ValueError, match=name):
            arrival_times(5, **kwargs)


def test_engine_driven_by_arrivals_reports_consistent_timings():
    from llmlab import LLM, SamplingParams
    from llmlab.model import tiny_model

    llm = LLM(tiny_model(seed=0), block_size=8, max_model_len=64, num_kv_blocks=64)
    prompts = [[5, 6, 7, 8], [9, 10, 11], [12, 13, 14, 15, 16], [20, 21]]
    arrivals = [0.0, 0.01, 0.02, 0.05]
    outs, duration = metrics.run_with_arrivals(
        llm.llm_engine,
        prompts,
        SamplingParams(temperature=0, max_tokens=4, ignore_eos=True),
        arrivals,
    )
    assert [o.request_id for o in outs] == [f"req-{i}" for i in range(4)]
    ts = [metrics.timeline_of(o) for o in outs]
    start = ts[0].arrival_time
    assert [t.arrival_time - start for t in ts] == pytest.approx(arrivals)
    assert all(t.num_output_tokens == 4 and t.ttft > 0 for t in ts)
    s = summarize(outs, duration=duration)
    assert s.total_output_tokens == 16 and s.tpot.count == 4


def test_arrival_explorer_text_reports_the_drawn_gaps():
    from llmlab.course.widgets.metrics import ARRIVALS_TEXT_PATTERN, arrivals_text

    m = ARRIVALS_TEXT_PATTERN.search(arrivals_text(rate=4.0, burstiness=0.25, num_requests=400))
    gaps = np.diff(arrival_times(400, 4.0, 0.25, seed=0))
    assert m and float(m.group(4)) == pytest.approx(gaps.mean(), abs=1e-3)
    assert float(m.group(5)) == pytest.approx(gaps.std() / gaps.mean(), abs=0.01)
