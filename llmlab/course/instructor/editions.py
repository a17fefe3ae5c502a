"""The two editions of the course, from one source.

- The **instructor's edition** is `notebooks/` itself (in Chinese: `python -m llmlab lang build`),
  every exercise solved.
- The **student edition** (what `make lab` opens) is built from the same notebooks: each chapter
  with its solutions stripped (`llmlab.course.instructor.student`), outputs and execution counts cleared
  and no exercise list in its metadata, and beside the chapters a folder `solutions/` holding, per
  chapter, a notebook of the worked solutions (`NN-solutions.ipynb`). A checker's last
  staged hint names that notebook (`llmlab.course.check.core.solution_pointer`), so a student reaches a
  worked solution only after trying.

    python -m llmlab edition LANG NOTEBOOKS OUT     # the student edition in LANG (en or zh) into OUT

A chapter the student has edited since the last build is kept (see `llmlab.course.lang.write_keeping_edits`).
Each cell of a solutions notebook that holds a solution records the id of the exercise cell it
solves (`metadata["llmlab"]["solution_for"]`); `fold_solutions` uses it to put each worked
solution under its exercise, folded away, in the HTML that `make run` writes.
"""

from __future__ import annotations

import copy
import html
import sys
from pathlib import Path
from typing import Any

from llmlab.course.check.core import SOLUTIONS_DIR
from llmlab.course.check.core import solutions_notebook as solutions_path
from llmlab.course.instructor.exercises import exercise_calls
from llmlab.course.instructor.student import METADATA_KEY, is_prediction, student_notebook
from llmlab.i18n import speaking, tr

EDITION_LANGS = ("en", "zh")


def solutions_name(stem: str) -> str:
    """The file name of chapter `stem`'s solutions notebook ("04-kv-cache" -> "04-solutions.ipynb",
    as `llmlab.course.check.core.solutions_notebook` names it in the hints)."""
    return solutions_path(f"ch{stem[:2]}.x").removeprefix(f"{SOLUTIONS_DIR}/")


def _cell_exercises(nb: Any) -> dict[int, list[str]]:
    """cell index -> the exercise ids first called in that cell."""
    found: dict[int, list[str]] = {}
    for ex, index in exercise_calls(nb):
        found.setdefault(index, []).append(ex)
    return found


def _build_skeletons(nb: Any, stem: str) -> dict[int, list[str]]:
    """cell index -> the build exercises (the chapter module's `BUILDS`) whose class or function
    that cell defines: the skeleton holds the solution, a later cell calls the checker."""
    import importlib
    import re

    try:
        builds = importlib.import_module(f"llmlab.course.check.ch{stem[:2]}").__dict__.get(
            "BUILDS", {}
        )
    except ImportError:
        return {}
    found: dict[int, list[str]] = {}
    for ex, name in builds.items():
        for i, cell in enumerate(nb.cells):
            if cell.cell_type == "code" and re.search(
                rf"^(class|def) {re.escape(name)}\b", cell.source, re.M
            ):
                found.setdefault(i, []).append(ex)
    return found


GUESS_COMMENT = "# one reasonable guess, not an answer: the measurement after it decides\n"


def _solution_heading(stem: str, ids: list[str], guess: bool) -> str:
    """The heading above one worked solution: the exercises it solves, or, for a prediction,
    that it is one reasonable guess and not an answer (no prediction is graded)."""
    if ids:
        names = ", ".join(f"`{ex}`" for ex in ids)
        return tr(
            f"## {names}\n\nThe cell of `{stem}.ipynb` that calls it, with its solution written in.",
            f"## {names}\n\n`{stem}.ipynb` 里调用这个检查的单元格，已经填好解答。",
        )
    if guess:
        return tr(
            f"## A prediction in `{stem}.ipynb`\n\nOne reasonable guess, not an answer: no prediction "
            f"is graded, and the measurement right after it, on your machine, is what counts. Commit "
            f"to your own before you read this one.",
            f"## `{stem}.ipynb` 里的一个预测\n\n这只是一个合理猜测，不是答案。预测不计分，"
            f"算数的是紧接着在你机器上做的测量。先写下自己的猜测，再来看这一个。",
        )
    return tr(
        f"## A step of `{stem}.ipynb`\n\nAs the instructor wrote it (the chapter shows the same "
        f"cell with `# YOUR CODE HERE`).",
        f"## `{stem}.ipynb` 中一个步骤\n\n教师版写法（该章里同一个单元格显示为 `# YOUR CODE HERE`）。",
    )


def solutions_notebook(nb: Any, stem: str) -> Any:
    """The worked solutions of the instructor's notebook `nb` (already in the edition's
    language): a title, then for each code cell that holds a marked solution, a heading naming
    its exercises and the cell as the instructor wrote it. Cell ids are derived from the
    chapter's, so a rebuild writes the same notebook."""
    from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

    _, solutions = student_notebook(nb, where=stem)
    solved = sorted({s.cell_index for s in solutions})
    by_cell = _cell_exercises(nb)
    for index, ids in _build_skeletons(nb, stem).items():
        by_cell.setdefault(index, []).extend(ids)
    title = new_markdown_cell(
        tr(
            f"# {stem}: worked solutions\n\n"
            f"Open this only after trying: each exercise's checker points here as its last hint. Each "
            f"section is an exercise cell of `{stem}.ipynb` with its solution written in; the code uses "
            f"the names the chapter defines above the exercise, so run it in the chapter notebook (copy "
            f"the lines you need into the exercise cell), not here.",
            f"# {stem}：完整解答\n\n"
            f"请先自己尝试，再打开这里：每道练习的检查器把这里作为最后一条提示。每一节是 `{stem}.ipynb` "
            f"中一个练习单元格，已经填好解答。代码用到该章在练习之前定义的名字，所以请在那一章的 notebook "
            f"里运行（把需要的几行抄进练习单元格），不要在这里运行。",
        )
    )
    title.id = "title"
    cells = [title]
    for index in solved:
        cell = nb.cells[index]
        ids = by_cell.get(index, [])
        guess = not ids and is_prediction(cell.source)
        heading = new_markdown_cell(_solution_heading(stem, ids, guess))
        heading.id = f"h-{cell.get('id', index)}"[:64]
        code = new_code_cell((GUESS_COMMENT if guess else "") + cell.source)
        code.id = f"s-{cell.get('id', index)}"[:64]
        code.metadata[METADATA_KEY] = {"solution_for": cell.get("id"), "exercises": ids}
        cells += [heading, code]
    out = new_notebook(cells=cells, metadata=copy.deepcopy(nb.metadata))
    meta = {k: v for k, v in out.metadata.get(METADATA_KEY, {}).items() if k != "exercises"}
    out.metadata[METADATA_KEY] = {**meta, "version": "solutions", "source": f"{stem}.ipynb"}
    return out


def _student_edition(nb: Any, stem: str, lang: str, store: dict | None) -> tuple[Any, Any]:
    """(the student's chapter, its solutions notebook) from the English instructor's notebook
    `nb`; in another language the markdown is translated from `store`."""
    from llmlab.course import lang as languages

    if lang != "en":
        nb = languages.translate(nb, stem, store or {}, lang)
    student, _ = student_notebook(nb, where=f"{stem}.ipynb")
    student.metadata[METADATA_KEY]["source"] = f"{stem}.ipynb"
    student.metadata[METADATA_KEY]["solutions"] = f"{SOLUTIONS_DIR}/{solutions_name(stem)}"
    with speaking(lang):  # the solutions notebook's own texts in the edition's language
        solutions = solutions_notebook(nb, stem)
    return student, solutions


def build(lang: str, src: str | Path, out: str | Path) -> list[Path]:
    """Write the student edition of the notebook(s) `src` in `lang` into the folder `out` (the
    chapters) and `out/solutions/` (their worked solutions); returns the chapters written. A
    chapter the student edited since the last build is kept beside the new one (`.bak`)."""
    import nbformat

    from llmlab.course import lang as languages

    if lang not in EDITION_LANGS:
        raise ValueError(f"lang must be one of {EDITION_LANGS}, got {lang!r}")
    src, out = Path(src), Path(out)
    paths = [src] if src.suffix == ".ipynb" else sorted(src.glob("*.ipynb"))
    if not paths:
        raise ValueError(f"{str(src)!r} holds no notebook")
    if out.resolve() == paths[0].parent.resolve():
        raise ValueError("out must not be the folder of the instructor's notebooks")
    written = []
    for path in paths:
        nb = nbformat.read(path, as_version=4)
        store = (
            languages.read_store(languages.store_dir(path.parent, lang) / f"{path.stem}.json")
            if lang != "en"
            else None
        )
        student, solutions = _student_edition(nb, path.stem, lang, store)
        target = out / path.name
        languages.write_keeping_edits(student, target)
        languages.write_keeping_edits(solutions, out / SOLUTIONS_DIR / solutions_name(path.stem))
        written.append(target)
    return written


# --------------------------------------------------------------------------- the HTML's folds


def fold_solutions(nb: Any, solutions: Any) -> Any:
    """A copy of the (executed) student chapter `nb` with each worked solution of `solutions`
    put right under its exercise cell as a markdown cell holding an HTML `<details>` fold: a
    reader of the HTML sees the question first and opens the solution on purpose."""
    from nbformat.v4 import new_markdown_cell

    out = copy.deepcopy(nb)
    folds: dict[str, str] = {}
    summary = tr("Worked solution (open it after trying)", "完整解答（先自己尝试，再打开）")
    for cell in solutions.cells:
        target = cell.get("metadata", {}).get(METADATA_KEY, {}).get("solution_for")
        if cell.cell_type == "code" and target:
            folds[target] = (
                f"<details>\n<summary>{html.escape(summary)}</summary>\n\n"
                f"```python\n{cell.source}\n```\n\n</details>"
            )
    cells = []
    for cell in out.cells:
        cells.append(cell)
        fold = folds.get(cell.get("id"))
        if fold is not None:
            md = new_markdown_cell(fold)
            md.id = f"fold-{cell.get('id')}"[:64]
            md.metadata["tags"] = ["llmlab-solution-fold"]
            cells.append(md)
    out.cells = cells
    return out


def solutions_for(chapter: str | Path) -> Any | None:
    """The solutions notebook of the student chapter at `chapter` (its `solutions/` folder), or
    None when the chapter is not from a student edition."""
    import nbformat

    chapter = Path(chapter)
    if not chapter.stem[:2].isdigit():
        return None  # not a numbered chapter
    path = chapter.parent / SOLUTIONS_DIR / solutions_name(chapter.stem)
    return nbformat.read(path, as_version=4) if path.is_file() else None


# --------------------------------------------------------------------------- command line

USAGE = "usage: python -m llmlab edition LANG NOTEBOOKS OUT   (LANG: en or zh)"


def main(args: list[str]) -> int:
    if len(args) != 3 or args[0] in ("-h", "--help"):
        print(
            __doc__ if args[:1] in (["-h"], ["--help"]) else USAGE,
            file=sys.stdout if args[:1] in (["-h"], ["--help"]) else sys.stderr,
        )
        return 0 if args[:1] in (["-h"], ["--help"]) else 2
    try:
        for path in build(args[0], Path(args[1]), Path(args[2])):
            print(f"wrote {path} (and {SOLUTIONS_DIR}/{solutions_name(path.stem)})")
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0
