"""The headless grader: run a student's notebook in a fresh kernel and grade its exercises.

`python -m llmlab grade PATH.ipynb [--json] [--cell-timeout S]` runs the notebook in a fresh
kernel (LLMLAB_FAST=1, HF_HUB_OFFLINE=1, a time limit per cell, errors do not stop the run),
reads the checkers' lines (`[check ID] PASS: ...` / `[check ID] NOT YET: hint`) from the
outputs and prints one verdict per exercise and a total. The grader itself never imports or
runs the notebook's code; only the kernel does.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from llmlab.check.core import FAIL_WORD, LINE_PREFIX, PASS_WORD
from llmlab.instructor.exercises import exercise_calls, exercise_ids
from llmlab.instructor.student import METADATA_KEY, _notebook_paths

DEFAULT_CELL_TIMEOUT_S = 300
GRADING_ENV = {"LLMLAB_FAST": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
# unless the caller's environment says otherwise: OpenMP threads sleep instead of spinning
# (spinning slowed the model many times over when several kernels share a few cores)
GRADING_ENV_DEFAULTS = {"OMP_WAIT_POLICY": "PASSIVE"}
CHECK_LINE = re.compile(r"^" + re.escape(LINE_PREFIX) + r"([^\]\s]+)\] (" + re.escape(PASS_WORD)
                        + "|" + re.escape(FAIL_WORD) + r"): ?(.*)$")
NO_LINE_MESSAGE = "no check line was printed: the notebook stopped or skipped this exercise before its checker ran"


# --------------------------------------------------------------------------- grading

@dataclass
class ExerciseResult:
    id: str
    passed: bool
    message: str


@dataclass
class GradeReport:
    notebook: str
    exercises: list[ExerciseResult]
    errors: list[dict] = field(default_factory=list)   # {"cell", "index", "ename", "evalue"}
    seconds: float = 0.0

    @property
    def score(self) -> int:
        return sum(e.passed for e in self.exercises)

    @property
    def total(self) -> int:
        return len(self.exercises)

    def to_dict(self) -> dict:
        return {"notebook": self.notebook, "score": self.score, "total": self.total,
                "exercises": [asdict(e) for e in self.exercises], "errors": self.errors,
                "seconds": round(self.seconds, 2)}

    def text(self) -> str:
        lines = [f"{self.notebook}"]
        width = max((len(e.id) for e in self.exercises), default=0)
        for e in self.exercises:
            word = "PASS   " if e.passed else "NOT YET"
            lines.append(f"  {word}  {e.id:<{width}}  {e.message}")
        for err in self.errors:
            lines.append(f"  error in cell {err['cell']}: {err['ename']}: {err['evalue']}")
        lines.append(f"  score: {self.score} of {self.total}  ({self.seconds:.0f} s)")
        return "\n".join(lines)


def check_lines(nb: Any) -> dict[str, tuple[bool, str]]:
    """Exercise id → (passed, message) from the check lines in an executed notebook's outputs;
    when an exercise printed several lines, the last one counts."""
    found: dict[str, tuple[bool, str]] = {}
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        texts: list[str] = []
        stdout = "".join(o.get("text", "") for o in cell.get("outputs", [])
                         if o.get("output_type") == "stream" and o.get("name") == "stdout")
        texts.append(stdout)
        for o in cell.get("outputs", []):
            if o.get("output_type") in ("execute_result", "display_data"):
                plain = o.get("data", {}).get("text/plain", "")
                texts.append("".join(plain) if isinstance(plain, list) else plain)
        for text in texts:
            for line in text.splitlines():
                m = CHECK_LINE.match(line.strip())
                if m:
                    found[m[1]] = (m[2] == PASS_WORD, m[3].strip())
    return found


def expected_exercises(nb: Any, reference: Any = None) -> list[str]:
    """The exercises to grade: those of `reference` (the instructor's notebook) when given;
    else those recorded in the metadata at student-build time, then any the cells call."""
    if reference is not None:
        return exercise_ids(reference)
    recorded = nb.metadata.get(METADATA_KEY, {}).get("exercises", [])
    ids = [x for x in recorded if isinstance(x, str)] if isinstance(recorded, list) else []
    for x in exercise_ids(nb):
        if x not in ids:
            ids.append(x)
    return ids


def _error(nb: Any, index: int | None, ename: str, evalue: str) -> dict:
    if index is None:
        return {"cell": "-", "index": None, "ename": ename, "evalue": evalue}
    return {"cell": _cell_label(nb, index), "index": index, "ename": ename, "evalue": evalue}


def _cell_label(nb: Any, index: int) -> str:
    first = next((ln.strip() for ln in nb.cells[index].source.split("\n") if ln.strip()), "")
    return f"{index}" + (f" ({first[:60]})" if first else "")


def execute_for_grading(nb: Any, cwd: str | Path, cell_timeout: float) -> tuple[list[dict], float]:
    """Run `nb` in place in a fresh python3 kernel started in `cwd` with GRADING_ENV; errors
    and timeouts are recorded per cell and never stop the run. Returns (errors, seconds)."""
    from nbclient import NotebookClient
    from nbclient.exceptions import DeadKernelError

    if cell_timeout <= 0:
        raise ValueError(f"cell_timeout must be > 0 seconds, got {cell_timeout!r}")
    env = {**GRADING_ENV_DEFAULTS, **os.environ, **GRADING_ENV}
    client = NotebookClient(nb, timeout=cell_timeout, kernel_name="python3", allow_errors=True,
                            interrupt_on_timeout=True, record_timing=False,
                            error_on_timeout={"ename": "CellTimeoutError",
                                              "evalue": f"the cell ran longer than {cell_timeout:g} s",
                                              "traceback": []},
                            resources={"metadata": {"path": str(cwd)}})
    for cell in nb.cells:     # outputs handed in are never graded: only what this run prints
        if cell.cell_type == "code":
            cell.outputs = []
            cell.execution_count = None
    errors: list[dict] = []
    t0 = time.perf_counter()
    try:
        with client.setup_kernel(env=env, cwd=str(cwd)):
            for index, cell in enumerate(nb.cells):
                if cell.cell_type != "code" or not cell.source.strip():
                    continue
                c0 = time.perf_counter()
                try:
                    client.execute_cell(cell, index)
                except DeadKernelError as e:
                    errors.append(_error(nb, index, "DeadKernelError",
                                         f"the kernel died ({e}); the cells after it did not run"))
                    break
                except Exception as e:  # nbclient's own failures: record them and go on
                    text = str(e).strip()
                    errors.append(_error(nb, index, type(e).__name__, text.splitlines()[-1] if text else ""))
                    continue
                elapsed = time.perf_counter() - c0
                errs = [o for o in cell.get("outputs", []) if o.get("output_type") == "error"]
                if elapsed >= cell_timeout:
                    errors.append(_error(nb, index, "CellTimeoutError",
                                         f"the cell ran longer than {cell_timeout:g} s and was interrupted"))
                elif errs:
                    errors.append(_error(nb, index, errs[0].get("ename", "Error"),
                                         str(errs[0].get("evalue", ""))[:300]))
    except DeadKernelError as e:
        errors.append(_error(nb, None, "DeadKernelError", str(e)))
    except RuntimeError as e:   # the kernel did not start
        errors.append(_error(nb, None, type(e).__name__, str(e)[:300]))
    return errors, time.perf_counter() - t0


def _missing_message(cell_index: int | None, errors: list[dict]) -> str:
    """Why an exercise printed no line: its own cell's error, else the error that stopped the
    run before it, else the first error."""
    cause = None
    if cell_index is not None:
        cause = next((e for e in errors if e["index"] == cell_index), None)
        if cause is None:
            cause = next((e for e in errors if e["index"] is not None and e["index"] < cell_index
                          and e["ename"] == "DeadKernelError"), None)
    if cause is None:
        cause = next((e for e in errors if e["ename"] == "DeadKernelError"), None) or (errors[0] if errors else None)
    if cause is None:
        return NO_LINE_MESSAGE + " (no cell raised an error: was the checker call removed?)"
    return NO_LINE_MESSAGE + f" (cell {cause['cell']}: {cause['ename']}: {cause['evalue']})"


def grade_notebook(path: str | Path, *, cell_timeout: float = DEFAULT_CELL_TIMEOUT_S,
                   reference: str | Path | None = None, keep: str | Path | None = None) -> GradeReport:
    """Execute the notebook at `path` headless and grade its exercises.

    reference: the instructor's notebook whose exercises are expected (else the ids recorded at
    student-build time plus those the cells call). keep: write the executed copy there."""
    import nbformat

    path = Path(path)
    if not path.is_file():
        raise ValueError(f"path {str(path)!r} is not a notebook file")
    nb = nbformat.read(path, as_version=4)
    ref_nb = nbformat.read(Path(reference), as_version=4) if reference is not None else None
    expected = expected_exercises(nb, ref_nb)
    errors, seconds = execute_for_grading(nb, path.parent.resolve(), cell_timeout)
    if keep is not None:
        Path(keep).parent.mkdir(parents=True, exist_ok=True)
        nbformat.write(nb, keep)
    seen = check_lines(nb)
    if not expected:
        expected = list(seen)
    cells = dict(exercise_calls(nb))
    results = []
    for ex in expected:
        if ex in seen:
            ok, msg = seen[ex]
            results.append(ExerciseResult(ex, ok, msg))
        else:
            results.append(ExerciseResult(ex, False, _missing_message(cells.get(ex), errors)))
    return GradeReport(str(path), results, errors, seconds)


def grade_main(argv: list[str]) -> int:
    """`python -m llmlab grade PATH... [--json] [--cell-timeout S] [--reference P]`."""
    parser = argparse.ArgumentParser(prog="python -m llmlab grade",
                                     description="Execute notebooks headless and grade their exercises.")
    parser.add_argument("paths", nargs="+", help="student notebooks, or folders of them")
    parser.add_argument("--json", action="store_true",
                        help="print one JSON object per notebook (one per line) instead of text")
    parser.add_argument("--cell-timeout", type=float, default=DEFAULT_CELL_TIMEOUT_S, metavar="S",
                        help=f"seconds a cell may run before it is interrupted (default {DEFAULT_CELL_TIMEOUT_S})")
    parser.add_argument("--reference", metavar="P",
                        help="the instructor's notebook, or folder of them (matched by file name), "
                             "whose exercises are expected")
    parser.add_argument("--keep", metavar="DIR", help="write the executed notebooks into DIR")
    args = parser.parse_args(argv)
    if args.cell_timeout <= 0:
        print(f"error: --cell-timeout must be > 0 seconds, got {args.cell_timeout}", file=sys.stderr)
        return 2
    paths: list[Path] = []
    for p in map(Path, args.paths):
        if not p.exists():
            print(f"error: {p} does not exist", file=sys.stderr)
            return 2
        paths.extend(_notebook_paths(p))
    if not paths:
        print("error: no .ipynb file to grade", file=sys.stderr)
        return 2
    for p in paths:
        reference = None
        if args.reference:
            ref = Path(args.reference)
            reference = ref / p.name if ref.is_dir() else ref
            if not reference.is_file():
                print(f"error: no reference notebook {reference} for {p}", file=sys.stderr)
                return 2
        keep = Path(args.keep) / p.name if args.keep else None
        report = grade_notebook(p, cell_timeout=args.cell_timeout, reference=reference, keep=keep)
        if args.json:
            print(json.dumps(report.to_dict(), ensure_ascii=False))
        else:
            print(report.text())
        sys.stdout.flush()
    return 0
