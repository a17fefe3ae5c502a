"""Chapter 10's newer checkers: the arrival explorer's task (burstiness), the serving explorer's
task (largest batch under a TPOT target), cost per million tokens, the seed's question 4 as a
matching with more options than answers; every exercise is described for the instructors."""

from __future__ import annotations

import inspect

import numpy as np
import pytest

from llmlab.analysis import metrics, roofline
from llmlab.config import PRESETS
from llmlab.course.check import ch10, core

RIGHT_BURSTINESS = {"short_gaps", "same_mean_gap", "ttft_tail", "less_spread"}


def test_burstiness_right_set_passes_in_any_container():
    assert ch10.burstiness(RIGHT_BURSTINESS).passed
    assert ch10.burstiness(sorted(RIGHT_BURSTINESS)).passed
    assert ch10.burstiness([k.upper() for k in RIGHT_BURSTINESS]).passed
    assert "not answered" in ch10.burstiness(None).message


def test_burstiness_statements_match_the_arrival_generator():
    """The statements marked true are true of `metrics.arrival_times` (which mirrors vLLM's
    client); those marked false are false."""
    rate, n = 4.0, 20000
    bursty = np.diff(metrics.arrival_times(n, rate, 0.2, seed=0))
    even = np.diff(metrics.arrival_times(n, rate, 5.0, seed=0))
    poisson = np.diff(metrics.arrival_times(n, rate, 1.0, seed=0))
    assert bursty.mean() == pytest.approx(even.mean(), rel=0.1)  # same_mean_gap
    tenth = 0.1 / rate
    assert (bursty < tenth).mean() > 10 * (even < tenth).mean()  # short_gaps
    assert even.std() / even.mean() < poisson.std() / poisson.mean()  # less_spread
    assert abs(poisson.std() / poisson.mean() - 1) < 0.05  # Poisson is 1, not 5
    assert set(ch10.BURSTINESS_TRUE) <= set(ch10.BURSTINESS_STATEMENTS)
    assert len(ch10.BURSTINESS_STATEMENTS) > len(ch10.BURSTINESS_TRUE)  # more options than answers
    assert list(ch10.BURSTINESS_STATEMENTS)[0] not in ch10.BURSTINESS_TRUE  # not sorted true-first


@pytest.mark.parametrize(
    "wrong,words",
    [
        ("fewer_per_second", "not the rate"),
        ("poisson", "CV of 1"),
        ("more_throughput", "offered rate"),
    ],
)
def test_burstiness_wrong_statement_says_why(wrong, words):
    res = ch10.burstiness(RIGHT_BURSTINESS | {wrong})
    assert not res.passed and words in res.message


def test_burstiness_missing_statement_hint_comes_in_stages():
    ex = "ch10.burstiness"
    core._WRONG_TRIES.pop(ex, None)
    first = ch10.burstiness({"short_gaps", "same_mean_gap"})
    second = ch10.burstiness({"short_gaps", "same_mean_gap"})
    assert not first.passed and "2 more" in first.message and "clump" not in first.message
    assert "clump" in second.message and "Poisson's" in second.message
    assert "choose keys" in ch10.burstiness({"vibes"}).message
    assert "set of keys" in ch10.burstiness(3).message


def brute_force_largest_batch() -> int:
    cfg = PRESETS[ch10.SLO_MODEL]
    return max(
        b
        for b in range(1, 4097)
        if roofline.decode_step_floor(
            cfg, ch10.SLO_HARDWARE, b, ch10.SLO_CONTEXT, ch10.SLO_DTYPE_BYTES
        )
        <= ch10.SLO_TPOT
    )


def test_largest_batch_under_slo_agrees_with_a_brute_force_search():
    b = brute_force_largest_batch()
    assert 1 < b < 512  # reachable with the explorer's batch slider
    assert ch10.largest_batch_under_slo(b).passed
    assert ch10.largest_batch_under_slo(float(b)).passed
    assert core.expected_values("ch10.largest_batch_under_slo") == [b]


def test_largest_batch_under_slo_hints_name_the_side_then_the_model():
    b = brute_force_largest_batch()
    ex = "ch10.largest_batch_under_slo"
    core._WRONG_TRIES.pop(ex, None)
    over = ch10.largest_batch_under_slo(b + 1)
    assert (
        not over.passed
        and "longer than the TPOT target" in over.message
        and "MB" not in over.message
    )
    over2 = ch10.largest_batch_under_slo(b + 5)
    assert "KV cache" in over2.message
    under = ch10.largest_batch_under_slo(b // 2)
    assert "larger batch still meets" in under.message and "bandwidth" in under.message
    assert "whole number" in ch10.largest_batch_under_slo(12.5).message
    assert "whole number" in ch10.largest_batch_under_slo("many").message
    assert str(b) not in over.message + over2.message + under.message


def test_largest_batch_is_not_handed_out_by_a_public_helper():
    public = [
        n
        for n, v in vars(ch10).items()
        if callable(v)
        and not n.startswith("_")
        and inspect.isfunction(v)
        and v.__module__.startswith(ch10.__name__ + ".")
    ]
    assert set(public) == set(ch10.EXERCISES)


BREAK_EVEN = ch10.COST_PRICE_PER_HOUR / ch10.COST_SELL_PER_MILLION * 1e6 / 3600


@pytest.mark.parametrize(
    "wrong,words",
    [
        (BREAK_EVEN * 3600, "tokens per hour"),
        (BREAK_EVEN * 60, "more than 60 seconds"),
        (ch10.COST_SELL_PER_MILLION / ch10.COST_PRICE_PER_HOUR * 1e6 / 3600, "upside down"),
        (ch10.COST_PRICE_PER_HOUR / ch10.COST_SELL_PER_MILLION / 3600, "million"),
    ],
)
def test_break_even_names_the_mistake(wrong, words):
    res = ch10.break_even_tokens_per_s(wrong)
    assert not res.passed and words in res.message


def test_break_even_right_answer_and_staged_formula():
    assert ch10.break_even_tokens_per_s(BREAK_EVEN).passed
    # at that throughput a million tokens costs exactly the selling price (the section's formula)
    cost = ch10.COST_PRICE_PER_HOUR / (BREAK_EVEN * 3600) * 1e6
    assert cost == pytest.approx(ch10.COST_SELL_PER_MILLION)
    ex = "ch10.break_even_tokens_per_s"
    core._WRONG_TRIES.pop(ex, None)
    first = ch10.break_even_tokens_per_s(BREAK_EVEN * 3.3)
    second = ch10.break_even_tokens_per_s(BREAK_EVEN * 3.3)
    assert "seconds per hour" not in first.message and "seconds per hour" in second.message


def test_source_q4_is_a_shuffled_matching_with_a_distractor():
    assert len(ch10.Q4_METRICS) > len(ch10.Q4_KEYS)
    right = {k: sorted(ch10.Q4_ACCEPT[k])[0] for k in ch10.Q4_KEYS}
    assert [ch10.Q4_METRICS.index(right[k]) for k in ch10.Q4_KEYS] != list(range(len(ch10.Q4_KEYS)))
    res = ch10.source_q4(
        {"chat": "gpu_util", "batch_jobs": "throughput", "code_completion": "ttft"}
    )
    assert not res.passed and "utilisation" in res.message
    assert ch10.source_q4(
        {"chat": "TPOT", "batch_jobs": "Throughput", "code_completion": "e2el"}
    ).passed


def test_every_exercise_is_described():
    called = {
        "tpot",
        "mean_tpot",
        "ttlt",
        "goodput",
        "burstiness",
        "largest_batch_under_slo",
        "break_even_tokens_per_s",
        "source_q4",
        "metrics_from_trace",
    }
    assert set(ch10.EXERCISES) == called
    assert sum(info.kind == "reasoning" for info in ch10.EXERCISES.values()) >= 2
    assert ch10.EXERCISES["source_q4"].source_question == 4
