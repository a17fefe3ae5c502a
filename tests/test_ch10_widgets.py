"""Chapter 10's serving explorer: its numbers come from the roofline presets, its line parses,
its plot marks the chosen batch and the TPOT target, and the widget builds."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import numpy as np
import pytest

from llmlab.analysis import costs, roofline
from llmlab.config import PRESETS
from llmlab.course.widgets import serving as sw


def test_serving_point_is_the_roofline_floor_and_its_price():
    p = sw.serving_point("llama-3-8b", "H100-SXM", batch=32, context=1024, price_per_hour=3.6)
    step = roofline.decode_step_floor(PRESETS["llama-3-8b"], "H100-SXM", 32, 1024, 2)
    assert p["tpot"] == pytest.approx(step)
    assert p["tokens_per_s"] == pytest.approx(32 / step)
    assert p["usd_per_million"] == pytest.approx(3.6 / (32 / step * 3600) * 1e6)
    need = costs.weight_bytes(PRESETS["llama-3-8b"], 2) + 32 * costs.kv_bytes(
        PRESETS["llama-3-8b"], 1024, 2
    )
    assert p["bytes_needed"] == pytest.approx(need) and p["fits"]


def test_serving_text_parses_and_says_when_memory_is_short():
    text = sw.serving_text(
        model="llama-3-8b",
        hardware="H100-SXM",
        batch=16,
        context=1024,
        price_per_hour=2.5,
        tpot_target_ms=20,
    )
    m = sw.SERVING_TEXT_PATTERN.search(text)
    assert m and m[1] == "16" and m[4] == "meets"
    assert "NOT fit" not in text
    big = sw.serving_text(
        model="llama-3-8b", hardware="L4", batch=256, context=8192, tpot_target_ms=5
    )
    assert sw.SERVING_TEXT_PATTERN.search(big)[4] == "misses" and "NOT fit" in big


def test_plot_serving_marks_the_batch_and_the_target():
    import matplotlib.pyplot as plt

    fig = sw.plot_serving(
        model="llama-3-8b", hardware="H100-SXM", batch=64, context=2048, tpot_target_ms=12
    )
    a1, a2 = fig.axes
    marker = next(ln for ln in a1.get_lines() if ln.get_label() == "batch 64")
    here = sw.serving_point("llama-3-8b", "H100-SXM", 64, 2048)
    np.testing.assert_allclose(marker.get_ydata(), [here["tpot"] * 1e3])
    target = next(ln for ln in a1.get_lines() if "target" in ln.get_label())
    np.testing.assert_allclose(target.get_ydata(), [12, 12])
    assert a1.get_xscale() == "log" and "ms" in a1.get_ylabel() and "million" in a2.get_ylabel()
    plt.close(fig)


def test_serving_explorer_builds():
    pytest.importorskip("ipywidgets")
    box = sw.serving_explorer()
    assert "TPOT floor" in box.children[3].value
