"""The question decorators (`llmlab.course.check.question`): a question written as the function
that computes its answer becomes the checker the notebook calls, named "<chapter>.<name>", with
the catalog's default hint and formula read by that name."""

from __future__ import annotations

import inspect

import pytest

from llmlab.course.check import core
from llmlab.course.check.catalog import catalog
from llmlab.course.check.ch09 import questions as ch09
from llmlab.course.check.question import Expected, numeric
from llmlab.parallel import pp

M = catalog("ch09")


@pytest.fixture(autouse=True)
def fresh_tries(monkeypatch):
    monkeypatch.setattr(core, "_WRONG_TRIES", {})


def test_a_numeric_question_checks_as_its_chapter_names_it():
    expected = pp.theoretical_bubble(ch09.BUBBLE_P, ch09.BUBBLE_M)
    right = ch09.bubble_fraction(expected)
    assert right.passed and right.exercise == "ch09.bubble_fraction"
    percent = ch09.bubble_fraction(100 * expected)
    assert not percent.passed and percent.message == M("bubble_fraction.percentage")
    assert ch09.bubble_fraction.__name__ == "bubble_fraction"
    assert "idle" in ch09.bubble_fraction.__doc__
    assert list(inspect.signature(ch09.bubble_fraction).parameters) == ["answer"]


def test_the_catalog_default_hint_then_the_formula_by_the_question_name():
    first = ch09.bubble_fraction(0.123)  # no mistake explains it
    assert first.message == M("bubble_fraction.default_hint")
    second = ch09.bubble_fraction(0.123)
    assert second.message.startswith(M("bubble_fraction.default_hint"))
    assert M("bubble_fraction.formula") in second.message


def test_a_choice_question_takes_its_hints_from_the_table_of_keys():
    assert ch09.dp_at_low_load("c").passed
    wrong = ch09.dp_at_low_load("e")
    assert not wrong.passed and wrong.message == M(ch09.DP_HINTS["e"])
    assert not ch09.dp_at_low_load(None).passed


def test_a_question_outside_a_chapter_is_refused():
    def loose() -> Expected:
        return Expected(1.0)

    loose.__module__ = "llmlab.course.widgets.kv"
    with pytest.raises(ValueError, match="chapter"):
        numeric()(loose)
