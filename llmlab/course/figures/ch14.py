"""Figures of chapter 14 (speculative decoding). They present; the numbers come from
`llmlab.analysis.speculation` and `llmlab.bench.spec`."""

from __future__ import annotations

from typing import Any, Sequence

from llmlab.i18n import tr

WORKLOADS_ZH = {"repetitive": "重复性文本", "free-form": "自由生成"}  # `bench.spec`'s workloads


def plot_verify_cost(num_tokens: Sequence[int], seconds: Sequence[float], context: int) -> Any:
    """A step's time against the tokens it runs (1 = a plain decode step, k + 1 = a verify step
    of k drafts), measured, with the line a step would follow if every token cost a full step."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.4))
    ms = [1e3 * s for s in seconds]
    ax.plot(num_tokens, ms, "o-", color="#2563eb", label=tr("measured", "实测"))
    ax.plot(
        num_tokens,
        [ms[0] * n for n in num_tokens],
        "--",
        color="#94a3b8",
        label=tr("if each token cost a whole step", "假如每个 token 都要花一整步"),
    )
    ax.set_xlabel(tr("tokens in the step (k + 1)", "这一步里的 token 数（k + 1）"))
    ax.set_ylabel(tr("ms per step (measured)", "每步 ms（实测）"))
    ax.set_title(
        tr(
            f"SmolLM2-135M on this machine, batch 1, context {context}",
            f"SmolLM2-135M 在本机上，batch 1，上下文 {context}",
        )
    )
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def plot_speedup(speedups: dict[str, dict[int, float]]) -> Any:
    """Speed-up of speculation over plain decoding against batch size, one line per workload,
    measured, with the break-even line at 1."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.4))
    for (workload, by_batch), colour in zip(speedups.items(), ("#15803d", "#b45309")):
        batches = sorted(by_batch)
        label = tr(workload, WORKLOADS_ZH.get(workload, workload))
        ax.plot(batches, [by_batch[b] for b in batches], "o-", color=colour, label=label)
    ax.axhline(1.0, color="#64748b", lw=1, ls="--", label=tr("break-even", "持平"))
    ax.set_xscale("log", base=2)
    ax.set_xlabel(tr("batch size (requests)", "batch 大小（请求数）"))
    ax.set_ylabel(tr("speed-up over plain (measured)", "相对普通 decode 的加速比（实测）"))
    ax.set_title(tr("n-gram speculation on this machine", "本机上的 n-gram 投机解码"))
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig
