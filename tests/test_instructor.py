"""The instructor's tools: student versions built from the marked solutions, and the grader.

Fast tier: marking rules on sources, exercise discovery, check-line parsing, the student
version of every notebook in notebooks/ (built, not run), and a full round trip on a small
synthetic notebook through the command line (a few kernel starts).
Slow tier (`notebook`, `slow`): for every notebook in notebooks/ (new ones picked up
automatically, 00-setup-and-map included), the student version grades 0 of N with a hint per
exercise and no crash, and the solutions filled in again grade N of N.
"""
from __future__ import annotations

import ast
import contextlib
import importlib
import inspect
import io
import json
import os
import subprocess
import warnings
import sys
import textwrap
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

from llmlab import instructor
from llmlab.check.core import NOT_ANSWERED
from llmlab.instructor import (PLACEHOLDER, bound_names, check_lines, exercise_calls, exercise_ids,
                               fill_solutions, grade_main, strip_source, student_main,
                               student_notebook)

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
CHECK_MODULES = sorted(p.stem for p in (ROOT / "llmlab" / "check").glob("ch[0-9]*.py"))
NOTEBOOK_BUDGET_S = 180


# --------------------------------------------------------------------------- marking rules

def test_marked_line_becomes_none_placeholder():
    src = "x = 1\nanswer = 6 * 7  # SOLUTION\ncheck(answer)"
    out, pairs = strip_source(src)
    assert out == f"x = 1\nanswer = None  {PLACEHOLDER}\ncheck(answer)"
    assert pairs == [("answer = 6 * 7  # SOLUTION", f"answer = None  {PLACEHOLDER}")]


def test_block_becomes_placeholder_and_every_top_level_name():
    src = textwrap.dedent("""\
        import torch
        # BEGIN SOLUTION
        def helper(x):
            inner = x + 1
            return inner
        a, (b, *rest) = 1, (2, 3, 4)
        for i in range(3):
            total = i
        with open(__file__) as fh:
            pass
        answer = helper(a)
        answer += 1
        # END SOLUTION
        check(answer)""")
    out, pairs = strip_source(src)
    lines = out.split("\n")
    assert lines[0] == "import torch" and lines[1] == PLACEHOLDER and lines[-1] == "check(answer)"
    assert lines[2:-1] == [f"{n} = None" for n in ("helper", "a", "b", "rest", "i", "total", "fh", "answer")]
    assert "inner" not in out               # names inside the function body are not top level
    assert len(pairs) == 1 and pairs[0][0].startswith("# BEGIN SOLUTION") and pairs[0][0].endswith("# END SOLUTION")


def test_indented_block_keeps_indentation_and_stays_valid_python():
    src = textwrap.dedent("""\
        def pick():
            # BEGIN SOLUTION
            choice = "b"
            return choice
            # END SOLUTION

        def other():
            # BEGIN SOLUTION
            return 3
            # END SOLUTION
        answer = pick()""")
    out, pairs = strip_source(src)
    assert f"    {PLACEHOLDER}\n    choice = None\n" in out
    assert f"    {PLACEHOLDER}\n    pass\n" in out      # an emptied suite still needs a statement
    ast.parse(out)
    assert len(pairs) == 2


def test_statement_marked_on_every_line_or_first_line_only():
    every = 'answer = {"a": 1,  # SOLUTION\n          "b": 2}  # SOLUTION\ncheck(answer)'
    first = 'answer = {"a": 1,  # SOLUTION\n          "b": 2}\ncheck(answer)'
    for src in (every, first):
        out, pairs = strip_source(src)
        assert out == f"answer = None  {PLACEHOLDER}\ncheck(answer)", src
        assert pairs[0][0] == "\n".join(src.split("\n")[:2])


def test_begin_and_end_markers_are_not_line_markers():
    out, pairs = strip_source("# BEGIN SOLUTION\nx = 1\n# END SOLUTION")
    assert out == f"{PLACEHOLDER}\nx = None" and len(pairs) == 1


@pytest.mark.parametrize("src, fragment", [
    ("# BEGIN SOLUTION\nx = 1", "no matching '# END SOLUTION'"),
    ("x = 1\n# END SOLUTION", "without a '# BEGIN SOLUTION'"),
    ("# BEGIN SOLUTION\n# BEGIN SOLUTION\nx = 1\n# END SOLUTION", "inside another"),
    ("x = (1 +  # SOLUTION", "do not parse"),
])
def test_bad_markers_raise_valueerror_naming_the_cell(src, fragment):
    with pytest.raises(ValueError, match="demo.ipynb, cell 4") as e:
        strip_source(src, "demo.ipynb, cell 4")
    assert fragment in str(e.value)


def test_bound_names_includes_imports_and_walrus_but_not_attributes():
    code = "import numpy as np\nfrom os import path as p\nobj.x = 1\nd['k'] = 2\nif (n := 3):\n    y = n"
    assert bound_names(code) == ["np", "p", "n", "y"]


# --------------------------------------------------------------------------- exercises and lines

def _nb(*sources: str):
    return new_notebook(cells=[new_code_cell(s) for s in sources])


def test_exercise_calls_follow_every_import_style():
    nb = _nb("from llmlab import check\ncheck.ch00.num_chapters(1)",
             "from llmlab.check import ch04 as c4\nc4.kv_bytes_per_token(None)",
             "import llmlab.check.ch07 as roof\nx = roof.ridge_point(2)",
             "from llmlab.check.ch10 import tpot as my_tpot\nmy_tpot(0.1)",
             "import llmlab\nllmlab.check.ch02.head_size(None)\nch03.forwards(None)",
             "%timeit 1\nch08.why_continuous('b')",
             "print(ch02.HIDDEN, check.ch00.CHAPTERS)\nch00.num_chapters(None)  # again: counted once",
             "not python (\nch09.bubble_fraction(answer)")
    assert exercise_calls(nb) == [("ch00.num_chapters", 0), ("ch04.kv_bytes_per_token", 1),
                                  ("ch07.ridge_point", 2), ("ch10.tpot", 3), ("ch02.head_size", 4),
                                  ("ch03.forwards", 4), ("ch08.why_continuous", 5),
                                  ("ch09.bubble_fraction", 7)]


def test_check_lines_last_line_wins_and_other_text_is_ignored():
    nb = _nb("", "", "")
    nb.cells[0].outputs = [nbformat.v4.new_output("stream", name="stdout",
                                                  text="[check ch00.a] NOT YET: try again\nnoise\n[check ch00.b] PA"),
                           nbformat.v4.new_output("stream", name="stdout", text="SS: correct.\n")]
    nb.cells[1].outputs = [nbformat.v4.new_output("execute_result", data={"text/plain": "[check ch00.a] PASS: correct."})]
    nb.cells[2].outputs = [nbformat.v4.new_output("stream", name="stderr", text="[check ch00.c] PASS: fake\n")]
    assert check_lines(nb) == {"ch00.a": (True, "correct."), "ch00.b": (True, "correct.")}


def test_every_checker_answers_none_with_its_own_id_and_a_hint():
    """The grader names exercises `module.function`; every checker must print that id, once,
    NOT YET with a hint, for the placeholder None."""
    count = 0
    for name in CHECK_MODULES:
        module = importlib.import_module(f"llmlab.check.{name}")
        for fname, fn in inspect.getmembers(module, inspect.isfunction):
            if fn.__module__ != module.__name__ or fname.startswith("_") \
                    or "CheckResult" not in str(inspect.signature(fn).return_annotation):
                continue
            buf = io.StringIO()
            with contextlib.redirect_stdout(buf):
                result = fn(None)
            lines = [ln for ln in buf.getvalue().splitlines() if ln.startswith("[check ")]
            assert lines == [f"[check {name}.{fname}] NOT YET: {result.message}"], (name, fname, buf.getvalue())
            assert not result.passed and result.message.strip()
            count += 1
    assert count >= 3 * len(CHECK_MODULES)


# --------------------------------------------------------------------------- the real notebooks, built not run

@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_student_version_of_each_notebook(path):
    nb = nbformat.read(path, as_version=4)
    student, solutions = student_notebook(nb, where=path.name)
    ids = exercise_ids(nb)
    assert ids, f"{path.name} calls no llmlab.check function"
    for ex in ids:                                      # every id names a real checker
        mod, fname = ex.split(".")
        assert callable(getattr(importlib.import_module(f"llmlab.check.{mod}"), fname, None)), ex
    assert student.metadata["llmlab"]["exercises"] == ids
    assert len(solutions) >= len(ids), f"{path.name}: {len(ids)} exercises but {len(solutions)} marked solutions"
    for i, (cell, orig) in enumerate(zip(student.cells, nb.cells)):
        if cell.cell_type != "code":
            assert cell.source == orig.source
            continue
        assert "SOLUTION" not in cell.source, f"{path.name} cell {i} still holds a solution marker"
        assert cell.outputs == [] and cell.execution_count is None
        with contextlib.suppress(SyntaxError):      # cells with magics are not plain Python
            ast.parse(orig.source)
            ast.parse(cell.source)
    filled = fill_solutions(student, solutions)
    assert [c.source for c in filled.cells] == [c.source for c in nb.cells]
    assert exercise_ids(student) == ids                  # the checker calls stay in the student version


# --------------------------------------------------------------------------- synthetic round trip (runs kernels)

SYNTHETIC = [
    new_markdown_cell("# A tiny chapter\nThree exercises built on chapter 00's checkers."),
    new_code_cell("from llmlab import check\nfrom llmlab.check import ch00 as c0"),
    new_code_cell("answer = 13  # SOLUTION\ncheck.ch00.num_chapters(answer)"),
    new_code_cell(textwrap.dedent("""\
        def pick():
            # BEGIN SOLUTION
            choice = "b"
            return choice
            # END SOLUTION
        answer = pick()
        c0.fast_mode(answer)""")),
    new_code_cell(textwrap.dedent("""\
        # BEGIN SOLUTION
        parts = ["llmlab", "ops"]
        # END SOLUTION
        answer = ".".join(["llmlab",  # SOLUTION
                           "ops"])  # SOLUTION
        c0.module_for_paged_attention(answer)""")),
    new_code_cell("print('parts later on:', parts)"),
]
SYNTHETIC_IDS = ["ch00.num_chapters", "ch00.fast_mode", "ch00.module_for_paged_attention"]


def _run_cli(main, argv):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = main(argv)
    return rc, out.getvalue()


def _grade_json(paths, *extra):
    rc, text = _run_cli(grade_main, [str(p) for p in paths] + ["--json", "--cell-timeout", "120", *extra])
    assert rc == 0, text
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


def _assert_student_report(rep, n):
    assert (rep["score"], rep["total"]) == (0, n), rep
    assert rep["errors"] == [], f"the student version crashed: {rep['errors']}"
    for ex in rep["exercises"]:
        assert not ex["passed"]
        assert ex["message"].strip() and instructor.NO_LINE_MESSAGE not in ex["message"], ex


@pytest.mark.notebook
def test_synthetic_round_trip_through_the_command_line(tmp_path):
    src, dst = tmp_path / "instructor", tmp_path / "student"
    src.mkdir()
    nbformat.write(new_notebook(cells=SYNTHETIC), src / "01-tiny.ipynb")
    rc, text = _run_cli(student_main, [str(src), str(dst)])
    assert rc == 0 and "3 exercises, 4 solutions removed" in text, text
    student = nbformat.read(dst / "01-tiny.ipynb", as_version=4)
    assert student.metadata["llmlab"]["exercises"] == SYNTHETIC_IDS

    _, solutions = student_notebook(nbformat.read(src / "01-tiny.ipynb", as_version=4))
    nbformat.write(fill_solutions(student, solutions), tmp_path / "filled.ipynb")

    rep_student, rep_instructor, rep_filled = _grade_json(
        [dst / "01-tiny.ipynb", src / "01-tiny.ipynb", tmp_path / "filled.ipynb"])
    _assert_student_report(rep_student, 3)
    assert all(ex["message"] == NOT_ANSWERED for ex in rep_student["exercises"]
               if ex["id"] != "ch00.fast_mode")          # pick() returns None: the same hint
    assert [e["id"] for e in rep_student["exercises"]] == SYNTHETIC_IDS
    for rep in (rep_instructor, rep_filled):
        assert (rep["score"], rep["total"]) == (3, 3), rep
        assert rep["errors"] == []
    assert set(rep_instructor) >= {"notebook", "score", "total", "exercises"}
    assert set(rep_instructor["exercises"][0]) >= {"id", "passed", "message"}


@pytest.mark.notebook
def test_grader_counts_exercises_after_a_crash_and_interrupts_slow_cells(tmp_path):
    """A cell over the time limit is interrupted and grading goes on; a kernel that dies
    leaves the later exercises failed with a message that says why; outputs handed in with
    the notebook are never graded."""
    nb = new_notebook(cells=[
        new_code_cell("from llmlab.check import ch00\nimport time"),
        new_code_cell("time.sleep(600)"),
        new_code_cell("ch00.num_chapters(13)"),
        new_code_cell("import os\nos._exit(1)"),
        new_code_cell("ch00.fast_mode('b')"),
    ])
    nb.cells[4].outputs = [nbformat.v4.new_output("stream", name="stdout", text="[check ch00.fast_mode] PASS: correct.\n")]
    nb.metadata["llmlab"] = {"exercises": ["ch00.num_chapters", "ch00.fast_mode", "ch00.module_for_paged_attention"]}
    path = tmp_path / "crash.ipynb"
    nbformat.write(nb, path)
    (rep,) = _grade_json([path], "--cell-timeout", "12")
    assert (rep["score"], rep["total"]) == (1, 3), rep
    by_id = {e["id"]: e for e in rep["exercises"]}
    assert by_id["ch00.num_chapters"]["passed"]          # graded after the interrupted cell
    assert not by_id["ch00.fast_mode"]["passed"] and "kernel died" in by_id["ch00.fast_mode"]["message"]
    assert instructor.NO_LINE_MESSAGE in by_id["ch00.module_for_paged_attention"]["message"]
    assert [e["ename"] for e in rep["errors"]] == ["CellTimeoutError", "DeadKernelError"]
    assert rep["seconds"] < 120


def test_text_report_lists_each_exercise_and_the_total():
    rep = instructor.GradeReport("nb.ipynb", [instructor.ExerciseResult("ch00.a", True, "correct."),
                                              instructor.ExerciseResult("ch00.bb", False, "count again.")],
                                 [{"cell": "3 (1/0)", "index": 3, "ename": "ZeroDivisionError", "evalue": "division by zero"}])
    lines = rep.text().splitlines()
    assert lines[0] == "nb.ipynb"
    assert lines[1].split() == ["PASS", "ch00.a", "correct."]
    assert lines[2].split()[:3] == ["NOT", "YET", "ch00.bb"] and lines[2].endswith("count again.")
    assert "ZeroDivisionError" in lines[3]
    assert "score: 1 of 2" in lines[4]
    assert json.loads(json.dumps(rep.to_dict()))["score"] == 1


def test_command_line_rejects_bad_input(tmp_path):
    nb_path = tmp_path / "a.ipynb"
    nbformat.write(new_notebook(cells=SYNTHETIC), nb_path)
    before = nb_path.read_text()
    rc, _ = _run_cli(student_main, [str(tmp_path), str(tmp_path)])    # would overwrite the solutions
    assert rc == 1 and nb_path.read_text() == before
    rc, _ = _run_cli(student_main, [str(tmp_path / "missing"), str(tmp_path / "out")])
    assert rc == 1
    assert _run_cli(grade_main, [str(tmp_path / "missing.ipynb")])[0] == 2
    assert _run_cli(grade_main, [str(nb_path), "--cell-timeout", "0"])[0] == 2
    bad = tmp_path / "bad" / "b.ipynb"
    bad.parent.mkdir()
    nbformat.write(_nb("# BEGIN SOLUTION\nx = 1"), bad)
    rc, _ = _run_cli(student_main, [str(bad.parent), str(tmp_path / "out2")])
    assert rc == 1 and not (tmp_path / "out2" / "b.ipynb").exists()


# --------------------------------------------------------------------------- every real notebook, run

def _grade_subprocesses(paths: list[Path], timeout_s: float) -> list[dict]:
    """Grade each notebook in its own `python -m llmlab grade --json` process, one after another.

    One at a time: two notebook kernels side by side on a 2-core machine starve each other (a
    student-version cell once hit the 180 s cell limit that way in CI-like runs).
    """
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    reports = []
    for p in paths:
        proc = subprocess.run([sys.executable, "-m", "llmlab", "grade", str(p), "--json",
                               "--cell-timeout", str(NOTEBOOK_BUDGET_S)],
                              cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout_s)
        assert proc.returncode == 0, f"grade {p} exited {proc.returncode}: {proc.stderr[-2000:]}"
        reports.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    return reports


@pytest.mark.notebook
@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_round_trip_every_notebook(path, tmp_path):
    """Student version: 0 of N, each exercise NOT YET with its hint, no cell crashes.
    Solutions filled in again (= the instructor's version): N of N."""
    nb = nbformat.read(path, as_version=4)
    student, solutions = student_notebook(nb, where=path.name)
    filled = fill_solutions(student, solutions)
    assert [c.source for c in filled.cells] == [c.source for c in nb.cells]
    # both copies sit next to the original, so relative paths resolve as in notebooks/
    work = tmp_path / "work"
    work.mkdir()
    for item in path.parent.iterdir():
        if item.suffix != ".ipynb" and not item.name.startswith("."):
            (work / item.name).symlink_to(item)
    nbformat.write(student, work / f"student-{path.name}")
    nbformat.write(filled, work / f"instructor-{path.name}")
    paths = [work / f"student-{path.name}", work / f"instructor-{path.name}"]
    reports = _grade_subprocesses(paths, timeout_s=NOTEBOOK_BUDGET_S + 120)
    for i, rep in enumerate(reports):
        # nbclient sometimes waits out a whole cell timeout after a widget cell although the
        # kernel finished it (seen twice in ~80 headless runs): grade that version once more,
        # and say so. Any other error, or a second timeout, still fails below.
        if rep["errors"] and all(e["ename"] == "CellTimeoutError" for e in rep["errors"]):
            warnings.warn(f"{paths[i].name}: cell timeout {rep['errors']}; graded once more")
            reports[i] = _grade_subprocesses([paths[i]], timeout_s=NOTEBOOK_BUDGET_S + 120)[0]
    rep_student, rep_instructor = reports
    n = len(exercise_ids(nb))
    print(f"{path.name}: student {rep_student['seconds']:.1f} s, instructor {rep_instructor['seconds']:.1f} s, {n} exercises")
    assert rep_instructor["errors"] == [], f"the instructor's version itself fails: {rep_instructor['errors']}"
    assert (rep_instructor["score"], rep_instructor["total"]) == (n, n), rep_instructor
    _assert_student_report(rep_student, n)
