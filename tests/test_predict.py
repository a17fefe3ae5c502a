"""Predict, then measure: a prediction is judged on order of magnitude and, against a baseline,
on direction; a missing one is asked for, never graded."""

from __future__ import annotations

import pytest

from llmlab.course.check.predict import NO_PREDICTION, compare, compare_choice


def test_order_of_magnitude(capsys):
    assert compare(2.0, 3.1, quantity="step", unit="ms").verdict == "close"
    high = compare(40.0, 3.1, quantity="step", unit="ms", if_high="you pictured compute.")
    assert high.verdict == "too high" and "1.1 orders of magnitude" in high.message
    assert high.message.endswith("you pictured compute.")
    low = compare(0.5, 3.1, quantity="step", if_low="you forgot the weights.")
    assert low.verdict == "too low" and "factor 3" in low.message and "weights" in low.message
    assert "you measured" in capsys.readouterr().out


def test_direction_against_a_baseline_outranks_size():
    wrong = compare(0.9, 3.0, quantity="ratio", baseline=1.0)
    assert wrong.verdict == "wrong direction" and "went up" in wrong.message
    assert compare(2.5, 3.0, quantity="ratio", baseline=1.0).verdict == "close"


def test_missing_or_bad_prediction_and_bad_measurement():
    assert compare(None, 3.0, quantity="q").message == NO_PREDICTION
    assert compare("fast", 3.0, quantity="q").verdict == "no prediction"
    with pytest.raises(ValueError, match="measured must be a number"):
        compare(1.0, None, quantity="q")
    with pytest.raises(ValueError, match="tolerance must be > 1"):
        compare(1.0, 2.0, quantity="q", tolerance=1.0)


def test_choice():
    opts = ("memory", "compute")
    assert (
        compare_choice("Memory", "memory", quantity="bound", options=opts).verdict == "as observed"
    )
    miss = compare_choice(
        "compute", "memory", quantity="bound", options=opts, explain="weights dominate."
    )
    assert miss.verdict == "not as observed" and miss.message.endswith("weights dominate.")
    assert (
        compare_choice("disk", "memory", quantity="bound", options=opts).verdict == "no prediction"
    )
    with pytest.raises(ValueError, match="observed must be one of"):
        compare_choice("memory", "disk", quantity="bound", options=opts)
