"""The student version: solutions marked in the instructor's notebooks, stripped for students.

The marking rules on sources, the student version of every notebook in notebooks/ (built, not
run: the grader's tests run them), and the `student` command with the manifest it writes.
"""

from __future__ import annotations

import ast
import contextlib
import importlib
import io
import textwrap
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

from llmlab.course.instructor import (
    MANIFEST_NAME,
    PLACEHOLDER,
    Exercise,
    bound_names,
    exercise_ids,
    fill_solutions,
    read_manifest,
    strip_source,
    student_main,
    student_notebook,
)

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


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
    assert lines[2:-1] == [
        f"{n} = None" for n in ("helper", "a", "b", "rest", "i", "total", "fh", "answer")
    ]
    assert "inner" not in out  # names inside the function body are not top level
    assert (
        len(pairs) == 1
        and pairs[0][0].startswith("# BEGIN SOLUTION")
        and pairs[0][0].endswith("# END SOLUTION")
    )


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
    assert f"    {PLACEHOLDER}\n    pass\n" in out  # an emptied suite still needs a statement
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


@pytest.mark.parametrize(
    "src, fragment",
    [
        ("# BEGIN SOLUTION\nx = 1", "no matching '# END SOLUTION'"),
        ("x = 1\n# END SOLUTION", "without a '# BEGIN SOLUTION'"),
        ("# BEGIN SOLUTION\n# BEGIN SOLUTION\nx = 1\n# END SOLUTION", "inside another"),
        ("x = (1 +  # SOLUTION", "do not parse"),
    ],
)
def test_bad_markers_raise_valueerror_naming_the_cell(src, fragment):
    with pytest.raises(ValueError, match="demo.ipynb, cell 4") as e:
        strip_source(src, "demo.ipynb, cell 4")
    assert fragment in str(e.value)


def test_bound_names_includes_imports_and_walrus_but_not_attributes():
    code = "import numpy as np\nfrom os import path as p\nobj.x = 1\nd['k'] = 2\nif (n := 3):\n    y = n"
    assert bound_names(code) == ["np", "p", "n", "y"]


# --------------------------------------------------------------------------- the real notebooks, built not run


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_student_version_of_each_notebook(path):
    nb = nbformat.read(path, as_version=4)
    student, solutions = student_notebook(nb, where=path.name)
    ids = exercise_ids(nb)
    assert ids, f"{path.name} calls no llmlab.course.check function"
    for ex in ids:  # every id names a real checker
        mod, fname = ex.split(".")
        assert callable(
            getattr(importlib.import_module(f"llmlab.course.check.{mod}"), fname, None)
        ), ex
    assert (
        "exercises" not in student.metadata["llmlab"]
    )  # the grader reads them from the source only
    assert len(solutions) >= len(ids), (
        f"{path.name}: {len(ids)} exercises but {len(solutions)} marked solutions"
    )
    for i, (cell, orig) in enumerate(zip(student.cells, nb.cells)):
        if cell.cell_type != "code":
            assert cell.source == orig.source
            continue
        assert "SOLUTION" not in cell.source, f"{path.name} cell {i} still holds a solution marker"
        assert cell.outputs == [] and cell.execution_count is None
        with contextlib.suppress(SyntaxError):  # cells with magics are not plain Python
            ast.parse(orig.source)
            ast.parse(cell.source)
    filled = fill_solutions(student, solutions)
    assert [c.source for c in filled.cells] == [c.source for c in nb.cells]
    assert exercise_ids(student) == ids  # the checker calls stay in the student version


# --------------------------------------------------------------------------- the command

TINY = [
    new_markdown_cell("# A tiny chapter"),
    new_code_cell("from llmlab.course.check import ch00"),
    new_code_cell("answer = 13  # SOLUTION\nch00.num_chapters(answer)"),
    new_code_cell("answer = 'b'  # SOLUTION\nch00.fast_mode(answer)"),
]


def _nb(*sources: str):
    return new_notebook(cells=[new_code_cell(s) for s in sources])


def _run_cli(main, argv):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = main(argv)
    return rc, out.getvalue()


def test_student_command_writes_versions_and_a_manifest_that_keeps_other_entries(tmp_path):
    src, dst = tmp_path / "instructor", tmp_path / "student"
    src.mkdir()
    nbformat.write(new_notebook(cells=TINY), src / "01-tiny.ipynb")
    nbformat.write(new_notebook(cells=TINY[:3]), src / "02-tinier.ipynb")
    rc, text = _run_cli(student_main, [str(src), str(dst)])
    assert rc == 0 and "01-tiny.ipynb: 2 exercises, 2 solutions removed" in text, text
    assert MANIFEST_NAME in text
    both = {
        "01-tiny.ipynb": [Exercise("ch00.num_chapters"), Exercise("ch00.fast_mode")],
        "02-tinier.ipynb": [Exercise("ch00.num_chapters")],
    }
    assert read_manifest(dst / MANIFEST_NAME) == both
    # one chapter rebuilt alone: its entry is replaced, the other one kept
    nbformat.write(new_notebook(cells=TINY[:2] + TINY[3:]), src / "02-tinier.ipynb")
    rc, _ = _run_cli(student_main, [str(src / "02-tinier.ipynb"), str(dst)])
    assert rc == 0
    assert read_manifest(dst / MANIFEST_NAME) == {
        **both,
        "02-tinier.ipynb": [Exercise("ch00.fast_mode")],
    }
    student = nbformat.read(dst / "01-tiny.ipynb", as_version=4)
    assert student.metadata["llmlab"] == {"version": "student", "source": "01-tiny.ipynb"}


def test_student_command_rejects_bad_input(tmp_path):
    nb_path = tmp_path / "a.ipynb"
    nbformat.write(new_notebook(cells=TINY), nb_path)
    before = nb_path.read_text()
    rc, _ = _run_cli(student_main, [str(tmp_path), str(tmp_path)])  # would overwrite the solutions
    assert rc == 1 and nb_path.read_text() == before
    assert not (tmp_path / MANIFEST_NAME).exists()
    rc, _ = _run_cli(student_main, [str(tmp_path / "missing"), str(tmp_path / "out")])
    assert rc == 1
    bad = tmp_path / "bad" / "b.ipynb"
    bad.parent.mkdir()
    nbformat.write(_nb("# BEGIN SOLUTION\nx = 1"), bad)
    rc, _ = _run_cli(student_main, [str(bad.parent), str(tmp_path / "out2")])
    assert rc == 1 and not (tmp_path / "out2" / "b.ipynb").exists()
