"""Choosing the language, and Chinese in figures: with the CJK font every glyph is drawn (no
"Glyph ... missing" warning); without it the same figure warns (so the check can fail)."""

from __future__ import annotations

import io
import warnings

import matplotlib
import pytest

matplotlib.use("Agg")

from llmlab import i18n  # noqa: E402

TITLE = "每个词元的 KV 缓存（字节）"


def _glyph_warnings() -> list[str]:
    import matplotlib.pyplot as plt

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fig, ax = plt.subplots()
        ax.set_title(TITLE)
        ax.set_xlabel("批大小")
        fig.savefig(io.BytesIO(), format="png")
        plt.close(fig)
    return [str(w.message) for w in caught if "Glyph" in str(w.message)]


def test_language_defaults_to_english_and_refuses_others(monkeypatch):
    monkeypatch.setattr(i18n, "_chosen", None)
    monkeypatch.delenv(i18n.LANG_ENV, raising=False)
    assert i18n.language() == "en"
    monkeypatch.setenv(i18n.LANG_ENV, "zh")
    assert i18n.language() == "zh"
    with pytest.raises(ValueError, match="lang must be one of"):
        i18n.set_language("fr")


def test_chinese_figure_draws_every_glyph(monkeypatch):
    assert i18n.cjk_font_path() is not None, "the set-up did not install the CJK font"
    with matplotlib.rc_context({"font.family": ["sans-serif"], "font.sans-serif": ["DejaVu Sans"]}):
        assert _glyph_warnings(), "without a CJK font the figure should warn about missing glyphs"
    with matplotlib.rc_context():
        monkeypatch.setattr(i18n, "_chosen", None)
        assert i18n.set_language("zh") is None  # a notebook cell calling it echoes nothing
        assert i18n.language() == "zh"
        assert _glyph_warnings() == []
    monkeypatch.setattr(i18n, "_chosen", None)
