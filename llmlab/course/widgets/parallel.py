"""Parallelism explorer: TP/PP degree, interconnect, batch → compute vs communication bars
(from `llmlab.analysis.parallel_cost`), plus plots of a measured pipeline timeline and bubble.

`parallel_text(...)` gives a line "TP=<t> PP=<p> over <link>: compute <a> ms, communication
<b> ms (<c>% of the step)" (`PARALLEL_TEXT_PATTERN` reads the English line; the Chinese one holds
the same numbers).
"""

from __future__ import annotations

import re
from typing import Any

from llmlab.analysis.hardware import get_hardware
from llmlab.course.widgets._show import show_figure
from llmlab.i18n import notebook_text, tr
from llmlab.parallel import cost

PARALLEL_TEXT_PATTERN = re.compile(
    r"TP=(\d+) PP=(\d+) over (.+): compute ([0-9.]+) ms, communication ([0-9.]+) ms "
    r"\(([0-9.]+)% of the step\)"
)
COLOURS = {"compute": "#2563eb", "tp": "#b45309", "pp": "#15803d"}


def parallel_text(
    tp: int = 8,
    pp: int = 1,
    interconnect: str = "nvlink",
    batch: int = 1,
    context: int = 1024,
    model: str = "llama-3-70b",
    hardware: str = "H100-SXM",
) -> str:
    """One line per setting: compute vs communication of a decode step."""
    c = cost.decode_step_cost(
        model,
        tp=tp,
        pp=pp,
        batch=batch,
        interconnect=interconnect,
        hardware=hardware,
        context=context,
    )
    return tr(
        f"TP={tp} PP={pp} over {c.interconnect}: compute {c.compute * 1e3:.2f} ms, "
        f"communication {c.comm * 1e3:.2f} ms ({100 * c.comm_fraction:.0f}% of the step)\n"
        f"{c.all_reduces} all-reduces of {c.all_reduce_bytes / 1024:.0f} KiB per step; "
        f"{c.weight_bytes_per_gpu / 1e9:.1f} GB of weights per GPU; "
        f"{c.tokens_per_second:.0f} tokens/s for the group",
        f"TP={tp} PP={pp}，走 {c.interconnect}：计算 {c.compute * 1e3:.2f} ms，"
        f"通信 {c.comm * 1e3:.2f} ms（占这一步的 {100 * c.comm_fraction:.0f}%）\n"
        f"每步 {c.all_reduces} 次 all-reduce，每次 {c.all_reduce_bytes / 1024:.0f} KiB；"
        f"每块 GPU 上 {c.weight_bytes_per_gpu / 1e9:.1f} GB 权重；"
        f"整组 {c.tokens_per_second:.0f} tokens/s",
    )


def plot_parallel_cost(
    tp: int = 8,
    pp: int = 1,
    interconnect: str = "nvlink",
    batch: int = 1,
    context: int = 1024,
    model: str = "llama-3-70b",
    hardware: str = "H100-SXM",
    tps: tuple[int, ...] = (1, 2, 4, 8),
) -> Any:
    """Stacked bars per TP degree for both links: compute, TP all-reduces, PP sends (ms per step).

    The chosen (tp, interconnect) bar is outlined. Preset figures, not measurements.
    """
    import matplotlib.pyplot as plt

    links = ("nvlink", "pcie")
    tps = tuple(sorted(set(tps) | {tp}))
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8), sharey=True)
    for ax, link in zip(axes, links):
        rows = [
            cost.decode_step_cost(
                model,
                tp=t,
                pp=pp,
                batch=batch,
                interconnect=link,
                hardware=hardware,
                context=context,
            )
            for t in tps
        ]
        x = range(len(tps))
        comp = [r.compute * 1e3 for r in rows]
        tpc = [r.tp_comm * 1e3 for r in rows]
        ppc = [r.pp_comm * 1e3 for r in rows]
        ax.bar(
            x, comp, color=COLOURS["compute"], label=tr("compute (roofline)", "计算（roofline）")
        )
        ax.bar(
            x, tpc, bottom=comp, color=COLOURS["tp"], label=tr("TP all-reduces", "TP 的 all-reduce")
        )
        ax.bar(
            x,
            ppc,
            bottom=[a + b for a, b in zip(comp, tpc)],
            color=COLOURS["pp"],
            label=tr("PP sends", "PP 的发送"),
        )
        mem = get_hardware(hardware).mem_size
        for i, r in enumerate(rows):
            label = f"{100 * r.comm_fraction:.0f}%"
            if r.weight_bytes_per_gpu > mem:  # the weights alone overflow one GPU's memory
                label += tr("\nweights don't fit", "\n权重放不下")
            ax.text(i, r.total * 1e3, label, ha="center", va="bottom", fontsize=8)
            if link == interconnect.lower() and tps[i] == tp:
                ax.bar(i, r.total * 1e3, fill=False, edgecolor="black", linewidth=2)
        ax.set_xticks(list(x), [f"TP={t}" for t in tps])
        ax.set_title(f"{rows[0].interconnect}")
        ax.set_xlabel(
            tr(
                "tensor-parallel degree (label: communication share)",
                "张量并行度（标注：通信占比）",
            )
        )
    axes[0].set_ylabel(tr("time per decode step (ms)", "每步 decode 的时间（ms）"))
    axes[0].legend(loc="upper right", fontsize=8)
    fig.suptitle(
        tr(
            f"{model}, decode step, batch {batch}, context {context}, PP={pp} "
            f"(preset figures, not measured)",
            f"{model}，decode 一步，batch {batch}，上下文 {context}，PP={pp}（预设数字，不是实测）",
        ),
        fontsize=10,
    )
    fig.tight_layout()
    return fig


def parallelism_explorer(
    tp: int = 8,
    pp: int = 1,
    interconnect: str = "nvlink",
    batch: int = 1,
    context: int = 1024,
    model: str = "llama-3-70b",
) -> Any:
    """Sliders for TP/PP degree, interconnect, batch and context; bars and a summary line update."""
    import ipywidgets as w

    style = {"description_width": "90px"}
    tp_w = w.Dropdown(
        options=[1, 2, 4, 8], value=tp, description=tr("TP degree", "TP 并行度"), style=style
    )
    pp_w = w.Dropdown(
        options=[1, 2, 4, 8], value=pp, description=tr("PP degree", "PP 并行度"), style=style
    )
    link_w = w.Dropdown(
        options=[("NVLink", "nvlink"), ("PCIe 5.0", "pcie")],
        value=interconnect,
        description=tr("interconnect", "互联"),
        style=style,
    )
    batch_w = w.SelectionSlider(
        options=[1, 2, 4, 8, 16, 32, 64, 128, 256, 512],
        value=batch,
        description="batch",
        style=style,
    )
    ctx_w = w.SelectionSlider(
        options=[1, 256, 1024, 4096, 16384],
        value=context,
        description=tr("context", "上下文"),
        style=style,
    )
    result = w.HTML()
    out = w.Output()

    def redraw(*_: Any) -> None:
        args = dict(
            tp=tp_w.value,
            pp=pp_w.value,
            interconnect=link_w.value,
            batch=batch_w.value,
            context=ctx_w.value,
            model=model,
        )
        result.value = f'<pre class="llmlab-parallel-result">{parallel_text(**args)}</pre>'
        show_figure(out, plot_parallel_cost(**args))

    for c in (tp_w, pp_w, link_w, batch_w, ctx_w):
        c.observe(redraw, names="value")
    redraw()
    return w.VBox([w.HBox([tp_w, pp_w, link_w]), w.HBox([batch_w, ctx_w]), result, out])


def plot_pipeline_timeline(timelines: list, title: str | None = None) -> Any:
    """Gantt chart of one pass: a row per stage, a bar per micro-batch (ms from the first start);
    `title` by default "pipeline pass (measured)"."""
    import matplotlib.pyplot as plt

    title = notebook_text(title)  # a title a notebook cell wrote, in the language in use

    if title is None:
        title = tr("pipeline pass (measured)", "流水线的一轮（实测）")
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
        range(len(timelines)), [tr(f"stage {tl.stage}", f"第 {tl.stage} 段") for tl in timelines]
    )
    ax.invert_yaxis()
    ax.set_xlabel(
        tr(
            "time since the first micro-batch started (ms)",
            "从第一个 micro-batch 开始算起的时间（ms）",
        )
    )
    ax.set_title(title)
    fig.tight_layout()
    return fig


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
        label=tr("theory (p−1)/(m+p−1)", "理论值 (p−1)/(m+p−1)"),
    )
    ax.plot(
        ms,
        [results[m]["measured"] for m in ms],
        "s-",
        color=COLOURS["compute"],
        label=tr("measured (mean over stages)", "实测（各段的平均）"),
    )
    ax.set_xscale("log", base=2)
    ax.set_xticks(ms, [str(m) for m in ms])
    ax.set_ylim(0, 1)
    ax.set_xlabel(tr("micro-batches m", "micro-batch 数 m"))
    ax.set_ylabel(tr("idle fraction of each stage", "每段空闲的比例"))
    ax.set_title(
        title
        or tr(
            f"pipeline bubble, p = {num_stages} stages (measured on this machine)",
            f"流水线气泡，p = {num_stages} 段（本机实测）",
        )
    )
    ax.legend()
    fig.tight_layout()
    return fig
