"""Every build exercise against its planted bugs (`tests/planted/`): the notebook's solution
passes its checker, and each realistic wrong solution fails on a first try with a hint that names
the rule it broke (the text of its catalog key), in English; the first bug of each exercise in
Chinese too. Each runs the path of `python -m llmlab check chNN` (`cli.main` on a module holding
the source) where the chapter lists the exercise in `BUILDS`, else the notebook's: the module's
definitions loaded as the command loads them (`cli.load_definitions`), the checker called on them.
"""

from __future__ import annotations

import importlib
import re

import nbformat
import pytest
from planted import (
    ROOT,
    Exercise,
    ch01,
    ch02,
    ch03,
    ch04,
    ch07,
    ch08,
    ch09,
    ch10,
    ch11,
    ch13,
    ch14,
    ch15,
    ch16,
    rule_text,
)

from llmlab.course.check import cli
from llmlab.course.check.core import CheckResult
from llmlab.course.instructor.exercises import exercise_calls

pytestmark = pytest.mark.usefixtures("first_try")  # each run: a student's first try, in English

MODULES = (ch01, ch02, ch03, ch04, ch07, ch08, ch09, ch10, ch11, ch13, ch14, ch15, ch16)
EXERCISES = [exercise for module in MODULES for exercise in module.EXERCISES]
MIN_BUGS = 6


def _builds(chapter: str) -> dict[str, str]:
    return getattr(importlib.import_module(f"llmlab.course.check.{chapter}"), "BUILDS", {})


def check(exercise: Exercise, source: str, tmp_path, capsys) -> tuple[bool, str]:
    """(passed, what the student reads) for `source` as the answer to `exercise`."""
    chapter, name = exercise.id.split(".")
    path = tmp_path / f"{chapter}_answer.py"
    path.write_text(source, encoding="utf-8")
    if exercise.id in _builds(chapter):  # python -m llmlab check chNN answer.py
        code = cli.main([chapter, str(path)])
        return code == 0, capsys.readouterr().out
    checker = getattr(importlib.import_module(f"llmlab.course.check.{chapter}"), name)
    result: CheckResult = checker(exercise.answer_from(cli.load_definitions(path)))
    capsys.readouterr()
    return result.passed, result.message


def _params(with_bugs: bool, first_only: bool = False) -> list:
    out = []
    for ex in EXERCISES:
        if not with_bugs:
            out.append(pytest.param(ex, id=ex.id, marks=(*ex.marks, *ex.solution_marks)))
            continue
        for bug in ex.bugs[:1] if first_only else ex.bugs:
            out.append(pytest.param(ex, bug, id=f"{ex.id}-{bug.name}", marks=ex.marks))
    return out


def _function_exercises() -> set[str]:
    """The exercises whose checker a notebook calls on a function or class the notebook
    defines, and those the chapters list in BUILDS: every one must have planted bugs."""
    found = set()
    for path in sorted((ROOT / "notebooks").glob("[0-9][0-9]-*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        defined = set()
        for cell in nb.cells:
            if cell.cell_type == "code":
                defined |= set(re.findall(r"^(?:def|class) (\w+)", cell.source, re.M))
        for ex, index in exercise_calls(nb):
            call = re.search(rf"{re.escape(ex.split('.')[1])}\((\w+)\)", nb.cells[index].source)
            if call and call[1] in defined:
                found.add(ex)
        found |= set(_builds(f"ch{path.name[:2]}"))
    return found


def test_every_build_exercise_has_its_planted_bugs():
    ids = [ex.id for ex in EXERCISES]
    assert len(ids) == len(set(ids))
    assert _function_exercises() <= set(ids), sorted(_function_exercises() - set(ids))
    for ex in EXERCISES:
        names = [bug.name for bug in ex.bugs]
        assert len(names) >= MIN_BUGS and len(set(names)) == len(names), (ex.id, names)
        assert len({bug.source for bug in ex.bugs} | {ex.solution}) == len(names) + 1, ex.id
        for bug in ex.bugs:
            assert all(len(rule_text(rule)) >= 12 for rule in bug.rules), (ex.id, bug.name)


@pytest.mark.parametrize("exercise", _params(with_bugs=False))
def test_the_notebooks_solution_passes(exercise, tmp_path, capsys):
    passed, text = check(exercise, exercise.solution, tmp_path, capsys)
    assert passed, text


@pytest.mark.parametrize("exercise, bug", _params(with_bugs=True))
def test_a_planted_bug_fails_with_a_hint_naming_its_rule(exercise, bug, tmp_path, capsys):
    passed, text = check(exercise, bug.source, tmp_path, capsys)
    assert not passed, f"{exercise.id}: the planted bug {bug.name!r} passes"
    assert any(rule_text(rule) in text for rule in bug.rules), (bug.rules, text)


@pytest.mark.parametrize("exercise, bug", _params(with_bugs=True, first_only=True))
def test_the_rule_is_named_in_chinese_too(exercise, bug, tmp_path, capsys):
    from llmlab import i18n

    i18n.set_language("zh")
    passed, text = check(exercise, bug.source, tmp_path, capsys)
    assert not passed and any(rule_text(rule) in text for rule in bug.rules), (bug.rules, text)
