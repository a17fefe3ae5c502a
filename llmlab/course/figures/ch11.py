"""Figures of chapter 11 (vLLM arrives): KV memory waste simulated and measured, the per-step
token split of chunked prefill, and the throughput benchmark's bars. Each function returns the
matplotlib Figure it drew."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from llmlab.analysis.sim import WasteResult
from llmlab.course.check.catalog import catalog
from llmlab.course.figures._axes import finish

M = catalog("figures.ch11")

PREFILL_COLOUR = "#2563eb"
DECODE_COLOUR = "#d97706"


def kv_waste(waste: WasteResult, block_sizes: Sequence[int], paged_waste: Sequence[float]) -> Any:
    """Left: reserved vs used KV slots per step on one trace (contiguous max-length reservation
    and paging). Right: the paged waste (fractions) against block size, with the contiguous
    waste as a dashed line."""
    import matplotlib.pyplot as plt

    if len(block_sizes) != len(paged_waste) or not block_sizes:
        raise ValueError(
            M(
                "kv_waste.block_sizes_paged",
                len_block_sizes=len(block_sizes),
                len_paged_waste=len(paged_waste),
            )
        )
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 4), gridspec_kw={"width_ratios": [1.6, 1]})
    plot_kv_waste(waste, ax=ax1)
    ax2.plot(
        list(block_sizes),
        [100 * p for p in paged_waste],
        "o-",
        label=M("kv_waste.paged_simulated"),
    )
    ax2.axhline(
        100 * waste.contiguous_waste,
        color="#b45309",
        ls="--",
        label=M("kv_waste.contiguous_max_model"),
    )
    ax2.set_xscale("log", base=2)
    return finish(ax2, **M.figure("kv_waste"), legend=8)


def measured_waste(measured: WasteResult, title: str) -> Any:
    """Reserved vs used KV slots per step, measured on the engine, on a log scale."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 4))
    plot_kv_waste(measured, ax=ax)
    ax.set_yscale("log")
    return finish(ax, ylabel=M("measured_waste.kv_slots_tokens"), title=title)


def token_split(rows: Sequence[Mapping[str, int]], budget: int, title: str | None = None) -> Any:
    """Stacked bars, one per engine step: prefill tokens (bottom) and decode tokens (top), each
    bar labelled "prefill + decode", with the token budget `max_num_batched_tokens` as a dashed
    line. `rows`: per step a mapping with
    "prefill" and "decode" token counts."""
    import matplotlib.pyplot as plt

    if not rows:
        raise ValueError(M("token_split.rows_must_hold"))
    steps = list(range(1, len(rows) + 1))
    prefill = [r["prefill"] for r in rows]
    decode = [r["decode"] for r in rows]
    fig, ax = plt.subplots(figsize=(max(5, 0.6 * len(rows) + 3), 3.6))
    ax.bar(
        steps,
        prefill,
        color=PREFILL_COLOUR,
        label=M("token_split.prefill_tokens_prompt"),
    )
    ax.bar(
        steps,
        decode,
        bottom=prefill,
        color=DECODE_COLOUR,
        label=M("token_split.decode_tokens_1"),
    )
    ax.axhline(budget, color="black", ls="--", lw=1, label=f"max_num_batched_tokens = {budget}")
    for x, p, d in zip(steps, prefill, decode):  # the decode share is too thin to see: write it
        ax.text(x, p + d + budget * 0.02, f"{p} + {d}", ha="center", va="bottom", fontsize=8)
    ax.set_xticks(steps)
    ax.set_xlabel(M("token_split.engine_step"))
    ax.set_ylabel(M("token_split.tokens_scheduled"))
    ax.set_ylim(0, budget * 1.45)
    ax.set_title(title or M("token_split.chunked_prefill_one"))
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
        raise ValueError(M("throughput_bars.report_holds_no"))
    fig, ax = plt.subplots(figsize=(7, 0.5 * len(names) + 1.6))
    ax.barh(
        names,
        [systems[n]["tok_per_s"] for n in names],
        color=["#2563eb" if n.startswith("llmlab") else "#9ca3af" for n in names],
    )
    ax.invert_yaxis()
    ax.set_xlabel(M("throughput_bars.output_tokens_per"))
    machine = report.get("machine", {})
    n, threads = report["settings"]["num_requests"], machine.get("threads", "?")
    ax.set_title(M("throughput_bars.same_requests_same", n=n, threads=threads))
    fig.tight_layout()
    return fig


def plot_kv_waste(result: WasteResult, ax: Any = None) -> Any:
    """Reserved vs used KV slots per step, contiguous and paged."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(8, 4))
    steps = range(len(result.used))
    contiguous = M(
        "plot_kv_waste.contiguous_reserved_wasted",
        contiguous_policy=result.contiguous_policy,
        contiguous_waste=result.contiguous_waste,
    )
    paged = M(
        "plot_kv_waste.paged_block_wasted",
        block_size=result.block_size,
        paged_waste=result.paged_waste,
    )
    ax.plot(steps, result.contiguous, label=contiguous)
    ax.plot(steps, result.paged, label=paged)
    ax.fill_between(
        steps,
        result.used,
        color="#15803d",
        alpha=0.3,
        label=M("plot_kv_waste.tokens_actually_stored"),
    )
    ax.set_xlabel(M("token_split.engine_step"))
    ax.set_ylabel(M("plot_kv_waste.kv_slots_tokens"))
    ax.set_title(M("plot_kv_waste.kv_cache_memory"))
    ax.legend(fontsize=8)
    return ax
