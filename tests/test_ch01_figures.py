"""Chapter 01's figures draw the values they are given."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from llmlab.course.figures import ch01  # noqa: E402


def test_token_ratios_draws_each_measurement_and_the_rule():
    measured = {
        "A": {"tokens per English word": 1.2, "tokens per Chinese character": 1.8},
        "B": {"tokens per English word": 2.9, "tokens per Chinese character": 1.7},
    }
    fig = ch01.token_ratios(measured)
    ax = fig.axes[0]
    heights = [round(p.get_height(), 6) for p in ax.patches]
    assert heights == [1.2, 1.8, 2.9, 1.7, 1.3, 2.0]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == [
        "A",
        "B",
        "the source chapter's rule of thumb",
    ]
    assert ax.get_ylabel() == "tokens"
    plt.close(fig)


def test_vocab_sizes_draws_vocab_and_embedding_bytes():
    fig = ch01.vocab_sizes(["m1", "m2"], [1000, 128256], [10, 4096])
    a1, a2 = fig.axes
    assert [p.get_width() for p in a1.patches] == pytest.approx([1.0, 128.256])
    assert [p.get_width() for p in a2.patches] == pytest.approx(
        [1000 * 10 * 2 / 1e9, 128256 * 4096 * 2 / 1e9]
    )
    assert "GB" in a2.get_xlabel()
    plt.close(fig)
