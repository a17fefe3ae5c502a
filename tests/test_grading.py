"""The grader: it runs a handed-in notebook and decides each exercise itself.

Fast tier (a few kernel starts on a tiny synthetic notebook of chapter 00's checkers): the
honest round trip (student version 0 of N, instructor's N of N, a partial one exactly its right
answers); the forgeries (printed PASS lines, a replaced checker, an exercise dropped from the
metadata, lines written into the answers file) score nothing; a function answer is recorded in
the kernel and checked in the sandbox; timeouts, a dead kernel and a kernel that ignores
interrupts. Without a kernel: reading the answers file, the package fingerprint, the report.
Slow tier (`notebook`, `slow`): every notebook in notebooks/, student version 0 of N with a
hint per exercise, instructor's version N of N.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import textwrap
from pathlib import Path

import nbformat
import pytest
from course_folder import code_notebook
from english_prose import find_english_prose
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook
from notebook_grading import NOTEBOOKS, ZH_CHAPTERS, grade_subprocess, sample_report

from llmlab.course.check.core import NOT_ANSWERED
from llmlab.course.instructor import (
    MANIFEST_NAME,
    NOT_RECORDED,
    exercise_ids,
    fill_solutions,
    grade_main,
    grading,
    kernel_run,
    read_answers,
    student_main,
    student_notebook,
)

SYNTHETIC = [
    new_markdown_cell("# A tiny chapter\nThree exercises built on chapter 00's checkers."),
    new_code_cell("from llmlab.course import check\nfrom llmlab.course.check import ch00 as c0"),
    new_code_cell("answer = 13  # SOLUTION\ncheck.ch00.num_chapters(answer)"),
    new_code_cell(
        textwrap.dedent("""\
        def pick():
            # BEGIN SOLUTION
            choice = "b"
            return choice
            # END SOLUTION
        answer = pick()
        c0.fast_mode(answer)""")
    ),
    new_code_cell(
        textwrap.dedent("""\
        # BEGIN SOLUTION
        parts = ["llmlab", "ops"]
        # END SOLUTION
        answer = ".".join(["llmlab",  # SOLUTION
                           "ops"])  # SOLUTION
        c0.module_for_paged_attention(answer)""")
    ),
    new_code_cell("print('parts later on:', parts)"),
]
SYNTHETIC_IDS = ["ch00.num_chapters", "ch00.fast_mode", "ch00.module_for_paged_attention"]
NAME = "01-tiny.ipynb"


def _run_cli(main, argv):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = main(argv)
    return rc, out.getvalue()


def _grade_json(paths, *extra):
    rc, text = _run_cli(
        grade_main, [str(p) for p in paths] + ["--json", "--cell-timeout", "120", *extra]
    )
    assert rc == 0, text
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


def _by_id(rep: dict) -> dict:
    return {e["id"]: e for e in rep["exercises"]}


def _assert_student_report(rep, n):
    assert (rep["score"], rep["total"]) == (0, n), rep
    assert rep["errors"] == [], f"the student version crashed: {rep['errors']}"
    for ex in rep["exercises"]:
        assert not ex["passed"]
        assert ex["message"].strip() and NOT_RECORDED not in ex["message"], ex


@pytest.fixture
def tiny(tmp_path):
    """(the instructor's notebook, the student version, its solutions), in tmp_path/instructor."""
    src = tmp_path / "instructor" / NAME
    src.parent.mkdir()
    nbformat.write(new_notebook(cells=SYNTHETIC), src)
    student, solutions = student_notebook(nbformat.read(src, as_version=4))
    return src, student, solutions


def _write(tmp_path, folder: str, nb) -> Path:
    path = tmp_path / folder / NAME
    path.parent.mkdir()
    nbformat.write(nb, path)
    return path


# --------------------------------------------------------------------------- honest notebooks


@pytest.mark.notebook
def test_round_trip_student_instructor_and_partial_through_the_command_line(tmp_path, tiny):
    src, _, solutions = tiny
    dst = tmp_path / "student"
    rc, text = _run_cli(student_main, [str(src.parent), str(dst)])
    assert rc == 0 and "3 exercises, 4 solutions removed" in text, text
    partial = fill_solutions(nbformat.read(dst / NAME, as_version=4), solutions)
    partial.cells[3].source = partial.cells[3].source.replace('choice = "b"', 'choice = "a"')
    partial_path = _write(tmp_path, "partial", partial)

    rep_student, rep_instructor, rep_partial = _grade_json(
        [dst / NAME, src, partial_path], "--source", str(dst / MANIFEST_NAME)
    )
    _assert_student_report(rep_student, 3)
    assert all(
        ex["message"] == NOT_ANSWERED
        for ex in rep_student["exercises"]
        if ex["id"] != "ch00.fast_mode"
    )  # pick() returns None: the same hint
    assert [e["id"] for e in rep_student["exercises"]] == SYNTHETIC_IDS
    assert (rep_instructor["score"], rep_instructor["total"], rep_instructor["errors"]) == (
        3,
        3,
        [],
    )
    assert (rep_partial["score"], rep_partial["total"]) == (2, 3), rep_partial
    assert [e["id"] for e in rep_partial["exercises"] if e["passed"]] == [
        "ch00.num_chapters",
        "ch00.module_for_paged_attention",
    ]
    assert "every figure is still drawn" in _by_id(rep_partial)["ch00.fast_mode"]["message"]
    assert set(rep_instructor) >= {
        "notebook",
        "source",
        "score",
        "total",
        "exercises",
        "errors",
        "seconds",
    }
    assert rep_instructor["source"] == str(dst / MANIFEST_NAME)


@pytest.mark.notebook
def test_the_kernel_runs_over_local_sockets_and_is_shut_down_by_the_grader(tiny):
    """No "Kernel is running over TCP without encryption" warning (the kernel talks over IPC
    sockets in a private folder) and no "Parent appears to have exited" (the grader shuts its
    kernel down itself instead of leaving it to notice the grader is gone)."""
    import subprocess
    import sys

    src, _, _ = tiny
    proc = subprocess.run(
        [sys.executable, "-m", "llmlab", "grade", str(src), "--source", str(src), "--json"],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1])["score"] == 3
    for warning in ("without encryption", "Parent appears to have exited", "TCP"):
        assert warning not in proc.stderr, proc.stderr[-2000:]


@pytest.mark.notebook
def test_a_function_answer_is_recorded_in_the_kernel_and_checked_in_the_sandbox(tmp_path):
    """The student's function uses a helper and module aliases from other cells; the grader
    carries them along and the checker passes it."""
    nb = code_notebook(
        "import torch\nimport torch.nn.functional as F\nfrom llmlab.course.check import ch02",
        "def causal(T):\n    return torch.ones(T, T, dtype=torch.bool).triu(1)",
        textwrap.dedent("""\
            def my_attention(q, k, v):
                T, d = q.shape
                s = (q @ k.T / d ** 0.5).masked_fill(causal(T), float("-inf"))
                return F.softmax(s, dim=-1) @ v
            ch02.attention(my_attention)"""),
    )
    path = _write(tmp_path, "fn", nb)
    (rep,) = _grade_json([path], "--source", str(path))
    assert (rep["score"], rep["total"], rep["errors"]) == (1, 1, []), rep


# --------------------------------------------------------------------------- forgeries


@pytest.mark.notebook
def test_printed_pass_lines_score_nothing(tmp_path, tiny):
    src, student, _ = tiny
    student.cells.append(
        new_code_cell("\n".join(f'print("[check {ex}] PASS: ok")' for ex in SYNTHETIC_IDS))
    )
    (rep,) = _grade_json([_write(tmp_path, "forged", student)], "--source", str(src))
    assert (rep["score"], rep["total"]) == (0, 3), rep
    assert all(
        e["message"] == NOT_ANSWERED for e in rep["exercises"] if e["id"] != "ch00.fast_mode"
    )


@pytest.mark.notebook
def test_a_replaced_checker_scores_nothing(tmp_path, tiny):
    src, student, _ = tiny
    student.cells.insert(
        2,
        new_code_cell(
            textwrap.dedent("""\
        check.ch00.num_chapters = lambda a: print("[check ch00.num_chapters] PASS: ok")
        c0.fast_mode = lambda a: print("[check ch00.fast_mode] PASS: ok")
        import llmlab.course.check.ch00
        llmlab.course.check.ch00.module_for_paged_attention = print""")
        ),
    )
    (rep,) = _grade_json([_write(tmp_path, "forged", student)], "--source", str(src))
    assert (rep["score"], rep["total"]) == (0, 3), rep
    for ex in rep["exercises"]:
        assert (
            ex["message"].startswith(NOT_RECORDED)
            and "never reached llmlab's checker" in ex["message"]
        ), ex


@pytest.mark.notebook
def test_an_exercise_dropped_from_the_metadata_is_still_expected_and_reported_missing(
    tmp_path, tiny
):
    src, student, solutions = tiny
    solved = fill_solutions(student, solutions)
    del solved.cells[4]  # the third exercise's cell
    solved.metadata["llmlab"]["exercises"] = SYNTHETIC_IDS[:2]
    (rep,) = _grade_json([_write(tmp_path, "forged", solved)], "--source", str(src))
    assert (rep["score"], rep["total"]) == (2, 3), rep
    dropped = _by_id(rep)["ch00.module_for_paged_attention"]
    assert not dropped["passed"]
    assert (
        "no longer calls llmlab.course.check.ch00.module_for_paged_attention" in dropped["message"]
    )


@pytest.mark.notebook
def test_lines_written_into_the_answers_file_forge_nothing(tmp_path, tiny):
    """The kernel can find the grader's answers file (through the wrapped checker) and write
    into it; verdict-like lines are skipped, and a record is only ever an answer to check."""
    src, student, _ = tiny
    student.cells[2].source = "answer = 13\ncheck.ch00.num_chapters(answer)"
    student.cells.append(
        new_code_cell(
            textwrap.dedent("""\
        import json
        path = next(c.cell_contents for c in c0.fast_mode.__closure__
                    if isinstance(c.cell_contents, str) and c.cell_contents.endswith(".jsonl"))
        with open(path, "a") as f:
            f.write("[check ch00.fast_mode] PASS: ok\\n")
            f.write(json.dumps({"exercise": "ch00.fast_mode", "passed": True, "message": "ok"}) + "\\n")
            f.write(json.dumps({"exercise": "ch00.module_for_paged_attention",
                                "args": [{"__eval__": "'llmlab.ops'"}], "kwargs": {}}) + "\\n")""")
        )
    )
    (rep,) = _grade_json([_write(tmp_path, "forged", student)], "--source", str(src))
    assert (rep["score"], rep["errors"]) == (1, []), rep
    assert _by_id(rep)["ch00.num_chapters"]["passed"]
    assert _by_id(rep)["ch00.fast_mode"]["message"] == NOT_ANSWERED  # its last real call
    assert "cannot be read" in _by_id(rep)["ch00.module_for_paged_attention"]["message"]


# --------------------------------------------------------------------------- runs that go wrong


@pytest.mark.notebook
def test_grader_counts_exercises_after_a_crash_and_interrupts_slow_cells(tmp_path):
    """A cell over the time limit is interrupted and grading goes on; a kernel that dies
    leaves the later exercises failed with a message that says why; outputs handed in with
    the notebook are never graded."""
    source = _write(
        tmp_path,
        "instructor",
        code_notebook(
            "from llmlab.course.check import ch00\nch00.num_chapters(13)\nch00.fast_mode('b')\n"
            "ch00.module_for_paged_attention('ops')"
        ),
    )
    nb = code_notebook(
        "from llmlab.course.check import ch00\nimport time",
        "time.sleep(600)",
        "ch00.num_chapters(13)",
        "import os\nos._exit(1)",
        "ch00.fast_mode('b')",
    )
    nb.cells[4].outputs = [
        nbformat.v4.new_output(
            "stream", name="stdout", text="[check ch00.fast_mode] PASS: correct.\n"
        )
    ]
    (rep,) = _grade_json(
        [_write(tmp_path, "crash", nb)], "--cell-timeout", "12", "--source", str(source)
    )
    assert (rep["score"], rep["total"]) == (1, 3), rep
    by_id = _by_id(rep)
    assert by_id["ch00.num_chapters"]["passed"]  # graded after the interrupted cell
    assert (
        not by_id["ch00.fast_mode"]["passed"]
        and "kernel died" in by_id["ch00.fast_mode"]["message"]
    )
    assert "no longer calls" in by_id["ch00.module_for_paged_attention"]["message"]
    assert [e["ename"] for e in rep["errors"]] == ["CellTimeoutError", "DeadKernelError"]
    assert rep["seconds"] < 120


@pytest.mark.notebook
def test_a_kernel_that_ignores_interrupts_ends_the_run(tmp_path, monkeypatch):
    # 12 s per cell, as the crash test above: the first cell imports llmlab, which takes seconds
    # on a busy machine; only the endless cell reaches the limit
    monkeypatch.setattr(kernel_run, "PROBE_TIMEOUT_S", 2)
    nb = code_notebook(
        "from llmlab.course.check import ch00\nimport signal, time",
        "ch00.num_chapters(13)",
        "signal.signal(signal.SIGINT, signal.SIG_IGN)  # the kernel restores it for the next cell\n"
        "while True:\n    time.sleep(0.05)",
        "ch00.fast_mode('b')",
    )
    path = _write(tmp_path, "hang", nb)
    (rep,) = _grade_json([path], "--cell-timeout", "12", "--source", str(path))
    assert (rep["score"], rep["total"]) == (1, 2), rep
    assert [e["ename"] for e in rep["errors"]] == ["CellTimeoutError"]
    assert "did not stop when interrupted" in rep["errors"][0]["evalue"]
    assert "did not stop when interrupted" in _by_id(rep)["ch00.fast_mode"]["message"]
    assert rep["seconds"] < 90


# --------------------------------------------------------------------------- without a kernel


def test_read_answers_keeps_the_last_well_formed_record_of_an_expected_exercise(tmp_path):
    path = tmp_path / "answers.jsonl"
    lines = [
        {"exercise": "ch00.a", "args": [1], "kwargs": {}},
        {"exercise": "ch00.a", "args": [2], "kwargs": {}},
        {"exercise": "ch00.b", "error": "cannot record a Timeline"},
        {"exercise": "ch00.b", "passed": True},  # not a record: skipped
        {"exercise": "ch00.c", "args": 3, "kwargs": {}},  # args not a list: skipped
        {"exercise": "ch99.other", "args": [1], "kwargs": {}},  # not expected: skipped
        {"exercise": ["ch00.a"], "args": [1], "kwargs": {}},
    ]
    path.write_text("\n".join(map(json.dumps, lines)) + "\n[check ch00.c] PASS: ok\n{broken")
    assert read_answers(path, ["ch00.a", "ch00.b", "ch00.c"]) == {
        "ch00.a": {"args": [2], "kwargs": {}},
        "ch00.b": {"error": "cannot record a Timeline"},
    }


def test_read_answers_takes_nothing_from_a_link_or_a_pipe(tmp_path):
    real = tmp_path / "real.jsonl"
    real.write_text(json.dumps({"exercise": "ch00.a", "args": [1], "kwargs": {}}) + "\n")
    (tmp_path / "link.jsonl").symlink_to(real)
    os.mkfifo(tmp_path / "pipe.jsonl")  # opening it must not wait for a writer
    assert read_answers(real, ["ch00.a"]) != {}
    assert read_answers(tmp_path / "link.jsonl", ["ch00.a"]) == {}
    assert read_answers(tmp_path / "pipe.jsonl", ["ch00.a"]) == {}
    assert read_answers(tmp_path / "missing.jsonl", ["ch00.a"]) == {}


def test_package_fingerprint_sees_an_edited_checker_but_not_compiled_caches(tmp_path, monkeypatch):
    (tmp_path / "llmlab" / "course" / "check" / "__pycache__").mkdir(parents=True)
    (tmp_path / "data").mkdir()
    checker = tmp_path / "llmlab" / "course" / "check" / "ch00.py"
    checker.write_text("CHAPTERS = 13\n")
    (tmp_path / "data" / "models.json").write_text("{}")
    monkeypatch.setattr(grading, "package_root", lambda: tmp_path)
    monkeypatch.setattr("llmlab.paths.DATA_DIR", tmp_path / "data")
    before = grading.package_fingerprint()
    (tmp_path / "llmlab" / "course" / "check" / "__pycache__" / "ch00.cpython-311.pyc").write_bytes(
        b"compiled"
    )
    assert grading.package_fingerprint() == before
    checker.write_text("CHAPTERS = 12\n")
    assert grading.package_fingerprint() != before
    checker.write_text("CHAPTERS = 13\n")
    (tmp_path / "data" / "models.json").write_text('{"x": 1}')
    assert grading.package_fingerprint() != before


def test_text_report_lists_each_exercise_and_the_total():
    rep = sample_report()
    lines = rep.text().splitlines()
    assert lines[0] == "nb.ipynb"
    assert lines[1].split() == ["PASS", "ch00.a", "correct."]
    assert lines[2].split()[:3] == ["NOT", "YET", "ch00.bb"] and lines[2].endswith("count again.")
    assert "ZeroDivisionError" in lines[3]
    assert "score: 1 of 2" in lines[4]
    assert json.loads(json.dumps(rep.to_dict()))["score"] == 1


def test_command_line_needs_a_source_and_checks_it_before_running_anything(tmp_path, capsys):
    nb_path = tmp_path / NAME
    nbformat.write(new_notebook(cells=SYNTHETIC), nb_path)
    with pytest.raises(SystemExit) as e:
        grade_main([str(nb_path)])
    assert e.value.code == 2 and "--source" in capsys.readouterr().err
    assert grade_main([str(tmp_path / "missing.ipynb"), "--source", str(nb_path)]) == 2
    assert grade_main([str(nb_path), "--source", str(nb_path), "--cell-timeout", "0"]) == 2
    assert grade_main([str(nb_path), "--source", str(tmp_path / "nowhere")]) == 2
    assert "does not exist" in capsys.readouterr().err


# --------------------------------------------------------------------------- every real notebook, run

# the student's edition goes round in the language the instructor's run does not use
ZH_STUDENT = tuple(p.stem for p in NOTEBOOKS if p.stem not in ZH_CHAPTERS)


@pytest.mark.notebook
@pytest.mark.slow
@pytest.mark.parametrize(
    "path", NOTEBOOKS, ids=[p.stem + ("-zh" if p.stem in ZH_STUDENT else "") for p in NOTEBOOKS]
)
def test_round_trip_every_notebook(path, tmp_path):
    """The student edition (what `make lab` opens, built as it builds it): 0 of N, each exercise
    NOT YET with its hint, no cell crashes. (The instructor's edition is graded N of N by
    test_notebooks.py, in the one run that also checks its time and figures; its solutions put
    back into the student version give it exactly.) It goes round in the language the
    instructor's run does not use, so every chapter runs once in each: in the Chinese edition
    the grader hears its checkers in Chinese."""
    from llmlab.course.instructor import editions

    zh = path.stem in ZH_STUDENT
    nb = nbformat.read(path, as_version=4)
    if zh:
        from llmlab.course import lang

        [translated] = lang.build("zh", path, tmp_path / "zh")
        nb = nbformat.read(translated, as_version=4)
    student, solutions = student_notebook(nb, where=path.name)
    assert [c.source for c in fill_solutions(student, solutions).cells] == [
        c.source for c in nb.cells
    ]
    # the edition sits in a folder of its own with the notebooks' other files linked in, so
    # relative paths resolve as in notebooks/
    work = tmp_path / "work"
    work.mkdir()
    for item in path.parent.iterdir():
        if item.suffix != ".ipynb" and not item.name.startswith("."):
            (work / item.name).symlink_to(item)
    [chapter] = editions.build("zh" if zh else "en", path, work)
    assert [c.source for c in nbformat.read(chapter, as_version=4).cells] == [
        c.source for c in student.cells
    ]
    executed = tmp_path / "executed"
    rep_student = grade_subprocess(chapter, path, keep=executed)
    n = len(exercise_ids(nb))
    print(f"{path.name}: student {rep_student['seconds']:.1f} s, {n} exercises")
    _assert_student_report(rep_student, n)
    if zh:
        assert all(
            re.search(r"[\u4e00-\u9fff]", ex["message"]) for ex in rep_student["exercises"]
        ), [ex["message"] for ex in rep_student["exercises"]]
        # nothing a Chinese reader sees is English prose (tests/english_prose.py says what counts)
        prose = find_english_prose(nbformat.read(executed / chapter.name, as_version=4))
        assert not prose, f"{path.name}: English prose in the Chinese edition:\n" + "\n".join(
            map(str, prose)
        )
