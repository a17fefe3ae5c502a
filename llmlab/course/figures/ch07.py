"""Chapter 07's harness and figures: rooflines of devices with operations placed on them, the
real model's decode steps timed at several batch sizes and drawn against this machine's measured
roof, and its throughput set beside what the roofline allows an H100. The numbers come from
`llmlab.analysis.roofline`."""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

from llmlab.analysis import roofline
from llmlab.analysis.hardware import Hardware, get_hardware
from llmlab.config import ModelConfig
from llmlab.course.check.catalog import catalog
from llmlab.course.figures.ch06 import print_table, table_text  # noqa: F401  (chapter 07's tables print the same way)
from llmlab.i18n import notebook_text

M = catalog("figures.ch07")


def measure_steps(
    model: Any,
    batches: Sequence[int],
    context: int,
    prompts: Sequence[int] = (),
    fast: bool = False,
) -> list[roofline.StepMeasurement]:
    """Time the real model's decode step at each batch (each sequence with `context` cached
    tokens), then a prefill of each prompt length: the points chapter 07 draws on its roofline."""
    measured = [
        roofline.measure_decode_step(
            model, b, context, repeats=3 if fast else 5, budget_s=2 if fast else 5
        )
        for b in batches
    ]
    measured += [
        roofline.measure_prefill(model, n, repeats=2, budget_s=2 if fast else 5) for n in prompts
    ]
    return measured


def throughput_vs_batch(
    measured: Sequence[roofline.StepMeasurement],
    machine: str,
    gpu_cfg: ModelConfig,
    gpu: str = "H100-SXM",
    gpu_context: int = 1024,
    gpu_batches: Sequence[int] = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024),
) -> Any:
    """Two panels: tokens/s against batch measured on this machine (decode steps of `measured`),
    and the roofline's tokens/s bound for `gpu_cfg` on the `gpu` preset (bf16)."""
    import matplotlib.pyplot as plt

    dec = [m for m in measured if m.kind == "decode"]
    if not dec:
        raise ValueError(M("throughput_vs_batch.measured_holds_no"))
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.8))
    left.plot(
        [m.batch for m in dec],
        [m.batch / m.seconds for m in dec],
        "o-",
        label=M("throughput_vs_batch.measured"),
    )
    left.set_title(M("throughput_vs_batch.measured_decode_steps", machine=machine))
    sweep = roofline.decode_batch_sweep(gpu_cfg, gpu, gpu_batches, context=gpu_context)
    right.plot(
        [r["batch"] for r in sweep],
        [r["tokens_per_s"] for r in sweep],
        "s-",
        color="#dc2626",
        label=M("throughput_vs_batch.roofline_bound"),
    )
    right.set_title(
        M(
            "throughput_vs_batch.preset_bf16_context",
            name=gpu_cfg.name,
            gpu=gpu,
            gpu_context=gpu_context,
        )
    )
    for ax in (left, right):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel(M("throughput_vs_batch.batch_sequences_per"))
        ax.set_ylabel("tokens/s")
        ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def plot_roofline(
    hardware: Sequence[Hardware | str] | Hardware | str = ("H100-SXM", "A100-80GB", "L4"),
    dtype: str = "bf16",
    ops: Sequence[roofline.Operation] = (),
    ax: Any = None,
    intensity_range: tuple[float, float] = (0.1, 10_000),
    title: str | None = None,
) -> Any:
    """Log-log roofline of each device (FLOP/s against FLOP/byte), ridge points marked, `ops` placed on the first."""
    import matplotlib.pyplot as plt

    title = notebook_text(title)  # a title a notebook cell wrote, in the language in use

    hws = [
        get_hardware(h) if isinstance(h, str) else h
        for h in ([hardware] if isinstance(hardware, (str, Hardware)) else hardware)
    ]
    if not hws:
        raise ValueError(M("plot_roofline.hardware_must_name"))
    if ax is None:
        _, ax = plt.subplots(figsize=(8, 5))
    x = np.logspace(math.log10(intensity_range[0]), math.log10(intensity_range[1]), 300)
    for hw in hws:
        dt = dtype if dtype in hw.peak_flops else "fp32"
        src = (
            M("throughput_vs_batch.measured")
            if hw.measured
            else M("plot_measured_roofline.datasheet")
        )
        label = M("plot_roofline.text", name=hw.name, dt=dt, src=src)
        (line,) = ax.loglog(x, roofline.attainable(hw, x, dt) / 1e12, label=label)
        r = roofline.ridge_point(hw, dt)
        ax.plot([r], [hw.flops(dt) / 1e12], "o", color=line.get_color())
        ax.annotate(
            M("plot_roofline.ridge", r=r),
            (r, hw.flops(dt) / 1e12),
            textcoords="offset points",
            xytext=(5, -14),
            fontsize=8,
            color=line.get_color(),
        )
    if ops:
        hw = hws[0]
        dt = dtype if dtype in hw.peak_flops else "fp32"
        for op in ops:
            y = roofline.attainable(hw, op.intensity, dt) / 1e12
            ax.plot([op.intensity], [y], "s", ms=7)
            ax.annotate(
                op.name, (op.intensity, y), textcoords="offset points", xytext=(6, 4), fontsize=8
            )
    ylabel = M("plot_roofline.roofline_attainable_tflop")
    return _roof_axes(ax, ylabel, title or M("plot_roofline.roofline_dense_peaks", dtype=dtype))


def _roof_axes(ax: Any, ylabel: str, title: str) -> Any:
    """End a roofline panel, the same on both roofline plots: arithmetic intensity along x,
    `ylabel` up, `title`, a grid on every tick of the log axes, the legend lower right (under
    the flat roofs); return `ax`."""
    ax.set_xlabel(M("plot_roofline.arithmetic_intensity_flop"))
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    return ax


def plot_measured_roofline(
    hw: Hardware,
    measurements: Sequence[roofline.StepMeasurement],
    dtype: str = "fp32",
    ax: Any = None,
    title: str | None = None,
) -> Any:
    """The measured machine's roof with the real model's measured steps as points (achieved FLOP/s)."""
    import matplotlib.pyplot as plt

    title = notebook_text(title)  # a title a notebook cell wrote, in the language in use

    if ax is None:
        _, ax = plt.subplots(figsize=(8, 5))
    lo = min([m.op.intensity for m in measurements] + [0.5]) / 2
    hi = max([m.op.intensity for m in measurements] + [roofline.ridge_point(hw, dtype)]) * 4
    x = np.logspace(math.log10(lo), math.log10(hi), 300)
    src = (
        M("throughput_vs_batch.measured") if hw.measured else M("plot_measured_roofline.datasheet")
    )
    ax.loglog(
        x,
        roofline.attainable(hw, x, dtype) / 1e9,
        "k-",
        label=M("plot_measured_roofline.roof", name=hw.name, src=src),
    )
    r = roofline.ridge_point(hw, dtype)
    ax.axvline(r, color="grey", ls=":", lw=1)
    ax.annotate(
        M("plot_measured_roofline.ridge_flop_b", r=r),
        (r, hw.flops(dtype) / 1e9),
        textcoords="offset points",
        xytext=(5, -14),
        fontsize=8,
    )
    for kind, marker in (("decode", "o"), ("prefill", "^")):
        pts = [m for m in measurements if m.kind == kind]
        if not pts:
            continue
        xs = [m.op.intensity for m in pts]
        ys = [m.achieved_flops / 1e9 for m in pts]
        ax.plot(
            xs,
            ys,
            marker,
            ls="--",
            label=M("plot_measured_roofline.measured", kind=kind, name=hw.name),
        )
        for m, xv, yv in zip(pts, xs, ys):
            tag = f"B={m.batch}" if kind == "decode" else f"n={m.tokens}"
            ax.annotate(tag, (xv, yv), textcoords="offset points", xytext=(4, -12), fontsize=8)
    ylabel = M("plot_measured_roofline.achieved_gflop_s")
    return _roof_axes(ax, ylabel, title or M("plot_measured_roofline.real_model_s"))


def plot_batch_sweep(
    cfg: ModelConfig,
    hw: Hardware | str,
    batches: Sequence[int] = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512),
    context: int = 1,
    dtype_bytes: float = 2,
    axes: Any = None,
) -> Any:
    """Step-time floor and tokens/s against batch size: flat time, linear throughput, until the ridge."""
    import matplotlib.pyplot as plt

    hw = get_hardware(hw) if isinstance(hw, str) else hw
    rows = roofline.decode_batch_sweep(cfg, hw, batches, context, dtype_bytes)
    if axes is None:
        _, axes = plt.subplots(1, 2, figsize=(11, 4))
    bs = [r["batch"] for r in rows]
    floor = M("plot_batch_sweep.floor", name=cfg.name, name2=hw.name)
    axes[0].semilogx(bs, [r["step_time"] * 1e3 for r in rows], "o-", label=floor)
    axes[0].set_xlabel(M("plot_batch_sweep.batch_size_sequences"))
    axes[0].set_ylabel(M("plot_batch_sweep.decode_step_time"))
    axes[0].set_title(M("plot_batch_sweep.step_time_barely"))
    axes[1].loglog(bs, [r["tokens_per_s"] for r in rows], "o-", label=floor)
    axes[1].set_xlabel(M("plot_batch_sweep.batch_size_sequences"))
    axes[1].set_ylabel(M("plot_batch_sweep.tokens_s_log"))
    axes[1].set_title(M("plot_batch_sweep.throughput_grows_batch"))
    cross = roofline.crossover_batch(cfg, hw, context, dtype_bytes)
    for ax in axes:
        if cross is not None and cross <= max(bs):
            ax.axvline(
                cross,
                color="grey",
                ls=":",
                lw=1,
                label=M("plot_batch_sweep.compute_bound_batch", cross=cross),
            )
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    return axes


def plot_measured_batches(
    hw: Hardware,
    measurements: Sequence[roofline.StepMeasurement],
    dtype: str = "fp32",
    axes: Any = None,
    title: str | None = None,
) -> Any:
    """Measured decode step time (= per-token latency) and tokens/s against batch, with the roofline floor."""
    import matplotlib.pyplot as plt

    title = notebook_text(title)  # a title a notebook cell wrote, in the language in use

    dec = sorted((m for m in measurements if m.kind == "decode"), key=lambda m: m.batch)
    if not dec:
        raise ValueError(M("plot_measured_batches.measurements_must_contain"))
    if axes is None:
        _, axes = plt.subplots(1, 2, figsize=(11, 4))
    bs = [m.batch for m in dec]
    floors = [roofline.place(m.op, hw, dtype).time_floor for m in dec]
    measured = M("plot_measured_batches.measured", name=hw.name)
    axes[0].semilogx(bs, [m.seconds * 1e3 for m in dec], "o-", label=measured)
    axes[0].semilogx(
        bs,
        [f * 1e3 for f in floors],
        "k--",
        label=M("plot_measured_batches.roofline_floor_measured"),
    )
    axes[0].set_ylabel(M("plot_measured_batches.decode_step_time"))
    axes[1].loglog(bs, [m.batch / m.seconds for m in dec], "o-", label=measured)
    axes[1].loglog(
        bs,
        [m.batch / f for m, f in zip(dec, floors)],
        "k--",
        label=M("plot_measured_batches.roofline_ceiling"),
    )
    axes[1].loglog(
        bs,
        [dec[0].batch / dec[0].seconds * b / dec[0].batch for b in bs],
        ":",
        color="grey",
        label=M("plot_measured_batches.linear_batch_free"),
    )
    axes[1].set_ylabel(M("plot_batch_sweep.tokens_s_log"))
    for ax in axes:
        ax.set_xlabel(M("plot_batch_sweep.batch_size_sequences"))
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    axes[0].set_title(title or M("plot_measured_batches.step_time_against"))
    axes[1].set_title(M("plot_measured_batches.throughput_against_batch"))
    return axes
