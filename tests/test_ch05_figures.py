"""Chapter 05's figures and timing harness (`llmlab.course.figures.ch05`)."""

import matplotlib

matplotlib.use("Agg")

import pytest

from llmlab.analysis import roofline
from llmlab.config import get_config
from llmlab.course.figures import ch05
from llmlab.model import tiny_model


def test_prefill_decode_plot_draws_per_token_times_in_ms():
    fig = ch05.plot_prefill_decode(
        [10, 100], [0.01, 0.05], [32, 64], [0.02, 0.021], [1e-3, 2e-3], [5e-3, 5e-3]
    )
    left, right = fig.axes
    pre, dec = left.get_lines()
    assert list(pre.get_ydata()) == pytest.approx([1.0, 0.5])  # 10 ms / 10, 50 ms / 100
    assert list(dec.get_ydata()) == pytest.approx([20, 21])
    assert list(right.get_lines()[1].get_ydata()) == pytest.approx([5, 5])


def test_gpu_floors_prefill_per_token_falls_decode_stays():
    pre, dec = roofline.prefill_decode_floors("llama-3-8b", [16, 4096], [16, 4096], "H100-SXM")
    assert pre[1] / 4096 < pre[0] / 16 / 10
    assert dec[1] == pytest.approx(dec[0], rel=0.1)
    assert dec[0] == pytest.approx(
        roofline.decode_step_floor(get_config("llama-3-8b"), "H100-SXM", 1, 16, 2)
    )


def test_intensities_cross_the_ridge_for_prefill_only():
    pre, dec = ch05.intensities("llama-3-70b", [1, 4096])
    ridge = roofline.ridge_point("H100-SXM")
    assert pre[1] > ridge > dec[0]
    fig = ch05.plot_intensity([1, 4096], pre, dec, ridge)
    assert fig.axes[0].get_lines()[2].get_ydata()[0] == pytest.approx(ridge)


def test_timing_harness_and_flops_plot():
    model = tiny_model(seed=0)
    ids = list(range(3, 40))
    assert ch05.prefill_seconds(model, ids, 16, repeats=1) > 0
    assert ch05.decode_seconds(model, ids, 16, repeats=1) > 0
    fig = ch05.plot_achieved_flops([16, 32], [1.0, 2.0], [16], [0.5])
    assert list(fig.axes[0].get_lines()[0].get_ydata()) == [1.0, 2.0]


def test_timeline_draws_one_bar_per_request():
    from types import SimpleNamespace as NS

    m = NS(arrival_time=0.0, first_token_time=0.1, token_times=[0.1, 0.15, 0.2])
    outs = [NS(metrics=m, prompt_token_ids=[1] * 8), NS(metrics=m, prompt_token_ids=[1] * 2)]
    fig = ch05.plot_timeline(outs)
    bars = fig.axes[0].patches
    assert len(bars) == 2 and bars[0].get_width() == pytest.approx(100)
