"""Figures of chapter 12 (glossary and review): where the glossary's terms are introduced, the
generation loop with what each step does to the KV cache, and the table of the source chapter's
learning goals against the exercises that show them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from llmlab.i18n import language, tr

_MARK_COLOURS = {
    "none": "#e5e7eb",
    "read": "#bfdbfe",
    "write": "#fde68a",
    "write_then_read": "#fca5a5",
}
_MARKS_ZH = {
    "none": "不涉及",
    "read": "读",
    "write": "写",
    "write_then_read": "先写后读",
}  # the legend in Chinese


def terms_per_chapter(entries: Sequence[Any] | None = None):
    """Bar chart: how many glossary terms each chapter introduces (`llmlab.course.glossary`)."""
    import matplotlib.pyplot as plt

    from llmlab.course import glossary

    fig, ax = plt.subplots(figsize=(8, 3.2))
    glossary.plot_terms_per_chapter(entries, ax=ax)
    fig.tight_layout()
    return fig


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
            (tr("prefill: n tokens", "prefill：n 个 token"), 0),
            (tr("decode: 1 token", "decode：1 个 token"), names.index(decode_starts_at)),
        )
    ):
        y = 1 - row
        ax.text(-0.9, y, label, ha="right", va="center", fontsize=9)
        for i, (step, mark) in enumerate(steps):
            if i < first:
                continue
            text = step + (
                tr("\n(per layer)", "\n（每层）")
                if step in ("qkv_projection", "attention", "ffn")
                else ""
            )
            if step == "attention":
                text += (
                    tr("\nwrite K/V, read all", "\n写入 K/V，读全部")
                    if row == 0
                    else tr("\nwrite 1, read history", "\n写入 1 个，读历史")
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
        handles=[Patch(facecolor=c, label=tr(m, _MARKS_ZH[m])) for m, c in _MARK_COLOURS.items()],
        title="KV cache",
        loc="lower left",
        fontsize=7,
        title_fontsize=8,
        ncol=4,
    )
    ax.set_title(
        tr(
            "One generation step, then the next: what each step does to the KV cache",
            "生成一步，再生成下一步：每一步对 KV cache 做了什么",
        )
    )
    fig.tight_layout()
    return fig


def goals_table(goals: Sequence[tuple[int, str, str, Sequence[str]]]) -> list[tuple[int, str, str]]:
    """Print the source chapter's learning goals, each with the exercises (ids) that show it;
    return the rows (goal number, English goal, exercise ids joined by commas). In Chinese the
    source chapter's own words stand alone (the English line is left out)."""
    rows = [(n, english, ", ".join(ids)) for n, _, english, ids in goals]
    for n, source_words, english, ids in goals:
        print(tr(f"Goal {n}. {source_words}", f"目标 {n}：{source_words}"))
        if language() == "en":
            print(f"        {english}")
        for i in range(0, len(ids), 4):
            if i == 0:
                lead = tr("        exercises: ", "        练习：")
            else:  # as wide on screen as the first line's lead (a Chinese character is two columns)
                lead = tr("                   ", "              ")
            print(lead, ", ".join(ids[i : i + 4]))
    return rows
