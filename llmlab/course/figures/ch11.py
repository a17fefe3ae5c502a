"""Figures of chapter 11 (vLLM arrives): KV memory waste simulated and measured, the per-step
token split of chunked prefill, and the throughput benchmark's bars. Each function returns the
matplotlib Figure it drew."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from llmlab.analysis.sim import WasteResult, plot_kv_waste
from llmlab.i18n import tr

PREFILL_COLOUR = "#2563eb"
DECODE_COLOUR = "#d97706"


def kv_waste(waste: WasteResult, block_sizes: Sequence[int], paged_waste: Sequence[float]) -> Any:
    """Left: reserved vs used KV slots per step on one trace (contiguous max-length reservation
    and paging). Right: the paged waste (fractions) against block size, with the contiguous
    waste as a dashed line."""
    import matplotlib.pyplot as plt

    if len(block_sizes) != len(paged_waste) or not block_sizes:
        raise ValueError(
            tr(
                f"block_sizes and paged_waste must be non-empty and of equal length, "
                f"got {len(block_sizes)} and {len(paged_waste)}",
                f"block_sizes 和 paged_waste 不能为空，且长度要相同；"
                f"你给的长度是 {len(block_sizes)} 和 {len(paged_waste)}",
            )
        )
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 4), gridspec_kw={"width_ratios": [1.6, 1]})
    plot_kv_waste(waste, ax=ax1)
    ax2.plot(
        list(block_sizes),
        [100 * p for p in paged_waste],
        "o-",
        label=tr("paged (simulated)", "分页（模拟）"),
    )
    ax2.axhline(
        100 * waste.contiguous_waste,
        color="#b45309",
        ls="--",
        label=tr("contiguous, max_model_len", "连续预留，max_model_len"),
    )
    ax2.set_xscale("log", base=2)
    ax2.set_xlabel(tr("block size (tokens)", "块大小（token 数）"))
    ax2.set_ylabel(tr("KV slots wasted (%)", "浪费的 KV 槽位（%）"))
    ax2.set_title(tr("Waste against block size (same trace)", "浪费随块大小的变化（同一条 trace）"))
    ax2.legend(fontsize=8)
    fig.tight_layout()
    return fig


def measured_waste(measured: WasteResult, title: str) -> Any:
    """Reserved vs used KV slots per step, measured on the engine, on a log scale."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 4))
    plot_kv_waste(measured, ax=ax)
    ax.set_yscale("log")
    ax.set_ylabel(tr("KV slots (tokens, log scale)", "KV 槽位（token 数，对数坐标）"))
    ax.set_title(title)
    fig.tight_layout()
    return fig


def token_split(rows: Sequence[Mapping[str, int]], budget: int, title: str | None = None) -> Any:
    """Stacked bars, one per engine step: prefill tokens (bottom) and decode tokens (top), each
    bar labelled "prefill + decode", with the token budget `max_num_batched_tokens` as a dashed
    line. `rows`: per step a mapping with
    "prefill" and "decode" token counts."""
    import matplotlib.pyplot as plt

    if not rows:
        raise ValueError(tr("rows must hold at least one step", "rows 里至少要有一步"))
    steps = list(range(1, len(rows) + 1))
    prefill = [r["prefill"] for r in rows]
    decode = [r["decode"] for r in rows]
    fig, ax = plt.subplots(figsize=(max(5, 0.6 * len(rows) + 3), 3.6))
    ax.bar(
        steps,
        prefill,
        color=PREFILL_COLOUR,
        label=tr("prefill tokens (prompt chunk)", "prefill token（prompt 的一块）"),
    )
    ax.bar(
        steps,
        decode,
        bottom=prefill,
        color=DECODE_COLOUR,
        label=tr("decode tokens (1 per running request)", "decode token（每个运行中的请求 1 个）"),
    )
    ax.axhline(budget, color="black", ls="--", lw=1, label=f"max_num_batched_tokens = {budget}")
    for x, p, d in zip(steps, prefill, decode):  # the decode share is too thin to see: write it
        ax.text(x, p + d + budget * 0.02, f"{p} + {d}", ha="center", va="bottom", fontsize=8)
    ax.set_xticks(steps)
    ax.set_xlabel(tr("engine step", "引擎的步"))
    ax.set_ylabel(tr("tokens scheduled", "调度的 token 数"))
    ax.set_ylim(0, budget * 1.45)
    ax.set_title(
        title
        or tr(
            "Chunked prefill: one long prompt sharing steps with decodes",
            "chunked prefill：一个长 prompt 与 decode 共用每一步",
        )
    )
    ax.legend(fontsize=8, loc="upper right")
    fig.tight_layout()
    return fig


def throughput_bars(report: Mapping[str, Any]) -> Any:
    """Horizontal bars of output tokens/s per system from a `python -m llmlab bench throughput`
    report (its JSON, loaded); llmlab's systems in blue, Hugging Face's in grey."""
    import matplotlib.pyplot as plt

    systems = report["systems"]
    names = list(systems)
    if not names:
        raise ValueError(tr("the report holds no systems", "报告里没有任何系统"))
    fig, ax = plt.subplots(figsize=(7, 0.5 * len(names) + 1.6))
    ax.barh(
        names,
        [systems[n]["tok_per_s"] for n in names],
        color=["#2563eb" if n.startswith("llmlab") else "#9ca3af" for n in names],
    )
    ax.invert_yaxis()
    ax.set_xlabel(tr("output tokens per second (measured)", "每秒输出的 token 数（实测）"))
    machine = report.get("machine", {})
    n, threads = report["settings"]["num_requests"], machine.get("threads", "?")
    ax.set_title(
        tr(
            f"Same requests, same weights: {n} requests, {threads} threads on this machine",
            f"同样的请求、同样的权重：{n} 个请求，本机 {threads} 个线程",
        )
    )
    fig.tight_layout()
    return fig
