"""Figures and tables of chapter 13 (dtypes and quantization). They present; the numbers come
from `llmlab.analysis.dtypes` and `llmlab.bench.quality`."""

from __future__ import annotations

from typing import Any, Sequence

from llmlab.analysis.dtypes import Format
from llmlab.course.check.catalog import catalog
from llmlab.utils import format_table

M = catalog("figures.ch13")

SIGN, EXPONENT, MANTISSA, INTEGER = "#64748b", "#2563eb", "#f59e0b", "#15803d"


def plot_formats(fmts: Sequence[Format]) -> Any:
    """One bar per format, its bits split into sign, exponent and mantissa, and an integer
    format's value bits (it has neither exponent nor mantissa). Returns the Figure."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 2.8))
    names = [f.name for f in fmts][::-1]
    rows = list(fmts)[::-1]
    ax.barh(names, [1] * len(rows), color=SIGN, label=M("plot_formats.sign"))
    ax.barh(
        names,
        [f.exponent_bits for f in rows],
        left=[1] * len(rows),
        color=EXPONENT,
        label=M("plot_formats.exponent_range"),
    )
    ax.barh(
        names,
        [f.mantissa_bits for f in rows],
        left=[1 + f.exponent_bits for f in rows],
        color=MANTISSA,
        label=M("plot_formats.mantissa_precision"),
    )
    ax.barh(
        names,
        [f.integer_bits for f in rows],
        left=[1 + f.exponent_bits + f.mantissa_bits for f in rows],
        color=INTEGER,
        label=M("plot_formats.integer_value_bits"),
    )
    ax.set_xlabel(M("plot_formats.bits_per_number"))
    ax.set_title(M("plot_formats.where_bits_each"))
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    return fig


def plot_decode_speeds(
    names: Sequence[str], weight_mb: Sequence[float], tokens_per_s: Sequence[float]
) -> Any:
    """Left: the bytes of weights one step reads per precision; right: the batch-1 decode speed
    measured on this machine. Returns the Figure."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 3.2))
    colours = ["#2563eb", "#f59e0b", "#15803d", "#b91c1c"][: len(names)]
    axes[0].bar(names, weight_mb, color=colours)
    axes[0].set_ylabel(M("plot_decode_speeds.mb_weights_per"))
    axes[0].set_title(M("plot_decode_speeds.bytes_decode_step"))
    axes[1].bar(names, tokens_per_s, color=colours)
    axes[1].set_ylabel(M("plot_decode_speeds.tokens_s_batch"))
    axes[1].set_title(M("plot_decode_speeds.smollm2_135m_machine"))
    fig.tight_layout()
    return fig


def quality_table(report: dict, weight_mb: dict[str, float]) -> str:
    """The rows of `bench.quality.measure` as a table: the weights a step reads, perplexity on
    the held-out text, and agreement with float32."""
    headers = [
        M("quality_table.precision"),
        M("quality_table.weights_mb"),
        M("quality_table.perplexity"),
        M("quality_table.top_1_same"),
        M("quality_table.greedy_same"),
    ]
    rows = [
        [
            name,
            f"{weight_mb[name]:.0f}",
            f"{r['perplexity']:.2f}",
            f"{r['top1_agreement']:.1%}",
            f"{r['greedy_agreement']:.1%}",
        ]
        for name, r in report["rows"].items()
    ]
    return format_table(rows, headers)
