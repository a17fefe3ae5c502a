"""Chapter 07's harness and figures: the real model's decode steps timed at several batch sizes,
and its throughput set beside what the roofline allows an H100."""

from __future__ import annotations

from typing import Any, Sequence

from llmlab.analysis import roofline
from llmlab.config import ModelConfig
from llmlab.course.figures.ch06 import print_table, table_text  # noqa: F401  (chapter 07's tables print the same way)
from llmlab.i18n import tr


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
        raise ValueError(tr("measured holds no decode step", "measured 里没有 decode step"))
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.8))
    left.plot(
        [m.batch for m in dec],
        [m.batch / m.seconds for m in dec],
        "o-",
        label=tr("measured", "实测"),
    )
    left.set_title(tr(f"{machine}: measured decode steps", f"{machine}：实测的 decode step"))
    sweep = roofline.decode_batch_sweep(gpu_cfg, gpu, gpu_batches, context=gpu_context)
    right.plot(
        [r["batch"] for r in sweep],
        [r["tokens_per_s"] for r in sweep],
        "s-",
        color="#dc2626",
        label=tr("roofline bound", "roofline 上限"),
    )
    right.set_title(
        tr(
            f"{gpu_cfg.name} on {gpu} (preset, bf16, context {gpu_context})",
            f"{gpu_cfg.name} 在 {gpu} 上（预设，bf16，上下文 {gpu_context}）",
        )
    )
    for ax in (left, right):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel(tr("batch (sequences per step)", "batch（每步的序列数）"))
        ax.set_ylabel("tokens/s")
        ax.legend(fontsize=8)
    fig.tight_layout()
    return fig
