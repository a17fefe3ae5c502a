"""Planted bugs of the build exercises: for every exercise in which the student writes a function
or a class that a checker drives, the worked solution and realistic wrong solutions (an off-by-one,
a wrong row or axis, a wrong order, a rule of the mechanism broken, an edge case dropped), each
with the rule its hint must name on a first try.

One module per chapter (`chNN.py`) holds `EXERCISES`, a list of `Exercise`. A solution is the
notebook's own (its skeleton cell with the solution in, read from `notebooks/`); a bug is that
source with one slip planted by text replacement (`planted`), so that a change of the notebook's
solution that drops the slipped line fails loudly. `tests/test_planted_bugs.py` runs each through
the path of the notebook and of `python -m llmlab check chNN`: the source written to a module,
its definitions loaded by `cli.load_definitions`, the chapter's checker called on them.

A rule is "<catalog>:<key>" (`llmlab/course/check/messages/<catalog>.json`): the test asserts
that the first-try hint holds that text's longest literal piece, in the language in use.
"""

from __future__ import annotations

import ast
import re
import string
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import nbformat

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Bug:
    """A wrong solution: `source` defines the exercise's name with one slip; its hint must show
    the text of `rule` ("<catalog>:<key>"), or of one of them when it is a tuple (the forms of
    one rule: for one block and for several)."""

    name: str
    source: str
    rule: str | tuple[str, ...]

    @property
    def rules(self) -> tuple[str, ...]:
        return (self.rule,) if isinstance(self.rule, str) else self.rule


@dataclass(frozen=True)
class Exercise:
    """A build exercise: its checker `id` ("ch08.build_scheduler"), the `name` the student's
    code defines, the notebook's `solution` and the `bugs`. `answer(namespace)` turns the loaded
    definitions into the checker's argument (by default the object named `name`; chapter 04's
    checker takes the text the student's loop generates). `marks`: pytest marks of all its runs;
    `solution_marks`: those of the solution's run alone (a passing check goes on to the engine,
    the real model, processes of its own, where a planted bug fails before)."""

    id: str
    name: str
    solution: str
    bugs: tuple[Bug, ...]
    answer: Callable[[dict], Any] | None = None
    marks: tuple = field(default=())
    solution_marks: tuple = field(default=())

    def answer_from(self, namespace: dict) -> Any:
        return self.answer(namespace) if self.answer else namespace[self.name]

    def bug(self, name: str) -> Bug:
        """The planted bug called `name` (the tests of the grader's sandbox reuse a few)."""
        (found,) = [b for b in self.bugs if b.name == name]
        return found


def _keeps(node: ast.stmt) -> bool:
    """A statement of a definition: an import, a def, a class, or a name bound to a literal."""
    if isinstance(node, (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.ClassDef)):
        return True
    if isinstance(node, ast.Assign) and all(isinstance(t, ast.Name) for t in node.targets):
        try:
            ast.literal_eval(node.value)
        except ValueError:
            return False
        return True
    return False


def notebook_definitions(stem: str, defines: str) -> str:
    """The definitions of the instructor's code cell of `notebooks/<stem>.ipynb` that defines
    `defines` (a def or a class at the cell's top level), solution markers dropped: its imports,
    defs, classes and literal constants, without the checker call some cells end with."""
    nb = nbformat.read(ROOT / "notebooks" / f"{stem}.ipynb", as_version=4)
    pattern = re.compile(rf"^(def|class) {re.escape(defines)}\b", re.M)
    (cell,) = [c for c in nb.cells if c.cell_type == "code" and pattern.search(c.source)]
    source = "\n".join(
        line
        for line in cell.source.splitlines()
        if "BEGIN SOLUTION" not in line and "END SOLUTION" not in line
    )
    tree = ast.parse(source)
    lines = source.splitlines()

    def segment(node: ast.stmt) -> str:  # a def with its decorators (chapter 16's @triton.jit)
        first = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
        return "\n".join(lines[first - 1 : node.end_lineno])

    return "\n\n\n".join(segment(n) for n in tree.body if _keeps(n)) + "\n"


def planted(source: str, *pairs: str) -> str:
    """`source` with each (old, new) of `pairs` replaced once; `old` must occur exactly once."""
    for old, new in zip(pairs[::2], pairs[1::2]):
        assert source.count(old) == 1, f"the solution has {source.count(old)} of {old!r}"
        source = source.replace(old, new, 1)
    return source


def bug(name: str, solution: str, rule: str | tuple[str, ...], *pairs: str) -> Bug:
    """The bug `name`: `solution` with `pairs` replaced (see `planted`), whose hint names `rule`."""
    return Bug(name, planted(solution, *pairs), rule)


def rule_text(rule: str) -> str:
    """The longest literal piece of the rule's text in the language in use (the parts between
    its placeholders): what the hint must hold whatever the case it shows."""
    from llmlab.course.check.catalog import catalog
    from llmlab.i18n import language

    name, key = rule.split(":")
    template = catalog(name).template(key, language())
    pieces = [literal for literal, *_ in string.Formatter().parse(template)]
    return max(pieces, key=len).strip()
