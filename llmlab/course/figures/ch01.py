"""Figures of chapter 01 (tokens)."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from llmlab.i18n import tr

SEED_RULE = {"tokens per English word": 1.3, "tokens per Chinese character": 2.0}
# the ratios' names in Chinese, looked up when the figure is drawn
RULE_ZH = {
    "tokens per English word": "每个英文单词的 token 数",
    "tokens per Chinese character": "每个汉字的 token 数",
}


def token_ratios(
    measured: Mapping[str, Mapping[str, float]], rule: Mapping[str, float] = SEED_RULE
) -> Any:
    """Grouped bars: for each ratio of `rule` (e.g. "tokens per English word"), one bar per
    tokenizer in `measured` ({tokenizer label: {ratio name: value}}) and a grey bar for the
    source chapter's rule of thumb. Returns the Figure."""
    import matplotlib.pyplot as plt

    names = list(rule)
    series = list(measured.items()) + [
        (tr("the source chapter's rule of thumb", "原章节的经验值"), dict(rule))
    ]
    width = 0.8 / len(series)
    fig, ax = plt.subplots(figsize=(7, 3.2))
    for k, (label, values) in enumerate(series):
        xs = [i - 0.4 + width * (k + 0.5) for i in range(len(names))]
        colour = "#d1d5db" if k == len(series) - 1 else None
        bars = ax.bar(xs, [values[n] for n in names], width=width, label=label, color=colour)
        ax.bar_label(bars, fmt="%.2f", fontsize=7)
    ax.set_xticks(range(len(names)), [tr(n, RULE_ZH.get(n, n)) for n in names])
    ax.set_ylabel(tr("tokens", "token 数"))
    ax.set_title(
        tr(
            "Measured token ratios (this text) vs the source chapter's rule of thumb",
            "实测的 token 比例（本段文本）与原章节的经验值",
        )
    )
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def vocab_sizes(
    names: Sequence[str], vocab: Sequence[int], hidden: Sequence[int], dtype_bytes: int = 2
) -> Any:
    """Two panels: the vocabulary size of each model, and its embedding table
    (vocab × hidden × dtype_bytes) in GB. Returns the Figure."""
    import matplotlib.pyplot as plt

    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 3.2))
    a1.barh(names, [v / 1000 for v in vocab])
    a1.set_xlabel(tr("vocabulary size (thousands of tokens)", "词表大小（千个 token）"))
    a1.set_title(
        tr(
            "Vocabulary sizes (presets from data/models.json)",
            "词表大小（data/models.json 中的预设）",
        )
    )
    a2.barh(names, [v * h * dtype_bytes / 1e9 for v, h in zip(vocab, hidden)], color="#f59e0b")
    a2.set_xlabel(
        tr(
            f"embedding table, {dtype_bytes} bytes per number (GB)",
            f"embedding 表，每个数 {dtype_bytes} 字节（GB）",
        )
    )
    a2.set_title(
        tr(
            "vocab_size × hidden_size × bytes per number",
            "vocab_size × hidden_size × 每个数的字节数",
        )
    )
    fig.tight_layout()
    return fig
