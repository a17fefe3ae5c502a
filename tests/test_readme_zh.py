"""README.zh.md and docs/instructors.zh.md: the Chinese README gives the same commands as the
English one, lists every chapter, links both ways, and follows the README.md it was translated
from (it records that English's hash: an English edit flags it until it is revised and stamped);
neither names a host of a package registry or mirror; both use the primary Chinese terms only."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from llmlab.course import glossary as g

ROOT = Path(__file__).resolve().parent.parent
README_ZH = ROOT / "README.zh.md"
DOCS_ZH = (README_ZH, ROOT / "docs" / "instructors.zh.md")


def test_readme_zh_gives_the_commands_and_every_chapter():
    text = README_ZH.read_text(encoding="utf-8")
    for command in (
        "make lab",
        "make test",
        "make lab LLMLAB_LANG=zh",
        "make run LLMLAB_LANG=zh",
        "PIP_INDEX_URL=",
        "pip config set global.index-url",
    ):
        assert command in text, command
    for nb in sorted((ROOT / "notebooks").glob("*.ipynb")):
        assert f"| {nb.stem[:2]} | `{nb.stem}` |" in text, f"no row for {nb.stem}"


def test_readmes_link_to_each_other():
    assert "(README.zh.md)" in (ROOT / "README.md").read_text(encoding="utf-8").splitlines()[0]
    assert "(README.md)" in README_ZH.read_text(encoding="utf-8").splitlines()[0]


@pytest.mark.parametrize("doc", DOCS_ZH, ids=lambda p: p.name)
def test_chinese_docs_name_no_host(doc):
    text = doc.read_text(encoding="utf-8")
    assert "://" not in text, "a URL in the Chinese docs"
    hosts = re.findall(r"\b[\w-]+(?:\.[\w-]+)*\.(?:org|com|cn|net|edu|io)\b", text)
    assert not hosts, f"host names in {doc.name}: {hosts}"


@pytest.mark.parametrize("doc", DOCS_ZH, ids=lambda p: p.name)
def test_chinese_docs_use_primary_terms(doc):
    uses = g.zh_synonym_uses(doc.read_text(encoding="utf-8"))
    assert not uses, "\n".join(f"{u.found!r} → {u.primary!r}: …{u.context}…" for u in uses)


def test_readme_zh_follows_the_english_it_was_translated_from():
    from llmlab.course import lang

    assert lang.stale_docs("zh") == [], (
        "README.md changed since README.zh.md was translated: revise README.zh.md, then run "
        "`python -m llmlab lang docs zh --stamp`"
    )


def test_an_english_edit_makes_the_translation_stale_until_stamped(tmp_path):
    from llmlab.course import lang

    times = "<!-- chapter times: written by x -->\n| a |\n<!-- end of chapter times -->\n"
    (tmp_path / "README.md").write_text("# llmlab\n\nText.\n" + times, encoding="utf-8")
    (tmp_path / "README.zh.md").write_text("# llmlab\n\n正文。\n", encoding="utf-8")
    assert lang.stale_docs("zh", tmp_path) == [
        "README.zh.md: records no hash of README.md (a line '<!-- translated from ...')"
    ]
    lang.stamp_docs("zh", tmp_path)
    assert lang.stale_docs("zh", tmp_path) == []
    # a generated block rewritten by its command is no edit of the prose
    english = (tmp_path / "README.md").read_text(encoding="utf-8")
    (tmp_path / "README.md").write_text(english.replace("| a |", "| b |"), encoding="utf-8")
    assert lang.stale_docs("zh", tmp_path) == []
    (tmp_path / "README.md").write_text(english.replace("Text.", "Text, edited."), encoding="utf-8")
    assert lang.stale_docs("zh", tmp_path) == [
        "README.zh.md: README.md changed since it was translated"
    ]
    lang.stamp_docs("zh", tmp_path)  # revised, then stamped: one stamp line, the new hash
    zh = (tmp_path / "README.zh.md").read_text(encoding="utf-8")
    assert zh.count("<!-- translated from README.md") == 1 and lang.stale_docs("zh", tmp_path) == []
