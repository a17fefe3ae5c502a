"""Figures of chapter 11 (vLLM arrives): KV memory waste simulated and measured, the per-step
token split of chunked prefill, and the throughput benchmark's bars. Each function returns the
matplotlib Figure it drew."""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from llmlab.sim import WasteResult, plot_kv_waste

PREFILL_COLOUR = "#2563eb"
DECODE_COLOUR = "#d97706"


def kv_waste(waste: WasteResult, block_sizes: Sequence[int], paged_waste: Sequence[float]) -> Any:
    """Left: reserved vs used KV slots per step on one trace (contiguous max-length reservation
    and paging). Right: the paged waste (fractions) against block size, with the contiguous
    waste as a dashed line."""
    import matplotlib.pyplot as plt

    if len(block_sizes) != len(paged_waste) or not block_sizes:
        raise ValueError(f"block_sizes and paged_waste must be non-empty and of equal length, "
                         f"got {len(block_sizes)} and {len(paged_waste)}")
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 4), gridspec_kw={"width_ratios": [1.6, 1]})
    plot_kv_waste(waste, ax=ax1)
    ax2.plot(list(block_sizes), [100 * p for p in paged_waste], "o-", label="paged (simulated)")
    ax2.axhline(100 * waste.contiguous_waste, color="#b45309", ls="--",
                label="contiguous, max_model_len")
    ax2.set_xscale("log", base=2)
    ax2.set_xlabel("block size (tokens)")
    ax2.set_ylabel("KV slots wasted (%)")
    ax2.set_title("Waste against block size (same trace)")
    ax2.legend(fontsize=8)
    fig.tight_layout()
    return fig


def measured_waste(measured: WasteResult, title: str) -> Any:
    """Reserved vs used KV slots per step, measured on the engine, on a log scale."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 4))
    plot_kv_waste(measured, ax=ax)
    ax.set_yscale("log")
    ax.set_ylabel("KV slots (tokens, log scale)")
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
        raise ValueError("rows must hold at least one step")
    steps = list(range(1, len(rows) + 1))
    prefill = [r["prefill"] for r in rows]
    decode = [r["decode"] for r in rows]
    fig, ax = plt.subplots(figsize=(max(5, 0.6 * len(rows) + 3), 3.6))
    ax.bar(steps, prefill, color=PREFILL_COLOUR, label="prefill tokens (prompt chunk)")
    ax.bar(steps, decode, bottom=prefill, color=DECODE_COLOUR, label="decode tokens (1 per running request)")
    ax.axhline(budget, color="black", ls="--", lw=1, label=f"max_num_batched_tokens = {budget}")
    for x, p, d in zip(steps, prefill, decode):     # the decode share is too thin to see: write it
        ax.text(x, p + d + budget * 0.02, f"{p} + {d}", ha="center", va="bottom", fontsize=8)
    ax.set_xticks(steps)
    ax.set_xlabel("engine step")
    ax.set_ylabel("tokens scheduled")
    ax.set_ylim(0, budget * 1.45)
    ax.set_title(title or "Chunked prefill: one long prompt sharing steps with decodes")
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
        raise ValueError("the report holds no systems")
    fig, ax = plt.subplots(figsize=(7, 0.5 * len(names) + 1.6))
    ax.barh(names, [systems[n]["tok_per_s"] for n in names],
            color=["#2563eb" if n.startswith("llmlab") else "#9ca3af" for n in names])
    ax.invert_yaxis()
    ax.set_xlabel("output tokens per second (measured)")
    machine = report.get("machine", {})
    ax.set_title(f"Same requests, same weights: {report['settings']['num_requests']} requests, "
                 f"{machine.get('threads', '?')} threads on this machine")
    fig.tight_layout()
    return fig
