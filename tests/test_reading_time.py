"""llmlab.course.instructor.reading_time: the one formula for how long a chapter takes, on synthetic
notebooks (prose, code cells, exercises of each kind, a "Going further" section left out)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

from llmlab.course.instructor import reading_time as rt


def _nb(*cells):
    return new_notebook(cells=list(cells))


def test_prose_code_and_each_kind_of_exercise_add_up():
    nb = _nb(
        new_markdown_cell("# 04 · A chapter\n\n**Time:** about 20 minutes.\n\n" + "word " * 293),
        new_code_cell(
            "from llmlab.course.check import ch04\nanswer = 1  # SOLUTION\nch04.kv_bytes_per_token(answer)"
        ),
        new_code_cell(
            "# BEGIN SOLUTION\ndef f(x):\n    return x\nanswer = f\n# END SOLUTION\nch04.generate_greedy(answer)"
        ),
        new_code_cell("answer = 'b'  # SOLUTION\nch04.utilization_gain(answer)"),
    )
    est = rt.estimate(nb)
    assert est.words == 300 and est.code_cells == 3
    assert est.exercises == {"plug-in": 1, "coding": 1, "reasoning": 1}
    assert est.minutes == pytest.approx(300 / 150 + 3 * 0.25 + 2 + 12.5 + 4.5)
    assert rt.stated_minutes(nb) == 20


def test_going_further_sections_are_left_out_until_the_next_section():
    required = [new_markdown_cell("## 1. Required\n\none two three"), new_code_cell("x = 1")]
    optional = [
        new_markdown_cell("## Going further: more\n\n" + "word " * 600),
        new_code_cell("from llmlab.course.check import ch04\nch04.kv_bytes_per_token(None)"),
    ]
    after = [new_markdown_cell("## Summary\n\n- four five")]
    short, long = (
        rt.estimate(_nb(*required, *after)),
        rt.estimate(_nb(*required, *optional, *after)),
    )
    assert long == short, "a Going further section adds nothing to the required path"
    assert short.words == len("Required one two three Summary four five".split()) + 1  # "1" counts


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
    nb.cells[
        1
    ].source = "x = y = 1\nimport numpy as np\ndef f(): pass"  # bound on the path too: fine
    assert rt.required_uses_of_optional(nb) == []


# The course's own chapters.
ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
ZH_TIME = re.compile(r"\*\*时间：\*\*\s*约\s*(\d+)\s*分钟")


def _read(path):
    return nbformat.read(path, as_version=4)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_header_states_the_time_the_formula_computes_in_both_languages(path):
    nb = _read(path)
    computed = round(rt.estimate(nb).minutes)
    assert rt.stated_minutes(nb) == computed, (
        f"{path.stem}: the header says {rt.stated_minutes(nb)} minutes, the content takes {computed}"
    )
    first = next(c for c in nb.cells if c.cell_type == "markdown")
    store = json.loads((ROOT / "i18n" / "zh" / f"{path.stem}.json").read_text(encoding="utf-8"))[
        "cells"
    ]
    m = ZH_TIME.search(store[first.id]["text"])
    assert m and int(m[1]) == computed, (
        f"{path.stem}: the Chinese header does not say {computed} 分钟"
    )


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_no_required_cell_depends_on_a_going_further_section(path):
    assert rt.required_uses_of_optional(_read(path)) == [], (
        f"{path.stem}: required cells read names bound only in a Going further section"
    )


def test_required_path_fits_in_five_hours():
    path = NOTEBOOKS[: rt.PATH_CHAPTERS]
    assert [p.stem[:2] for p in path] == [f"{i:02d}" for i in range(rt.PATH_CHAPTERS)]
    estimated = sum(rt.estimate(_read(p)).minutes for p in path)
    stated = sum(rt.stated_minutes(_read(p)) for p in path)
    assert estimated <= rt.PATH_MINUTES and stated <= rt.PATH_MINUTES, (
        f"required path: {estimated:.0f} min estimated, {stated} stated"
    )


def test_each_going_further_chapter_fits_in_half_an_hour():
    further = NOTEBOOKS[rt.PATH_CHAPTERS :]
    assert further, "the Going further part has no chapter"
    for p in further:
        minutes = max(rt.estimate(_read(p)).minutes, rt.stated_minutes(_read(p)))
        assert minutes <= rt.CHAPTER_MINUTES_FURTHER + 0.5, f"{p.stem}: {minutes:.1f} min"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_going_further_sections_come_before_the_summary_and_say_so(path):
    nb = _read(path)
    required = rt._required(nb)
    assert required[-1] and nb.cells[-1].source.lstrip().startswith("## Summary"), path.stem
    for cell, on_path in zip(nb.cells, required):
        if not on_path and cell.cell_type == "markdown" and cell.source.lstrip().startswith("## "):
            assert rt.GOING_FURTHER.match(cell.source.lstrip()), path.stem


def test_the_instructors_guide_states_the_total_the_headers_add_up_to():
    stated = sum(rt.stated_minutes(_read(p)) for p in NOTEBOOKS[: rt.PATH_CHAPTERS])
    en = re.sub(r"\s+", " ", (ROOT / "docs" / "instructors.md").read_text(encoding="utf-8"))
    zh = (ROOT / "docs" / "instructors.zh.md").read_text(encoding="utf-8")
    assert f"add up to {stated} minutes" in en, (
        f"docs/instructors.md does not say the headers add up to {stated}"
    )
    assert f"加起来是 {stated} 分钟" in zh, (
        f"docs/instructors.zh.md does not say 加起来是 {stated} 分钟"
    )
