"""The A–Z glossary of the series (English and Chinese), and the scanner that checks notebooks
use it.

`data/glossary.json` holds one entry per term: the English term, its Chinese name, other
accepted spellings in each language, a one-sentence definition (in English and Chinese) and the
chapter that introduces it.

One term per concept in Chinese text: `zh_term` is the term the Chinese edition writes (where
Chinese engineers keep the English word, as the source chapter does, it is English: token, KV
cache, prefill, decode, memory-bound, kernel, logits, TTFT). Every other name the entry lists
(`zh`, `zh_aliases`) may appear in Chinese text only as a gloss in brackets after it;
`zh_synonym_uses()` finds the places where one is used instead. Names wrong for the field
(`zh_avoid`) are never written, not even as a gloss; English names the Chinese edition translates
(`zh_no_english`: widget → 控件) may stand only as a gloss. `load_glossary()` reads and validates
it; `lookup()` finds an entry by any of its names;
`glossary_markdown()` renders the A–Z table of chapter 12.

Words the course uses that are no inference concept of their own (benchmark, greedy, a draft
token, a scale factor) are not in the A–Z table, but Chinese text must name them one way too:
`house_terms()` reads them from the same file ("house_terms": term, zh, the names to avoid), and
the lint checks them with the glossary's terms (`lint_terms()`).

Notebooks introduce a term once as "term (中文)" (also "*term* (中文)", "term (ABBR, 中文)").
`find_term_uses()` finds those places in a notebook's markdown and `unknown_term_uses()` lists
the ones whose Chinese name is not in the glossary.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llmlab.paths import DATA_DIR

GLOSSARY_PATH = DATA_DIR / "glossary.json"
MAX_CHAPTER = 16  # the last notebook (13 to 16: the Going further part)
_CJK = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]")
# a parenthesised group (ASCII or full-width brackets) with at least one CJK character inside,
# and up to 60 characters of text before it on the same line
_PAREN = re.compile(r"([^\n()（）]{0,60}?)\s*[(（]([^()（）\n]*[\u3400-\u9fff][^()（）\n]*)[)）]")
_SPLIT = re.compile(r"[,，、;；/]")


@dataclass(frozen=True)
class GlossaryEntry:
    """One glossary term. `chapter`: the notebook number (0–MAX_CHAPTER) that introduces it."""

    term: str
    zh: str
    definition: str
    chapter: int
    aliases: tuple[str, ...] = ()  # other English names: abbreviations, code names
    zh_aliases: tuple[str, ...] = ()  # other Chinese names in use
    zh_term: str = ""  # the one term Chinese text uses ("" means `zh`)
    zh_avoid: tuple[str, ...] = ()  # names wrong for the field: never written, not even as a gloss
    definition_zh: str = ""  # the definition in Chinese
    zh_no_english: tuple[str, ...] = ()  # English names Chinese text translates (widget → 控件)

    @property
    def primary_zh(self) -> str:
        """The term the Chinese edition writes for this concept."""
        return self.zh_term or self.zh

    @property
    def shown_definition(self) -> str:
        """The definition in the language in use (`llmlab.i18n`): `definition_zh` in Chinese,
        where the entry has one."""
        from llmlab.i18n import language

        return self.definition_zh if language() == "zh" and self.definition_zh else self.definition

    def zh_synonyms(self) -> tuple[str, ...]:
        """The Chinese names that Chinese text must not use in place of `primary_zh`."""
        return tuple(n for n in (self.zh, *self.zh_aliases) if n != self.primary_zh)

    @property
    def letter(self) -> str:
        """The A–Z section the term is filed under."""
        return self.term[0].upper()

    def names(self) -> tuple[str, ...]:
        """Every English and Chinese name of the term."""
        return (self.term, *self.aliases, self.zh, *self.zh_aliases)


def sort_key(term: str) -> str:
    """The A–Z order of the glossary: case-insensitive."""
    return term.casefold()


def has_cjk(text: str) -> bool:
    """True when `text` holds at least one Chinese character."""
    return bool(_CJK.search(text))


def _entry(raw: Any, index: int) -> GlossaryEntry:
    if not isinstance(raw, dict):
        raise ValueError(f"glossary entry {index} must be an object, got {type(raw).__name__}")
    missing = {"term", "zh", "definition", "chapter"} - set(raw)
    if missing:
        raise ValueError(f"glossary entry {index} ({raw.get('term')!r}) lacks {sorted(missing)}")
    term, zh, definition, chapter = raw["term"], raw["zh"], raw["definition"], raw["chapter"]
    if not isinstance(term, str) or not term.strip() or has_cjk(term):
        raise ValueError(
            f"glossary entry {index}: term must be a non-empty English string, got {term!r}"
        )
    if not isinstance(zh, str) or not has_cjk(zh):
        raise ValueError(
            f"glossary entry {index} ({term!r}): zh must hold Chinese characters, got {zh!r}"
        )
    if not isinstance(definition, str) or not definition.strip():
        raise ValueError(
            f"glossary entry {index} ({term!r}): definition must be a non-empty string"
        )
    if isinstance(chapter, bool) or not isinstance(chapter, int) or not 0 <= chapter <= MAX_CHAPTER:
        raise ValueError(
            f"glossary entry {index} ({term!r}): chapter must be an int in "
            f"[0, {MAX_CHAPTER}], got {chapter!r}"
        )
    aliases = tuple(raw.get("aliases", ()))
    zh_aliases = tuple(raw.get("zh_aliases", ()))
    bad = [a for a in zh_aliases if not isinstance(a, str) or not has_cjk(a)]
    if bad:
        raise ValueError(
            f"glossary entry {index} ({term!r}): zh_aliases must hold Chinese, got {bad}"
        )
    zh_term = raw.get("zh_term", "")
    if not isinstance(zh_term, str):
        raise ValueError(
            f"glossary entry {index} ({term!r}): zh_term must be a string, got {zh_term!r}"
        )
    definition_zh = raw.get("definition_zh", "")
    if not isinstance(definition_zh, str) or (definition_zh and not has_cjk(definition_zh)):
        raise ValueError(
            f"glossary entry {index} ({term!r}): definition_zh must be Chinese, "
            f"got {definition_zh!r}"
        )
    zh_avoid = tuple(raw.get("zh_avoid", ()))
    bad = [a for a in zh_avoid if not isinstance(a, str) or not has_cjk(a)]
    if bad:
        raise ValueError(
            f"glossary entry {index} ({term!r}): zh_avoid must hold Chinese, got {bad}"
        )
    zh_no_english = tuple(raw.get("zh_no_english", ()))
    bad = [a for a in zh_no_english if not isinstance(a, str) or not a.strip() or has_cjk(a)]
    if bad:
        raise ValueError(
            f"glossary entry {index} ({term!r}): zh_no_english must hold English names, got {bad}"
        )
    return GlossaryEntry(
        term,
        zh,
        definition,
        chapter,
        aliases,
        zh_aliases,
        zh_term,
        zh_avoid,
        definition_zh,
        zh_no_english,
    )


def parse_glossary(data: Any) -> list[GlossaryEntry]:
    """Validate a glossary document ({"terms": [...]}) and return its entries in file order.

    Raises ValueError for a missing field, a term without Chinese, a chapter outside 0–MAX_CHAPTER, or
    two entries with the same English term.
    """
    if not isinstance(data, dict) or not isinstance(data.get("terms"), list):
        raise ValueError('a glossary must be an object with a "terms" list')
    entries = [_entry(raw, i) for i, raw in enumerate(data["terms"])]
    seen: dict[str, str] = {}
    for e in entries:
        key = sort_key(e.term)
        if key in seen:
            raise ValueError(f"glossary term {e.term!r} appears twice")
        seen[key] = e.term
    return entries


def load_glossary(path: str | Path | None = None) -> list[GlossaryEntry]:
    """The glossary's entries in file order (which the tests keep A–Z)."""
    path = Path(path) if path is not None else GLOSSARY_PATH
    return parse_glossary(json.loads(path.read_text(encoding="utf-8")))


def house_terms(path: str | Path | None = None) -> list[GlossaryEntry]:
    """The words outside the A–Z table whose Chinese the lint holds to one name ("house_terms":
    each with its term, `zh`, and `zh_aliases` / `zh_avoid` / `zh_no_english` as a glossary entry
    has them; no definition, no chapter)."""
    path = Path(path) if path is not None else GLOSSARY_PATH
    raws = json.loads(path.read_text(encoding="utf-8")).get("house_terms", [])
    return [
        _entry({"definition": raw.get("why", "-"), "chapter": 0, **raw}, i)
        for i, raw in enumerate(raws)
    ]


def lint_terms(path: str | Path | None = None) -> list[GlossaryEntry]:
    """What the term lint checks: the glossary's entries and the house terms."""
    return load_glossary(path) + house_terms(path)


def lookup(name: str, entries: Sequence[GlossaryEntry] | None = None) -> GlossaryEntry:
    """The entry one of whose English or Chinese names is `name` (English case-insensitive)."""
    entries = load_glossary() if entries is None else entries
    key = sort_key(name.strip())
    for e in entries:
        if any(sort_key(n) == key for n in e.names()):
            return e
    raise ValueError(f"name {name!r} is not in the glossary ({len(entries)} terms)")


def find_zh(zh: str, entries: Sequence[GlossaryEntry]) -> GlossaryEntry | None:
    """The entry whose Chinese name or Chinese alias is `zh` (spaces ignored), or None."""
    want = re.sub(r"\s+", "", zh)
    for e in entries:
        if any(re.sub(r"\s+", "", z) == want for z in (e.zh, *e.zh_aliases)):
            return e
    return None


def glossary_markdown(entries: Sequence[GlossaryEntry] | None = None) -> str:
    """The A–Z table as Markdown: one section per letter, columns term, 中文, definition, chapter
    (in Chinese, `llmlab.set_language("zh")`: the Chinese term first and the Chinese definition)."""
    from llmlab.i18n import language

    entries = load_glossary() if entries is None else entries
    zh_edition = language() == "zh"
    header = (
        "| 中文术语 | English | 定义 | 章节 |"
        if zh_edition
        else "| term | 中文 | definition | chapter |"
    )
    lines: list[str] = []
    letter = None
    for e in sorted(entries, key=lambda e: sort_key(e.term)):
        if e.letter != letter:
            letter = e.letter
            lines += ["", f"**{letter}**", "", header, "|---|---|---|---|"]
        names = e.term + (f" ({', '.join(e.aliases)})" if e.aliases else "")
        if zh_edition:
            others = e.zh_synonyms()
            zh = e.primary_zh + (f"（亦作 {'、'.join(others)}）" if others else "")
            definition = e.definition_zh or e.definition
            lines.append(f"| {zh} | {names} | {definition.replace('|', '/')} | {e.chapter:02d} |")
        else:
            zh = e.zh + (f" ({'、'.join(e.zh_aliases)})" if e.zh_aliases else "")
            lines.append(f"| {names} | {zh} | {e.definition.replace('|', '/')} | {e.chapter:02d} |")
    return "\n".join(lines).strip() + "\n"


# ---- one term per concept in Chinese text ----------------------------------------------------

# a sentence of the source chapter quoted word for word: its terms are the source's, not ours
SOURCE_QUOTE = re.compile(r"「([^」]+)」\s*（引自原章节）")  # group 1: the quoted words
_BRACKETED = re.compile(r"[(（][^()（）]*[)）]|`[^`\n]*`")


def _loose(name: str) -> re.Pattern:
    """`name` with any spacing between its characters ("首 token 延迟" = "首token延迟")."""
    chars = [re.escape(c) for c in name if not c.isspace()]
    return re.compile(r"\s*".join(chars), re.IGNORECASE)


def _english_word(name: str) -> re.Pattern:
    """An English `name` as a whole word, plural too ("widget", "widgets"; not "ipywidgets" or
    `llmlab.course.widgets`)."""
    words = r"\s+".join(re.escape(w) for w in name.split())
    return re.compile(rf"(?<![A-Za-z0-9_.]){words}(?:e?s)?(?![A-Za-z0-9_.])", re.IGNORECASE)


@dataclass(frozen=True)
class SynonymUse:
    """A non-primary Chinese name used in running Chinese text."""

    found: str  # the text as written
    primary: str  # the term to write instead
    term: str  # the glossary's English term
    context: str  # a few characters around it


def not_synonyms(path: str | Path | None = None) -> tuple[str, ...]:
    """Words that contain a synonym but name something else (操作系统内核: the OS kernel)."""
    path = Path(path) if path is not None else GLOSSARY_PATH
    return tuple(json.loads(path.read_text(encoding="utf-8")).get("zh_not_synonyms", ()))


def zh_synonym_uses(
    text: str,
    entries: Sequence[GlossaryEntry] | None = None,
    exceptions: Sequence[str] | None = None,
) -> list[SynonymUse]:
    """Every place in Chinese `text` where a concept is named by one of its non-primary Chinese
    names, or by an English name the edition translates (`zh_no_english`). A name may stand as a
    gloss in brackets after the primary term, except a name wrong for the field (`zh_avoid`); code spans and quotes of the source chapter (「…」（引自原章节）)
    are skipped, and so is a name inside a primary term
    written out (自回归 inside 自回归生成) or inside one of the `exceptions` (操作系统内核)."""
    entries = lint_terms() if entries is None else entries
    exceptions = not_synonyms() if exceptions is None else exceptions
    blank = lambda m: " " * len(m.group())  # noqa: E731 - keeps offsets
    no_code = re.sub(r"`[^`\n]*`|" + SOURCE_QUOTE.pattern, blank, text)
    plain = _BRACKETED.sub(blank, no_code)
    covered: list[tuple[int, int]] = []
    for word in [e.primary_zh for e in entries] + list(exceptions):
        for m in _loose(word).finditer(no_code):
            covered.append(m.span())
    out = []
    for e in entries:
        names = [(_loose(n), plain) for n in e.zh_synonyms()]
        names += [(_loose(n), no_code) for n in e.zh_avoid]
        names += [(_english_word(n), plain) for n in e.zh_no_english]
        for pattern, where in names:
            for m in pattern.finditer(where):
                a, b = m.span()
                if any(x <= a and b <= y and (y - x) > (b - a) for x, y in covered):
                    continue
                out.append(
                    SynonymUse(
                        m.group(),
                        e.primary_zh,
                        e.term,
                        text[max(0, a - 12) : b + 12].replace("\n", " "),
                    )
                )
    return out


def terms_per_chapter(entries: Sequence[GlossaryEntry] | None = None) -> dict[int, int]:
    """How many glossary terms each chapter 0–MAX_CHAPTER introduces."""
    entries = load_glossary() if entries is None else entries
    counts = dict.fromkeys(range(MAX_CHAPTER + 1), 0)
    for e in entries:
        counts[e.chapter] += 1
    return counts


# ---- scanning notebooks for "term (中文)" ----------------------------------------------------


@dataclass(frozen=True)
class TermUse:
    """One "term (中文)" in a notebook's markdown."""

    notebook: str  # file name
    cell: int  # cell index
    english: str  # the words before the bracket (may hold more than the term itself)
    zh: str  # one Chinese name inside the bracket


def find_term_uses(text: str, notebook: str = "", cell: int = 0) -> list[TermUse]:
    """Every Chinese name in brackets in `text` with the words before it.

    "*prefill* (预填充)", "GQA (grouped-query attention, 分组查询注意力)" and
    "throughput (吞吐, tokens/s)" all count; each Chinese part of a bracket is one use.
    """
    uses = []
    for m in _PAREN.finditer(text):
        before = re.sub(r"[*_`]", "", m.group(1)).strip()
        for part in _SPLIT.split(m.group(2)):
            part = part.strip()
            if has_cjk(part):
                uses.append(TermUse(notebook, cell, before, part))
    return uses


def notebook_term_uses(path: str | Path) -> list[TermUse]:
    """`find_term_uses` over every markdown cell of a notebook."""
    path = Path(path)
    cells = json.loads(path.read_text(encoding="utf-8")).get("cells", [])
    uses: list[TermUse] = []
    for i, c in enumerate(cells):
        if c.get("cell_type") == "markdown":
            src = c.get("source", "")
            uses += find_term_uses("".join(src) if isinstance(src, list) else src, path.name, i)
    return uses


def unknown_term_uses(
    paths: Iterable[str | Path], entries: Sequence[GlossaryEntry] | None = None
) -> list[TermUse]:
    """The "term (中文)" uses in these notebooks whose Chinese name the glossary lacks."""
    entries = load_glossary() if entries is None else entries
    return [u for p in paths for u in notebook_term_uses(p) if find_zh(u.zh, entries) is None]
