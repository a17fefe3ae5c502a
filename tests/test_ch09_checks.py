"""Chapter 09's new and changed exercises: right answers pass, each wrong one gets its own
hint (the formula only from the second wrong try), and the declared exercises match the module."""

from __future__ import annotations

from test_check_ch09_10 import STYLE  # the right split of each projection

from llmlab.analysis import parallel_cost
from llmlab.course.check import ch09, core


def test_exercises_table_names_the_module_functions():
    assert set(ch09.EXERCISES) == {
        "dp_at_low_load",
        "parallel_style",
        "allreduces_per_forward",
        "bubble_fraction",
        "ring_all_reduce_us",
        "best_tp_long_context",
        "split_two_servers",
        "tensor_parallel_layer",
    }
    assert all(callable(getattr(ch09, name)) for name in ch09.EXERCISES)
    assert sum(i.kind == "reasoning" for i in ch09.EXERCISES.values()) >= 2


def test_dp_at_low_load():
    assert ch09.dp_at_low_load("c") and ch09.dp_at_low_load("C")
    assert "cannot exceed what arrives" in ch09.dp_at_low_load("b").message
    assert "memory-bound" in ch09.dp_at_low_load("d").message
    assert not ch09.dp_at_low_load("z")


def test_parallel_style_refuses_replicated_projections():
    assert ch09.parallel_style(STYLE)
    r = ch09.parallel_style(dict(STYLE, q_proj="replicated"))
    assert not r and "replicated projection" in r.message and "q_proj" in r.message


def test_best_tp_long_context_is_the_fastest_degree_and_differs_from_short_context():
    times = {
        t: parallel_cost.decode_step_cost(
            "llama-3-70b",
            tp=t,
            batch=ch09.LONG_BATCH,
            interconnect="pcie",
            context=ch09.LONG_CONTEXT,
        ).total
        for t in ch09.TP_DEGREES
    }
    best = min(times, key=times.get)
    assert ch09.best_tp_long_context(best)
    short = min(
        ch09.TP_DEGREES,
        key=lambda t: (
            parallel_cost.decode_step_cost(
                "llama-3-70b", tp=t, batch=1, interconnect="pcie", context=1024
            ).total
        ),
    )
    assert short != best  # the task teaches that the context changes the answer
    assert "short context" in ch09.best_tp_long_context(short).message
    assert "do not even fit" in ch09.best_tp_long_context(1).message


def test_ring_formula_only_from_the_second_wrong_try():
    core._WRONG_TRIES.pop("ch09.ring_all_reduce_us", None)  # a fresh student
    first, second = ch09.ring_all_reduce_us(12345.0), ch09.ring_all_reduce_us(12345.0)
    assert "2(p−1)·α" not in first.message and "2(p−1)·α" in second.message
