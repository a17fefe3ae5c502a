"""Where the course states its times, and the writer that keeps them equal to the model.

Every chapter's header (English and Chinese), chapter 00's table, README.md, README.zh.md and the
instructors' guides (docs/instructors.md, docs/instructors.zh.md) give the two times of each
chapter that `llmlab.course.instructor.reading_time` computes: the required path and the whole
chapter. `write()` puts them there (`python -m llmlab exercises --write-times`); `problems()`
lists every place that disagrees, which the tests assert is none.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

from llmlab.course.instructor import reading_time as rt

ROOT = rt.ROOT
BEGIN = "<!-- chapter times: written by `python -m llmlab exercises --write-times`; do not edit by hand -->"
END = "<!-- end of chapter times -->"
DOCS = {
    "README.md": "en",
    "README.zh.md": "zh",
    "docs/instructors.md": "en",
    "docs/instructors.zh.md": "zh",
}
CH00, CH00_CELL = "00-setup-and-map", "ch00-times"
AFTERNOON = 240  # minutes of study in an afternoon
STUDY_DAY = 360  # minutes of study in a working day

# the header's time line, as it reads now and as it read before the two times
_LINE = {
    "en": re.compile(
        r"\*\*Time:\*\*\s*about\s+\d+\s+minutes(?: on the required path, \d+ minutes for the whole"
        r" chapter(?: top to bottom)?\.| \(the Going further sections not included\)\.)"
    ),
    "zh": re.compile(
        r"\*\*时间：\*\*\s*(?:约\s*\d+\s*分钟（不含“延伸学习”各节）。|必修路线约 \d+ 分钟，整章从头到尾约 \d+ 分钟。)"
    ),
}


def _hours(minutes: int, lang: str) -> str:
    h, m = divmod(minutes, 60)
    if lang == "zh":
        return f"{h} 小时 {m} 分钟" if h else f"{m} 分钟"
    return f"{h} h {m} min" if h else f"{m} min"


def machine(run_times: dict | None = None) -> str:
    """The machine most chapters' run times were measured on."""
    data = rt.read_run_times() if run_times is None else run_times
    seen = Counter(c.get("machine", "?") for c in data.get("chapters", {}).values())
    return seen.most_common(1)[0][0] if seen else "?"


def table(times: list[rt.ChapterTime], lang: str, run_times: dict | None = None) -> str:
    """The markdown block: how the times are computed, one row per chapter, the totals and what
    the required path fits."""
    path = [t for t in times if int(t.stem[:2]) < rt.PATH_CHAPTERS]
    further = [t for t in times if int(t.stem[:2]) >= rt.PATH_CHAPTERS]
    req = sum(t.stated[0] for t in path)
    whole = sum(t.stated[1] for t in path)
    longest = max(t.stated[0] for t in path)
    zh = lang == "zh"
    rows = [
        "| 章节 | 必修路线 | 整章 |" if zh else "| chapter | required path | whole chapter |",
        "|---|---|---|",
    ]
    unit = " 分钟" if zh else " min"
    rows += [f"| `{t.stem}` | {t.stated[0]}{unit} | {t.stated[1]}{unit} |" for t in times]
    first, last = path[0].stem[:2], path[-1].stem[:2]
    rows.append(
        f"| {'第 ' if zh else 'chapters '}{first}–{last}{' 章' if zh else ''} | "
        f"{_hours(req, lang)} | {_hours(whole, lang)} |"
    )
    if further:
        a, b = further[0].stem[:2], further[-1].stem[:2]
        fr = sum(t.stated[0] for t in further)
        fw = sum(t.stated[1] for t in further)
        label = f"第 {a}–{b} 章（延伸部分）" if zh else f"chapters {a}–{b} (Going further part)"
        rows.append(f"| {label} | {_hours(fr, lang)} | {_hours(fw, lang)} |")
    where = machine(run_times)
    if zh:
        how = (
            "每章写明两个时间：必修路线，以及从头到尾的整章（含“延伸学习”各节）。"
            "两个时间出自同一个模型（`llmlab/course/instructor/reading_time.py`）。"
            "正文和代码按每分钟 150 词读。"
            "每运行一个单元格、看它的输出，算半分钟。"
            "练习按类型计时，自己写的代码按长度计时，动手实现练习 25 到 45 分钟。"
            f"单元格的运行时间是在 {where} 上无界面运行时实测的。"
            "机器快一些或慢一些，只影响运行时间这一项。"
        )
        fit = (
            f"第 {first}–{last} 章的必修路线一个下午学得完。"
            if req <= AFTERNOON
            else f"第 {first}–{last} 章的必修路线一个下午学不完。"
            f"它约需 {req / 60:.0f} 小时，按每天学六小时算约 {req / STUDY_DAY:.1f} 天。"
            f"也可以每次学一章，必修路线最长的一章是 {longest} 分钟。"
        )
    else:
        how = (
            "Every chapter states two times: its required path, and the whole chapter top to bottom, "
            "Going further sections included. Both come from one model "
            "(`llmlab/course/instructor/reading_time.py`): prose and code read at 150 words a minute, "
            "half a minute to run each cell and look at its output, minutes per exercise by kind, "
            "code you write by its size (a build exercise 25 to 45 minutes), and each cell's run time "
            f"as measured headless on {where}; a faster or slower machine moves only that last part."
        )
        fit = (
            f"The required path of chapters {first}–{last} fits an afternoon."
            if req <= AFTERNOON
            else f"The required path of chapters {first}–{last} does not fit an afternoon: it takes "
            f"about {req / 60:.0f} hours, {req / STUDY_DAY:.1f} working days of six hours of study, "
            f"or one chapter per session (the longest required path is {longest} minutes)."
        )
    return f"{how}\n\n" + "\n".join(rows) + f"\n\n{fit}"


def chapter00_cell(times: list[rt.ChapterTime], lang: str, run_times: dict | None = None) -> str:
    heading = "## 每章要多久" if lang == "zh" else "## How long each chapter takes"
    return f"{heading}\n\n{table(times, lang, run_times)}"


def with_time_line(text: str, required: int, whole: int, lang: str) -> str:
    """`text` (a header cell) with its time line saying these two times."""
    new, n = _LINE[lang].subn(rt.time_line(required, whole, lang), text, count=1)
    if n != 1:
        raise ValueError(f"no time line in the header: {text[:200]!r}")
    return new


def _doc_block(text: str, block: str, where: str) -> str:
    if BEGIN not in text or END not in text:
        raise ValueError(f"{where} has no chapter-times markers ({BEGIN!r} ... {END!r})")
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{BEGIN}\n{block}\n{END}{tail}"


# --------------------------------------------------------------------------- write and check


def _store_path(root: Path, stem: str) -> Path:
    return root / "i18n" / "zh" / f"{stem}.json"


def write(root: Path = ROOT, only: set[str] | None = None) -> list[str]:
    """Write the model's times everywhere they are stated; returns the files changed. Chapter
    00's table is part of chapter 00's own reading, so the writing repeats until the figures
    stop moving (a few rounds at most: they are rounded to 5 minutes)."""
    changed: list[str] = []
    for _ in range(5):
        now = _write_once(root, only)
        if not now:
            return changed
        changed += [f for f in now if f not in changed]
    raise RuntimeError(f"the stated times did not settle after 5 rounds: {changed}")


def _write_once(root: Path, only: set[str] | None) -> list[str]:
    """One round of `write` (with `only`, the chapters' files outside it are left as they are)."""
    import nbformat

    from llmlab.course.lang import en_sha

    run_times = rt.read_run_times()
    times = rt.course_times(root / "notebooks")
    changed = []
    for t in times:
        if only is not None and t.stem not in only:
            continue
        path = root / "notebooks" / f"{t.stem}.ipynb"
        nb = nbformat.read(path, as_version=4)
        store_file = _store_path(root, t.stem)
        store = json.loads(store_file.read_text(encoding="utf-8"))
        texts = {}
        first = next(c for c in nb.cells if c.cell_type == "markdown")
        texts[first.get("id")] = {
            "en": with_time_line(first.source, *t.stated, "en"),
            "zh": with_time_line(store["cells"][first.get("id")]["text"], *t.stated, "zh"),
        }
        if t.stem == CH00:
            texts[CH00_CELL] = {
                "en": chapter00_cell(times, "en", run_times),
                "zh": chapter00_cell(times, "zh", run_times),
            }
        for cell in nb.cells:
            new = texts.get(cell.get("id"))
            if new is None:
                continue
            cell.source = new["en"]
            entry = store["cells"][cell.get("id")]
            entry.update(en_sha=en_sha(cell.source), en=cell.source, text=new["zh"])
        old = path.read_text(encoding="utf-8")
        text = nbformat.writes(nb) + "\n"
        if text != old:
            path.write_text(text, encoding="utf-8")
            store_file.write_text(
                json.dumps(store, ensure_ascii=False, indent=1) + "\n", encoding="utf-8"
            )
            changed.append(str(path.relative_to(root)))
    for doc, lang in DOCS.items():
        p = root / doc
        old = p.read_text(encoding="utf-8")
        new = _doc_block(old, table(times, lang, run_times), doc)
        if new != old:
            p.write_text(new, encoding="utf-8")
            changed.append(doc)
    return changed


def problems(root: Path = ROOT) -> list[str]:
    """Every place whose stated times differ from the model's."""
    import nbformat

    run_times = rt.read_run_times()
    times = rt.course_times(root / "notebooks")
    out = []
    for t in times:
        nb = nbformat.read(root / "notebooks" / f"{t.stem}.ipynb", as_version=4)
        store = json.loads(_store_path(root, t.stem).read_text(encoding="utf-8"))["cells"]
        first = next(c for c in nb.cells if c.cell_type == "markdown")
        if rt.stated_minutes(nb) != t.stated:
            out.append(f"{t.stem}: the header states {rt.stated_minutes(nb)}, the model {t.stated}")
        zh = rt.stated_minutes_zh(store[first.get("id")]["text"])
        if zh != t.stated:
            out.append(f"{t.stem}: the Chinese header states {zh}, the model {t.stated}")
        if t.stem == CH00:
            cell = next((c for c in nb.cells if c.get("id") == CH00_CELL), None)
            for lang, text in (
                ("en", cell.source if cell else ""),
                ("zh", store.get(CH00_CELL, {}).get("text", "")),
            ):
                if text != chapter00_cell(times, lang, run_times):
                    out.append(f"{t.stem}: the table of times ({lang}) is not the model's")
    for doc, lang in DOCS.items():
        text = (root / doc).read_text(encoding="utf-8")
        try:
            current = _doc_block(text, table(times, lang, run_times), doc)
        except ValueError as e:
            out.append(str(e))
            continue
        if current != text:
            out.append(f"{doc}: the table of times is not the model's")
    return out
