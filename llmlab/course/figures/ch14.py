"""Figures of chapter 14 (speculative decoding). They present; the numbers come from
`llmlab.analysis.speculation` and `llmlab.bench.spec`."""

from __future__ import annotations

from typing import Any, Sequence

from llmlab.course.check.catalog import catalog
from llmlab.course.figures._axes import finish

M = catalog("figures.ch14")


def plot_verify_cost(num_tokens: Sequence[int], seconds: Sequence[float], context: int) -> Any:
    """A step's time against the tokens it runs (1 = a plain decode step, k + 1 = a verify step
    of k drafts), measured, with the line a step would follow if every token cost a full step."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.4))
    ms = [1e3 * s for s in seconds]
    ax.plot(num_tokens, ms, "o-", color="#2563eb", label=M("plot_verify_cost.measured"))
    ax.plot(
        num_tokens,
        [ms[0] * n for n in num_tokens],
        "--",
        color="#94a3b8",
        label=M("plot_verify_cost.if_each_token"),
    )
    return finish(ax, **M.figure("plot_verify_cost", context=context), legend=8)


def plot_speedup(speedups: dict[str, dict[int, float]]) -> Any:
    """Speed-up of speculation over plain decoding against batch size, one line per workload,
    measured, with the break-even line at 1."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.4))
    for (workload, by_batch), colour in zip(speedups.items(), ("#15803d", "#b45309")):
        batches = sorted(by_batch)
        label = M.by_english(workload, "workload")  # `bench.spec`'s workloads
        ax.plot(batches, [by_batch[b] for b in batches], "o-", color=colour, label=label)
    ax.axhline(1.0, color="#64748b", lw=1, ls="--", label=M("plot_speedup.break_even"))
    ax.set_xscale("log", base=2)
    return finish(ax, **M.figure("plot_speedup"), legend=8)
