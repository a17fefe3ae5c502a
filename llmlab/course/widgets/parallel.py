"""Parallelism explorer: TP/PP degree, interconnect, batch → compute vs communication bars
(from `llmlab.analysis.parallel_cost`), plus plots of a measured pipeline timeline and bubble.

`parallel_text(...)` gives a line "TP=<t> PP=<p> over <link>: compute <a> ms, communication
<b> ms (<c>% of the step)" (`PARALLEL_TEXT_PATTERN` reads the English line; the Chinese one holds
the same numbers).
"""

from __future__ import annotations

import re
from typing import Any

from llmlab.analysis import parallel_cost
from llmlab.analysis.hardware import get_hardware
from llmlab.course.check.catalog import catalog
from llmlab.course.figures._axes import finish
from llmlab.course.widgets._show import controls_of, explorer
from llmlab.i18n import notebook_text

M = catalog("widgets.parallel")

PARALLEL_TEXT_PATTERN = re.compile(
    r"TP=(\d+) PP=(\d+) over (.+): compute ([0-9.]+) ms, communication ([0-9.]+) ms "
    r"\(([0-9.]+)% of the step\)"
)
COLOURS = {"compute": "#2563eb", "tp": "#b45309", "pp": "#15803d"}


# where the explorer starts: Llama-3-70B over 8 GPUs on NVLink, one sequence of 1,024 tokens
START = {
    "tp": 8,
    "pp": 1,
    "interconnect": "nvlink",
    "batch": 1,
    "context": 1024,
    "model": "llama-3-70b",
    "hardware": "H100-SXM",
}


def _step_cost(setting: dict[str, Any]) -> parallel_cost.StepCost:
    """`parallel_cost.decode_step_cost` at `setting` (START for what it leaves out)."""
    s = START | setting
    return parallel_cost.decode_step_cost(s.pop("model"), **s)


def parallel_text(**setting: Any) -> str:
    """One line per setting (`START`'s keys; its values for those not given): compute vs
    communication of a decode step."""
    c = _step_cost(setting)
    return M(
        "parallel_text.tp_pp_over",
        tp=c.tp,
        pp=c.pp,
        interconnect=c.interconnect,
        compute_ms=c.compute * 1e3,
        comm_ms=c.comm * 1e3,
        comm_fraction=100 * c.comm_fraction,
        all_reduces=c.all_reduces,
        all_reduce_kib=c.all_reduce_bytes / 1024,
        weight_gb_per_gpu=c.weight_bytes_per_gpu / 1e9,
        tokens_per_second=c.tokens_per_second,
    )


def plot_parallel_cost(tps: tuple[int, ...] = (1, 2, 4, 8), **setting: Any) -> Any:
    """Stacked bars per TP degree for both links: compute, TP all-reduces, PP sends (ms per step).

    The chosen (tp, interconnect) bar is outlined. Preset figures, not measurements.
    """
    import matplotlib.pyplot as plt

    setting = START | setting
    tp, interconnect = setting["tp"], setting["interconnect"]
    links = ("nvlink", "pcie")
    tps = tuple(sorted(set(tps) | {tp}))
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8), sharey=True)
    for ax, link in zip(axes, links):
        rows = [_step_cost(setting | {"tp": t, "interconnect": link}) for t in tps]
        x = range(len(tps))
        comp = [r.compute * 1e3 for r in rows]
        tpc = [r.tp_comm * 1e3 for r in rows]
        ppc = [r.pp_comm * 1e3 for r in rows]
        ax.bar(x, comp, color=COLOURS["compute"], label=M("plot_parallel_cost.compute_roofline"))
        ax.bar(
            x, tpc, bottom=comp, color=COLOURS["tp"], label=M("plot_parallel_cost.tp_all_reduces")
        )
        ax.bar(
            x,
            ppc,
            bottom=[a + b for a, b in zip(comp, tpc)],
            color=COLOURS["pp"],
            label=M("plot_parallel_cost.pp_sends"),
        )
        mem = get_hardware(setting["hardware"]).mem_size
        for i, r in enumerate(rows):
            label = f"{100 * r.comm_fraction:.0f}%"
            if r.weight_bytes_per_gpu > mem:  # the weights alone overflow one GPU's memory
                label += M("plot_parallel_cost.weights_don_t")
            ax.text(i, r.total * 1e3, label, ha="center", va="bottom", fontsize=8)
            if link == interconnect.lower() and tps[i] == tp:
                ax.bar(i, r.total * 1e3, fill=False, edgecolor="black", linewidth=2)
        ax.set_xticks(list(x), [f"TP={t}" for t in tps])
        ax.set_title(f"{rows[0].interconnect}")
        ax.set_xlabel(M("plot_parallel_cost.tensor_parallel_degree"))
    axes[0].set_ylabel(M("plot_parallel_cost.time_per_decode"))
    axes[0].legend(loc="upper right", fontsize=8)
    fig.suptitle(M("plot_parallel_cost.decode_step_batch", **setting), fontsize=10)
    fig.tight_layout()
    return fig


def parallelism_explorer(**setting: Any) -> Any:
    """Sliders for TP/PP degree, interconnect, batch and context, starting at `setting` (`START`
    for what it leaves out); bars and a summary line update."""
    start = START | setting
    degrees, contexts = [1, 2, 4, 8], [1, 256, 1024, 4096, 16384]
    links = [("NVLink", "nvlink"), ("PCIe 5.0", "pcie")]
    table = {
        "tp": ("Dropdown", M("parallelism_explorer.tp_degree"), degrees),
        "pp": ("Dropdown", M("parallelism_explorer.pp_degree"), degrees),
        "interconnect": ("Dropdown", M("parallelism_explorer.interconnect"), links),
        "batch": ("SelectionSlider", "batch", [2**i for i in range(10)]),
        "context": ("SelectionSlider", M("parallelism_explorer.context"), contexts),
    }
    controls = controls_of(table, start, "90px")
    return explorer(
        controls,
        [("tp", "pp", "interconnect"), ("batch", "context")],
        "llmlab-parallel-result",
        parallel_text,
        plot_parallel_cost,
        fixed={"model": start["model"], "hardware": start["hardware"]},
    )


def plot_pipeline_timeline(timelines: list, title: str | None = None) -> Any:
    """Gantt chart of one pass: a row per stage, a bar per micro-batch (ms from the first start);
    `title` by default "pipeline pass (measured)"."""
    import matplotlib.pyplot as plt

    # a title a notebook cell wrote, in the language in use
    title = (
        M("plot_pipeline_timeline.pipeline_pass_measured")
        if title is None
        else notebook_text(title)
    )
    t0 = min(s for tl in timelines for s, _ in tl.intervals)
    fig, ax = plt.subplots(figsize=(8, 0.8 + 0.6 * len(timelines)))
    cmap = plt.get_cmap("tab10")
    for row, tl in enumerate(timelines):
        for i, (s, e) in enumerate(tl.intervals):
            ax.barh(row, (e - s) * 1e3, left=(s - t0) * 1e3, color=cmap(i % 10), edgecolor="white")
            ax.text(
                (s - t0 + (e - s) / 2) * 1e3,
                row,
                f"mb{i}",
                ha="center",
                va="center",
                fontsize=7,
                color="white",
            )
    ax.set_yticks(
        range(len(timelines)),
        [M("plot_pipeline_timeline.stage", stage=tl.stage) for tl in timelines],
    )
    ax.invert_yaxis()
    return finish(ax, M("plot_pipeline_timeline.time_since_first"), title=title)


def plot_bubble(results: dict, num_stages: int = 2, title: str | None = None) -> Any:
    """Measured idle fraction per micro-batch count against (p−1)/(m+p−1)."""
    import matplotlib.pyplot as plt

    title = notebook_text(title)  # a title a notebook cell wrote, in the language in use

    ms = sorted(results)
    fig, ax = plt.subplots(figsize=(6, 3.6))
    ax.plot(
        ms,
        [results[m]["theory"] for m in ms],
        "o--",
        color="black",
        label=M("plot_bubble.theory_p_1"),
    )
    ax.plot(
        ms,
        [results[m]["measured"] for m in ms],
        "s-",
        color=COLOURS["compute"],
        label=M("plot_bubble.measured_mean_over"),
    )
    ax.set_xscale("log", base=2)
    ax.set_xticks(ms, [str(m) for m in ms])
    ax.set_ylim(0, 1)
    ax.set_xlabel(M("plot_bubble.micro_batches_m"))
    ax.set_ylabel(M("plot_bubble.idle_fraction_each"))
    ax.set_title(title or M("plot_bubble.pipeline_bubble_p", num_stages=num_stages))
    ax.legend()
    fig.tight_layout()
    return fig
