"""Chapter 04's figures and timing harness (`llmlab.course.figures.ch04`)."""

import matplotlib

matplotlib.use("Agg")

import pytest

from llmlab.analysis import costs, roofline
from llmlab.config import get_config
from llmlab.course.figures import ch04
from llmlab.model import tiny_model


def test_step_time_plot_draws_the_values_passed_in_ms():
    fig = ch04.plot_step_times(
        [32, 64],
        [0.01, 0.02],
        [0.005, 0.006],
        [32, 64, 128],
        [1e-3, 2e-3, 3e-3],
        [1e-3, 1e-3, 1e-3],
    )
    left, right = fig.axes
    no, yes = left.get_lines()
    assert list(no.get_ydata()) == pytest.approx([10, 20]) and list(
        yes.get_ydata()
    ) == pytest.approx([5, 6])
    assert list(right.get_lines()[0].get_xdata()) == [32, 64, 128]
    assert "measured" in left.get_ylabel() and "floor" in right.get_ylabel()


def test_gpu_floors_are_the_roofline_floors_and_the_cached_step_is_flat_then_cheaper():
    lengths = [32, 4096]
    no, yes = roofline.prefill_decode_floors("llama-3-8b", lengths, lengths, "H100-SXM")
    cfg = get_config("llama-3-8b")
    assert yes[0] == pytest.approx(roofline.decode_step_floor(cfg, "H100-SXM", 1, 32, 2))
    # short: both pay the weight read; long: the cache-less forward is compute-bound and dearer
    assert no[0] == pytest.approx(yes[0], rel=0.05)
    assert no[1] > 5 * yes[1]


def test_timing_harness_times_both_steps_on_a_tiny_model():
    model = tiny_model(seed=0)
    ids = list(range(3, 40))
    assert ch04.no_cache_step_seconds(model, ids, 16, repeats=1) > 0
    assert ch04.cached_step_seconds(model, ids, 16, repeats=1) > 0


def test_seed_example_and_layout_bars():
    fig = ch04.plot_source_example(1.342e9, 10.7e9)
    widths = [p.get_width() for p in fig.axes[0].patches]
    assert widths == pytest.approx([1.342, 10.7])
    fig = ch04.plot_kv_layouts(["llama-3-8b"])
    heights = sorted(p.get_height() for p in fig.axes[0].patches)
    v = costs.kv_variants(get_config("llama-3-8b"), 2)
    assert heights == pytest.approx(sorted(x / 1024 for x in v.values()))
