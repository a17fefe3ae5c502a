"""The glossary's Chinese definitions: every entry has one, written with the primary Chinese
terms only (no synonym outside a bracketed gloss), in full-width punctuation with a space between
Chinese and Latin text; the Chinese A–Z table shows them and the English table does not."""

from __future__ import annotations

import json
import re

import pytest

from llmlab import i18n
from llmlab.course import glossary as g

_CJK = r"[\u3400-\u4dbf\u4e00-\u9fff]"
_LATIN = r"[A-Za-z0-9]"


@pytest.fixture(scope="module")
def entries():
    return g.load_glossary()


def test_every_entry_has_a_chinese_definition(entries):
    missing = [e.term for e in entries if not e.definition_zh.strip()]
    assert not missing, f"no definition_zh: {missing}"
    for e in entries:
        assert g.has_cjk(e.definition_zh), e.term
        assert e.definition_zh.endswith("。"), f"{e.term}: the Chinese definition is not a sentence"


def test_chinese_definitions_use_primary_terms_only(entries):
    uses = [
        (e.term, u.found, u.primary, u.context)
        for e in entries
        for u in g.zh_synonym_uses(e.definition_zh, entries)
    ]
    assert not uses, "non-primary Chinese names (write the primary term instead):\n" + "\n".join(
        f"  {term}: {found!r} → {primary!r} in …{ctx}…" for term, found, primary, ctx in uses
    )


def test_chinese_definitions_are_typeset(entries):
    for e in entries:
        text = e.definition_zh
        assert not re.search(f"{_CJK}{_LATIN}|{_LATIN}{_CJK}", text), (
            f"{e.term}: no space between Chinese and Latin text: {text}"
        )
        assert not re.search(f"{_CJK}[,;:?!()]|[,;:?!()]{_CJK}", text), (
            f"{e.term}: half-width punctuation next to Chinese: {text}"
        )


def test_the_file_keeps_its_format_and_key_order():
    text = g.GLOSSARY_PATH.read_text(encoding="utf-8")
    data = json.loads(text)
    assert json.dumps(data, ensure_ascii=False, indent=1) + "\n" == text
    order = [
        "term",
        "zh_term",
        "zh",
        "zh_aliases",
        "zh_avoid",
        "zh_no_english",
        "aliases",
        "chapter",
        "definition",
        "definition_zh",
    ]
    for raw in data["terms"]:
        keys = list(raw)
        known = [k for k in keys if k in order]
        assert known == [k for k in order if k in keys], f"{raw['term']}: key order {keys}"
        assert keys[-2:] == ["definition", "definition_zh"], raw["term"]


def test_the_chinese_table_shows_the_chinese_definitions(entries, monkeypatch):
    monkeypatch.setattr(i18n, "_chosen", "zh")
    table = g.glossary_markdown(entries)
    assert "| 中文术语 | English | 定义 | 章节 |" in table
    for e in entries:
        row = next(
            (
                line
                for line in table.splitlines()
                if line.startswith(f"| {e.primary_zh}") and f"| {e.term}" in line
            ),
            None,
        )
        assert row is not None, f"{e.term}: no row in the Chinese table"
        assert e.definition_zh.replace("|", "/") in row, (
            f"{e.term}: row lacks its Chinese definition"
        )


def test_the_english_table_is_unchanged(entries, monkeypatch):
    monkeypatch.setattr(i18n, "_chosen", "en")
    table = g.glossary_markdown(entries)
    assert "| term | 中文 | definition | chapter |" in table
    for e in entries:
        assert e.definition_zh not in table, e.term
        assert e.definition.replace("|", "/") in table, e.term
