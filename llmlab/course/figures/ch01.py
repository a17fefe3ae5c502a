"""Figures of chapter 01 (tokens)."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from llmlab.course.check.catalog import catalog
from llmlab.course.figures._axes import finish

M = catalog("figures.ch01")

SEED_RULE = {"tokens per English word": 1.3, "tokens per Chinese character": 2.0}


def token_ratios(
    measured: Mapping[str, Mapping[str, float]], rule: Mapping[str, float] = SEED_RULE
) -> Any:
    """Grouped bars: for each ratio of `rule` (e.g. "tokens per English word"), one bar per
    tokenizer in `measured` ({tokenizer label: {ratio name: value}}) and a grey bar for the
    source chapter's rule of thumb. Returns the Figure."""
    import matplotlib.pyplot as plt

    names = list(rule)
    series = list(measured.items()) + [(M("token_ratios.source_chapter_s"), dict(rule))]
    width = 0.8 / len(series)
    fig, ax = plt.subplots(figsize=(7, 3.2))
    for k, (label, values) in enumerate(series):
        xs = [i - 0.4 + width * (k + 0.5) for i in range(len(names))]
        colour = "#d1d5db" if k == len(series) - 1 else None
        bars = ax.bar(xs, [values[n] for n in names], width=width, label=label, color=colour)
        ax.bar_label(bars, fmt="%.2f", fontsize=7)
    ax.set_xticks(range(len(names)), [M.by_english(n, "ratio") for n in names])
    return finish(
        ax, ylabel=M("token_ratios.tokens"), title=M("token_ratios.measured_token_ratios"), legend=8
    )


def vocab_sizes(
    names: Sequence[str], vocab: Sequence[int], hidden: Sequence[int], dtype_bytes: int = 2
) -> Any:
    """Two panels: the vocabulary size of each model, and its embedding table
    (vocab × hidden × dtype_bytes) in GB. Returns the Figure."""
    import matplotlib.pyplot as plt

    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 3.2))
    a1.barh(names, [v / 1000 for v in vocab])
    a1.set_xlabel(M("vocab_sizes.vocabulary_size_thousands"))
    a1.set_title(M("vocab_sizes.vocabulary_sizes_presets"))
    a2.barh(names, [v * h * dtype_bytes / 1e9 for v, h in zip(vocab, hidden)], color="#f59e0b")
    return finish(
        a2,
        M("vocab_sizes.embedding_table_bytes", dtype_bytes=dtype_bytes),
        title=M("vocab_sizes.vocab_size_hidden"),
    )
