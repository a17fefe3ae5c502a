"""The instructors' table of exercises, written from one source: each chapter's checker module
reads `EXERCISES` from its catalog (function name -> `ExerciseInfo`: kind, the mistakes its checker
names, the source question it covers; `Catalog.exercises`), and the notebooks say which exercises
each chapter calls.

    python -m llmlab exercises                  # print the tables
    python -m llmlab exercises --times          # each chapter's two times (reading_time)
    python -m llmlab exercises --write-times    # write them wherever the course states them
    python -m llmlab exercises --write docs/instructors.md   # replace them between the markers
    LLMLAB_LANG=zh python -m llmlab exercises --write docs/instructors.zh.md   # the same, in Chinese

In Chinese (`LLMLAB_LANG=zh`) the headers, the kind names and the mistakes (entries of the
chapters' catalogs) are Chinese. A test fails when `docs/instructors.md` or
`docs/instructors.zh.md` is not what `--write` would make it.
"""

from __future__ import annotations

import importlib
import sys
from dataclasses import dataclass
from pathlib import Path

from llmlab.course.check.catalog import KINDS, ExerciseInfo
from llmlab.course.check.core import clauses
from llmlab.course.instructor.exercises import exercise_calls
from llmlab.i18n import tr
from llmlab.utils import format_table

BEGIN = (
    "<!-- exercises table: written by `python -m llmlab exercises --write`; do not edit by hand -->"
)
END = "<!-- end of exercises table -->"
USAGE = "usage: python -m llmlab exercises [--write DOC | --times | --write-times]"


def kind_name(kind: str) -> str:
    """The kind as the table writes it: English, or Chinese under `LLMLAB_LANG=zh`."""
    zh = {"recall": "记忆", "plug-in": "代公式", "reasoning": "推理"}
    return tr(kind, zh[kind]) if kind in zh else kind


@dataclass(frozen=True)
class Row:
    notebook: str
    exercise: str
    info: ExerciseInfo | None  # None: the checker module does not describe it
    required: bool = True  # False: inside a "Going further" section


def info_of(exercise: str) -> ExerciseInfo | None:
    module_name, _, fn = exercise.partition(".")
    try:
        module = importlib.import_module(f"llmlab.course.check.{module_name}")
    except ModuleNotFoundError:
        return None
    return getattr(module, "EXERCISES", {}).get(fn)


def rows(notebooks: Path) -> list[Row]:
    import nbformat

    from llmlab.course.instructor.reading_time import required_cells

    out = []
    for path in sorted(Path(notebooks).glob("*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        required = required_cells(nb)
        for ex, index in exercise_calls(nb):
            out.append(Row(path.stem, ex, info_of(ex), required[index]))
    return out


def path(row: Row) -> str:
    """Where the exercise sits: on the required path, or in a Going further section."""
    return tr("required", "必修") if row.required else tr("Going further", "延伸学习")


def markdown(notebooks: Path) -> str:
    table = rows(notebooks)
    lines = [
        tr("| chapter | exercises | ", "| 章节 | 练习数 | ")
        + " | ".join(kind_name(k) for k in KINDS)
        + tr(" | mistakes named | in Going further |", " | 能指出的错误数 | 在“延伸学习”中 |"),
        "|---|---|---|---|---|---|---|",
    ]
    by_nb: dict[str, list[Row]] = {}
    for r in table:
        by_nb.setdefault(r.notebook, []).append(r)
    for nb, rs in by_nb.items():
        kinds = [r.info.kind if r.info else "?" for r in rs]
        mistakes = sum(len(r.info.mistakes) for r in rs if r.info)
        lines.append(
            f"| `{nb}` | {len(rs)} | "
            + " | ".join(str(kinds.count(k)) for k in KINDS)
            + f" | {mistakes} | {sum(not r.required for r in rs)} |"
        )
    lines += [
        "",
        tr(
            "| chapter | exercise | kind | mistakes its checker names | source question | path |",
            "| 章节 | 练习 | 类型 | 检查器能指出的错误 | 原章节问题 | 所在部分 |",
        ),
        "|---|---|---|---|---|---|",
    ]
    for r in table:
        if r.info is None:
            lines.append(
                f"| `{r.notebook[:2]}` | `{r.exercise}` | ? | {tr('(not described)', '（未描述）')} | | {path(r)} |"
            )
            continue
        mistakes = clauses(r.info.mistakes) if r.info.mistakes else "—"
        question = f"Q{r.info.source_question}" if r.info.source_question else ""
        lines.append(
            f"| `{r.notebook[:2]}` | `{r.exercise}` | {kind_name(r.info.kind)} | {mistakes} "
            f"| {question} | {path(r)} |"
        )
    return "\n".join(lines)


def rewrite(doc: Path, notebooks: Path) -> str:
    """The text of `doc` with the part between BEGIN and END replaced by the current tables."""
    text = Path(doc).read_text(encoding="utf-8")
    if BEGIN not in text or END not in text:
        raise ValueError(f"{doc} has no exercises-table markers ({BEGIN!r} ... {END!r})")
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{BEGIN}\n{markdown(notebooks)}\n{END}{tail}"


def print_times(notebooks: Path) -> None:
    """Each chapter's two times and their parts (reading_time's model)."""
    from llmlab.course.instructor.reading_time import WORDS_PER_MINUTE, course_times

    table = []
    for t in course_times(notebooks):
        r, w = t.required, t.whole
        table.append(
            [
                t.stem,
                t.stated[0],
                t.stated[1],
                f"{r.words / WORDS_PER_MINUTE:.0f}",
                f"{sum(r.exercise_minutes.values()):.0f}",
                f"{r.run_seconds / 60:.1f}",
                f"{w.run_seconds / 60:.1f}",
            ]
        )
    print("minutes per chapter (llmlab/course/instructor/reading_time.py)")
    headers = ["chapter", "required", "whole", "reading", "exercises", "run (req.)", "run (whole)"]
    print(format_table(table, headers, rule=False))


def main(args: list[str]) -> int:
    root = Path(__file__).resolve().parents[3]
    notebooks = root / "notebooks"
    if args[:1] == ["--write"]:
        if len(args) != 2:
            print(USAGE, file=sys.stderr)
            return 2
        doc = Path(args[1])
        doc.write_text(rewrite(doc, notebooks), encoding="utf-8")
        print(f"wrote the exercises table into {doc}")
        return 0
    if args == ["--times"]:
        print_times(notebooks)
        return 0
    if args == ["--write-times"]:
        from llmlab.course.instructor.stated_times import write

        for changed in write() or ["nothing: every stated time is the model's"]:
            print(f"wrote {changed}")
        return 0
    if args:
        print(USAGE, file=sys.stderr)
        return 2
    print(markdown(notebooks))
    return 0
