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
from llmlab.analysis.sim import SimResult
from llmlab.course.check.catalog import catalog
from llmlab.course.figures._axes import finish
from llmlab.course.figures.headers import header
from llmlab.i18n import notebook_text
from llmlab.utils import format_table

M = catalog("figures.ch08")

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
        raise ValueError(M("text_table.rows_must_not"))
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
        raise ValueError(M("batch_scaling.steps_must_include"))
    bs = [m.batch for m in steps]
    context = steps[0].tokens + 1
    gpu_t = [_gpu_floor(cfg, gpu, b, context).time_floor for b in bs]
    cpu_rel = [m.seconds / steps[0].seconds for m in steps]
    gpu_rel = [t / gpu_t[0] for t in gpu_t]
    fig, (a0, a1) = plt.subplots(1, 2, figsize=(11, 4))
    measured = M("batch_scaling.measured", name=hw.name)
    floor = M("batch_scaling.roofline_floor_preset", gpu=gpu)
    a0.plot(bs, cpu_rel, "o-", label=measured)
    a0.plot(bs, gpu_rel, "s--", label=floor)
    a0.set_ylabel(M("batch_scaling.step_time_step"))
    a0.set_title(M("batch_scaling.per_token_latency"))
    a1.plot(bs, [b / r for b, r in zip(bs, cpu_rel)], "o-", label=measured)
    a1.plot(bs, [b / r for b, r in zip(bs, gpu_rel)], "s--", label=floor)
    a1.plot(
        bs,
        bs,
        ":",
        color="grey",
        label=M("batch_scaling.free_batching_batch"),
    )
    a1.set_ylabel(M("batch_scaling.tokens_s_tokens"))
    a1.set_title(M("batch_scaling.throughput_gained_batching"))
    for ax in (a0, a1):
        ax.set_xscale("log", base=2)
        ax.set_xticks(bs, [str(b) for b in bs])
        ax.set_xlabel(M("batch_scaling.batch_size_sequences"))
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(
        M("batch_scaling.decode_context_machine", name=cfg.name, context=context, gpu=gpu),
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
            M("cpu_vs_gpu_table.steps_must_include", batch=batch, sorted_by_batch=sorted(by_batch))
        )
    m1, mb = by_batch[1], by_batch[batch]
    here = roofline.place(mb.op, hw, dtype)
    context = m1.tokens + 1
    g1, gb = _gpu_floor(cfg, gpu, 1, context), _gpu_floor(cfg, gpu, batch, context)
    device, step1 = M("cpu_vs_gpu_table.device"), M("cpu_vs_gpu_table.step_ms_batch_2")
    step_b = M("cpu_vs_gpu_table.step_ms_batch", batch=batch)
    ratio, ridge = M("cpu_vs_gpu_table.throughput_ratio"), M("cpu_vs_gpu_table.ridge_flop_b")
    flop_b = M("cpu_vs_gpu_table.flop_b", batch=batch)
    rows = [
        {
            device: M("cpu_vs_gpu_table.measured", name=hw.name, dtype=dtype),
            step1: m1.seconds * 1e3,
            step_b: mb.seconds * 1e3,
            ratio: batch * m1.seconds / mb.seconds,
            flop_b: here.op.intensity,
            ridge: roofline.ridge_point(hw, dtype),
        },
        {
            device: M("cpu_vs_gpu_table.roofline_floor_bf16", gpu=gpu),
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
            (M("sim_vs_engine.simulator"), simulated[policy]),
            (M("sim_vs_engine.real_engine"), real[policy]),
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


def plot_gantt(
    result: SimResult,
    ax: Any = None,
    title: str | None = None,
    time_unit: str = "steps",
    time_scale: float = 1.0,
) -> Any:
    """One row per request: waiting (light) from arrival to start, running (dark) to finish.

    `time_scale` multiplies times for the axis (e.g. 1e3 with time_unit="ms" for seconds).
    """
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    title = notebook_text(title)  # a title a notebook cell wrote, in the language in use
    unit = M.by_english(time_unit, "unit")

    if ax is None:
        _, ax = plt.subplots(figsize=(9, max(2.5, 0.22 * len(result.requests) + 1)))
    colour = "#2563eb" if result.policy == "continuous" else "#b45309"
    for row, tl in enumerate(result.requests):
        a, s, f = tl.arrival * time_scale, tl.start * time_scale, tl.finish * time_scale
        ax.barh(row, s - a, left=a, color="#d1d5db", height=0.7)
        ax.barh(row, f - s, left=s, color=colour, height=0.7)
    ax.set_yticks(range(len(result.requests)))
    ax.set_yticklabels([str(tl.request_id) for tl in result.requests], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel(M("plot_gantt.time", unit=unit))
    ax.set_ylabel(M("plot_gantt.request"))
    ax.legend(
        handles=[
            Patch(color="#d1d5db", label=M("plot_gantt.waiting")),
            Patch(color=colour, label=M("plot_gantt.running")),
        ],
        fontsize=8,
        loc="lower right",
    )
    latency = result.mean_latency * time_scale
    ax.set_title(
        title
        or M(
            "plot_gantt.batching_max_batch",
            policy=result.policy,
            max_batch=result.max_batch,
            latency=latency,
            unit=unit,
        )
    )
    return ax


def plot_compare(
    results: dict[str, SimResult],
    time_unit: str = "steps",
    time_scale: float = 1.0,
    source: str | None = None,
) -> Any:
    """Both Gantt charts one above the other on a shared time axis, plus batch occupancy per step.

    `source` opens each title (default "simulated", in the language in use)."""
    import matplotlib.pyplot as plt

    # a source a notebook cell wrote, in the language in use
    source = M("plot_compare.simulated") if source is None else notebook_text(source)
    unit = M.by_english(time_unit, "unit")

    n = len(results[next(iter(results))].requests)
    fig, axes = plt.subplots(
        len(results) + 1,
        1,
        figsize=(10, 2 * (0.2 * n + 1) + 2.5),
        sharex=True,
        gridspec_kw={"height_ratios": [1] * len(results) + [0.6]},
    )
    for ax, (name, res) in zip(axes, results.items()):
        plot_gantt(
            res,
            ax,
            time_unit=time_unit,
            time_scale=time_scale,
            title=M(
                "plot_compare.batching_max_batch",
                source=source,
                name=name,
                max_batch=res.max_batch,
                res_throughput_time_scale=res.throughput / time_scale,
                unit=unit,
                res_mean_latency_time_scale=res.mean_latency * time_scale,
            ),
        )
    ax = axes[-1]
    for name, res in results.items():
        ax.step(
            [t * time_scale for t in res.step_start],
            res.step_batch,
            where="post",
            label=M("plot_compare.policy", name=name),
        )
    return finish(
        ax,
        M("plot_gantt.time", unit=unit),
        M("plot_compare.batch_size"),
        M("plot_compare.requests_per_step"),
        legend=8,
    )
