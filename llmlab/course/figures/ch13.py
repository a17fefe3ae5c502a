"""Figures and tables of chapter 13 (dtypes and quantization). They present; the numbers come
from `llmlab.analysis.dtypes` and `llmlab.bench.quality`."""

from __future__ import annotations

from typing import Any, Sequence

from llmlab.analysis.dtypes import Format
from llmlab.i18n import tr
from llmlab.utils import format_table

SIGN, EXPONENT, MANTISSA, INTEGER = "#64748b", "#2563eb", "#f59e0b", "#15803d"


def plot_formats(fmts: Sequence[Format]) -> Any:
    """One bar per format, its bits split into sign, exponent and mantissa, and an integer
    format's value bits (it has neither exponent nor mantissa). Returns the Figure."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 2.8))
    names = [f.name for f in fmts][::-1]
    rows = list(fmts)[::-1]
    ax.barh(names, [1] * len(rows), color=SIGN, label=tr("sign", "符号位"))
    ax.barh(
        names,
        [f.exponent_bits for f in rows],
        left=[1] * len(rows),
        color=EXPONENT,
        label=tr("exponent (range)", "指数位（范围）"),
    )
    ax.barh(
        names,
        [f.mantissa_bits for f in rows],
        left=[1 + f.exponent_bits for f in rows],
        color=MANTISSA,
        label=tr("mantissa (precision)", "尾数位（精度）"),
    )
    ax.barh(
        names,
        [f.integer_bits for f in rows],
        left=[1 + f.exponent_bits + f.mantissa_bits for f in rows],
        color=INTEGER,
        label=tr("integer value bits (steps at a scale)", "整数数值位（按 scale 的台阶）"),
    )
    ax.set_xlabel(tr("bits per number", "每个数的位数"))
    ax.set_title(tr("Where the bits of each format go", "各格式的位都用在了哪里"))
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
    axes[0].set_ylabel(tr("MB of weights per step", "每步读取的权重（MB）"))
    axes[0].set_title(tr("Bytes a decode step reads", "一个 decode step 读取的字节数"))
    axes[1].bar(names, tokens_per_s, color=colours)
    axes[1].set_ylabel(tr("tokens/s at batch 1 (measured)", "batch 1 时的 tokens/s（实测）"))
    axes[1].set_title(
        tr("SmolLM2-135M on this machine (measured)", "SmolLM2-135M 在本机上（实测）")
    )
    fig.tight_layout()
    return fig


def quality_table(report: dict, weight_mb: dict[str, float]) -> str:
    """The rows of `bench.quality.measure` as a table: the weights a step reads, perplexity on
    the held-out text, and agreement with float32."""
    headers = [
        tr("precision", "精度"),
        tr("weights MB", "权重 MB"),
        tr("perplexity", "困惑度"),
        tr("top-1 same", "top-1 相同"),
        tr("greedy same", "greedy 相同"),
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
