"""Each chapter reads in order, in both languages: its numbered sections ascend by one and none
sits after the first Going further section; its exercises carry the labels 1, 2, 3, ... in the
order they come, one label each; every slider (a widget function that builds ipywidgets) runs on
the required path, never only in Going further; and its summary's "Next" names the next chapter
(the last chapter points back to the map, chapter 00, or the glossary, chapter 12).

Read from the committed notebooks and the Chinese stores, without running anything."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

from llmlab.course import lang as lang_tools
from llmlab.course.instructor.exercises import exercise_calls
from llmlab.course.instructor.reading_time import GOING_FURTHER, required_cells

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
IDS = [p.stem for p in NOTEBOOKS]
WIDGETS = ROOT / "llmlab" / "course" / "widgets"

# the sliders each of these chapters promises on its required path (the course map's list)
PROMISED = {
    "04": {"kv_calculator"},
    "07": {"roofline_explorer"},
    "08": {"batching_simulator"},
    "09": {"parallelism_explorer"},
}
MEASURING = [f"{n:02d}" for n in range(4, 12)]  # each holds a slider with a task on its path

SECTION = re.compile(r"^##\s+(\d+)\.\s", re.M)
EXERCISE = {
    "en": re.compile(r"\*\*Exercise (?:(\d\d)\.)?(\d+)\b|\bsay\(f?\"Exercise (\d+)[:.]"),
    "zh": re.compile(r"\*\*练习 (?:(\d\d)\.)?(\d+)(?!\d)|^练习 (\d+)：", re.M),
}
NEXT = {"en": "**Next:**", "zh": "**下一章：**"}
CHAPTER_REF = re.compile(r"(?<![\d.])(\d\d)(?![\d.%])")


def _nb(path: Path):
    return nbformat.read(path, as_version=4)


def _store(path: Path) -> dict:
    store = ROOT / "i18n" / "zh" / f"{path.stem}.json"
    return json.loads(store.read_text(encoding="utf-8"))["cells"]


def _markdown(nb, lang: str, store: dict | None) -> list[str]:
    """Each cell's text as the reader of `lang` sees it: a markdown cell's translation, and for a
    code cell the texts it prints through the notebook-strings catalog (`say("Exercise 2: ...")`)."""
    if lang == "en":
        return [c.source for c in nb.cells]
    catalog = lang_tools.read_catalog(lang_tools.catalog_path(ROOT / "notebooks", lang))
    return [
        store.get(c.get("id"), {}).get("text", "")
        if c.cell_type == "markdown"
        else "\n".join(catalog.get(s, "") for s in lang_tools.code_strings(c.source))
        for c in nb.cells
    ]


# --------------------------------------------------------------------------- the checks


def section_problems(nb, texts: list[str]) -> list[str]:
    """Numbered sections out of order, skipped or doubled, or after a Going further section."""
    problems, numbers, further = [], [], False
    for cell, text in zip(nb.cells, texts):
        if cell.cell_type != "markdown":
            continue
        for line in text.splitlines():
            if GOING_FURTHER.match(cell.source.lstrip()) and line.startswith("## "):
                further = True
            m = SECTION.match(line)
            if m:
                if further:
                    problems.append(f"section {m[1]} comes after a Going further section")
                numbers.append(int(m[1]))
    if numbers and numbers[0] not in (0, 1):
        problems.append(f"the first numbered section is {numbers[0]}, not 0 or 1")
    for a, b in zip(numbers, numbers[1:]):
        if b != a + 1:
            problems.append(f"section {b} follows section {a}")
    return problems


def exercise_labels(nb, texts: list[str], lang: str) -> list[tuple[str, list[str]]]:
    """(exercise id, the labels found for it): the labels in the cells after the previous
    exercise's checker call, up to and including this one's."""
    out, start = [], 0
    for ex, index in exercise_calls(nb):
        found = []
        for text in texts[start : index + 1]:
            for m in EXERCISE[lang].finditer(text):
                groups = [g for g in m.groups() if g is not None]
                found.append(".".join(groups))
        out.append((ex, found))
        start = index + 1
    return out


def exercise_problems(nb, texts: list[str], lang: str, chapter: str) -> list[str]:
    problems = []
    for n, (ex, labels) in enumerate(exercise_labels(nb, texts, lang), start=1):
        numbers = [label.split(".")[-1] for label in labels]
        prefixes = {label.split(".")[0] for label in labels if "." in label}
        if numbers != [str(n)]:
            problems.append(f"{ex} is exercise {n} in order, labelled {labels or 'nowhere'}")
        if prefixes - {chapter}:
            problems.append(f"{ex} carries another chapter's number: {labels}")
    return problems


def _builds_sliders(n: ast.AST) -> bool:
    """`n` imports ipywidgets, or calls the widgets' shared `control` / `explorer` builders."""
    if isinstance(n, (ast.Import, ast.ImportFrom)):
        return any(a.name.startswith("ipywidgets") for a in n.names) or (
            isinstance(n, ast.ImportFrom) and (n.module or "").startswith("ipywidgets")
        )
    return isinstance(n, ast.Call) and getattr(n.func, "id", None) in ("control", "explorer")


def slider_functions() -> set[str]:
    """The public widget functions that build sliders: those whose body imports ipywidgets or
    calls the shared builders of `widgets/_show.py`."""
    names = set()
    for path in WIDGETS.glob("*.py"):
        if path.name.startswith("_"):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (
                isinstance(node, ast.FunctionDef)
                and not node.name.startswith("_")
                and any(_builds_sliders(n) for n in ast.walk(node))
            ):
                names.add(node.name)
    return names


def slider_calls(nb, sliders: set[str]) -> list[tuple[int, str]]:
    """(cell index, slider) of every call of a slider function in the code cells."""
    calls = []
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        try:
            tree = ast.parse(cell.source)
        except SyntaxError:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                f = node.func
                name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", None)
                if name in sliders:
                    calls.append((i, name))
    return calls


def slider_problems(nb, chapter: str, sliders: set[str]) -> list[str]:
    required = required_cells(nb)
    calls = slider_calls(nb, sliders)
    problems = [
        f"{name} (cell {i}) runs only in Going further" for i, name in calls if not required[i]
    ]
    on_path = {name for i, name in calls if required[i]}
    missing = PROMISED.get(chapter, set()) - on_path
    if missing:
        problems.append(f"the promised {sorted(missing)} is not on the required path")
    if chapter in MEASURING and not on_path:
        problems.append("a measuring chapter with no slider on its required path")
    return problems


def next_problems(texts: list[str], lang: str, chapter: int, chapters: list[int]) -> list[str]:
    """The summary's "Next" paragraph names chapter + 1 (the last chapter: 00 or 12)."""
    summary = texts[-1]
    start = summary.find(NEXT[lang])
    if start < 0:
        return [f"the summary has no {NEXT[lang]!r}"]
    named = {int(n) for n in CHAPTER_REF.findall(summary[start:])}
    if chapter != chapters[-1]:
        wanted = {chapter + 1}
    else:
        wanted = {0, 12} & named or {0}
    if not wanted <= named:
        return [f"'Next' names chapters {sorted(named)}, not {sorted(wanted)}"]
    return []


# --------------------------------------------------------------------------- the chapters


@pytest.fixture(scope="module")
def sliders():
    found = slider_functions()
    assert {"kv_calculator", "roofline_explorer", "batching_simulator"} <= found, found
    return found


@pytest.mark.parametrize("lang", ["en", "zh"])
@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_sections_and_exercises_are_numbered_in_order(path, lang):
    nb = _nb(path)
    texts = _markdown(nb, lang, _store(path) if lang == "zh" else None)
    problems = section_problems(nb, texts) + exercise_problems(nb, texts, lang, path.stem[:2])
    assert not problems, f"{path.stem} ({lang}):\n  " + "\n  ".join(problems)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_every_slider_is_on_the_required_path(path, sliders):
    problems = slider_problems(_nb(path), path.stem[:2], sliders)
    assert not problems, f"{path.stem}:\n  " + "\n  ".join(problems)


@pytest.mark.parametrize("lang", ["en", "zh"])
@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_next_names_the_next_chapter(path, lang):
    nb = _nb(path)
    texts = _markdown(nb, lang, _store(path) if lang == "zh" else None)
    chapters = [int(p.stem[:2]) for p in NOTEBOOKS]
    problems = next_problems(texts, lang, int(path.stem[:2]), chapters)
    assert not problems, f"{path.stem} ({lang}): " + "; ".join(problems)


# --------------------------------------------------------------------------- the checks catch


def _toy(*cells):
    return new_notebook(cells=list(cells))


def test_the_section_check_catches_order_gaps_and_numbers_in_going_further():
    ok = _toy(new_markdown_cell("## 1. A"), new_markdown_cell("## 2. B"))
    assert section_problems(ok, [c.source for c in ok.cells]) == []
    for bad in (["## 1. A", "## 3. B"], ["## 2. A", "## 1. B"], ["## 1. A", "## 1. B"]):
        nb = _toy(*map(new_markdown_cell, bad))
        assert section_problems(nb, bad), bad
    late = ["## 1. A", "## Going further: more", "## 2. B"]
    nb = _toy(*map(new_markdown_cell, late))
    assert section_problems(nb, late) == ["section 2 comes after a Going further section"]


def _exercises(labels: list[str]):
    cells = []
    for label in labels:
        cells += [
            new_markdown_cell(label),
            new_code_cell("from llmlab.course.check import ch04\nch04.kv_bytes_per_token(1)"),
        ]
    # a different checker per exercise: exercise_calls keeps the first call of each id
    names = ["kv_bytes_per_token", "kv_gb_for_request", "utilization_gain"]
    for cell, name in zip(cells[1::2], names):
        cell.source = cell.source.replace("kv_bytes_per_token", name)
    return _toy(*cells)


def test_the_exercise_check_catches_shuffled_doubled_and_missing_labels():
    ok = _exercises(["**Exercise 1.** a", "**Exercise 2.** b", "**Exercise 3.** c"])
    assert exercise_problems(ok, [c.source for c in ok.cells], "en", "04") == []
    for labels in (
        ["**Exercise 1.** a", "**Exercise 3.** b", "**Exercise 2.** c"],
        ["**Exercise 1.** a", "**Exercise 1.** b", "**Exercise 2.** c"],
        ["**Exercise 1.** a", "no label", "**Exercise 3.** c"],
        ["**Exercise 04.1** a", "**Exercise 05.2** b", "**Exercise 04.3** c"],
    ):
        nb = _exercises(labels)
        assert exercise_problems(nb, [c.source for c in nb.cells], "en", "04"), labels


def test_the_slider_check_catches_a_promised_slider_in_going_further(sliders):
    call = new_code_cell("from llmlab.course.widgets import kv_calculator\nkv_calculator()")
    on_path = _toy(new_markdown_cell("## 1. A"), call, new_markdown_cell("## Summary"))
    assert slider_problems(on_path, "04", sliders) == []
    further = _toy(
        new_markdown_cell("## 1. A"),
        new_markdown_cell("## Going further: the calculator"),
        call,
        new_markdown_cell("## Summary"),
    )
    problems = slider_problems(further, "04", sliders)
    assert any("only in Going further" in p for p in problems)
    assert any("promised" in p for p in problems)
    assert slider_problems(_toy(new_markdown_cell("## 1. A")), "05", sliders)


def test_the_next_check_catches_a_wrong_chapter():
    def summary(text):
        return ["# x", f"## Summary\n\n- a point\n\n{text}"]

    chapters = [12, 13, 14, 15]
    assert next_problems(summary("**Next:** chapter 14 · speculation"), "en", 13, chapters) == []
    assert next_problems(summary("**Next:** chapter 12's glossary"), "en", 13, chapters)
    assert (
        next_problems(summary("**Next:** chapter 16; chapter 12's glossary"), "en", 15, chapters)
        == []
    )
    assert next_problems(summary("**Next:** chapter 16"), "en", 15, chapters)
    assert next_problems(summary("Next, chapter 14"), "en", 13, chapters)
