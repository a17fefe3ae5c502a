"""Chapter 10's figures draw what they are given: the TTLT prediction's points, goodput against
the rate, and TPOT against the batch relative to batch 1."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import numpy as np
import pytest

from llmlab.analysis.metrics import Timeline, summarize
from llmlab.course.figures import ch10 as fig10


def two_rates():
    """Summaries of two small runs at 2 and 8 requests/s, with a TTFT and a TPOT objective."""
    a = summarize(
        [Timeline(0.0, (0.2, 0.3, 0.4)), Timeline(0.1, (0.5, 0.7)), Timeline(0.2, (0.6,))],
        slo={"ttft": 0.25, "tpot": 0.15},
    )
    b = summarize(
        [Timeline(0.0, (0.3, 0.5, 0.7, 0.9)), Timeline(0.05, (0.8, 0.9))],
        slo={"ttft": 0.25, "tpot": 0.15},
    )
    return {2.0: a, 8.0: b}


@pytest.fixture
def results():
    return two_rates()


def test_ttlt_prediction_plots_measured_against_predicted(results):
    import matplotlib.pyplot as plt

    fig = fig10.ttlt_prediction(results)
    lines = fig.axes[0].get_lines()
    s = results[2.0]
    ts = [t for t in s.timelines if t.tpot is not None]  # the one-token request is left out
    np.testing.assert_allclose(lines[0].get_xdata(), [t.e2el for t in ts])
    np.testing.assert_allclose(
        lines[0].get_ydata(), [t.ttft + (t.num_output_tokens - 1) * s.tpot.mean for t in ts]
    )
    assert lines[-1].get_label() == "prediction = measurement"
    assert "measured" in fig.axes[0].get_title()
    plt.close(fig)


def test_goodput_vs_rate_draws_throughput_goodput_and_the_offered_rate(results):
    import matplotlib.pyplot as plt

    fig = fig10.goodput_vs_rate(results, {"ttft": 0.25, "tpot": 0.15})
    thr, good, offered = fig.axes[0].get_lines()
    np.testing.assert_allclose(thr.get_ydata(), [results[r].request_throughput for r in (2.0, 8.0)])
    np.testing.assert_allclose(good.get_ydata(), [results[r].goodput for r in (2.0, 8.0)])
    np.testing.assert_allclose(offered.get_ydata(), [2.0, 8.0])
    assert "250 ms" in fig.axes[0].get_title() and "150 ms" in fig.axes[0].get_title()
    plt.close(fig)


def test_tpot_vs_batch_divides_each_series_by_its_smallest_batch():
    import matplotlib.pyplot as plt

    cpu = {1: 0.02, 4: 0.03, 16: 0.06}
    gpu = {"H100 (computed)": {1: 0.005, 4: 0.0051, 16: 0.0055}}
    fig = fig10.tpot_vs_batch(cpu, gpu, machine="test CPU")
    lines = [ln for ln in fig.axes[0].get_lines() if len(ln.get_xdata()) == 3]
    np.testing.assert_allclose(lines[0].get_ydata(), [1.0, 1.5, 3.0])
    np.testing.assert_allclose(lines[1].get_ydata(), [1.0, 1.02, 1.1])
    labels = [ln.get_label() for ln in lines]
    assert labels == ["test CPU (measured)", "H100 (computed)"]
    plt.close(fig)
