"""How long a chapter takes a student: the one place the model lives.

Every chapter states two times, the **required path** (every cell outside its "Going further"
sections) and the **whole chapter**, top to bottom. Each is the sum of four parts:

    minutes = words read / WORDS_PER_MINUTE
            + code cells × CELL_MINUTES
            + Σ minutes of each exercise, by its kind and, for code the student writes, its size
            + the cells' run time, measured (data/run_times.json) / 60

- **Reading**, 150 words a minute: the markdown, and the code cells as the student edition shows
  them (solutions stripped; a word is a run of letters and digits). The average adult reads English
  non-fiction silently at 238 words a minute, most adults between 175 and 300 (Brysbaert 2019, a
  meta-analysis of 190 studies), and slower in a second language; reading to learn and to use the
  text minutes later is slower again (Carver 1990: about 200 words a minute for college readers
  learning, 138 memorising). A chapter of formulas, tables and code the student must apply sits
  between the two. The Chinese edition is a translation of the same text, and equivalent texts are
  read at about the same rate in Chinese as in English (IReST, Trauzettel-Klosinski and Dietz
  2012: 1.67 and 1.49 texts a minute), so one time serves both editions.
- **Running a cell**, half a minute each: pressing Shift+Enter and looking at what it prints or
  draws (a table, a figure), on top of reading its code.
- **Exercises**, by kind: 1 minute to recall a fact the text stated, 2 to put numbers into a
  formula it gave, 4.5 to reason a step it did not spell out, 1 to commit to a prediction. Code
  the student writes is priced by its size, the lines of the reference solution: a function of
  a few lines 8 minutes plus one a line; a build exercise (the chapter module's `BUILDS`: a
  skeleton with invariants, checked by drawn cases, then run in the engine) 20 plus one a line,
  never under 25 nor over 45 minutes (reading the skeleton and its invariants, a first try, one
  or two counterexamples to fix).
- **Run time**: each code cell's kernel time in a headless run of the chapter with the reader's
  workloads (no `LLMLAB_FAST`), recorded per cell id in `data/run_times.json` by
  `python -m llmlab run --measure NOTEBOOK...`, with the machine and its load.

Both times are rounded to 5 minutes. `python -m llmlab exercises --times` prints them and
`python -m llmlab exercises --write-times` writes them into every chapter's header (both
languages), chapter 00's table, the two READMEs and the instructors' guides; a test holds every
one of them equal to this model's output.
"""

from __future__ import annotations

import importlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from llmlab.course.check.ch00 import CHAPTERS as SOURCE_PATH_CHAPTERS
from llmlab.course.instructor.exercises import exercise_calls
from llmlab.course.instructor.student import is_prediction

# Chapters 00-12 (chapter 00's count of the source chapter's path) follow the source chapter;
# the chapters after them are the Going further part.
PATH_CHAPTERS = SOURCE_PATH_CHAPTERS

WORDS_PER_MINUTE = 150
CELL_MINUTES = 0.5
EXERCISE_MINUTES = {"recall": 1.0, "plug-in": 2.0, "reasoning": 4.5, "prediction": 1.0}
CODING_MINUTES = (8.0, 1.0)  # a function the student writes: base, per line of the solution
BUILD_MINUTES = (20.0, 1.0, 25.0, 45.0)  # a build exercise: base, per line, at least, at most
ROUND_TO = 5  # minutes

GOING_FURTHER = re.compile(r"^##\s+Going further", re.I)
STATED = re.compile(
    r"\*\*Time:\*\*\s*about\s+(\d+)\s+minutes on the required path,\s+(\d+)\s+minutes for the"
    r"\s+whole chapter"
)
STATED_ZH = re.compile(r"\*\*时间：\*\*\s*必修路线约\s*(\d+)\s*分钟，整章从头到尾约\s*(\d+)\s*分钟")
_WORD = re.compile(r"[A-Za-z0-9]+(?:['’-][A-Za-z0-9]+)*")
_BLOCK = re.compile(r"^[ \t]*#\s*BEGIN SOLUTION[ \t]*\n(.*?)^[ \t]*#\s*END SOLUTION", re.M | re.S)
ROOT = Path(__file__).resolve().parents[3]
RUN_TIMES = ROOT / "data" / "run_times.json"


@dataclass(frozen=True)
class Estimate:
    """One path through a chapter, in the model's parts."""

    words: int
    code_cells: int
    exercise_minutes: dict[str, float] = field(default_factory=dict)  # exercise id -> minutes
    predictions: int = 0
    run_seconds: float = 0.0

    @property
    def minutes(self) -> float:
        return (
            self.words / WORDS_PER_MINUTE
            + self.code_cells * CELL_MINUTES
            + sum(self.exercise_minutes.values())
            + self.predictions * EXERCISE_MINUTES["prediction"]
            + self.run_seconds / 60
        )


@dataclass(frozen=True)
class ChapterTime:
    stem: str
    required: Estimate
    whole: Estimate

    @property
    def stated(self) -> tuple[int, int]:
        """(required path, whole chapter) in minutes, as the chapter states them."""
        return rounded(self.required.minutes), rounded(self.whole.minutes)


def rounded(minutes: float) -> int:
    return max(ROUND_TO, ROUND_TO * round(minutes / ROUND_TO))


# --------------------------------------------------------------------------- the parts


def required_cells(nb: Any) -> list[bool]:
    """Per cell: True when it is on the required path (not inside a "Going further" section,
    which runs from its heading to the next "## " heading)."""
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


def _student_source(source: str) -> str:
    """A code cell as the student edition shows it (solutions stripped)."""
    from llmlab.course.instructor.student import strip_source

    try:
        return strip_source(source)[0]
    except ValueError:
        return source


def solution_lines(sources: list[str]) -> int:
    """Lines of code the student writes: the non-blank, non-comment lines of the solution blocks."""
    return sum(
        1
        for source in sources
        for block in _BLOCK.findall(source)
        for line in block.splitlines()
        if line.strip() and not line.strip().startswith("#")
    )


def exercise_kind(exercise: str, cell_source: str) -> str:
    """The kind of `exercise`: "coding" when its solution defines a function or it is a build
    exercise (its checker module lists it in `BUILDS`), else the kind its checker module declares
    (`EXERCISES`), "reasoning" when it declares none."""
    if "BEGIN SOLUTION" in cell_source and re.search(r"^\s*def \w+\(", cell_source, re.M):
        return "coding"
    if is_build(exercise):
        return "coding"
    module, name = exercise.split(".", 1)
    checks = importlib.import_module(f"llmlab.course.check.{module}")
    info = getattr(checks, "EXERCISES", {}).get(name)
    return info.kind if info is not None else "reasoning"


def is_build(exercise: str) -> bool:
    module = exercise.split(".", 1)[0]
    checks = importlib.import_module(f"llmlab.course.check.{module}")
    return exercise in getattr(checks, "BUILDS", {})


def exercise_minutes(exercise: str, sources: list[str]) -> float:
    """Minutes of one exercise; `sources` are its cells (from the one after the previous
    exercise's checker call to its own), where the code the student writes sits."""
    blocks = [b for source in sources for b in _BLOCK.findall(source)]
    writes_code = any(re.search(r"^\s*(def|class) \w+", b, re.M) for b in blocks)
    kind = "coding" if writes_code else exercise_kind(exercise, sources[-1])
    if kind != "coding":
        return EXERCISE_MINUTES[kind]
    lines = solution_lines(sources)
    if is_build(exercise):
        base, per_line, low, high = BUILD_MINUTES
        return min(high, max(low, base + per_line * lines))
    base, per_line = CODING_MINUTES
    return base + per_line * lines


def estimate(nb: Any, run_seconds: dict[str, float] | None = None, whole: bool = False) -> Estimate:
    """The required path of notebook `nb` (with `whole`, every cell); `run_seconds` maps a code
    cell's id to its measured run time."""
    on_path = [True] * len(nb.cells) if whole else required_cells(nb)
    run_seconds = run_seconds or {}
    words = code_cells = predictions = 0
    seconds = 0.0
    for cell, counted in zip(nb.cells, on_path):
        if not counted:
            continue
        if cell.cell_type == "markdown":
            words += len(_WORD.findall(cell.source))
        elif cell.cell_type == "code" and cell.source.strip():
            code_cells += 1
            words += len(_WORD.findall(_student_source(cell.source)))
            predictions += is_prediction(cell.source)
            seconds += run_seconds.get(cell.get("id"), 0.0)
    minutes, start = {}, 0
    for ex, index in exercise_calls(nb):
        if on_path[index]:
            minutes[ex] = exercise_minutes(ex, [c.source for c in nb.cells[start : index + 1]])
        start = index + 1
    return Estimate(words, code_cells, minutes, predictions, seconds)


# --------------------------------------------------------------------------- measured run times


def read_run_times(path: Path = RUN_TIMES) -> dict:
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {"chapters": {}}


def chapter_time(path: str | Path, run_times: dict | None = None) -> ChapterTime:
    import nbformat

    path = Path(path)
    nb = nbformat.read(path, as_version=4)
    data = read_run_times() if run_times is None else run_times
    seconds = data.get("chapters", {}).get(path.stem, {}).get("seconds", {})
    return ChapterTime(path.stem, estimate(nb, seconds), estimate(nb, seconds, whole=True))


def course_times(notebooks: str | Path = ROOT / "notebooks") -> list[ChapterTime]:
    data = read_run_times()
    return [chapter_time(p, data) for p in sorted(Path(notebooks).glob("*.ipynb"))]


def unmeasured_cells(path: str | Path, run_times: dict | None = None) -> list[str]:
    """Ids of the code cells of a chapter that have no measured run time."""
    import nbformat

    path = Path(path)
    nb = nbformat.read(path, as_version=4)
    data = read_run_times() if run_times is None else run_times
    seconds = data.get("chapters", {}).get(path.stem, {}).get("seconds", {})
    return [
        c.get("id")
        for c in nb.cells
        if c.cell_type == "code" and c.source.strip() and c.get("id") not in seconds
    ]


HOW_MEASURED = (
    "Each chapter's instructor notebook (every exercise solved) executed headless, top to bottom, "
    "in a fresh kernel, with the reader's workloads (LLMLAB_FAST unset), by `python -m llmlab "
    "run --measure NOTEBOOK`; per code cell (by id) the kernel's time from execute_input to "
    "execute_reply, in seconds. The machine, its load average before the run and the date are "
    "recorded per chapter: on a shared or slower machine every cell takes longer."
)


# --------------------------------------------------------------------------- what is stated


def stated_minutes(nb: Any) -> tuple[int, int] | None:
    """(required path, whole chapter) as the notebook's first markdown cell states them."""
    first = next((c for c in nb.cells if c.cell_type == "markdown"), None)
    m = STATED.search(first.source) if first is not None else None
    return (int(m[1]), int(m[2])) if m else None


def stated_minutes_zh(text: str) -> tuple[int, int] | None:
    m = STATED_ZH.search(text)
    return (int(m[1]), int(m[2])) if m else None


def time_line(required: int, whole: int, lang: str = "en") -> str:
    if lang == "zh":
        return f"**时间：** 必修路线约 {required} 分钟，整章从头到尾约 {whole} 分钟。"
    return (
        f"**Time:** about {required} minutes on the required path, {whole} minutes for the whole "
        f"chapter top to bottom."
    )


# --------------------------------------------------------------------------- the path stands alone


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
    required = required_cells(nb)
    cells = [(i, *_names(c.source)) for i, c in enumerate(nb.cells) if c.cell_type == "code"]
    on_path = set().union(*(b for i, b, _ in cells if required[i]))
    only_optional = set().union(*(b for i, b, _ in cells if not required[i])) - on_path
    return [
        (i, name) for i, _, read in cells if required[i] for name in sorted(read & only_optional)
    ]
