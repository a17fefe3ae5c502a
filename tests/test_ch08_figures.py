"""Chapter 08's figures and tables draw and list exactly the values they are given."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import pytest

from llmlab.analysis import roofline, sim
from llmlab.analysis.hardware import get_hardware
from llmlab.config import get_config
from llmlab.course.figures import ch08

CFG = get_config("smollm2-135m")
HW = get_hardware("A100-80GB")  # stands in for "this machine": any Hardware with fp32


def _steps(seconds: dict[int, float], context: int = 63):
    return [
        roofline.StepMeasurement(
            "decode", b, context, s, roofline.decode_step(CFG, b, context + 1, 4)
        )
        for b, s in seconds.items()
    ]


def test_batch_scaling_plots_measured_and_gpu_ratios():
    steps = _steps({1: 0.010, 8: 0.020, 32: 0.080})
    fig = ch08.batch_scaling(steps, HW, CFG)
    left, right = fig.axes[:2]
    measured = left.get_lines()[0]
    assert list(measured.get_xdata()) == [1, 8, 32]
    assert list(measured.get_ydata()) == pytest.approx([1.0, 2.0, 8.0])
    assert list(right.get_lines()[0].get_ydata()) == pytest.approx(
        [1.0, 4.0, 4.0]
    )  # batch / step ratio
    gpu = [
        roofline.place(roofline.decode_step(CFG, b, 64, 2), "H100-SXM", "bf16").time_floor
        for b in (1, 8, 32)
    ]
    assert list(left.get_lines()[1].get_ydata()) == pytest.approx([g / gpu[0] for g in gpu])
    assert list(right.get_lines()[2].get_ydata()) == [1, 8, 32]  # free batching
    assert "step time" in left.get_ylabel() and "batch" in left.get_xlabel()


def test_batch_scaling_needs_a_batch_1_baseline():
    with pytest.raises(ValueError, match="batch-1"):
        ch08.batch_scaling(_steps({8: 0.02, 32: 0.08}), HW, CFG)


def test_cpu_vs_gpu_table_rows():
    rows = ch08.cpu_vs_gpu_table(_steps({1: 0.010, 32: 0.080}), HW, CFG)
    here, gpu = rows
    assert here["throughput ratio"] == pytest.approx(32 * 0.010 / 0.080)
    assert here["step ms, batch 32"] == pytest.approx(80.0)
    assert here["ridge FLOP/B"] == pytest.approx(roofline.ridge_point(HW, "fp32"))
    assert gpu["ridge FLOP/B"] == pytest.approx(roofline.ridge_point("H100-SXM", "bf16"))
    # which resource bounds the step is exercise 2's question: the table shows the evidence only
    assert gpu["FLOP/B at 32"] < gpu["ridge FLOP/B"]
    assert not any("bound" in key for row in rows for key in row)
    with pytest.raises(ValueError, match="batch 32"):
        ch08.cpu_vs_gpu_table(_steps({1: 0.01, 8: 0.02}), HW, CFG)


def test_text_table_aligns_and_transposes():
    rows = [
        {"policy": "static", "steps": 36, "tokens/s": 27.123},
        {"policy": "continuous", "steps": 1250, "tokens/s": 0.5},
    ]
    text = ch08.text_table(rows)
    lines = text.splitlines()
    assert lines[0].split() == ["policy", "steps", "tokens/s"]
    assert lines[1].split() == ["static", "36", "27.12"] and lines[2].split() == [
        "continuous",
        "1,250",
        "0.5",
    ]
    assert len({len(line) for line in lines}) == 1
    assert ch08.text_table(rows, transpose=True).splitlines()[1].split() == ["steps", "36", "1,250"]
    with pytest.raises(ValueError):
        ch08.text_table([])


def test_sim_vs_engine_rows_come_from_the_results():
    reqs = [sim.SimRequest(i, 0.0, n) for i, n in enumerate([3, 1, 2])]
    a, b = sim.compare(reqs, 2), sim.compare(reqs, 2, step_time=0.5)
    rows = ch08.sim_vs_engine(a, b)
    assert [(r["policy"], r["source"]) for r in rows][:2] == [
        ("static", "simulator"),
        ("static", "real engine"),
    ]
    assert rows[1]["tokens/s"] == pytest.approx(b["static"].throughput)
    assert rows[2]["steps"] == a["continuous"].num_steps


def test_compare_has_a_title_per_policy():
    res = sim.compare(sim.make_trace(8, 1.0, 5, seed=0), max_batch=2)
    fig = ch08.plot_compare(res)
    titles = [ax.get_title() for ax in fig.axes]
    assert any("static" in t for t in titles) and any("continuous" in t for t in titles)
