"""llmlab.analysis.sim: the batching simulator's invariants (property tests) and the KV waste simulator."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmlab.analysis import sim
from llmlab.analysis.sim import SimRequest


@st.composite
def traces(draw, integer=True):
    n = draw(st.integers(1, 25))
    arrivals = draw(
        st.lists(st.integers(0, 40) if integer else st.floats(0, 40), min_size=n, max_size=n)
    )
    outs = draw(st.lists(st.integers(1, 20), min_size=n, max_size=n))
    return [SimRequest(i, a, o) for i, (a, o) in enumerate(zip(arrivals, outs))]


@settings(max_examples=150, deadline=None)
@given(traces(), st.integers(1, 6), st.sampled_from(sim.POLICIES))
def test_every_request_finishes_and_tokens_are_conserved(trace, max_batch, policy):
    r = sim.simulate(trace, policy, max_batch)
    by_id = {q.request_id: q for q in trace}
    for tl in r.requests:
        assert tl.generated == by_id[tl.request_id].output_len
        assert tl.arrival <= tl.start < tl.first_token <= tl.finish
        assert tl.finish - tl.start >= tl.output_len  # one token per step at most
    assert sum(r.step_batch) == sum(q.output_len for q in trace) == r.total_tokens
    assert max(r.step_batch) <= max_batch
    # each step's members are running: started before it, not finished before it
    for step, members in enumerate(r.step_members):
        for rid in members:
            tl = next(t for t in r.requests if t.request_id == rid)
            assert tl.start_step <= step <= tl.finish_step


@settings(max_examples=150, deadline=None)
@given(traces(), st.integers(1, 6))
def test_continuous_never_later_than_static(trace, max_batch):
    stat = sim.simulate(trace, "static", max_batch)
    cont = sim.simulate(trace, "continuous", max_batch)
    s_fin = {t.request_id: t.finish for t in stat.requests}
    for t in cont.requests:
        assert t.finish <= s_fin[t.request_id]  # per request, not just on average
    assert cont.mean_latency <= stat.mean_latency
    assert cont.throughput >= stat.throughput


@settings(max_examples=100, deadline=None)
@given(traces(), st.integers(1, 6))
def test_static_batches_run_to_completion(trace, max_batch):
    r = sim.simulate(trace, "static", max_batch)
    starts = {t.request_id: t.start_step for t in r.requests}
    for members in r.step_members:
        assert len({starts[m] for m in members}) == 1  # nobody joins a running batch


@settings(max_examples=100, deadline=None)
@given(traces(integer=False), st.integers(1, 6))
def test_continuous_is_work_conserving(trace, max_batch):
    r = sim.simulate(trace, "continuous", max_batch)
    for t0, b in zip(r.step_start, r.step_batch):
        if b < max_batch:  # a free slot: nobody who had arrived may be waiting
            assert not any(tl.arrival <= t0 < tl.start for tl in r.requests)


def test_hand_worked_example():
    # outputs 10, 2, 2, 2 all at step 0, max batch 2
    trace = [SimRequest(i, 0, n) for i, n in enumerate([10, 2, 2, 2])]
    stat = sim.simulate(trace, "static", 2)
    cont = sim.simulate(trace, "continuous", 2)
    assert [t.finish for t in stat.requests] == [10, 2, 12, 12]
    assert [t.finish for t in cont.requests] == [10, 2, 4, 6]
    assert stat.mean_batch < cont.mean_batch


def test_step_time_model_is_used():
    trace = [SimRequest(0, 0, 3), SimRequest(1, 0, 3)]
    r = sim.simulate(trace, "continuous", 2, step_time=lambda b: 0.5 + 0.25 * b)
    assert r.step_end[-1] == pytest.approx(3 * 1.0)
    assert r.requests[0].ttft == pytest.approx(1.0)


def test_idle_engine_waits_for_next_arrival():
    r = sim.simulate([SimRequest(0, 5.5, 2)], "continuous", 4)
    assert r.requests[0].start == 5.5 and r.requests[0].finish == 7.5


def test_make_trace_is_seeded_and_in_range():
    a = sim.make_trace(50, 2.0, 20, 0.5, seed=3)
    assert a == sim.make_trace(50, 2.0, 20, 0.5, seed=3)
    assert all(10 <= r.output_len <= 30 for r in a)
    assert all(x.arrival <= y.arrival for x, y in zip(a, a[1:]))
    assert 50 / 2.0 / 3 < a[-1].arrival < 50 / 2.0 * 3  # Poisson at rate 2: about 25


def test_bad_arguments_name_themselves():
    with pytest.raises(ValueError, match="policy"):
        sim.simulate([SimRequest(0, 0, 1)], "fcfs")
    with pytest.raises(ValueError, match="max_batch"):
        sim.simulate([SimRequest(0, 0, 1)], max_batch=0)
    with pytest.raises(ValueError, match="output_len"):
        SimRequest(0, 0, 0)
    with pytest.raises(ValueError, match="request_id"):
        sim.simulate([SimRequest(0, 0, 1), SimRequest(0, 1, 1)])
    with pytest.raises(ValueError, match="arrival_rate"):
        sim.make_trace(arrival_rate=0)


def test_kv_waste_has_the_vllm_paper_shape():
    trace = sim.make_trace(120, 1.0, 200, 0.9, prompt_len=(20, 400), seed=0, max_tokens=400)
    w = sim.kv_memory_waste(trace, max_model_len=2048, block_size=16, max_batch=32)
    assert w.contiguous_waste >= 0.5
    assert w.paged_waste < 0.05
    for u, c, p in zip(w.used, w.contiguous, w.paged):
        assert u <= p <= c
    # reserving each request's own cap wastes less than max_model_len, still far more than paging
    w2 = sim.kv_memory_waste(trace, 2048, 16, 32, contiguous_policy="max_tokens")
    assert w.paged_waste < w2.contiguous_waste < w.contiguous_waste


@settings(max_examples=60, deadline=None)
@given(traces(), st.integers(1, 64))
def test_paged_waste_is_under_one_block_per_request(trace, block_size):
    w = sim.kv_memory_waste(trace, max_model_len=64, block_size=block_size, max_batch=4)
    r = sim.simulate(trace, "continuous", 4)
    for u, p, b in zip(w.used, w.paged, r.step_batch):
        assert 0 <= p - u <= (block_size - 1) * b
    # with block size 1 nothing is wasted
    w1 = sim.kv_memory_waste(trace, max_model_len=64, block_size=1, max_batch=4)
    assert math.isclose(w1.paged_waste, 0.0, abs_tol=1e-12)


def test_kv_waste_rejects_requests_longer_than_max_len():
    with pytest.raises(ValueError, match="max_model_len"):
        sim.kv_memory_waste([SimRequest(0, 0, 10, prompt_len=100)], max_model_len=64)


def _fake_output(rid, arrival, scheduled, token_times):
    from types import SimpleNamespace

    m = SimpleNamespace(
        arrival_time=arrival,
        first_scheduled_time=scheduled,
        first_token_time=token_times[0],
        token_times=list(token_times),
        finished_time=token_times[-1],
    )
    return SimpleNamespace(request_id=rid, metrics=m)


def test_result_from_outputs_rebuilds_steps_from_token_times():
    # two requests share steps ending at 101, 102; the second then runs alone at 103
    outs = [
        _fake_output("a", 100.0, 100.0, [101.0, 102.0]),
        _fake_output("b", 100.0, 100.0, [101.0, 102.0, 103.0]),
    ]
    r = sim.result_from_outputs(outs, "continuous", 2)
    assert r.step_batch == [2, 2, 1]
    assert r.step_end == [1.0, 2.0, 3.0] and r.step_start == [0.0, 1.0, 2.0]
    assert [t.generated for t in r.requests] == [2, 3]
    assert r.requests[1].finish == 3.0 and r.requests[1].finish_step == 2
    assert r.throughput == pytest.approx(5 / 3.0)
    with pytest.raises(ValueError, match="outputs"):
        sim.result_from_outputs([], "static", 2)


def test_batching_widget_line_matches_the_simulator():
    import matplotlib

    matplotlib.use("Agg")
    from llmlab.course.widgets import batching_simulator
    from llmlab.course.widgets.batching import BATCHING_TEXT_PATTERN

    box = batching_simulator(num_requests=12, max_batch=4)
    ratio, cont, stat = map(float, BATCHING_TEXT_PATTERN.search(box.children[2].value).groups())
    r = sim.compare(sim.make_trace(12, 0.5, 24, 0.8, seed=0), 4)
    assert ratio == pytest.approx(r["continuous"].throughput / r["static"].throughput, abs=0.01)
    assert cont == pytest.approx(r["continuous"].mean_latency, abs=0.05)
    box.children[1].children[0].value = 1  # max batch 1: both policies are the same
    ratio, cont, stat = map(float, BATCHING_TEXT_PATTERN.search(box.children[2].value).groups())
    assert ratio == 1.0 and cont == stat
