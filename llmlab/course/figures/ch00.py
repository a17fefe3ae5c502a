"""Figures of chapter 00 (setup and map)."""

from __future__ import annotations

from typing import Any

from llmlab.course.check.catalog import catalog

M = catalog("figures.ch00")

# (number, title, part) of every chapter after this one; the parts follow the colours of the
# source chapter's flowchart: the model itself, performance on the hardware, the serving system;
# then the Going further part, past the source chapter's path.
CHAPTERS: tuple[tuple[str, str, str], ...] = (
    ("01", "Tokens", "model"),
    ("02", "Attention", "model"),
    ("03", "Generation", "model"),
    ("04", "KV cache", "model"),
    ("05", "Prefill vs decode", "model"),
    ("06", "Memory hierarchy", "hardware"),
    ("07", "Roofline", "hardware"),
    ("08", "Batching", "hardware"),
    ("09", "Parallelism", "serving"),
    ("10", "Metrics", "serving"),
    ("11", "vLLM arrives\n(PagedAttention)", "serving"),
    ("12", "Glossary & review", "serving"),
    ("13", "Dtypes &\nquantization", "further"),
    ("14", "Speculative\ndecoding", "further"),
    ("15", "Structured\noutput", "further"),
    ("16", "A step\non a GPU", "further"),
)
COLOURS = {
    "model": ("#eff5ff", "#2563eb"),
    "hardware": ("#fef3c7", "#b45309"),
    "serving": ("#dcfce7", "#15803d"),
    "further": ("#f1f5f9", "#64748b"),
}


def chapter_map(chapters: tuple[tuple[str, str, str], ...] = CHAPTERS, per_row: int = 6) -> Any:
    """The course as boxes and arrows, one box per chapter, coloured by part. Returns the Figure."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyBboxPatch, Patch

    rows = (len(chapters) + per_row - 1) // per_row
    fig, ax = plt.subplots(figsize=(12, 1.8 * rows + 0.6))
    for i, (num, title, part) in enumerate(chapters):
        row, col = divmod(i, per_row)
        x, y = col * 2.0, -row * 1.6
        fill, edge = COLOURS[part]
        ax.add_patch(
            FancyBboxPatch(
                (x, y),
                1.6,
                1.0,
                boxstyle="round,pad=0.05",
                fc=fill,
                ec=edge,
                lw=2,
                gid=f"chapter-{num}",
            )
        )
        shown = M.by_english(title, "title")
        ax.text(x + 0.8, y + 0.5, f"{num}\n{shown}", ha="center", va="center", fontsize=8)
        last = i == len(chapters) - 1
        if col < per_row - 1 and not last:
            ax.annotate(
                "",
                xy=(x + 2.0, y + 0.5),
                xytext=(x + 1.65, y + 0.5),
                arrowprops=dict(arrowstyle="->"),
            )
        elif not last:  # wrap to the first box of the next row
            ax.annotate(
                "",
                xy=(0.8, y - 0.55),
                xytext=(x + 0.8, y - 0.05),
                arrowprops=dict(arrowstyle="->", connectionstyle="arc3,rad=-0.1"),
            )
    ax.legend(
        handles=[
            Patch(fc=f, ec=e, label=label)
            for label, (f, e) in (
                (M("chapter_map.model"), COLOURS["model"]),
                (M("chapter_map.performance_hardware"), COLOURS["hardware"]),
                (M("chapter_map.serving_system"), COLOURS["serving"]),
                (M("chapter_map.going_further"), COLOURS["further"]),
            )
        ],
        loc="upper center",
        bbox_to_anchor=(0.5, 0.0),
        ncol=4,
        fontsize=8,
        frameon=False,
    )
    ax.set_xlim(-0.2, per_row * 2.0)
    ax.set_ylim(-1.6 * (rows - 1) - 0.4, 1.2)
    ax.axis("off")
    ax.set_title(M("chapter_map.chapter_map_token"))
    return fig
