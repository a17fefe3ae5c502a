"""Figures of chapter 15 (structured output). They present; the numbers come from
`llmlab.analysis.structured`."""

from __future__ import annotations

from typing import Any

from llmlab.i18n import tr


def plot_validity(rates: dict[str, float], n: int) -> Any:
    """The share of answers that parse and validate, without the mask and with it (measured)."""
    import matplotlib.pyplot as plt

    labels = {
        "without": tr("without the mask", "不加掩码"),
        "with": tr("with the mask", "加上掩码"),
    }
    fig, ax = plt.subplots(figsize=(6, 2.6))
    keys = list(rates)
    bars = ax.barh(
        [labels.get(k, k) for k in keys],
        [100 * rates[k] for k in keys],
        color=["#b45309" if k == "without" else "#15803d" for k in keys],
    )
    for bar, k in zip(bars, keys):
        ax.text(
            bar.get_width() + 1,
            bar.get_y() + bar.get_height() / 2,
            f"{100 * rates[k]:.0f} %",
            va="center",
            fontsize=9,
        )
    ax.set_xlim(0, 110)
    ax.invert_yaxis()
    ax.set_xlabel(tr("answers that parse and validate (%)", "能解析且符合 schema 的回答（%）"))
    ax.set_title(
        tr(
            f"SmolLM2-135M, {n} prompts asking for a JSON person",
            f"SmolLM2-135M，{n} 个要求输出 JSON 人物的 prompt",
        )
    )
    fig.tight_layout()
    return fig


def plot_mask_cost(costs: dict[int, dict[str, float]]) -> Any:
    """Per batch size, a decode step's time split into the bitmask fill, applying the mask to
    the logits, and the rest of the step (forward and sampling), in ms (measured)."""
    import matplotlib.pyplot as plt

    batches = sorted(costs)
    fig, ax = plt.subplots(figsize=(7, 1.5 + 0.6 * len(batches)))
    parts = (
        ("fill", tr("fill the bitmask", "填 bitmask"), "#dc2626"),
        ("apply", tr("apply it to the logits", "作用到 logits"), "#f59e0b"),
        ("rest", tr("the rest of the step", "这一步的其余部分"), "#94a3b8"),
    )
    labels = [tr(f"batch {b}", f"batch {b}") for b in batches]
    left = [0.0] * len(batches)
    for key, label, colour in parts:
        ms = []
        for b in batches:
            c = costs[b]
            value = c["step"] - c["fill"] - c["apply"] if key == "rest" else c[key]
            ms.append(1e3 * value)
        ax.barh(labels, ms, left=left, color=colour, label=label)
        left = [a + b for a, b in zip(left, ms)]
    for y, b in enumerate(batches):
        c = costs[b]
        share = (c["fill"] + c["apply"]) / c["step"]
        ax.text(
            left[y] * 1.01,
            y,
            tr(f"mask {100 * share:.1f} %", f"掩码 {100 * share:.1f} %"),
            va="center",
            fontsize=8,
        )
    ax.set_xlim(0, max(left) * 1.25)
    ax.invert_yaxis()
    ax.set_xlabel(tr("ms per decode step (measured)", "每个 decode step 的 ms（实测）"))
    ax.set_title(tr("The mask's cost on this machine", "本机上掩码的开销"))
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.38), ncol=3, frameon=False)
    fig.tight_layout()
    return fig
