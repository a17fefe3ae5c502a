"""Figures of chapter 15 (structured output). They present; the numbers come from
`llmlab.analysis.structured`."""

from __future__ import annotations

from typing import Any

from llmlab.course.check.catalog import catalog
from llmlab.course.figures._axes import finish

M = catalog("figures.ch15")


def plot_validity(rates: dict[str, float], n: int) -> Any:
    """The share of answers that parse and validate, without the mask and with it (measured)."""
    import matplotlib.pyplot as plt

    labels = {
        "without": M("plot_validity.without_mask"),
        "with": M("plot_validity.mask"),
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
    return finish(
        ax,
        M("plot_validity.answers_parse_validate"),
        title=M("plot_validity.smollm2_135m_prompts", n=n),
    )


def plot_mask_cost(costs: dict[int, dict[str, float]]) -> Any:
    """Per batch size, a decode step's time split into the bitmask fill, applying the mask to
    the logits, and the rest of the step (forward and sampling), in ms (measured)."""
    import matplotlib.pyplot as plt

    batches = sorted(costs)
    fig, ax = plt.subplots(figsize=(7, 1.5 + 0.6 * len(batches)))
    parts = (
        ("fill", M("plot_mask_cost.fill_bitmask"), "#dc2626"),
        ("apply", M("plot_mask_cost.apply_logits"), "#f59e0b"),
        ("rest", M("plot_mask_cost.rest_step"), "#94a3b8"),
    )
    labels = [M("plot_mask_cost.batch", b=b) for b in batches]
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
            M("plot_mask_cost.mask", v_100_share=100 * share),
            va="center",
            fontsize=8,
        )
    ax.set_xlim(0, max(left) * 1.25)
    ax.invert_yaxis()
    ax.set_xlabel(M("plot_mask_cost.ms_per_decode"))
    ax.set_title(M("plot_mask_cost.mask_s_cost"))
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.38), ncol=3, frameon=False)
    fig.tight_layout()
    return fig
