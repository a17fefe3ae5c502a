"""Chapter 07's throughput figure draws the measured tokens/s on the left and the roofline's
bound for the GPU preset on the right; the harness times decode steps then prefills."""

from __future__ import annotations

import matplotlib
import pytest

matplotlib.use("Agg")

from llmlab.analysis import roofline  # noqa: E402
from llmlab.analysis.hardware import PRESETS  # noqa: E402
from llmlab.config import get_config  # noqa: E402
from llmlab.course.figures import ch07  # noqa: E402

L70 = get_config("llama-3-70b")


def _step(kind, batch, seconds):
    op = roofline.Operation("x", flops=1e9, bytes=1e8)
    return roofline.StepMeasurement(kind, batch, 16, seconds, op)


def test_throughput_vs_batch_draws_measured_and_preset_lines():
    import matplotlib.pyplot as plt

    measured = [_step("decode", 1, 0.02), _step("decode", 4, 0.04), _step("prefill", 1, 0.5)]
    fig = ch07.throughput_vs_batch(
        measured, "test machine", L70, gpu="H100-SXM", gpu_context=1024, gpu_batches=(1, 8, 64)
    )
    left, right = fig.axes
    xs, ys = left.get_lines()[0].get_data()
    assert list(xs) == [1, 4] and list(ys) == pytest.approx([50.0, 100.0])
    sweep = roofline.decode_batch_sweep(L70, "H100-SXM", [1, 8, 64], context=1024)
    assert list(right.get_lines()[0].get_ydata()) == pytest.approx(
        [r["tokens_per_s"] for r in sweep]
    )
    assert "H100-SXM" in right.get_title() and "test machine" in left.get_title()
    assert all(ax.get_ylabel() == "tokens/s" for ax in (left, right))
    plt.close(fig)
    with pytest.raises(ValueError, match="decode"):
        ch07.throughput_vs_batch([_step("prefill", 1, 0.5)], "m", L70)


def test_measure_steps_times_decodes_then_prefills(monkeypatch):
    calls = []
    monkeypatch.setattr(
        roofline,
        "measure_decode_step",
        lambda model, b, ctx, repeats, budget_s: (
            calls.append(("d", b, ctx)) or _step("decode", b, 1.0)
        ),
    )
    monkeypatch.setattr(
        roofline,
        "measure_prefill",
        lambda model, n, repeats, budget_s: calls.append(("p", n)) or _step("prefill", 1, 1.0),
    )
    out = ch07.measure_steps(object(), [1, 8], 64, prompts=[32], fast=True)
    assert calls == [("d", 1, 64), ("d", 8, 64), ("p", 32)]
    assert [m.kind for m in out] == ["decode", "decode", "prefill"]


def test_plots_label_measured_and_datasheet():
    ax = ch07.plot_roofline(
        ["H100-SXM", "A100-80GB"], ops=[roofline.decode_gemv(get_config("llama-3-70b"), 1)]
    )
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert any("datasheet" in t for t in labels) and "FLOP / byte" in ax.get_xlabel()
    hw = PRESETS["laptop-cpu"].replace(name="test cpu, 2 threads", measured=True)
    s = roofline.StepMeasurement(
        "decode", 1, 8, 0.01, roofline.decode_step(get_config("smollm2-135m"), 1, 9, 4)
    )
    ax = ch07.plot_measured_roofline(hw, [s])
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert any("measured on test cpu, 2 threads" in t for t in labels)


def test_plot_measured_batches_draws_floor_and_measurement():
    cfg = get_config("smollm2-135m")
    hw = PRESETS["laptop-cpu"].replace(name="cpu, 2 threads", measured=True)
    ms = [
        roofline.StepMeasurement(
            "decode", b, 64, 0.02 * b**0.5, roofline.decode_step(cfg, b, 65, 4)
        )
        for b in (1, 4, 16)
    ]
    axes = ch07.plot_measured_batches(hw, ms)
    ys = axes[1].get_lines()[0].get_ydata()
    assert list(ys) == pytest.approx([b / (0.02 * b**0.5) for b in (1, 4, 16)])
    with pytest.raises(ValueError, match="decode"):
        ch07.plot_measured_batches(hw, [])
