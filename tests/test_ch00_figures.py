"""The chapter map draws one box per chapter, with its number, in the colour of its part."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")

from matplotlib.patches import FancyBboxPatch  # noqa: E402

from llmlab.course.figures import ch00  # noqa: E402


def test_chapter_map_draws_one_box_per_chapter():
    import matplotlib.pyplot as plt

    fig = ch00.chapter_map()
    ax = fig.axes[0]
    boxes = [p for p in ax.patches if isinstance(p, FancyBboxPatch)]
    notebooks = sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("*.ipynb"))
    last = int(notebooks[-1].stem[:2])
    assert [b.get_gid() for b in boxes] == [f"chapter-{n:02d}" for n in range(1, last + 1)]
    texts = [t.get_text() for t in ax.texts]
    assert all(any(t.startswith(f"{n:02d}\n") for t in texts) for n in range(1, last + 1))
    edge = {num: part for num, _, part in ch00.CHAPTERS}
    for box, (num, _, _part) in zip(boxes, ch00.CHAPTERS):
        assert matplotlib.colors.same_color(box.get_edgecolor(), ch00.COLOURS[edge[num]][1])
    assert ax.get_title()
    plt.close(fig)
