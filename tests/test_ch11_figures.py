"""Chapter 11's figures draw what they are given: the waste curves, the per-step token split
under the budget line, and one bar per benchmarked system."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import pytest

from llmlab.analysis import sim
from llmlab.course.figures import ch11 as fig11
from llmlab.course.widgets import blocks


def _small_waste():
    trace = sim.make_trace(
        num_requests=12, mean_output=20, prompt_len=(5, 30), seed=3, max_tokens=40
    )
    return trace, sim.kv_memory_waste(trace, 256, 16, 8)


def test_kv_waste_plots_the_paged_waste_per_block_size():
    trace, waste = _small_waste()
    sizes = [1, 4, 16]
    paged = [sim.kv_memory_waste(trace, 256, b, 8).paged_waste for b in sizes]
    fig = fig11.kv_waste(waste, sizes, paged)
    right = fig.axes[1]
    line = right.get_lines()[0]
    assert list(line.get_xdata()) == sizes
    assert list(line.get_ydata()) == pytest.approx([100 * p for p in paged])
    assert right.get_lines()[1].get_ydata()[0] == pytest.approx(100 * waste.contiguous_waste)
    plt.close(fig)


def test_kv_waste_refuses_mismatched_lengths():
    _, waste = _small_waste()
    with pytest.raises(ValueError, match="block_sizes"):
        fig11.kv_waste(waste, [1, 2], [0.1])


def test_measured_waste_is_on_a_log_scale_with_the_used_tokens():
    _, waste = _small_waste()
    fig = fig11.measured_waste(waste, "measured")
    ax = fig.axes[0]
    assert ax.get_yscale() == "log" and ax.get_title() == "measured"
    assert list(ax.get_lines()[0].get_ydata()) == list(waste.contiguous)
    plt.close(fig)


def test_token_split_stacks_prefill_under_decode_below_the_budget_line():
    rows = blocks.chunked_prefill_schedule(prompt_len=300, budget=64, decodes=2)
    fig = fig11.token_split(rows, 64)
    ax = fig.axes[0]
    bars = ax.patches
    n = len(rows)
    assert [b.get_height() for b in bars[:n]] == [r["prefill"] for r in rows]
    assert [b.get_height() for b in bars[n : 2 * n]] == [r["decode"] for r in rows]
    assert [b.get_y() for b in bars[n : 2 * n]] == [r["prefill"] for r in rows]
    assert ax.get_lines()[0].get_ydata()[0] == 64
    assert all(r["prefill"] + r["decode"] <= 64 for r in rows)
    plt.close(fig)


def test_chunked_schedule_gives_the_prompt_what_the_decodes_leave():
    rows = blocks.chunked_prefill_schedule(prompt_len=300, budget=64, decodes=2)
    assert all(r["decode"] == 2 for r in rows)
    assert sum(r["prefill"] for r in rows) == 300
    assert [r["prefill"] for r in rows[:-1]] == [62] * (len(rows) - 1)


def test_throughput_bars_one_bar_per_system():
    report = {
        "systems": {"hf-sequential": {"tok_per_s": 8.0}, "llmlab": {"tok_per_s": 25.0}},
        "settings": {"num_requests": 12},
        "machine": {"threads": 4},
    }
    fig = fig11.throughput_bars(report)
    widths = [p.get_width() for p in fig.axes[0].patches]
    assert widths == [8.0, 25.0]
    assert "4 threads" in fig.axes[0].get_title()
    plt.close(fig)


def test_token_split_labels_each_bar_with_its_split():
    rows = [{"prefill": 61, "decode": 3}, {"prefill": 7, "decode": 3}]
    fig = fig11.token_split(rows, 64)
    assert [t.get_text() for t in fig.axes[0].texts] == ["61 + 3", "7 + 3"]
    plt.close(fig)


def test_kv_waste_plot_has_labelled_axes():
    ax = fig11.plot_kv_waste(sim.kv_memory_waste(sim.make_trace(8, 1.0, 5, seed=0), 64, 16, 4))
    assert ax.get_ylabel() and ax.get_xlabel()
