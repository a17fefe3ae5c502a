"""Chapter 08's figures (batching) and the table beside them.

`batch_scaling` sets this machine's measured decode steps beside an H100's roofline floor for
the same model: step time and throughput, each relative to batch 1, so a CPU effect (the step
growing with the batch) is never taken for a GPU one. `cpu_vs_gpu_table` is the same comparison
in numbers, and `sim_vs_engine` the chapter's simulator-against-engine table; both return rows
(dicts) that `text_table` prints as plain text, its headers in the language in use.
"""

from __future__ import annotations

from typing import Any, Sequence

from llmlab.analysis import roofline
from llmlab.analysis.hardware import Hardware
from llmlab.course.figures.headers import header
from llmlab.i18n import tr
from llmlab.utils import format_table

GPU = "H100-SXM"


def _cell(v: Any) -> str:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return str(v)
    if isinstance(v, int):
        return f"{v:,}"
    if v == 0 or abs(v) >= 100:
        return f"{v:,.0f}"
    return f"{v:.2f}" if abs(v) >= 1 else f"{v:.3g}"


def text_table(rows: Sequence[dict], transpose: bool = False) -> str:
    """Rows of dicts (same keys) as an aligned plain-text table; `transpose` puts one row per key."""
    if not rows:
        raise ValueError(tr("rows must not be empty", "rows 不能为空"))
    keys = list(rows[0])
    grid = [[header(str(k)) for k in keys]] + [[_cell(r[k]) for k in keys] for r in rows]
    if transpose:
        grid = [list(col) for col in zip(*grid)]
    return format_table(grid[1:], grid[0], align="lr", rule=False)


def _gpu_floor(cfg: Any, gpu: str | Hardware, batch: int, context: int, dtype_bytes: int = 2):
    return roofline.place(
        roofline.decode_step(cfg, batch, context, dtype_bytes),
        gpu,
        roofline.dtype_for_bytes(dtype_bytes),
    )


def batch_scaling(
    steps: Sequence[roofline.StepMeasurement], hw: Hardware, cfg: Any, gpu: str = GPU
) -> Any:
    """Two panels against the batch: step time / step time at batch 1, and tokens/s / tokens/s at
    batch 1, for the measured `steps` (on `hw`) and for the roofline floor of the same model
    (`cfg`, bf16, same context) on the preset `gpu`. The dotted line is free batching (ratio = batch)."""
    import matplotlib.pyplot as plt

    steps = sorted(steps, key=lambda m: m.batch)
    if not steps or steps[0].batch != 1:
        raise ValueError(
            tr(
                "steps must include a batch-1 measurement (the baseline)",
                "steps 里必须有 batch 1 的测量（作为基准）",
            )
        )
    bs = [m.batch for m in steps]
    context = steps[0].tokens + 1
    gpu_t = [_gpu_floor(cfg, gpu, b, context).time_floor for b in bs]
    cpu_rel = [m.seconds / steps[0].seconds for m in steps]
    gpu_rel = [t / gpu_t[0] for t in gpu_t]
    fig, (a0, a1) = plt.subplots(1, 2, figsize=(11, 4))
    measured = tr(f"measured: {hw.name}", f"实测：{hw.name}")
    floor = tr(f"{gpu} roofline floor (preset)", f"{gpu} 的 roofline 下限（预设）")
    a0.plot(bs, cpu_rel, "o-", label=measured)
    a0.plot(bs, gpu_rel, "s--", label=floor)
    a0.set_ylabel(tr("step time / step time at batch 1", "每步时间 / batch 1 时的每步时间"))
    a0.set_title(
        tr("Per-token latency: how much slower each step gets", "每个 token 的延迟：每一步慢了多少")
    )
    a1.plot(bs, [b / r for b, r in zip(bs, cpu_rel)], "o-", label=measured)
    a1.plot(bs, [b / r for b, r in zip(bs, gpu_rel)], "s--", label=floor)
    a1.plot(
        bs,
        bs,
        ":",
        color="grey",
        label=tr("free batching (= batch)", "不花代价的 batching（= batch）"),
    )
    a1.set_ylabel(tr("tokens/s / tokens/s at batch 1", "tokens/s / batch 1 时的 tokens/s"))
    a1.set_title(tr("Throughput gained by batching", "batching 带来的吞吐提升"))
    for ax in (a0, a1):
        ax.set_xscale("log", base=2)
        ax.set_xticks(bs, [str(b) for b in bs])
        ax.set_xlabel(tr("batch size (sequences)", "batch 大小（序列数）"))
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(
        tr(
            f"{cfg.name} decode, context {context}: this machine measured vs {gpu} floor",
            f"{cfg.name} decode，上下文 {context}：本机实测与 {gpu} 下限的对比",
        ),
        fontsize=10,
    )
    fig.tight_layout()
    return fig


def cpu_vs_gpu_table(
    steps: Sequence[roofline.StepMeasurement],
    hw: Hardware,
    cfg: Any,
    batch: int = 32,
    gpu: str = GPU,
    dtype: str = "fp32",
):
    """One row (dict) per device: step ms at batch 1 and at `batch`, the throughput ratio, the
    step's FLOP per byte at `batch` and the device's ridge point. Which of the two bounds the step
    is left to the reader (chapter 08's exercise 2 asks it). The keys (the printed headers) and
    the device names are in the language in use."""
    by_batch = {m.batch: m for m in steps}
    if 1 not in by_batch or batch not in by_batch:
        raise ValueError(
            tr(
                f"steps must include batch 1 and batch {batch}, got {sorted(by_batch)}",
                f"steps 里必须有 batch 1 和 batch {batch}，你给的是 {sorted(by_batch)}",
            )
        )
    m1, mb = by_batch[1], by_batch[batch]
    here = roofline.place(mb.op, hw, dtype)
    context = m1.tokens + 1
    g1, gb = _gpu_floor(cfg, gpu, 1, context), _gpu_floor(cfg, gpu, batch, context)
    device, step1 = tr("device", "设备"), tr("step ms, batch 1", "每步 ms，batch 1")
    step_b = tr(f"step ms, batch {batch}", f"每步 ms，batch {batch}")
    ratio, ridge = tr("throughput ratio", "吞吐之比"), tr("ridge FLOP/B", "拐点 FLOP/B")
    flop_b = tr(f"FLOP/B at {batch}", f"batch {batch} 时的 FLOP/B")
    rows = [
        {
            device: tr(f"{hw.name} (measured, {dtype})", f"{hw.name}（实测，{dtype}）"),
            step1: m1.seconds * 1e3,
            step_b: mb.seconds * 1e3,
            ratio: batch * m1.seconds / mb.seconds,
            flop_b: here.op.intensity,
            ridge: roofline.ridge_point(hw, dtype),
        },
        {
            device: tr(f"{gpu} (roofline floor, bf16)", f"{gpu}（roofline 下限，bf16）"),
            step1: g1.time_floor * 1e3,
            step_b: gb.time_floor * 1e3,
            ratio: batch * g1.time_floor / gb.time_floor,
            flop_b: gb.op.intensity,
            ridge: roofline.ridge_point(gpu, "bf16"),
        },
    ]
    return rows


def sim_vs_engine(simulated: dict, real: dict) -> list[dict]:
    """Rows (dicts): steps, tokens/s, mean batch and mean latency of each policy, simulator
    against engine."""
    rows = []
    for policy in real:
        for source, res in (
            (tr("simulator", "模拟器"), simulated[policy]),
            (tr("real engine", "真实引擎"), real[policy]),
        ):
            rows.append(
                {
                    "policy": policy,
                    "source": source,
                    "steps": res.num_steps,
                    "tokens/s": res.throughput,
                    "mean batch": res.mean_batch,
                    "mean latency s": res.mean_latency,
                }
            )
    return rows
