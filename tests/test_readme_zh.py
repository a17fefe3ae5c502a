"""README.zh.md and docs/instructors.zh.md: the Chinese README gives the same commands as the
English one, lists all thirteen chapters, links both ways, names no host of a package registry or
mirror; both Chinese documents use the primary Chinese terms only."""

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
