"""Figures of chapter 12 (glossary and review): where the glossary's terms are introduced, the
generation loop with what each step does to the KV cache, and the table of the source chapter's
learning goals against the exercises that show them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from llmlab.course.check.catalog import catalog
from llmlab.course.figures._axes import finish
from llmlab.i18n import language
from llmlab.utils import width

M = catalog("figures.ch12")

_MARK_COLOURS = {
    "none": "#e5e7eb",
    "read": "#bfdbfe",
    "write": "#fde68a",
    "write_then_read": "#fca5a5",
}


def terms_per_chapter(entries: Sequence[Any] | None = None):
    """Bar chart: how many glossary terms each chapter introduces (`llmlab.course.glossary`)."""
    import matplotlib.pyplot as plt

    from llmlab.course import glossary

    counts = glossary.terms_per_chapter(entries)
    fig, ax = plt.subplots(figsize=(8, 3.2))
    ax.bar([f"{c:02d}" for c in counts], list(counts.values()), color="#2563eb")
    return finish(ax, **M.figure("terms_per_chapter", terms=sum(counts.values())))


def generation_loop(steps: Sequence[tuple[str, str]], decode_starts_at: str):
    """The loop as two rows of boxes, prefill (every step) and decode (from `decode_starts_at`),
    each box coloured by what the step does to the KV cache; an arrow closes the loop."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyArrowPatch, Patch

    names = [s for s, _ in steps]
    fig, ax = plt.subplots(figsize=(13, 3.4))
    dx = 1.5  # horizontal room per step
    for row, (label, first) in enumerate(
        (
            (M("generation_loop.prefill_n_tokens"), 0),
            (M("generation_loop.decode_1_token"), names.index(decode_starts_at)),
        )
    ):
        y = 1 - row
        ax.text(-0.9, y, label, ha="right", va="center", fontsize=9)
        for i, (step, mark) in enumerate(steps):
            if i < first:
                continue
            text = step + (
                M("generation_loop.per_layer")
                if step in ("qkv_projection", "attention", "ffn")
                else ""
            )
            if step == "attention":
                text += (
                    M("generation_loop.write_k_v")
                    if row == 0
                    else M("generation_loop.write_1_read")
                )
            ax.text(
                i * dx,
                y,
                text,
                ha="center",
                va="center",
                fontsize=8,
                bbox={"boxstyle": "round", "facecolor": _MARK_COLOURS.get(mark, "white")},
            )
    ax.add_patch(
        FancyArrowPatch(
            ((len(steps) - 1) * dx, 0.72),
            (names.index(decode_starts_at) * dx, 0.28),
            arrowstyle="->",
            mutation_scale=12,
            color="#6b7280",
        )
    )
    ax.set_xlim(-3.6, (len(steps) - 1) * dx + 0.8)
    ax.set_ylim(-0.5, 1.5)
    ax.axis("off")
    ax.legend(
        handles=[
            Patch(facecolor=c, label=M.by_english(m, "mark")) for m, c in _MARK_COLOURS.items()
        ],
        title="KV cache",
        loc="lower left",
        fontsize=7,
        title_fontsize=8,
        ncol=4,
    )
    ax.set_title(M("generation_loop.one_generation_step"))
    fig.tight_layout()
    return fig


def goals_table(goals: Sequence[tuple[int, str, str, Sequence[str]]]) -> list[tuple[int, str, str]]:
    """Print the source chapter's learning goals, each with the exercises (ids) that show it;
    return the rows (goal number, English goal, exercise ids joined by commas). In Chinese the
    source chapter's own words stand alone (the English line is left out)."""
    rows = [(n, english, ", ".join(ids)) for n, _, english, ids in goals]
    for n, source_words, english, ids in goals:
        print(M("goals_table.goal", n=n, source_words=source_words))
        if language() == "en":
            print(f"        {english}")
        first = M("goals_table.exercises")
        for i in range(0, len(ids), 4):
            # the next lines' lead is as wide on screen as the first's (a Chinese character is two
            # columns)
            lead = first if i == 0 else " " * width(first)
            print(lead, ", ".join(ids[i : i + 4]))
    return rows
