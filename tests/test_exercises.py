"""Which exercises a notebook has: found in its source (every import style, the shape of each
call), recorded in the manifest, and looked up for a handed-in notebook from a source the
instructor names."""

from __future__ import annotations

import contextlib
import importlib
import inspect
import io
import json
from pathlib import Path

import pytest
from course_folder import code_notebook, write_course

from llmlab.course.instructor import (
    MANIFEST_NAME,
    Exercise,
    exercise_calls,
    exercises,
    exercises_for,
    read_manifest,
    write_manifest,
)

ROOT = Path(__file__).resolve().parent.parent
CHECK_MODULES = sorted(p.stem for p in (ROOT / "llmlab" / "course" / "check").glob("ch[0-9][0-9]*"))


def test_exercise_calls_follow_every_import_style():
    nb = code_notebook(
        "from llmlab.course import check\ncheck.ch00.num_chapters(1)",
        "from llmlab.course.check import ch04 as c4\nc4.kv_bytes_per_token(None)",
        "import llmlab.course.check.ch07 as roof\nx = roof.ridge_point(2)",
        "from llmlab.course.check.ch10 import tpot as my_tpot\nmy_tpot(0.1)",
        "import llmlab\nllmlab.check.ch02.head_size(None)\nch03.forwards(None)",
        "%timeit 1\nch08.why_continuous('b')",
        "print(ch02.HIDDEN, check.ch00.CHAPTERS)\nch00.num_chapters(None)  # again: counted once",
        "not python (\nch09.bubble_fraction(answer)",
    )
    assert exercise_calls(nb) == [
        ("ch00.num_chapters", 0),
        ("ch04.kv_bytes_per_token", 1),
        ("ch07.ridge_point", 2),
        ("ch10.tpot", 3),
        ("ch02.head_size", 4),
        ("ch03.forwards", 4),
        ("ch08.why_continuous", 5),
        ("ch09.bubble_fraction", 7),
    ]


def test_exercises_record_the_shape_of_the_first_call():
    nb = code_notebook(
        "from llmlab.course.check import ch06\nch06.working_set_level(answer, size=2**20)",
        "ch06.working_set_level(other)",  # a later call does not change it
        "ch06.hbm_vs_pcie(*pair, extra)\nch06.weight_read_ms()",
        "not python (\nch06.h200_floor_ms(answer)",
    )
    assert exercises(nb) == [
        Exercise("ch06.working_set_level", 1, ("size",)),
        Exercise("ch06.hbm_vs_pcie", 1),
        Exercise("ch06.weight_read_ms", 0),
        Exercise("ch06.h200_floor_ms", 1),
    ]


def test_every_checker_answers_none_with_its_own_id_and_a_hint():
    """Exercises are named `module.function`; every checker must print that id, once, NOT YET
    with a hint, for the placeholder None, and return the same verdict (the grader reads it)."""
    count = 0
    for name in CHECK_MODULES:
        module = importlib.import_module(f"llmlab.course.check.{name}")
        for fname, fn in inspect.getmembers(module, inspect.isfunction):
            if (
                not (fn.__module__ + ".").startswith(module.__name__ + ".")
                or fname.startswith("_")
                or "CheckResult" not in str(inspect.signature(fn).return_annotation)
            ):
                continue
            buf = io.StringIO()
            with contextlib.redirect_stdout(buf):
                result = fn(None)
            lines = [ln for ln in buf.getvalue().splitlines() if ln.startswith("[check ")]
            assert lines == [f"[check {name}.{fname}] NOT YET: {result.message}"], (
                name,
                fname,
                buf.getvalue(),
            )
            assert result.exercise == f"{name}.{fname}"
            assert not result.passed and result.message.strip()
            count += 1
    assert count >= 3 * len(CHECK_MODULES)


# --------------------------------------------------------------------------- the manifest and the source


def test_manifest_round_trip_and_malformed_entries(tmp_path):
    entries = {
        "04-kv.ipynb": [
            Exercise("ch04.kv_bytes_per_token"),
            Exercise("ch06.working_set_level", 1, ("size",)),
        ],
        "00-setup.ipynb": [],
    }
    path = write_manifest(tmp_path, entries)
    assert path == tmp_path / MANIFEST_NAME and read_manifest(path) == entries
    for bad, fragment in [
        ({"notebooks": {"a.ipynb": [{"id": "print('hi')"}]}}, "chNN.name"),
        ({"notebooks": {"a.ipynb": [{"id": "ch00.a", "positional": -1}]}}, "'positional'"),
        ({"notebooks": {"a.ipynb": [{"id": "ch00.a", "keywords": ["not a name"]}]}}, "'keywords'"),
        ({"exercises": []}, "expected"),
    ]:
        path.write_text(json.dumps(bad))
        with pytest.raises(ValueError, match=fragment):
            read_manifest(path)
    path.write_text("{not json")
    with pytest.raises(ValueError, match="cannot be read as JSON"):
        read_manifest(path)


def test_exercises_for_reads_a_notebook_a_manifest_or_a_folder(tmp_path):
    nb = code_notebook(
        "from llmlab.course.check import ch00\nch00.num_chapters(answer)", "ch00.fast_mode(answer)"
    )
    nbs = write_course(tmp_path, "00-setup.ipynb", nb)
    want = [Exercise("ch00.num_chapters"), Exercise("ch00.fast_mode")]
    assert exercises_for("renamed-by-student.ipynb", nbs / "00-setup.ipynb") == want
    assert exercises_for("00-setup.ipynb", nbs) == want
    (tmp_path / "handout").mkdir()
    write_manifest(tmp_path / "handout", {"00-setup.ipynb": want[:1]})
    assert (
        exercises_for("00-setup.ipynb", tmp_path / "handout") == want[:1]
    )  # the folder's manifest
    assert exercises_for("00-setup.ipynb", tmp_path / "handout" / MANIFEST_NAME) == want[:1]
    with pytest.raises(ValueError, match="no entry for '01-tokens.ipynb'"):
        exercises_for("01-tokens.ipynb", tmp_path / "handout")
    with pytest.raises(ValueError, match="holds neither"):
        exercises_for("01-tokens.ipynb", nbs)
    with pytest.raises(ValueError, match="does not exist"):
        exercises_for("00-setup.ipynb", tmp_path / "missing.ipynb")
