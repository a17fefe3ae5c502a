"""The course's shape, read from the committed notebooks without running them: short cells, a
stated time that adds up, an "In vLLM" box whose llmlab names exist, a summary, a prediction
before each main measurement, a task for every widget, and enough exercises of the right kinds,
described for the instructors' table."""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import nbformat
import pytest

from llmlab.course.check.catalog import KINDS, ExerciseInfo
from llmlab.course.instructor.exercises import _checker_calls, exercise_ids
from llmlab.course.instructor.student import strip_source

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
IDS = [p.stem for p in NOTEBOOKS]
MAX_LINES = 12  # a code cell that carries an idea


def _nb(path):
    return nbformat.read(path, as_version=4)


def _code_lines(source: str) -> list[str]:
    return [ln for ln in source.splitlines() if ln.strip()]


def is_optional(cell) -> bool:
    lines = _code_lines(cell.source)
    return bool(lines) and lines[0].lstrip().lower().startswith("# optional")


MAX_BUILD_LINES = (
    40  # a build exercise's skeleton as the student edition shows it (solution stripped)
)


def is_build_skeleton(cell, path) -> bool:
    """The cell defines the class or function a build exercise of the chapter checks (`BUILDS`)."""
    try:
        checks = importlib.import_module(f"llmlab.course.check.ch{path.stem[:2]}")
    except ImportError:
        return False
    names = set(getattr(checks, "BUILDS", {}).values())
    return any(re.search(rf"^(class|def) {re.escape(n)}\b", cell.source, re.M) for n in names)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_code_cells_carry_one_idea(path):
    """A code cell is at most 12 non-blank lines, unless it is marked as an optional deep dive
    (first line `# Optional ...`) or is a build exercise's skeleton (at most 40 lines as the
    student edition shows it, the solution stripped)."""
    long = [
        (i, len(_code_lines(c.source)))
        for i, c in enumerate(_nb(path).cells)
        if c.cell_type == "code"
        and not is_optional(c)
        and (
            len(_code_lines(strip_source(c.source)[0])) > MAX_BUILD_LINES
            if is_build_skeleton(c, path)
            else len(_code_lines(c.source)) > MAX_LINES
        )
    ]
    assert not long, f"{path.name}: code cells longer than {MAX_LINES} lines (cell, lines): {long}"


# The stated times and the five-hour required path: tests/test_reading_time.py.


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_last_markdown_cell_is_a_summary(path):
    md = [c for c in _nb(path).cells if c.cell_type == "markdown"]
    assert md and md[-1].source.lstrip().startswith("## Summary"), (
        f"{path.name}: the last markdown cell does not begin '## Summary'"
    )
    bullets = [
        ln for ln in md[-1].source.splitlines() if ln.lstrip().startswith(("- ", "* ", "1."))
    ]
    assert len(bullets) >= 3, f"{path.name}: the summary has fewer than 3 points"


def in_vllm_cells(nb) -> list[str]:
    return [
        c.source
        for c in nb.cells
        if c.cell_type == "markdown" and c.source.lstrip().startswith("### In vLLM")
    ]


def resolve(dotted: str):
    """The object a fully qualified `llmlab.…` name names (module, class, function, attribute)."""
    parts = dotted.split(".")
    for n in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:n]))
        except ModuleNotFoundError:
            continue
        for attr in parts[n:]:
            obj = getattr(obj, attr)
        return obj
    raise ModuleNotFoundError(dotted)


LLMLAB_NAME = re.compile(r"`(llmlab(?:\.[A-Za-z_]\w*)+)(?:\(\))?`")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_in_vllm_box_names_what_exists(path):
    """Every chapter has an "In vLLM" box; every llmlab name it cites exists in the package, and
    it cites vLLM V1 files."""
    cells = in_vllm_cells(_nb(path))
    assert cells, f"{path.name}: no markdown cell beginning '### In vLLM'"
    text = "\n".join(cells)
    names = LLMLAB_NAME.findall(text)
    assert names, f"{path.name}: the In vLLM box cites no `llmlab.…` name"
    broken = []
    for name in names:
        try:
            resolve(name)
        except (ImportError, AttributeError) as e:
            broken.append(f"{name} ({type(e).__name__})")
    assert not broken, f"{path.name}: In vLLM names that do not exist: {broken}"
    assert re.search(r"vllm/[\w/]+\.py", text), f"{path.name}: the In vLLM box names no vLLM file"


def test_resolve_fails_on_a_name_that_does_not_exist():
    assert resolve("llmlab.core.scheduler.Scheduler") is not None
    with pytest.raises(AttributeError):
        resolve("llmlab.core.scheduler.Scheduler.no_such_method")


# ----------------------------------------------------------------------- predictions and widgets

PREDICTION_CHAPTERS = [p for p in NOTEBOOKS if 3 <= int(p.stem[:2]) <= 11]


def _prediction_calls(source: str) -> list[ast.Call]:
    """Calls of llmlab.course.check.predict's compare / compare_choice (as `predict.compare(...)` or the
    bare imported name; `sim.compare(...)` and other modules' compare are not predictions)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    names = {"compare", "compare_choice"}
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            f = node.func
            if (
                isinstance(f, ast.Attribute)
                and f.attr in names
                and isinstance(f.value, ast.Name)
                and f.value.id == "predict"
            ):
                out.append(node)
            elif isinstance(f, ast.Name) and f.id in names:
                out.append(node)
    return out


@pytest.mark.parametrize("path", PREDICTION_CHAPTERS, ids=[p.stem for p in PREDICTION_CHAPTERS])
def test_prediction_is_written_before_the_measurement(path):
    """Chapters 03-11: a prediction is recorded (a marked line the handout blanks) at least one
    code cell before the cell that compares it with the measurement."""
    nb = _nb(path)
    found = []
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        for call in _prediction_calls(cell.source):
            if not call.args or not isinstance(call.args[0], ast.Name):
                continue
            var = call.args[0].id
            mark = re.compile(rf"^\s*{re.escape(var)}\s*=.*#\s*SOLUTION\s*$", re.M)
            where = [
                j
                for j, c in enumerate(nb.cells[:i])
                if c.cell_type == "code" and mark.search(c.source)
            ]
            code_between = where and any(c.cell_type == "code" for c in nb.cells[where[-1] + 1 : i])
            found.append((var, bool(code_between)))
    assert found, (
        f"{path.name}: no prediction compared with a measurement (llmlab.course.check.predict)"
    )
    assert all(ok for _, ok in found), (
        f"{path.name}: a prediction must be written (`name = ...  # SOLUTION`) in a cell before the measurement: {found}"
    )


def _widget_cells(nb) -> list[int]:
    out = []
    for i, c in enumerate(nb.cells):
        if (
            c.cell_type == "code"
            and re.search(r"\bwidgets\.\w+\.\w+\(|\bfrom llmlab\.widgets", c.source)
            and not c.source.lstrip().startswith("#")
        ):
            if re.search(r"\b(explorer|calculator|widget|slider|show|interactive)\w*\(", c.source):
                out.append(i)
    return out


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_every_widget_sets_a_task_with_a_checker(path):
    """After each widget, an exercise is checked before the next widget (or the end) comes."""
    nb = _nb(path)
    widgets = _widget_cells(nb)
    calls = {i for _, i, _ in _checker_calls(nb)}  # every checker call, not only the first
    bounds = widgets[1:] + [len(nb.cells)]
    lonely = [w for w, end in zip(widgets, bounds) if not any(w < i < end for i in calls)]
    assert not lonely, f"{path.name}: widget cells with no exercise after them: {lonely}"


# ----------------------------------------------------------------------- exercises and their kinds


def _info(exercise: str) -> ExerciseInfo | None:
    module, _, fn = exercise.partition(".")
    mod = importlib.import_module(f"llmlab.course.check.{module}")
    return getattr(mod, "EXERCISES", {}).get(fn)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_each_chapter_has_four_exercises_two_of_them_reasoning(path):
    ids = exercise_ids(_nb(path))
    undescribed = [ex for ex in ids if _info(ex) is None]
    assert not undescribed, (
        f"{path.name}: exercises missing from their module's EXERCISES: {undescribed}"
    )
    assert len(ids) >= 4, f"{path.name}: {len(ids)} exercises; at least 4"
    reasoning = [ex for ex in ids if _info(ex).kind == "reasoning"]
    assert len(reasoning) >= 2, f"{path.name}: {len(reasoning)} reasoning exercises; at least 2"


def test_every_described_exercise_is_in_a_notebook():
    called = {ex for p in NOTEBOOKS for ex in exercise_ids(_nb(p))}
    stale = []
    # a chapter's checkers: a module, or a package
    for module in sorted((ROOT / "llmlab" / "course" / "check").glob("ch[0-9][0-9]*")):
        mod = importlib.import_module(f"llmlab.course.check.{module.stem}")
        for fn, info in getattr(mod, "EXERCISES", {}).items():
            assert isinstance(info, ExerciseInfo) and info.kind in KINDS
            assert callable(getattr(mod, fn, None)), (
                f"{module.stem}.EXERCISES names no function {fn}"
            )
            if f"{module.stem}.{fn}" not in called:
                stale.append(f"{module.stem}.{fn}")
    assert not stale, f"described in EXERCISES but called by no notebook: {stale}"


def test_instructors_table_is_current():
    from llmlab.course.instructor.table import rewrite

    doc = ROOT / "docs" / "instructors.md"
    assert doc.read_text(encoding="utf-8") == rewrite(doc, ROOT / "notebooks"), (
        "docs/instructors.md is out of date: run `python -m llmlab exercises --write docs/instructors.md`"
    )


# ----------------------------------------------------------------------- what the course says of itself

TRACKER = re.compile(r"\b(issue|ticket|PR)\s*#?\d+\b|(?<![\w&])#\d{1,4}\b(?!\w)", re.I)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_no_tracker_references(path):
    hits = [(i, m[0]) for i, c in enumerate(_nb(path).cells) for m in TRACKER.finditer(c.source)]
    assert not hits, f"{path.name}: tracker references {hits}"


MACHINE_PROSE = re.compile(r"\b(2|two)[- ]core\b", re.I)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_no_machine_written_into_prose(path):
    """Facts about the reader's machine are measured (llmlab.analysis.hardware), not written as if every
    reader had the machine the course was written on."""
    hits = [
        i
        for i, c in enumerate(_nb(path).cells)
        if c.cell_type == "markdown" and MACHINE_PROSE.search(c.source)
    ]
    assert not hits, f"{path.name}: markdown cells {hits} speak of a 2-core machine"


# ----------------------------------------------------------------------- no infrastructure in the reader's way

INFRA = re.compile(r"os\.environ|LLMLAB_FAST|HF_HUB_OFFLINE|TRITON_INTERPRET|\bCI\b|\bFAST\b")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_cells_a_student_runs_hold_no_test_switch(path):
    """Test switches live in the package (`llmlab.course.session.sized`) and the test harness, not in the
    cells a student runs; chapter 00 alone prints the whole environment report."""
    nb = _nb(path)
    hits = [
        (i, m[0])
        for i, c in enumerate(nb.cells)
        if c.cell_type == "code"
        for m in INFRA.finditer(c.source)
    ]
    assert not hits, f"{path.name}: test switches in cells {hits}"
    if not path.stem.startswith("00"):
        dumps = [
            i
            for i, c in enumerate(nb.cells)
            if c.cell_type == "code" and "doctor.report" in c.source
        ]
        assert not dumps, (
            f"{path.name}: cells {dumps} print the environment report (chapter 00's job)"
        )


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_llmlab_is_imported_before_torch(path):
    """`import llmlab` chooses how OpenMP threads wait, which the runtime reads once, when torch
    loads: a chapter imports llmlab first."""
    code = "\n".join(c.source for c in _nb(path).cells if c.cell_type == "code")
    imports = [
        m[1]
        for m in re.finditer(r"^(?:import|from) (\w+)", code, re.M)
        if m[1] in ("llmlab", "torch")
    ]
    if "torch" in imports:
        assert imports.index("llmlab") < imports.index("torch"), (
            f"{path.name} imports torch before llmlab"
        )
