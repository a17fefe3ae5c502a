"""llmlab.course.instructor.reading_time: the one model of how long a chapter takes, on synthetic
notebooks (reading, running cells, exercises by kind and by size, measured run time, the required
path against the whole chapter), and the course's own chapters: every code cell has a measured
run time, and every place that states a time states the model's (stated_times)."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

from llmlab.course.instructor import reading_time as rt
from llmlab.course.instructor import stated_times


def _nb(*cells):
    return new_notebook(cells=list(cells))


def _code(source: str, cid: str):
    cell = new_code_cell(source)
    cell.id = cid
    return cell


def test_reading_running_exercises_and_run_time_add_up():
    nb = _nb(
        new_markdown_cell("# 04 · A chapter\n\n" + "word " * 300),
        _code(
            "from llmlab.course.check import ch04\nanswer = 1  # SOLUTION\nch04.kv_bytes_per_token(answer)",
            "a",
        ),
        _code("answer = 'b'  # SOLUTION\nch04.utilization_gain(answer)", "b"),
        _code("my_prediction = 3  # SOLUTION", "c"),
    )
    est = rt.estimate(nb, {"a": 30.0, "b": 0.5, "c": 0.0})
    code_words = sum(
        len(rt._WORD.findall(rt._student_source(c.source))) for c in nb.cells[1:]
    )  # the code as the student edition shows it
    prose = len(rt._WORD.findall(nb.cells[0].source))  # "04", "A", "chapter" and 300 words
    assert prose == 303 and est.words == prose + code_words
    assert est.code_cells == 3 and est.predictions == 1
    assert est.exercise_minutes == {"ch04.kv_bytes_per_token": 2.0, "ch04.utilization_gain": 4.5}
    assert est.run_seconds == 30.5
    assert est.minutes == pytest.approx(est.words / 150 + 3 * 0.5 + 2.0 + 4.5 + 1.0 + 30.5 / 60)


def _solution(lines: int, name: str = "f") -> str:
    body = "\n".join(f"    x{i} = {i}" for i in range(lines - 2))
    return f"# BEGIN SOLUTION\ndef {name}(x):\n{body}\n    return x\n# END SOLUTION"


def test_code_the_student_writes_is_priced_by_its_size_and_a_build_within_25_and_45():
    def minutes(exercise, lines, name="f"):
        skeleton = _code(_solution(lines, name), "s")
        check = _code(
            f"from llmlab.course.check import {exercise.split('.')[0]}\n{exercise}({name})", "k"
        )
        return rt.estimate(_nb(skeleton, check)).exercise_minutes[exercise]

    assert minutes("ch02.attention", 5) == 8 + 5  # a function: 8 minutes and one a line
    assert minutes("ch02.attention", 12) == 8 + 12
    assert minutes("ch08.build_scheduler", 2, "MyScheduler") == 25  # a build: at least 25
    assert minutes("ch08.build_scheduler", 12, "MyScheduler") == 20 + 12
    assert minutes("ch08.build_scheduler", 60, "MyScheduler") == 45  # ... at most 45
    # comments and blank lines in the solution are not code written
    padded = _solution(5).replace("    return x", "    # why\n\n    return x")
    assert rt.solution_lines([padded]) == rt.solution_lines([_solution(5)]) == 5


def test_going_further_counts_in_the_whole_chapter_only():
    required = [new_markdown_cell("## 1. Required\n\none two three"), _code("x = 1", "r")]
    optional = [
        new_markdown_cell("## Going further: more\n\n" + "word " * 600),
        _code("from llmlab.course.check import ch04\nch04.kv_bytes_per_token(None)", "o"),
    ]
    after = [new_markdown_cell("## Summary\n\n- four five")]
    nb = _nb(*required, *optional, *after)
    seconds = {"r": 6.0, "o": 60.0}
    short, whole = rt.estimate(_nb(*required, *after), seconds), rt.estimate(nb, seconds)
    assert rt.estimate(nb, seconds) == short, "a Going further section adds nothing to the path"
    whole = rt.estimate(nb, seconds, whole=True)
    assert whole.words == short.words + sum(len(rt._WORD.findall(c.source)) for c in optional)
    assert whole.run_seconds == 66.0 and whole.exercise_minutes == {"ch04.kv_bytes_per_token": 2.0}
    assert rt.required_cells(nb) == [True, True, False, False, True]


def test_a_required_cell_reading_a_name_bound_only_in_going_further_is_caught():
    nb = _nb(
        new_markdown_cell("## 1. Required"),
        new_code_cell("x = 1"),
        new_markdown_cell("## Going further: more"),
        new_code_cell("import numpy as np\ny = x + 1\ndef f(): pass"),
        new_markdown_cell("## 2. Back"),
        new_code_cell("print(x, y, np.pi)\nf()"),
        new_markdown_cell("## Summary"),
    )
    assert rt.required_uses_of_optional(nb) == [(5, "f"), (5, "np"), (5, "y")]
    nb.cells[1].source = "x = y = 1\nimport numpy as np\ndef f(): pass"  # bound on the path too
    assert rt.required_uses_of_optional(nb) == []


def test_the_time_line_reads_back_in_both_languages_and_rounds_to_five():
    header = "# 04 · X\n\n" + rt.time_line(45, 70) + "\n\nmore"
    assert rt.stated_minutes(_nb(new_markdown_cell(header))) == (45, 70)
    assert rt.stated_minutes_zh(rt.time_line(45, 70, "zh")) == (45, 70)
    old = "**Time:** about 21 minutes (the Going further sections not included)."
    assert stated_times.with_time_line(old, 45, 70, "en") == rt.time_line(45, 70)
    assert [rt.rounded(m) for m in (0.4, 12.4, 12.6, 47.4)] == [5, 10, 15, 45]


# The course's own chapters.
ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_every_code_cell_has_a_measured_run_time(path):
    missing = rt.unmeasured_cells(path)
    assert not missing, (
        f"{path.stem}: code cells {missing} have no run time in data/run_times.json; measure the "
        f"chapter with `python -m llmlab run --measure {path}`"
    )


def test_every_stated_time_is_the_models():
    problems = stated_times.problems()
    assert not problems, "\n".join(problems) + (
        "\n(`python -m llmlab exercises --write-times` writes the model's times everywhere)"
    )


def test_the_stated_times_check_catches_an_edited_header(tmp_path):
    """problems() reads what the files say: an edited header is reported."""
    import shutil

    for sub in ("notebooks", "i18n", "docs"):
        shutil.copytree(ROOT / sub, tmp_path / sub)
    for doc in ("README.md", "README.zh.md"):
        shutil.copy(ROOT / doc, tmp_path / doc)
    path = tmp_path / "notebooks" / "07-roofline.ipynb"
    nb = nbformat.read(path, as_version=4)
    first = next(c for c in nb.cells if c.cell_type == "markdown")
    first.source = stated_times.with_time_line(first.source, 5, 5, "en")
    nbformat.write(nb, path)
    problems = stated_times.problems(tmp_path)
    assert any(p.startswith("07-roofline: the header states (5, 5)") for p in problems), problems


def test_no_required_cell_depends_on_a_going_further_section():
    bad = {p.stem: rt.required_uses_of_optional(nbformat.read(p, as_version=4)) for p in NOTEBOOKS}
    assert not {k: v for k, v in bad.items() if v}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_going_further_sections_come_before_the_summary_and_say_so(path):
    nb = nbformat.read(path, as_version=4)
    required = rt.required_cells(nb)
    assert required[-1] and nb.cells[-1].source.lstrip().startswith("## Summary"), path.stem
    for cell, on_path in zip(nb.cells, required):
        if not on_path and cell.cell_type == "markdown" and cell.source.lstrip().startswith("## "):
            assert rt.GOING_FURTHER.match(cell.source.lstrip()), path.stem
