"""Chapter 00's self-checks: right answers pass, typical mistakes get a hint that names them,
hints come in stages, no string the module holds (or code a hint shows) passes as an answer, and
the options the notebook lists are the ones the checkers grade.

`literal_answers` and `assert_no_literal_passes` are shared with the tests of chapters 01 and 03.
"""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path

import nbformat
import pytest

from llmlab.course.check import ch00, core
from llmlab.course.check.core import NOT_ANSWERED

ROOT = Path(__file__).resolve().parent.parent
BACKTICKED = re.compile(r"`([^`]+)`")


def literal_answers(module) -> list:
    """Every str literal of `module`, and the value of every `backticked` snippet in them that
    evaluates in the module's namespace: what a student could paste from the checker's text."""
    strings = [
        node.value
        for node in ast.walk(ast.parse(inspect.getsource(module)))
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
    ]
    answers: list = list(dict.fromkeys(strings))
    for s in strings:
        for snippet in BACKTICKED.findall(s):
            try:
                answers.append(eval(snippet, dict(vars(module))))  # noqa: S307 - our own module's text
            except Exception:
                pass
    return answers


def assert_no_literal_passes(module, exercises=None) -> None:
    for name in exercises or module.EXERCISES:
        checker = getattr(module, name)
        passing = [a for a in literal_answers(module) if checker(a).passed]
        assert not passing, f"{module.__name__}.{name} passes on its own text: {passing!r}"


def test_no_literal_of_the_module_passes():
    assert_no_literal_passes(ch00)


def test_every_exercise_is_described():
    assert set(ch00.EXERCISES) == {
        "throughput_vs_wait",
        "number_kinds",
        "dominant_step",
        "symptom_to_chapter",
    }
    kinds = [info.kind for info in ch00.EXERCISES.values()]
    assert kinds.count("reasoning") >= 2


def test_right_answers_pass():
    import llmlab.ops

    assert ch00.num_chapters(13).passed
    assert ch00.module_for_paged_attention(llmlab.ops).passed
    assert ch00.module_for_paged_attention("llmlab.ops").passed
    assert ch00.fast_mode("b").passed
    assert ch00.throughput_vs_wait("C").passed
    assert ch00.number_kinds(
        {
            "head_size_of_hidden_4096_and_32_heads": "derive",
            "tokens_per_english_word": "measure",
            "decode_step_ms_70b_on_h100": "compute",
            "kv_bytes_per_token_llama3_70b": "derive",
            "ms_per_token_smollm2_here": "measure",
        }
    ).passed
    assert ch00.dominant_step("B").passed
    assert ch00.symptom_to_chapter(
        {
            "first_word_late": 10,
            "memory_runs_out": "11",
            "batch_is_free": "7",
            "needs_nvlink": "09",
            "chinese_costs_more": 1,
        }
    ).passed


def test_none_is_not_yet():
    for name in ch00.EXERCISES:
        assert getattr(ch00, name)(None).message == NOT_ANSWERED


def test_decode_dominates_on_the_presets():
    prefill, decode = ch00.phase_floors()
    assert decode > 10 * prefill  # the reason option (b) is the right one


def test_dominant_step_hints_come_in_stages():
    core._WRONG_TRIES.pop("ch00.dominant_step", None)
    first = ch00.dominant_step("a").message
    second = ch00.dominant_step("a").message
    assert "token counts" in first and "bandwidth" not in first
    assert second.startswith(first) and "bandwidth" in second
    assert "ms" not in first + second  # the preset times only come with a pass


def test_symptom_hint_names_the_wrong_pairing():
    right = {
        "first_word_late": "05",
        "memory_runs_out": "04",
        "batch_is_free": "08",
        "needs_nvlink": "09",
        "chinese_costs_more": "01",
    }
    r = ch00.symptom_to_chapter({**right, "memory_runs_out": "06"})
    assert not r.passed and "memory_runs_out" in r.message and "grows" in r.message
    assert "first_word_late" not in r.message


def _markdown(name: str) -> str:
    nb = nbformat.read(ROOT / "notebooks" / name, as_version=4)
    return "\n".join(c.source for c in nb.cells if c.cell_type == "markdown")


@pytest.mark.parametrize("options", [ch00.GOALS_OPTIONS, ch00.DOMINANT_OPTIONS])
def test_the_notebook_lists_the_options_the_checker_grades(options):
    """The markdown lists them as "- (a) ..." one per line, lettered as the checker letters them."""
    listed = "\n".join(f"- ({letter}) {text}" for letter, (text, _) in zip(ch00.LETTERS, options))
    assert listed in _markdown("00-setup-and-map.ipynb")


def test_chapter_00_grades_ideas_not_course_trivia():
    """The chapter asks about the series' question and how its numbers are obtained, not the
    chapter count, a module's name or a test switch (those checkers stay as the grader's fixtures)."""
    nb = nbformat.read(ROOT / "notebooks" / "00-setup-and-map.ipynb", as_version=4)
    from llmlab.course.instructor import exercise_ids

    assert exercise_ids(nb) == [
        "ch00.throughput_vs_wait",
        "ch00.dominant_step",
        "ch00.number_kinds",  # Going further, after the required two
        "ch00.symptom_to_chapter",
    ]


def test_throughput_vs_wait_says_why_a_change_helps_both_goals(monkeypatch):
    from llmlab.course.check import core

    monkeypatch.setattr(core, "_WRONG_TRIES", {})
    letters, right = ch00._lettered(ch00.GOALS_OPTIONS)
    assert right == {"c"}
    assert "both goals" in ch00.throughput_vs_wait("a").message
    assert "KV cache" in ch00.throughput_vs_wait("b").message
    assert "quality" in ch00.throughput_vs_wait("d").message


def test_number_kinds_names_the_wrong_number():
    right = dict(ch00._NUMBER_KIND)
    r = ch00.number_kinds(dict(right, decode_step_ms_70b_on_h100="measure"))
    assert (
        not r.passed and "decode_step_ms_70b_on_h100" in r.message and "without a GPU" in r.message
    )
    assert "tokens_per_english_word" not in r.message
