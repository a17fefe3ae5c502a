"""Every notebook runs top to bottom headless, in a fresh kernel, within its time budget, shows
its figures, and scores full marks: each notebook is executed once, through the grader, and
that one run is checked for everything (errors, full marks, time, figures, and that no
exercise's expected number is shown above the exercise) (the student version's run is in test_grading.py).

New notebooks in notebooks/ are picked up automatically. Executed copies go to build/notebooks/
(and, for a notebook that fails, its HTML) so a failure can be read there.

Chapters 04 and 11 run in the Chinese edition (built from i18n/zh/ as `make lab LLMLAB_LANG=zh`
builds it) instead, through the same checks, and their checkers must answer in Chinese. That
loses nothing of the English: the code cells are the same, every `tr(en, zh)` evaluates both
texts whichever language is shown, the English markdown is scanned for leaks against the same
run's outputs, and the student version's round trip (test_grading.py) runs them in English.
"""

from __future__ import annotations

import pytest
from english_prose import find_english_prose
from notebook_grading import BUDGET_S, NOTEBOOKS, ROOT, ZH_CHAPTERS, grade_subprocess

from llmlab.course.instructor import exercise_ids
from llmlab.course.instructor.leaks import find_leaks, read_expected_log, read_expected_words
from llmlab.course.notebook_runner import cell_seconds, write_outputs


def test_notebooks_exist():
    assert NOTEBOOKS, "notebooks/ holds no .ipynb"


RUNS = [(p, "zh" if p.stem in ZH_CHAPTERS else "en") for p in NOTEBOOKS]


@pytest.mark.notebook
@pytest.mark.slow
@pytest.mark.parametrize(
    "path,lang", RUNS, ids=[p.stem + ("" if lg == "en" else "-zh") for p, lg in RUNS]
)
def test_notebook_runs_headless(path, lang):
    """The instructor's notebook, graded: no error, full marks (what a student who solves every
    exercise hands in), within the time budget, every figure shown for default values."""
    import nbformat

    out = ROOT / "build" / "notebooks"
    english = nbformat.read(path, as_version=4)
    if lang == "zh":
        from llmlab.course import lang as languages

        # built apart from build/zh/notebooks/, where `make lab LLMLAB_LANG=zh` keeps the student's copies
        [path] = languages.build("zh", path, ROOT / "build" / "test-zh" / "notebooks")
        out = ROOT / "build" / "test-zh" / "executed"
    out.mkdir(parents=True, exist_ok=True)
    log = out / f"{path.stem}.expected.jsonl"
    report = grade_subprocess(path, path, keep=out, expected_log=log)
    nb = nbformat.read(out / path.name, as_version=4)
    try:
        _check_run(path, lang, english, report, nb, log, out)
    except AssertionError:
        write_outputs(nb, path.stem, out)  # the executed copy as HTML too, to read the failure in
        raise


def _check_run(path, lang, english, report, nb, log, out) -> None:
    import nbformat

    # The budget is the kernel's own time (execute_input → execute_reply of every cell, as nbclient
    # records it): nbclient has been seen to wait out a full cell timeout after a widget cell the
    # kernel had long finished, which is the harness's time, not the notebook's.
    kernel_s = sum(cell_seconds(c) for c in nb.cells if c.cell_type == "code")
    print(f"{path.name}: {kernel_s:.1f} s in the kernel, {report['seconds']:.1f} s graded")
    assert kernel_s > 0, "the executed copy carries no cell timings"
    assert kernel_s < BUDGET_S, (
        f"{path.name} took {kernel_s:.0f} s; the budget is {BUDGET_S} s with LLMLAB_FAST=1"
    )
    assert report["errors"] == [], f"{path.name} fails: {report['errors']}"
    n = len(exercise_ids(nb))
    assert (report["score"], report["total"]) == (n, n), report
    errors = [
        o
        for c in nb.cells
        if c.cell_type == "code"
        for o in c.get("outputs", [])
        if o.get("output_type") == "error"
    ]
    assert not errors
    figures = sum(
        1
        for c in nb.cells
        if c.cell_type == "code"
        for o in c.get("outputs", [])
        if "image/png" in o.get("data", {}) or "image/svg+xml" in o.get("data", {})
    )
    if path.stem != "00-setup-and-map":
        assert figures >= 1, f"{path.name} shows no figure for its default values"
    # No exercise can be answered by copying a number shown above it (the same run's outputs).
    expected, words = read_expected_log(log), read_expected_words(log)
    leaks = find_leaks(nb, expected, words)
    assert not leaks, f"{path.name}: answers shown before their questions:\n" + "\n".join(
        map(str, leaks)
    )
    if lang == "zh":
        # the English markdown, over the same outputs (the Chinese notebook has one cell more: the
        # first, which chooses the language)
        assert len(nb.cells) == len(english.cells) + 1
        for zh_cell, en_cell in zip(nb.cells[1:], english.cells):
            if en_cell.cell_type == "markdown":
                zh_cell.source = en_cell.source
        leaks = find_leaks(nb, expected, words)
        assert not leaks, (
            f"{path.name} (English text): answers shown before their questions:\n"
            + "\n".join(map(str, leaks))
        )
        lines = [
            line
            for c in nb.cells
            if c.cell_type == "code"
            for o in c.get("outputs", [])
            for line in str(o.get("text", "")).splitlines()
            if line.startswith("[check ")
        ]
        assert len(lines) >= n and all("] 通过" in line for line in lines), (
            f"{path.name}: checkers did not all answer 通过 in Chinese: {lines}"
        )
        # nothing a Chinese reader sees is English prose (tests/english_prose.py says what counts)
        prose = find_english_prose(nbformat.read(out / path.name, as_version=4))
        assert not prose, f"{path.name}: English prose in the Chinese edition:\n" + "\n".join(
            map(str, prose)
        )


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_is_committed_without_outputs(path):
    import nbformat

    nb = nbformat.read(path, as_version=4)
    dirty = [
        i
        for i, c in enumerate(nb.cells)
        if c.cell_type == "code" and (c.outputs or c.execution_count)
    ]
    assert not dirty, f"{path.name}: cells {dirty} carry outputs; clear them before committing"


@pytest.mark.notebook
def test_make_run_executes_and_writes_html(tmp_path):
    """`make run`'s executor (notebook_runner, not the grader): an executed copy and its HTML
    land in the output folder, and a failing cell raises, naming the error."""
    import nbformat
    from nbformat.v4 import new_code_cell, new_notebook

    from llmlab.course.notebook_runner import execute_notebook

    good = tmp_path / "good.ipynb"
    nbformat.write(new_notebook(cells=[new_code_cell("x = 6 * 7\nprint(x)")]), good)
    nb, _ = execute_notebook(good, tmp_path / "out", cell_timeout=60)
    assert nb.cells[0].outputs[0]["text"].strip() == "42"
    assert (tmp_path / "out" / "good.ipynb").is_file() and (
        tmp_path / "out" / "good.html"
    ).is_file()
    bad = tmp_path / "bad.ipynb"
    nbformat.write(new_notebook(cells=[new_code_cell("raise KeyError('nope')")]), bad)
    with pytest.raises(Exception, match="KeyError"):
        execute_notebook(bad, tmp_path / "out", cell_timeout=60)
