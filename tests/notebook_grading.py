"""Grading real notebooks in a subprocess, one at a time: shared by the notebook tests (the
instructor's version, which is also the run that checks time, errors and figures) and the
student-version round trip."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
BUDGET_S = 180  # a notebook's kernel time with LLMLAB_FAST=1 on a 2-core machine
# Each notebook runs once in each language: the instructor's edition in English (these chapters
# in Chinese) in test_notebooks.py, the student's edition in the other language in test_grading.py.
ZH_CHAPTERS = ("04-kv-cache", "11-vllm-arrives")


def grade_subprocess(
    path: Path, source: Path, keep: Path | None = None, expected_log: Path | None = None
) -> dict:
    """`python -m llmlab grade PATH --json --source SOURCE [--keep DIR]` in its own process
    (with `keep`, the executed copy is written to `keep / path.name`; with `expected_log`, every
    checker appends the numbers it expects to that file: see `llmlab.course.instructor.leaks`).

    One at a time: two notebook kernels side by side on a 2-core machine starve each other (a
    student-version cell once hit the 180 s cell limit that way in CI-like runs). nbclient
    sometimes waits out a whole cell timeout after a widget cell although the kernel finished it
    (seen twice in ~80 headless runs): such a run is graded once more, with a warning; any other
    error, or a second timeout, is left for the caller to fail on.
    """
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "LLMLAB_FAST": "1"}
    if expected_log is not None:
        env["LLMLAB_EXPECTED_LOG"] = str(expected_log)
    cmd = [
        sys.executable,
        "-m",
        "llmlab",
        "grade",
        str(path),
        "--json",
        "--source",
        str(source),
        "--cell-timeout",
        str(BUDGET_S),
    ] + (["--keep", str(keep)] if keep else [])
    for attempt in range(2):
        if expected_log is not None and expected_log.exists():
            expected_log.unlink()
        proc = subprocess.run(
            cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=BUDGET_S + 300
        )
        assert proc.returncode == 0, f"grade {path} exited {proc.returncode}: {proc.stderr[-2000:]}"
        report = json.loads(proc.stdout.strip().splitlines()[-1])
        timeouts = report["errors"] and all(
            e["ename"] == "CellTimeoutError" for e in report["errors"]
        )
        if not timeouts or attempt:
            return report
        warnings.warn(f"{path.name}: cell timeout {report['errors']}; graded once more")
    return report


def sample_report():
    """A grade report of two exercises, one passed, and an error in cell 3: the case the tests of
    the report's text read, in each language."""
    from llmlab.course.instructor.grading import ExerciseResult, GradeReport

    return GradeReport(
        "nb.ipynb",
        [
            ExerciseResult("ch00.a", True, "correct."),
            ExerciseResult("ch00.bb", False, "count again."),
        ],
        [
            {
                "cell": "3 (1/0)",
                "index": 3,
                "ename": "ZeroDivisionError",
                "evalue": "division by zero",
            }
        ],
    )
