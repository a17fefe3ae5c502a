"""The two editions: `make lab` opens the student edition (built from notebooks/, no solution,
no answer, no verdict anywhere in it), whose checkers point, as their last hint, to a solutions
notebook that exists and holds the exercise's worked solution; `make lab EDITION=instructor`
opens the solved notebooks. The editions are built here, never executed (the grader's round trip
of both editions is in test_grading.py and test_notebooks.py)."""

from __future__ import annotations

import ast
import json
import re
import shutil
import subprocess
from pathlib import Path

import nbformat
import pytest

from llmlab.course.check import core
from llmlab.course.instructor import editions, exercise_calls, student_notebook
from llmlab.course.instructor.student import _LINE_MARK

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """lang -> the folder holding that language's student edition."""
    out = tmp_path_factory.mktemp("editions")
    return {
        lang: (editions.build(lang, ROOT / "notebooks", out / lang), out / lang)[1]
        for lang in ("en", "zh")
    }


def _fresh_clone(tmp_path: Path) -> Path:
    """What `make lab` needs of a fresh clone: the Makefile, the package's metadata, the sources."""
    clone = tmp_path / "clone"
    clone.mkdir()
    for name in ("Makefile", "pyproject.toml"):
        shutil.copy(ROOT / name, clone / name)
    shutil.copytree(ROOT / "notebooks", clone / "notebooks")
    shutil.copytree(ROOT / "i18n", clone / "i18n")
    return clone


def _dry_run(clone: Path, *args: str) -> list[str]:
    proc = subprocess.run(
        ["make", "-n", "lab", *args], cwd=clone, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.splitlines()


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_make_lab_on_a_fresh_clone_builds_and_opens_the_student_edition(tmp_path, lang):
    clone = _fresh_clone(tmp_path)
    lines = _dry_run(clone, *([f"LLMLAB_LANG={lang}"] if lang == "zh" else []))
    [lab] = [ln for ln in lines if "jupyter lab" in ln]
    assert f"--notebook-dir=build/student/{lang}" in lab
    builds = [ln for ln in lines if f"-m llmlab edition {lang} " in ln]
    assert len(builds) == len(NOTEBOOKS), "every chapter is built into the student edition"
    assert not any("--notebook-dir=notebooks" in ln for ln in lines)


def test_make_lab_edition_instructor_opens_the_solved_notebooks(tmp_path):
    clone = _fresh_clone(tmp_path)
    [lab] = [ln for ln in _dry_run(clone, "EDITION=instructor") if "jupyter lab" in ln]
    assert "--notebook-dir=notebooks" in lab
    [lab] = [
        ln for ln in _dry_run(clone, "EDITION=instructor", "LLMLAB_LANG=zh") if "jupyter lab" in ln
    ]
    assert "--notebook-dir=build/zh/notebooks" in lab
    proc = subprocess.run(
        ["make", "-n", "lab", "EDITION=teacher"],
        cwd=clone,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode != 0 and "EDITION must be student or instructor" in proc.stderr


def _answer_expressions(solution: str) -> list[str]:
    """The right-hand sides of a solution's marked lines that compute something (a call, an
    operator, a container): a bare name or literal may be an option the question itself lists."""
    found = []
    for line in solution.splitlines():
        if not _LINE_MARK.search(line) or "=" not in line:
            continue
        rhs = _LINE_MARK.sub("", line).split("=", 1)[1].strip()
        try:
            node = ast.parse(rhs, mode="eval").body
        except SyntaxError:
            continue
        if not isinstance(node, (ast.Constant, ast.Name, ast.Attribute, ast.UnaryOp)):
            found.append(rhs)
    return found


def _body_lines(solution: str) -> list[str]:
    """The code lines of a `# BEGIN SOLUTION` block (markers and comments dropped)."""
    lines = [ln.strip() for ln in solution.splitlines()[1:-1]]
    return [ln for ln in lines if ln and not ln.startswith("#") and len(ln) > 8]


@pytest.mark.parametrize("lang", ["en", "zh"])
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_student_edition_holds_no_solution_answer_or_verdict(built, path, lang):
    instructor = nbformat.read(path, as_version=4)
    target = built[lang] / path.name
    student = nbformat.read(target, as_version=4)
    everything = target.read_text(encoding="utf-8")  # cells, outputs, metadata
    assert not re.search(r"#\s*(BEGIN |END )?SOLUTION", everything), "a solution marker is left"
    assert "[check " not in everything, "a checker's verdict is in the student edition"
    for word in (core.PASS_WORD + ":", core.PASS_WORD_ZH + "：", core.FAIL_WORD + ":"):
        assert word not in "\n".join(c.source for c in student.cells if c.cell_type == "code")
    assert all(
        not c.get("outputs") and c.get("execution_count") is None
        for c in student.cells
        if c.cell_type == "code"
    ), "outputs are cleared"
    assert "exercises" not in student.metadata.get("llmlab", {})
    _, solutions = student_notebook(instructor)
    assert solutions, f"{path.name} has exercises without a marked solution"
    code = "\n".join(c.source for c in student.cells)
    for s in solutions:
        for expr in _answer_expressions(s.solution):
            assert expr not in everything, (
                f"{path.name}: the answer {expr!r} is in the student edition"
            )
        if "BEGIN SOLUTION" in s.solution:
            for line in _body_lines(s.solution):
                assert line not in code, (
                    f"{path.name}: the solution line {line!r} is in the student edition"
                )


@pytest.mark.parametrize("lang", ["en", "zh"])
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_every_exercise_reaches_its_worked_solution_from_the_last_hint(built, path, lang):
    """The pointer names a solutions notebook that exists in the edition and holds a worked
    solution of that exercise (the instructor's solved cell)."""
    nb = nbformat.read(path, as_version=4)
    _, solutions = student_notebook(nb)
    for ex, _ in exercise_calls(nb):
        where = built[lang] / core.solutions_notebook(ex)
        assert where.is_file(), f"{ex}: the last hint names {where}, which is not there"
        sols = nbformat.read(where, as_version=4)
        cells = [
            c
            for c in sols.cells
            if c.cell_type == "code" and ex in c.metadata.get("llmlab", {}).get("exercises", [])
        ]
        assert cells, f"{ex}: {where.name} holds no worked solution for it"
        assert any(re.search(r"#\s*(SOLUTION|BEGIN SOLUTION)", c.source) for c in cells)
    own = nbformat.read(
        built[lang] / "solutions" / editions.solutions_name(path.stem), as_version=4
    )
    held = "\n".join(c.source for c in own.cells)
    assert all(s.solution in held for s in solutions), (
        "every marked solution is in the chapter's solutions"
    )


def test_each_chapter_has_its_own_number():
    """Solutions notebooks are named by the chapter's number: no two chapters may share one."""
    numbers = [p.stem[:2] for p in NOTEBOOKS]
    assert all(n.isdigit() for n in numbers) and len(set(numbers)) == len(numbers)


def test_the_worked_solution_is_named_only_at_the_last_stage(monkeypatch):
    from llmlab.course.check import ch04

    monkeypatch.setattr(core, "_WRONG_TRIES", {})
    messages = [ch04.kv_bytes_per_token(12345).message for _ in range(core.SOLUTION_AFTER)]
    pointer = "solutions/04-solutions.ipynb"
    assert all(pointer not in m for m in messages[:-1]), "the solution shows before the last stage"
    assert pointer in messages[-1] and "Last step" in messages[-1]
    assert ch04.kv_bytes_per_token(None).message == core.NOT_ANSWERED  # no try, no pointer


def test_rebuild_keeps_a_chapter_the_student_edited_and_never_overwrites_a_kept_copy(tmp_path):
    src = ROOT / "notebooks" / "00-setup-and-map.ipynb"
    [chapter] = editions.build("en", src, tmp_path)
    editions.build("en", src, tmp_path)
    assert not list(tmp_path.glob("*.bak*")), "an unchanged chapter is simply rebuilt"
    for attempt in ("first", "second"):
        mine = nbformat.read(chapter, as_version=4)
        mine.cells[-1].source = f"# my {attempt} notes"
        nbformat.write(mine, chapter)
        editions.build("en", src, tmp_path)
    kept = sorted(p.name for p in tmp_path.glob("*.bak*"))
    assert kept == ["00-setup-and-map.ipynb.bak", "00-setup-and-map.ipynb.bak2"]
    notes = [nbformat.read(tmp_path / k, as_version=4).cells[-1].source for k in kept]
    assert notes == ["# my first notes", "# my second notes"]
    assert nbformat.read(chapter, as_version=4).cells[-1].source != "# my second notes"
    with pytest.raises(ValueError, match="must not be the folder"):
        editions.build("en", ROOT / "notebooks", ROOT / "notebooks")


def test_html_folds_each_worked_solution_under_its_exercise(built):
    from llmlab.course.offline_html import to_html

    chapter = built["en"] / "04-kv-cache.ipynb"
    nb = nbformat.read(chapter, as_version=4)
    folded = editions.fold_solutions(nb, editions.solutions_for(chapter))
    ids = [c.get("id") for c in folded.cells]
    _, solutions = student_notebook(nbformat.read(ROOT / "notebooks" / chapter.name, as_version=4))
    solved_ids = {nb.cells[s.cell_index].get("id") for s in solutions}
    for cell_id in solved_ids:
        fold = folded.cells[ids.index(cell_id) + 1]
        assert fold.cell_type == "markdown" and fold.source.startswith("<details>")
    html = to_html(folded)
    assert html.count("<details>") == len(solved_ids)
    first_question = html.index("Exercise 1")
    assert first_question < html.index("<details>"), "the question comes before its solution"
    assert json.dumps(nb) == json.dumps(nbformat.read(chapter, as_version=4)), (
        "the chapter itself is unchanged"
    )


def test_run_writes_the_executed_copy_without_solutions_and_the_html_with_them_folded(
    built, tmp_path
):
    """What `make run` writes for a student chapter (here not executed: the writing step alone)."""
    from llmlab.course.notebook_runner import write_outputs

    chapter = built["zh"] / "05-prefill-decode.ipynb"
    nb = nbformat.read(chapter, as_version=4)
    write_outputs(nb, chapter.stem, tmp_path, solutions=editions.solutions_for(chapter))
    html = (tmp_path / f"{chapter.stem}.html").read_text(encoding="utf-8")
    copy = (tmp_path / f"{chapter.stem}.ipynb").read_text(encoding="utf-8")
    assert (
        html.count("<details>") >= 5 and "完整解答" in html
    )  # the fold speaks the edition's language
    assert "<details>" not in copy and not re.search(r"#\s*SOLUTION", copy)
    assert editions.solutions_for(tmp_path / "elsewhere.ipynb") is None


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_a_prediction_in_the_solutions_is_labelled_one_reasonable_guess(lang):
    """A prediction is ungraded: its cell in solutions/ says it is one reasonable guess, not an
    answer, in the edition's language; a solved exercise keeps its exercise heading."""
    from llmlab.i18n import speaking

    path = ROOT / "notebooks" / "05-prefill-decode.ipynb"
    nb = nbformat.read(path, as_version=4)
    with speaking(lang):
        sols = editions.solutions_notebook(nb, path.stem)
    code = [c for c in sols.cells if c.cell_type == "code"]
    guesses = [c for c in code if "my_prediction" in c.source]
    assert guesses and all(c.source.startswith(editions.GUESS_COMMENT) for c in guesses)
    headings = {c.id: c.source for c in sols.cells if c.cell_type == "markdown"}
    label = "One reasonable guess, not an answer" if lang == "en" else "合理猜测，不是答案"
    for c in guesses:
        assert label in headings["h-" + c.id.removeprefix("s-")]
    solved = [c for c in code if c.metadata["llmlab"]["exercises"]]
    assert solved and not any(label in headings["h-" + c.id.removeprefix("s-")] for c in solved)
