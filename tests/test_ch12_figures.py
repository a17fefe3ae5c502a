"""Chapter 12's figures and table draw and print what they are given."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import llmlab.course.figures.ch12 as fig12
from llmlab.course import glossary
from llmlab.course.check import ch12


def test_terms_per_chapter_bars_are_the_glossary_counts():
    fig = fig12.terms_per_chapter()
    heights = [p.get_height() for p in fig.axes[0].patches]
    assert heights == list(glossary.terms_per_chapter().values())


def test_generation_loop_draws_every_step_and_marks_attention():
    fig = fig12.generation_loop(ch12.LOOP_WITH_CACHE, ch12.DECODE_STARTS_AT)
    texts = [t.get_text() for t in fig.axes[0].texts]
    for step, _ in ch12.LOOP_WITH_CACHE:
        assert any(t.startswith(step) for t in texts), step
    # decode re-enters at embed: tokenize is drawn once (prefill only), embed twice
    assert sum(t.startswith("tokenize") for t in texts) == 1
    assert sum(t.startswith("embed") for t in texts) == 2
    attention = [t for t in fig.axes[0].texts if t.get_text().startswith("attention")]
    assert all("read" in t.get_text() for t in attention)
    colour = attention[0].get_bbox_patch().get_facecolor()
    assert matplotlib.colors.to_hex(colour) == fig12._MARK_COLOURS["write_then_read"]


def test_goals_table_prints_each_goal_with_its_exercises(capsys):
    rows = fig12.goals_table(ch12.LEARNING_GOALS)
    out = capsys.readouterr().out
    assert [r[0] for r in rows] == [1, 2, 3, 4]
    for _, source_words, _, ids in ch12.LEARNING_GOALS:
        assert source_words in out
        assert all(ex in out for ex in ids)
