"""How long a chapter takes a student, estimated from its content: the one place the formula lives.

    minutes = prose words / 150
            + per exercise: 1 (recall), 2 (plug-in), 4.5 (reasoning), 12.5 (coding: the answer is a
              function the student writes)
            + 0.25 per code cell (reading it, running it, looking at what it shows)

Markdown cells from a heading "## Going further" up to the next "## " heading (or the summary) are
left out, with every code cell and exercise inside them: that is where what does not fit the
required path goes. `python -m llmlab exercises --times` prints the estimate of every chapter
beside the time its first cell states.
"""

from __future__ import annotations

import importlib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llmlab.course.check.ch00 import CHAPTERS as SOURCE_PATH_CHAPTERS
from llmlab.course.instructor.exercises import exercise_calls

# Chapters 00-12 (chapter 00's count of the source chapter's path) follow the source chapter:
# their required paths together stay within PATH_MINUTES. The chapters after them are the Going
# further part (dtypes, ...), where each chapter's required path stays within
# CHAPTER_MINUTES_FURTHER on its own.
PATH_CHAPTERS = SOURCE_PATH_CHAPTERS
PATH_MINUTES = 300
CHAPTER_MINUTES_FURTHER = 30

WORDS_PER_MINUTE = 150
EXERCISE_MINUTES = {"recall": 1.0, "plug-in": 2.0, "reasoning": 4.5, "coding": 12.5}
CODE_CELL_MINUTES = 0.25
GOING_FURTHER = re.compile(r"^##\s+Going further", re.I)
STATED = re.compile(r"\*\*Time:\*\*\s*about\s+(\d+)\s+minutes")
_WORD = re.compile(r"[A-Za-z0-9]+(?:['’-][A-Za-z0-9]+)*")


@dataclass(frozen=True)
class Estimate:
    words: int
    code_cells: int
    exercises: dict[str, int]  # kind -> count

    @property
    def minutes(self) -> float:
        return (
            self.words / WORDS_PER_MINUTE
            + self.code_cells * CODE_CELL_MINUTES
            + sum(EXERCISE_MINUTES[k] * n for k, n in self.exercises.items())
        )


def _required(nb: Any) -> list[bool]:
    """Per cell: True when it is on the required path (not inside a "Going further" section)."""
    flags, optional = [], False
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            heading = cell.source.lstrip()
            if GOING_FURTHER.match(heading):
                optional = True
            elif heading.startswith("## "):
                optional = False
        flags.append(not optional)
    return flags


def exercise_kind(exercise: str, cell_source: str) -> str:
    """The kind of `exercise` for the estimate: "coding" when its solution defines a function
    or it is a build exercise (its checker module lists it in `BUILDS`: the skeleton the student
    completes sits in a cell of its own), else the kind its checker module declares
    (`EXERCISES`), "reasoning" when it declares none."""
    if "BEGIN SOLUTION" in cell_source and re.search(r"^\s*def \w+\(", cell_source, re.M):
        return "coding"
    module, name = exercise.split(".", 1)
    checks = importlib.import_module(f"llmlab.course.check.{module}")
    if exercise in getattr(checks, "BUILDS", {}):
        return "coding"
    info = getattr(checks, "EXERCISES", {}).get(name)
    return info.kind if info is not None else "reasoning"


def estimate(nb: Any) -> Estimate:
    """The estimate of one notebook (see the module docstring)."""
    required = _required(nb)
    words = sum(
        len(_WORD.findall(c.source))
        for c, r in zip(nb.cells, required)
        if r and c.cell_type == "markdown"
    )
    code_cells = sum(1 for c, r in zip(nb.cells, required) if r and c.cell_type == "code")
    kinds: dict[str, int] = {}
    for ex, index in exercise_calls(nb):
        if required[index]:
            kind = exercise_kind(ex, nb.cells[index].source)
            kinds[kind] = kinds.get(kind, 0) + 1
    return Estimate(words, code_cells, kinds)


def stated_minutes(nb: Any) -> int | None:
    """The minutes the notebook's first markdown cell states ("**Time:** about N minutes")."""
    first = next((c for c in nb.cells if c.cell_type == "markdown"), None)
    m = STATED.search(first.source) if first is not None else None
    return int(m[1]) if m else None


def report(src: str | Path) -> list[tuple[str, int | None, float]]:
    """(notebook stem, stated minutes, estimated minutes) of every notebook in the folder `src`."""
    import nbformat

    rows = []
    for path in sorted(Path(src).glob("*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        rows.append((path.stem, stated_minutes(nb), estimate(nb).minutes))
    return rows


def _names(source: str) -> tuple[set[str], set[str]]:
    """(names a code cell binds, names it reads); IPython lines (`%`, `!`) are skipped."""
    import ast

    code = "\n".join(
        "" if line.lstrip().startswith(("%", "!")) else line for line in source.splitlines()
    )
    bound, read = set(), set()
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Name):
            (bound if isinstance(node.ctx, (ast.Store, ast.Del)) else read).add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, ast.alias):
            bound.add((node.asname or node.name).split(".")[0])
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
    return bound, read


def required_uses_of_optional(nb: Any) -> list[tuple[int, str]]:
    """(cell index, name) for every required code cell that reads a name bound only inside a
    "Going further" section: the required path must run with every such section left out."""
    required = _required(nb)
    cells = [(i, *_names(c.source)) for i, c in enumerate(nb.cells) if c.cell_type == "code"]
    on_path = set().union(*(b for i, b, _ in cells if required[i]))
    only_optional = set().union(*(b for i, b, _ in cells if not required[i])) - on_path
    return [
        (i, name) for i, _, read in cells if required[i] for name in sorted(read & only_optional)
    ]
