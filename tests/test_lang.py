"""One source, two languages: a markdown cell with no translation, or whose English changed
since it was translated, is named; the built notebook keeps every code cell and swaps the
markdown for its translation."""

from __future__ import annotations

import nbformat
import pytest
from course_folder import write_course
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

from llmlab.course import lang


def _course(tmp_path):
    nb = new_notebook(
        cells=[
            new_markdown_cell("# 04 · The KV cache"),
            new_code_cell("x = 1\nprint(x)"),
            new_markdown_cell("Decode reads the whole cache."),
            new_code_cell(""),
        ]
    )
    return write_course(tmp_path, "04-kv.ipynb", nb), nb


def _translate_all(tmp_path, nbs):
    """Every markdown cell of the course in tmp_path gets a (mock) translation."""
    lang.extract("zh", nbs)
    store_file = tmp_path / "i18n" / "zh" / "04-kv.json"
    store = lang.read_store(store_file)
    for entry in store.values():
        entry["text"] = "中文：" + entry["en"]
    lang.write_store(store_file, store)


def test_missing_then_translated_then_stale(tmp_path):
    nbs, nb = _course(tmp_path)
    assert [p.what for p in lang.check("zh", nbs)] == ["missing", "missing"]
    assert lang.extract("zh", nbs) == 2
    store_file = tmp_path / "i18n" / "zh" / "04-kv.json"
    store = lang.read_store(store_file)
    for entry, text in zip(store.values(), ("# 04 · KV 缓存", "decode 读取整个 KV 缓存。")):
        entry["text"] = text
    lang.write_store(store_file, store)
    assert lang.check("zh", nbs) == []
    # an English edit made on purpose: the translation is now stale, named with its cell
    nb.cells[2].source = "Decode reads the whole cache, every step."
    nbformat.write(nb, nbs / "04-kv.ipynb")
    found = lang.check("zh", nbs)
    assert [(p.notebook, p.cell, p.what) for p in found] == [("04-kv", 2, "stale")]
    assert "changed since it was translated" in str(found[0])
    with pytest.raises(ValueError, match="04-kv cell 2"):
        lang.build("zh", nbs, tmp_path / "zh")


def test_build_keeps_code_and_translates_markdown(tmp_path):
    nbs, nb = _course(tmp_path)
    _translate_all(tmp_path, nbs)
    [out] = lang.build("zh", nbs, tmp_path / "build" / "zh")
    zh = nbformat.read(out, as_version=4)
    assert zh.cells[0].source == 'import llmlab\nllmlab.set_language("zh")'
    assert [c.source for c in zh.cells[1:] if c.cell_type == "code"] == [
        c.source for c in nb.cells if c.cell_type == "code"
    ]
    assert [c.source for c in zh.cells if c.cell_type == "markdown"] == [
        "中文：# 04 · The KV cache",
        "中文：Decode reads the whole cache.",
    ]
    with pytest.raises(ValueError, match="lang must be one of"):
        lang.check("fr", nbs)
    with pytest.raises(ValueError, match="must not be the folder"):
        lang.build("zh", nbs, nbs)


def test_rebuild_keeps_a_copy_the_student_edited(tmp_path):
    nbs, nb = _course(tmp_path)
    _translate_all(tmp_path, nbs)
    out = tmp_path / "build" / "zh"
    [built] = lang.build("zh", nbs, out)
    lang.build("zh", nbs, out)  # unchanged: nothing to keep
    assert not (out / "04-kv.ipynb.bak").exists()
    mine = nbformat.read(built, as_version=4)
    mine.cells[2].source = "answer = 42  # the student's work"
    nbformat.write(mine, built)
    lang.build("zh", nbs, out)
    kept = nbformat.read(out / "04-kv.ipynb.bak", as_version=4)
    assert kept.cells[2].source == "answer = 42  # the student's work"
    assert nbformat.read(built, as_version=4).cells[2].source == "x = 1\nprint(x)"
