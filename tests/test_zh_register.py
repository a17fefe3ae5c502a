"""The Chinese edition reads like the source chapter, not like a careful translation: few 的
(the source chapter has about 33 per 1,000 Han characters), the noun instead of 它 (under 1 per
1,000 there), few semicolons (2 per 1,000 there), short sentences; and it is typeset as Chinese
(no italic on Chinese words, no space before %, one shape of exercise heading:
「**练习 3（推理）。**」).

Everything a student reads in Chinese is measured, the printed half as much as the chapter text:

- each chapter: the markdown cells as the Chinese notebook shows them (the store's "text" for
  each markdown cell of the English notebook), tables included (a table's Chinese is prose
  too), and the lines its code cells print through the notebook-strings catalog;
- each catalog of the package, on its own: the checkers' (`llmlab/course/check/messages/`),
  the figures' and the widgets' (`llmlab/course/figures/messages/`,
  `llmlab/course/widgets/messages/`), the notebook strings, the pairs left in code
  (`i18n/zh/package-pairs.json`) and the glossary's definitions;
- the two Chinese documents, README.zh.md and docs/instructors.zh.md. They are made of commands,
  so there a code span, and an English message quoted in italics, count as one mark each; the
  tables that `python -m llmlab exercises --write` generates are left out.

Left out everywhere: code blocks and inline code's markup (its text stays), LaTeX, block quotes,
the sentences quoted from the source chapter (「…」（引自原章节）) and a template's placeholders.
A count may reach its bound's share of the text's Han characters, rounded up (one 的 in a label
of twenty characters is not a register).

    python tests/test_zh_register.py [i18n/zh]   # the figures per chapter and per catalog
"""

from __future__ import annotations

import json
import math
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from llmlab.course import lang
from llmlab.i18n import NOTEBOOK_STRINGS

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
STORE = ROOT / "i18n" / "zh"

MAX_DE = 45.0  # 的 per 1,000 Han characters
MAX_TA = 3.0  # 它 (and 它们) per 1,000 Han characters
MAX_SEMICOLONS = 4.0  # ； per 1,000 Han characters (the source chapter: 2)
MAX_SENTENCE = 80  # characters, split on 。！？； and line ends

HAN = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff]")
SOURCE_QUOTE = re.compile(r"「[^」]+」\s*（引自原章节）")
FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.M | re.S)
DISPLAY_MATH = re.compile(r"\$\$.+?\$\$", re.S)
INLINE_MATH = re.compile(r"(?<!\\)\$[^$\n]+\$")
INLINE_CODE = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"!?\[([^\]]*)\]\([^)]*\)")
HTML = re.compile(r"<[^>\n]+>")
MARKUP = re.compile(r"\*\*|__|(?<![\w*])\*(?!\s)|(?<=\S)\*(?![\w*])")
LINE_START = re.compile(r"^[ \t]*(?:#+[ \t]*)?(?:[-*+][ \t]+|\d+[.)][ \t]+)?", re.M)
SENTENCE_END = re.compile(r"[。！？；!?;\n]")
TABLE_RULE = re.compile(r"^\s*\|?[\s:|-]+\|?\s*$")  # |---|:---:|
PLACEHOLDER = re.compile(r"\{[^{}\n]*\}")


def _quote_mark(quote: re.Match) -> str:
    """A quoted sentence that ends the reader's sentence ("…。」") ends it here too."""
    return "□。" if re.search(r"[。！？]」", quote.group(0)) else "□"


def _table_cells(line: str) -> str:
    """A table's row as the reader reads it: each cell a piece of its own (a rule row: nothing)."""
    if TABLE_RULE.fullmatch(line):
        return ""
    return "\n".join(cell.strip() for cell in line.strip().strip("|").split("|"))


def prose(markdown: str, tables: bool = True) -> str:
    """The cell's own Chinese prose: code blocks, formulas, quotes and markup left out, each table
    cell a piece of its own (`tables=False`: no tables). An inline formula or a quote of the
    source chapter stays as one mark (it is read as part of its sentence), so a sentence's length
    counts it once; inline code keeps its text."""
    text = FENCE.sub("\n", markdown)
    text = DISPLAY_MATH.sub("\n", text)
    text = "\n".join(
        ""
        if line.lstrip().startswith(">") or (line.lstrip().startswith("|") and not tables)
        else _table_cells(line)
        if line.lstrip().startswith("|")
        else line
        for line in text.splitlines()
    )
    text = SOURCE_QUOTE.sub(_quote_mark, text)
    text = INLINE_MATH.sub("□", text)
    text = INLINE_CODE.sub(lambda m: m.group(0)[1:-1], text)
    text = LINK.sub(r"\1", text)
    text = HTML.sub("", text)
    text = LINE_START.sub("", text)
    return MARKUP.sub("", text)


# in a printed text, a long run with no Chinese is a formula or a piece of code: "(x_i, x_j) →
# (x_i·cos − x_j·sin, …)" is read as one mark, as an inline formula of a chapter is
NOT_CHINESE_RUN = re.compile(r"[^\u3400-\u9fff\u3000-\u303f\uff00-\uffef\n]{16,}")


def printed(text: str) -> str:
    """A printed text (a hint, a label, a line of a notebook cell) as prose: its placeholders
    and each formula or piece of code one mark."""
    return prose(NOT_CHINESE_RUN.sub("□", PLACEHOLDER.sub("□", text)))


DOCS = (ROOT / "README.zh.md", ROOT / "docs" / "instructors.zh.md")
GENERATED = re.compile(r"<!-- (exercises table|chapter times):.*?<!-- end of \1 -->", re.S)
ENGLISH_QUOTE = re.compile(
    r"(?<![*\w])\*{1,3}(?=[^*\n]*[A-Za-z])[^*\n\u3400-\u9fff]+\*{1,3}(?![*\w])"
)


def doc_prose(markdown: str) -> str:
    """A document's own Chinese prose: as `prose`, with each code span and each English message
    quoted in italics (*has no translation*) one mark, and the generated tables left out."""
    text = FENCE.sub("\n", GENERATED.sub("\n", markdown))
    text = ENGLISH_QUOTE.sub("□", INLINE_CODE.sub("□", text))
    return prose(text)


@dataclass(frozen=True)
class Figures:
    name: str
    han: int
    de: int
    ta: int
    semicolons: int
    longest: int
    longest_sentence: str

    def per_k(self, count: int) -> float:
        return count * 1000 / max(self.han, 1)

    def row(self) -> str:
        return (
            f"{self.name:34s} {self.han:6d}  {self.per_k(self.de):6.1f}  {self.per_k(self.ta):5.1f}"
            f"  {self.per_k(self.semicolons):5.1f}  {self.longest:4d}"
        )

    def problems(self) -> list[str]:
        """What is over the bounds (a count may reach its share of the Han characters, rounded
        up)."""
        out = []
        for mark, count, bound, advice in (
            ("的", self.de, MAX_DE, "rewrite the sentence; keep the grammatical 的"),
            ("它", self.ta, MAX_TA, "name it"),
            ("；", self.semicolons, MAX_SEMICOLONS, "end the sentence"),
        ):
            if count > math.ceil(bound * self.han / 1000):
                out.append(
                    f"{mark} {self.per_k(count):.1f} per 1,000 Han characters "
                    f"(at most {bound:.0f}): {advice}"
                )
        if self.longest > MAX_SENTENCE:
            out.append(
                f"a sentence of {self.longest} characters (at most {MAX_SENTENCE}): "
                f"{self.longest_sentence}"
            )
        return out


HEADER = f"{'chapter or catalog':34s}    Han    的/k   它/k   ；/k  longest"


def figures(name: str, text: str, sentences_of: str | None = None) -> Figures:
    """The figures of `text`; its longest sentence is looked for in `sentences_of` (by default
    `text`): a chapter's tables count for the marks, not for sentence length (a cell of the In
    vLLM table lists the files and functions it cites)."""
    sentences = [
        s.strip()
        for s in SENTENCE_END.split(text if sentences_of is None else sentences_of)
        if s.strip()
    ]
    longest = max(sentences, key=len, default="")
    return Figures(
        name=name,
        han=len(HAN.findall(text)),
        de=text.count("的"),
        ta=text.count("它"),
        semicolons=text.count("；"),
        longest=len(longest),
        longest_sentence=longest,
    )


def chinese_markdown(path: Path, store_dir: Path = STORE) -> list[tuple[str, str]]:
    """(cell id, Chinese markdown) for each markdown cell of the English notebook at `path`."""
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    store_path = store_dir / f"{path.stem}.json"
    store = json.loads(store_path.read_text(encoding="utf-8"))["cells"]
    return [
        (c["id"], str(store.get(c["id"], {}).get("text", "")))
        for c in cells
        if c["cell_type"] == "markdown"
    ]


def chapter_printed(path: Path, store_dir: Path = STORE) -> list[str]:
    """The Chinese of the lines the chapter's code cells show through the notebook-strings
    catalog (what `llmlab.say`, `say_table`, `notebook_text` and the plots' titles print)."""
    strings = lang.read_catalog(store_dir / NOTEBOOK_STRINGS)
    return [strings[t] for t in lang.notebook_strings(path) if strings.get(t)]


def chapter_figures(path: Path, store_dir: Path = STORE) -> Figures:
    markdown = [t for _, t in chinese_markdown(path, store_dir)]
    lines = "\n".join(printed(t) for t in chapter_printed(path, store_dir))
    text = "\n".join(prose(t) for t in markdown) + "\n" + lines
    running = "\n".join(prose(t, tables=False) for t in markdown) + "\n" + lines
    return figures(path.stem[:2], text, sentences_of=running)


def catalogs(root: Path = ROOT) -> dict[str, list[str]]:
    """{catalog name: the Chinese texts it holds} for every catalog of printed text."""
    found = {}
    for path in sorted((root / "llmlab" / "course").glob("*/messages/*.json")):
        entries = json.loads(path.read_text(encoding="utf-8"))["messages"]
        found[f"{path.parent.parent.name}/{path.stem}"] = [
            e.get("zh", "") for e in entries.values()
        ]
    strings = lang.read_catalog(root / "i18n" / "zh" / NOTEBOOK_STRINGS)
    found["notebook-strings"] = list(strings.values())
    pairs = json.loads((root / "i18n" / "zh" / "package-pairs.json").read_text(encoding="utf-8"))
    found["package-pairs"] = [p["zh"] for p in pairs["pairs"]]
    glossary = json.loads((root / "data" / "glossary.json").read_text(encoding="utf-8"))
    found["glossary"] = [t.get("definition_zh", "") for t in glossary["terms"]]
    return found


def catalog_figures(name: str, texts: list[str]) -> Figures:
    return figures(name, "\n".join(printed(t) for t in texts))


def test_the_figures_per_chapter_and_catalog(capsys):
    rows = [chapter_figures(p).row() for p in NOTEBOOKS]
    rows += [catalog_figures(name, texts).row() for name, texts in catalogs().items()]
    rows += [figures(doc.name, doc_prose(doc.read_text(encoding="utf-8"))).row() for doc in DOCS]
    with capsys.disabled():
        print("\n" + "\n".join([HEADER, *rows]))


def test_the_measure_leaves_out_what_is_not_our_prose():
    cell = (
        "## 1. 它的标题\n\n正文的一句。「它说的话」（引自原章节）\n\n```python\nx = '的的的'\n```\n"
        "$$\\text{的}$$ 公式 $a_{的}$。\n> 的的的\n"
    )
    text = prose(cell)
    assert text.count("的") == 2 and text.count("它") == 1
    assert "```" not in text and "$" not in text and "#" not in text
    assert figures("xx", text).longest == len("正文的一句")


def test_a_table_is_prose_cell_by_cell():
    text = prose("| 列一 | 说明 |\n|---|:---:|\n| `a` | 它的一个很长的说明 |\n")
    assert text.count("的") == 2 and text.count("它") == 1 and "|" not in text and "-" not in text
    assert figures("xx", text).longest == len("它的一个很长的说明")


def test_a_printed_text_counts_its_placeholders_and_formulas_once():
    f = figures("xx", printed("已经接受了 {accepted} 个草稿 token；{rate:.0%} 的接受率"))
    assert (f.de, f.semicolons) == (1, 1) and "accepted" not in printed("{accepted}")
    assert printed("旋转：(x_i, x_j) → (x_i·cos − x_j·sin)。") == "旋转：□。"


def test_a_count_may_reach_its_share_rounded_up():
    assert figures("xx", "的" + "字" * 22).problems() == []  # 1 的 in 23 Han: 43 per 1,000
    assert figures("xx", "的的的" + "字" * 20).problems() != []  # 3: over ceil(45 × 23 / 1000)
    text = "它；" + "。".join(["字" * 50] * 6)
    assert figures("xx", text).problems() == []  # one 它 and one ； in 302 Han
    assert len(figures("xx", "它它；；；" + text[2:]).problems()) == 2


def _chapters() -> list:
    return [pytest.param(p, id=p.stem) for p in NOTEBOOKS]


@pytest.mark.parametrize("path", _chapters())
def test_the_chinese_reads_plainly(path):
    problems = chapter_figures(path).problems()
    assert not problems, f"{path.stem}:\n  " + "\n  ".join(problems)


@pytest.mark.parametrize("name", sorted(catalogs()))
def test_the_printed_chinese_reads_plainly(name):
    problems = catalog_figures(name, catalogs()[name]).problems()
    assert not problems, f"{name}:\n  " + "\n  ".join(problems)


def test_every_catalog_of_printed_text_is_measured():
    names = set(catalogs())
    assert {"check/ch04", "check/core", "notebook-strings", "package-pairs", "glossary"} <= names
    assert any(n.startswith("figures/") for n in names) and any(
        n.startswith("widgets/") for n in names
    )


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_the_chinese_documents_read_plainly(doc):
    text = doc_prose(doc.read_text(encoding="utf-8"))
    f = figures(doc.name, text)
    problems = [p for p in f.problems() if not p.startswith("a sentence")]
    long = [s.strip() for s in SENTENCE_END.split(text) if len(s.strip()) > MAX_SENTENCE]
    problems += [f"a sentence of {len(s)} characters: {s}" for s in long]
    assert not problems, f"{doc.name}:\n  " + "\n  ".join(problems)


def test_the_document_measure_leaves_out_code_and_the_generated_tables():
    doc = (
        "运行 `python -m llmlab exercises --write docs/instructors.zh.md` 即可。\n"
        "报 *has no translation and a very long English message* 时补译文。\n"
        "```bash\nmake lab  # 的的的\n```\n"
        "<!-- exercises table: written by ... -->\n的它\n<!-- end of exercises table -->\n"
        "<!-- chapter times: written by ... -->\n| 的 | 它 |\n<!-- end of chapter times -->\n"
    )
    text = doc_prose(doc)
    assert text.count("□") == 2 and "的" not in text and "它" not in text
    assert figures("doc", text).longest == len("报 □ 时补译文")


EXERCISE = re.compile(r"\*\*练习 [^*\n]*\*\*")
EXERCISE_SHAPE = re.compile(r"\*\*练习 \d+(\.\d+)?(（[^）\n]+）)?。\*\*")
# an italic span holding a Chinese character, whatever stands before it: "把*块*" as much as " *块*"
ITALIC_CHINESE = re.compile(r"(?<!\*)\*(?![*\s])[^*\n]*[\u4e00-\u9fff][^*\n]*(?<![*\s])\*(?!\*)")


def italic_chinese(text: str) -> list[str]:
    """The italic spans of `text` that hold Chinese (bold, `**…**`, is not italic)."""
    plain = re.sub(r"\*\*[^*\n]+\*\*", lambda m: "B" * len(m.group()), text)
    return ITALIC_CHINESE.findall(plain)


def test_the_italic_lint_sees_an_italic_after_a_han_character():
    assert italic_chinese("用*草稿*模型") == ["*草稿*"]
    assert italic_chinese("一个 *块* 和**加粗**的字") == ["*块*"]
    assert italic_chinese("**练习 3（推理）。**算 2 * 3 * 4") == []
    assert italic_chinese("*has no translation*") == []


@pytest.mark.parametrize("path", _chapters())
def test_the_chinese_is_typeset_as_chinese(path):
    problems = []
    for cell_id, text in chinese_markdown(path):
        plain = INLINE_MATH.sub("", INLINE_CODE.sub("", FENCE.sub("", text)))
        plain = LINE_START.sub("", DISPLAY_MATH.sub("", plain))
        for heading in EXERCISE.findall(plain):
            if not EXERCISE_SHAPE.fullmatch(heading):
                problems.append(
                    f"{cell_id}: exercise heading {heading!r} (write 「**练习 3（推理）。**」)"
                )
        problems += [f"{cell_id}: italic Chinese {m!r}" for m in italic_chinese(plain)]
        problems += [f"{cell_id}: space before % in {m!r}" for m in re.findall(r"\S+ %", plain)]
        for line in plain.splitlines():
            if line.startswith("#") and HAN.search(line) and re.search(r"[,:;?!()]", line):
                problems.append(f"{cell_id}: half-width punctuation in heading {line!r}")
    assert not problems, f"{path.stem}:\n  " + "\n  ".join(problems)


@pytest.mark.parametrize("name", sorted(catalogs()))
def test_printed_chinese_has_no_literal_markup(name):
    """A hint is printed, not rendered: an asterisk or an underscore around a word stays on the
    screen; and no verdict is said twice (「通过：对：…」)."""
    problems = []
    for text in catalogs()[name]:
        # code is not markup: inline code, a placeholder, a power (2**30, 2 ** 20)
        plain = PLACEHOLDER.sub("", INLINE_CODE.sub("", text))
        plain = re.sub(r"[\w)\]]\s?\*\*\s?[\w(]", "", plain)
        if re.search(r"(?<![\w*])\*[^*\s\n][^*\n]*\*(?![\w*])|\*\*", plain):
            problems.append(f"markup: {text[:60]!r}")
        if re.match(r"\s*(对|不对|还不对|正确|答对了|通过|没通过|还没有作答)[：:，,。]", text):
            problems.append(f"a verdict the checker already prints: {text[:60]!r}")
    assert not problems, f"{name}:\n  " + "\n  ".join(problems)


if __name__ == "__main__":
    store_dir = Path(sys.argv[1]).resolve() if len(sys.argv) > 1 else STORE
    notebooks = sorted((store_dir.parent.parent / "notebooks").glob("*.ipynb"))
    print(HEADER)
    for path in notebooks:
        print(chapter_figures(path, store_dir).row())
    for name, texts in catalogs().items():
        print(catalog_figures(name, texts).row())
    for doc in DOCS:
        print(figures(doc.name, doc_prose(doc.read_text(encoding="utf-8"))).row())
    seed = sorted((ROOT.parent / "shared" / "seed").glob("*.txt"))
    if seed:
        text = "".join(p.read_text(encoding="utf-8") for p in seed)
        print(figures("the source chapter", prose(text)).row())
