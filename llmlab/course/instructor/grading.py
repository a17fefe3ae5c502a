"""The headless grader: run a student's notebook in a fresh kernel and judge its answers itself.

`python -m llmlab grade PATH.ipynb --source SRC [--json] [--cell-timeout S] [--keep DIR]`

1. The exercises come from the instructor's source (SRC: the instructor's notebook, a folder of
   them, or the manifest `student` wrote), read for every notebook before the first one runs;
   the notebook's own metadata and outputs are never read.
2. A checker process of the grader's own (`recheck`) starts and loads the checkers.
3. The notebook runs in a fresh kernel (LLMLAB_FAST=1, HF_HUB_OFFLINE=1, a time limit per
   cell, errors do not stop the run). Before its first cell, a set-up cell of the grader's wraps
   each expected checker so that every call records its arguments to a file with a random
   name in a folder of the grader's (`recording.record_calls`). The student still sees the
   checkers' lines; the grade never reads them.
4. The checker process judges the last recorded call of each exercise, cut to the shape of the
   instructor's call; function answers run in a sandbox process with a time limit.
5. One verdict per exercise and a total. An exercise whose checker was never called (a deleted
   or renamed cell, a replaced checker, a run that stopped early) counts as failed, with a
   message that says why.

The grader process itself never imports or runs the notebook's code; only the kernel, and for
function answers the sandbox, do. What remains trusted is written in docs/instructors.md.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import secrets
import stat
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable

from llmlab.course.instructor.exercises import Exercise, exercise_calls, exercises_for
from llmlab.course.instructor.kernel_run import (
    DID_NOT_RUN,
    cell_error,
    execute_for_grading,
    grading_env,
)
from llmlab.course.instructor.recheck import Recheck, RecheckError, package_root
from llmlab.course.instructor.student import _notebook_paths
from llmlab.i18n import LANG_ENV, tr

DEFAULT_CELL_TIMEOUT_S = 300
FUNCTION_TIMEOUT_S = 60  # a function answer: start-up and every call of its checker together
RECHECK_TIMEOUT_S = 600  # the checker process, all exercises of one notebook
MAX_ANSWERS_BYTES = 64 * 2**20  # the recorded answers of one run
NOT_RECORDED = "no answer was recorded"
NOT_RECORDED_ZH = "没有记录到答案"


@dataclass
class ExerciseResult:
    id: str
    passed: bool
    message: str


@dataclass
class GradeReport:
    notebook: str
    exercises: list[ExerciseResult]
    errors: list[dict] = field(default_factory=list)  # {"cell", "index", "ename", "evalue"}
    seconds: float = 0.0
    source: str = ""  # where the expected exercises came from

    @property
    def score(self) -> int:
        return sum(e.passed for e in self.exercises)

    @property
    def total(self) -> int:
        return len(self.exercises)

    def to_dict(self) -> dict:
        return {
            "notebook": self.notebook,
            "source": self.source,
            "score": self.score,
            "total": self.total,
            "exercises": [asdict(e) for e in self.exercises],
            "errors": self.errors,
            "seconds": round(self.seconds, 2),
        }

    def text(self) -> str:
        lines = [f"{self.notebook}"]
        width = max((len(e.id) for e in self.exercises), default=0)
        for e in self.exercises:
            word = tr("PASS   ", "通过  ") if e.passed else tr("NOT YET", "还不对")
            lines.append(f"  {word}  {e.id:<{width}}  {e.message}")
        for err in self.errors:
            lines.append(
                tr(
                    f"  error in cell {err['cell']}: {err['ename']}: {err['evalue']}",
                    f"  单元格 {err['cell']} 出错：{err['ename']}: {err['evalue']}",
                )
            )
        lines.append(
            tr(
                f"  score: {self.score} of {self.total}  ({self.seconds:.0f} s)",
                f"  得分：{self.score} / {self.total}（{self.seconds:.0f} s）",
            )
        )
        return "\n".join(lines)


# --------------------------------------------------------------------------- the package


def package_fingerprint() -> str:
    """A digest of the llmlab package's files and of its data folder, compiled caches left out
    (the kernel writes those as it imports). A notebook that edits the checkers or their data on
    disk changes it."""
    from llmlab.paths import DATA_DIR

    digest = hashlib.sha256()
    root = package_root()
    for base in (root / "llmlab", DATA_DIR):
        for p in sorted(base.rglob("*")):
            if "__pycache__" in p.parts or not p.is_file():
                continue
            digest.update(str(p.relative_to(base.parent)).encode() + b"\0")
            digest.update(hashlib.sha256(p.read_bytes()).digest())
    return digest.hexdigest()


# --------------------------------------------------------------------------- answers


def read_answers(path: str | Path, exercise_ids: Iterable[str]) -> dict[str, dict]:
    """Exercise id → the last well-formed record (`{"args", "kwargs"}` or `{"error"}`) of a
    call of its checker, from the file the kernel wrote. Lines that are not a record of an
    expected exercise are skipped; a file replaced by a link, a pipe or anything but a regular
    file counts as no answers; only the first MAX_ANSWERS_BYTES are read."""
    wanted = set(exercise_ids)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return {}
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            return {}
        data = f.read(MAX_ANSWERS_BYTES)
    found: dict[str, dict] = {}
    for line in data.decode("utf-8", errors="replace").splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if (
            not isinstance(rec, dict)
            or not isinstance(rec.get("exercise"), str)
            or rec["exercise"] not in wanted
        ):
            continue
        if set(rec) == {"exercise", "error"} and isinstance(rec["error"], str):
            found[rec["exercise"]] = {"error": rec["error"][:500]}
        elif (
            set(rec) == {"exercise", "args", "kwargs"}
            and isinstance(rec["args"], list)
            and isinstance(rec["kwargs"], dict)
        ):
            found[rec["exercise"]] = {"args": rec["args"], "kwargs": rec["kwargs"]}
    return found


def recording_setup(answers_path: str | Path, exercises: list[Exercise]) -> str:
    """The grader's set-up cell: wrap the expected checkers to record every call."""
    ids = [e.id for e in exercises]
    return (
        "from llmlab.course.instructor.recording import record_calls as _llmlab_record_calls\n"
        f"_llmlab_record_calls({str(answers_path)!r}, {ids!r})\n"
        "del _llmlab_record_calls"
    )


# --------------------------------------------------------------------------- grading


def _ended_run(error: dict) -> bool:
    return error["ename"] == "DeadKernelError" or any(
        text in error["evalue"] for text in DID_NOT_RUN
    )


def _missing_message(nb: Any, exercise: str, errors: list[dict]) -> str:
    """Why no answer was recorded: the notebook no longer calls the checker; or the cell that
    calls it raised, or the run ended before it; or the call never reached the real checker."""
    not_recorded = tr(NOT_RECORDED, NOT_RECORDED_ZH)
    cell_index = dict(exercise_calls(nb)).get(exercise)
    if cell_index is None:
        return tr(
            f"{not_recorded}: the notebook no longer calls llmlab.course.check.{exercise} "
            f"(was the exercise's cell deleted, or its checker call changed?)",
            f"{not_recorded}：notebook 不再调用 llmlab.course.check.{exercise}"
            f"（是这道练习的单元格被删了，还是检查调用被改了？）",
        )
    cause = next((e for e in errors if e["index"] == cell_index), None)
    if cause is None:  # the recording was never set up, or the run ended before this cell
        cause = next(
            (
                e
                for e in errors
                if e["ename"] == "GraderSetupError"
                or (_ended_run(e) and (e["index"] is None or e["index"] < cell_index))
            ),
            None,
        )
    if cause is None:
        return tr(
            f"{not_recorded}: the checker call in cell {cell_index} never reached llmlab's checker "
            f"(was the checker replaced, or the call skipped?)",
            f"{not_recorded}：单元格 {cell_index} 里的检查调用没有到达 llmlab 检查函数"
            f"（是检查函数被替换了，还是这次调用被跳过了？）",
        )
    return tr(
        f"{not_recorded}: the checker never ran (cell {cause['cell']}: {cause['ename']}: {cause['evalue']})",
        f"{not_recorded}：检查函数根本没有运行（单元格 {cause['cell']}：{cause['ename']}: {cause['evalue']}）",
    )


def _notebook_env(nb: Any) -> dict[str, str]:
    """The grading environment, in the language a notebook of an edition was written in (its
    checkers answer in that language) unless the caller chose one."""
    env = grading_env()
    written_in = nb.metadata.get("llmlab", {}).get("lang")  # "zh": the Chinese edition
    if written_in in ("en", "zh") and LANG_ENV not in env:
        env[LANG_ENV] = written_in
    return env


def _run_and_recheck(
    nb: Any, folder: Path, expected: list[Exercise], env: dict[str, str], cell_timeout: float
) -> tuple[list[dict], dict[str, dict], dict[str, tuple[bool, str]]]:
    """Run `nb` recording its checker calls, and judge them in the grader's checker process:
    (errors, the recorded answers, the verdicts)."""
    verdicts: dict[str, tuple[bool, str]] = {}
    with tempfile.TemporaryDirectory(prefix="llmlab-grade-", ignore_cleanup_errors=True) as tmp:
        answers_path = Path(tmp) / f"answers-{secrets.token_hex(8)}.jsonl"
        answers_path.touch(mode=0o600)
        (Path(tmp) / "checker").mkdir()
        with Recheck(expected, env=env, cwd=Path(tmp) / "checker") as recheck:
            errors, _ = execute_for_grading(
                nb, folder, cell_timeout, env=env, setup=recording_setup(answers_path, expected)
            )
            answers = read_answers(answers_path, [e.id for e in expected])
            try:
                verdicts = recheck.verdicts(
                    answers, timeout_s=RECHECK_TIMEOUT_S, function_timeout_s=FUNCTION_TIMEOUT_S
                )
            except RecheckError as e:
                errors.append(cell_error(nb, None, "RecheckError", str(e)))
    return errors, answers, verdicts


def _package_changed_error(nb: Any) -> dict:
    return cell_error(
        nb,
        None,
        "PackageChanged",
        tr(
            "the llmlab package or its data changed on disk while the notebook ran; "
            "nothing is graded",
            "notebook 运行期间，磁盘上的 llmlab 包或包数据被改动了，一律不评分",
        ),
    )


def _exercise_result(
    nb: Any,
    ex: Exercise,
    verdicts: dict[str, tuple[bool, str]],
    answers: dict[str, dict],
    errors: list[dict],
    tampered: bool,
) -> ExerciseResult:
    """One exercise's verdict: the checker process's, or why there is none."""
    if tampered:
        why = tr(
            "not graded: the llmlab package changed on disk during the run",
            "未评分：运行期间磁盘上 llmlab 包被改动了",
        )
        return ExerciseResult(ex.id, False, why)
    if ex.id in verdicts:
        return ExerciseResult(ex.id, *verdicts[ex.id])
    if ex.id in answers:
        why = tr(
            "not graded: the checker process failed (see the errors)",
            "未评分：检查进程失败了（见错误列表）",
        )
        return ExerciseResult(ex.id, False, why)
    return ExerciseResult(ex.id, False, _missing_message(nb, ex.id, errors))


def grade_notebook(
    path: str | Path,
    expected: list[Exercise],
    *,
    cell_timeout: float = DEFAULT_CELL_TIMEOUT_S,
    keep: str | Path | None = None,
    source: str = "",
) -> GradeReport:
    """Execute the notebook at `path` headless and grade it on the exercises `expected` (read
    from the instructor's side with `exercises_for`, before any student's code runs).
    keep: write the executed copy there; source: where `expected` came from, for the report."""
    import nbformat

    path = Path(path)
    if not path.is_file():
        raise ValueError(
            tr(
                f"path {str(path)!r} is not a notebook file",
                f"路径 {str(path)!r} 不是 notebook 文件",
            )
        )
    t0 = time.perf_counter()
    nb = nbformat.read(path, as_version=4)
    before = package_fingerprint()
    errors, answers, verdicts = _run_and_recheck(
        nb, path.parent.resolve(), expected, _notebook_env(nb), cell_timeout
    )
    tampered = package_fingerprint() != before
    if tampered:
        errors.append(_package_changed_error(nb))
    if keep is not None:
        Path(keep).parent.mkdir(parents=True, exist_ok=True)
        nbformat.write(nb, keep)
    results = [_exercise_result(nb, ex, verdicts, answers, errors, tampered) for ex in expected]
    return GradeReport(str(path), results, errors, time.perf_counter() - t0, source)


# --------------------------------------------------------------------------- command line


def _grade_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m llmlab grade",
        description=tr(
            "Execute notebooks headless and grade their exercises with the grader's own checkers.",
            "在无界面模式下运行 notebook，用评分器自带的检查函数给其中练习评分。",
        ),
    )
    parser.add_argument(
        "paths",
        nargs="+",
        help=tr(
            "student notebooks, or folders of them", "学生 notebook，或存放这些 notebook 的文件夹"
        ),
    )
    parser.add_argument(
        "--source",
        required=True,
        metavar="SRC",
        help=tr(
            "where the expected exercises come from: the instructor's notebook, a folder "
            "of them (matched by file name), or the manifest `student` wrote",
            "应有练习从哪里读：教师版 notebook、存放教师版的文件夹（按文件名对应），"
            "或 `student` 写出的清单",
        ),
    )
    parser.add_argument(
        "--json",
        action="store_true",
        help=tr(
            "print one JSON object per notebook (one per line) instead of text",
            "每个 notebook 打印一个 JSON 对象（一行一个），不打印文本",
        ),
    )
    parser.add_argument(
        "--cell-timeout",
        type=float,
        default=DEFAULT_CELL_TIMEOUT_S,
        metavar="S",
        help=tr(
            f"seconds a cell may run before it is interrupted (default {DEFAULT_CELL_TIMEOUT_S})",
            f"一个单元格最多运行多少秒，超时就中断（默认 {DEFAULT_CELL_TIMEOUT_S}）",
        ),
    )
    parser.add_argument(
        "--keep",
        metavar="DIR",
        help=tr("write the executed notebooks into DIR", "把运行后的 notebook 写进 DIR"),
    )
    return parser


def grade_main(argv: list[str]) -> int:
    """`python -m llmlab grade PATH... --source SRC [--json] [--cell-timeout S] [--keep DIR]`."""
    parser = _grade_parser()
    args = parser.parse_args(argv)
    if args.cell_timeout <= 0:
        print(
            tr(
                f"error: --cell-timeout must be > 0 seconds, got {args.cell_timeout}",
                f"错误：--cell-timeout 必须 > 0 秒，你给了 {args.cell_timeout}",
            ),
            file=sys.stderr,
        )
        return 2
    paths: list[Path] = []
    for p in map(Path, args.paths):
        if not p.exists():
            print(tr(f"error: {p} does not exist", f"错误：{p} 不存在"), file=sys.stderr)
            return 2
        paths.extend(_notebook_paths(p))
    if not paths:
        print(tr("error: no .ipynb file to grade", "错误：没有可评分 .ipynb 文件"), file=sys.stderr)
        return 2
    try:  # all read before any notebook runs: one submission cannot edit the next one's list
        expected = [exercises_for(p.name, args.source) for p in paths]
    except ValueError as e:
        print(tr(f"error: --source: {e}", f"错误：--source：{e}"), file=sys.stderr)
        return 2
    for p, exs in zip(paths, expected):
        keep = Path(args.keep) / p.name if args.keep else None
        report = grade_notebook(
            p, exs, cell_timeout=args.cell_timeout, keep=keep, source=args.source
        )
        if args.json:
            print(json.dumps(report.to_dict(), ensure_ascii=False))
        else:
            print(report.text())
        sys.stdout.flush()
    return 0
