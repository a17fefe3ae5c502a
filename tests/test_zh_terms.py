"""One term per concept beyond the notebooks, and widget labels quoted as the widgets show them.

1. The Chinese half of every bilingual pair in the package (`llmlab.course.lang.package_strings`:
   `tr(en, zh)`, ("English", "中文") tuples, {"English": "中文"} tables) uses the
   glossary's term, never a name the glossary says to avoid.
2. A widget label that a Chinese notebook cell quotes (in 「」 or “”) is written as the Chinese
   widget shows it: 「4. A 结束」, not “A finishes”; and no Chinese cell or Chinese package string
   names a control by its English label where the Chinese widget shows another
   (`arrivals / step` is 「每步到达数」 in Chinese).

The labels are read from the files, not by building the widgets: every entry of the widgets'
catalogs (llmlab/course/widgets/messages/), the plain `description=` texts of their modules (shown
as written in both languages), and the explorer's snapshot labels, which
llmlab/analysis/blocks.py writes.
"""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest

from llmlab.course import lang
from llmlab.course.glossary import SOURCE_QUOTE, load_glossary, not_synonyms, zh_synonym_uses

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "llmlab"
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
STORE = ROOT / "i18n" / "zh"
WIDGET_SOURCES = sorted((PACKAGE / "course" / "widgets").glob("*.py")) + [
    PACKAGE / "analysis" / "blocks.py"  # the block explorer's snapshot labels
]

# Pending: Chinese strings outside this area of the course that still use a name the glossary
# says to avoid, as (file, the name found). Their owners fix them; take an entry off when it is
# fixed, so the test is strict there too (a pending entry no longer found is printed).
PENDING_TERMS: set[tuple[str, str]] = set()
# Pending: English widget labels named in Chinese text where the Chinese widget shows another
# label, as (chapter store or file, the English label).
PENDING_LABELS: set[tuple[str, str]] = set()


def catalog_strings(folder: str = "*") -> list[lang.PackageString]:
    """The entries of the course's catalogs (llmlab/course/<folder>/messages/*.json: the
    checkers', the figures', the widgets'), as pairs."""
    found = []
    for path in sorted((PACKAGE / "course").glob(f"{folder}/messages/*.json")):
        entries = json.loads(path.read_text(encoding="utf-8"))["messages"]
        rel = str(path.relative_to(PACKAGE.parent))
        found += [lang.PackageString(rel, 0, e["zh"], e["en"]) for e in entries.values() if e["zh"]]
    return found


@pytest.fixture(scope="module")
def strings():
    """The package's pairs left in code, and the entries of the course's catalogs, which are
    pairs too: the same rules hold for both."""
    return lang.package_strings(PACKAGE) + catalog_strings()


def test_package_strings_are_found_by_reading_the_source():
    source = (
        'x = tr("model preset", "模型预设")\n'
        'y = tr(f"context {n}", f"上下文 {n}")\n'
        'HINTS = {"k": ("Off by 8.", "差了 8 倍。")}\n'
        'H = {"decode step": "decode step", "policy": "策略"}\n'
        'z = "只有中文，没有英文"\n'
    )
    found = {s.zh: s.en for s in lang.source_strings(source, "m.py")}
    assert found == {
        "模型预设": "model preset",
        "上下文 {n}": "context {n}",
        "差了 8 倍。": "Off by 8.",
        "策略": "policy",
    }


def test_every_widget_and_figure_module_s_words_are_in_the_lint(strings):
    files = {s.path for s in strings}
    for folder in ("widgets", "figures"):
        for path in sorted((PACKAGE / "course" / folder).glob("*.py")):
            if "M = catalog(" in path.read_text(encoding="utf-8"):
                assert f"llmlab/course/{folder}/messages/{path.stem}.json" in files, path.name


def test_the_lint_reads_english_names_as_whole_words():
    entries = load_glossary()
    assert [u.primary for u in zh_synonym_uses("用读权重 widget 设计设备。", entries)] == ["控件"]
    assert zh_synonym_uses("用读权重控件（widget）设计设备。", entries) == []
    assert zh_synonym_uses("见 `llmlab.course.widgets.kv` 与 ipywidgets。", entries) == []
    assert [u.found for u in zh_synonym_uses("把 hidden states 发给下一段。", entries)] == [
        "hidden states"
    ]
    assert [u.found for u in zh_synonym_uses("HBM（高带宽显存）", entries)] == ["高带宽显存"]
    assert zh_synonym_uses("早期 vLLM 可以把块换出到 CPU 内存。", entries) == []


def test_chinese_package_strings_use_the_glossary_terms(strings):
    entries, exceptions = load_glossary(), not_synonyms()
    found, pending = [], set()
    for s in strings:
        for u in zh_synonym_uses(s.zh, entries, exceptions):
            if (s.path, u.found) in PENDING_TERMS:
                pending.add((s.path, u.found))
            else:
                found.append(f"{s}: {u.found!r} -> write {u.primary!r}: …{u.context}…")
    for stale in sorted(PENDING_TERMS - pending):
        print(f"pending entry no longer found (take it off PENDING_TERMS): {stale}")
    assert not found, "\n".join(found)


# ---- widget labels ---------------------------------------------------------------------------

_NUMBERED = re.compile(r"^\d+\.\s*")
_PLACEHOLDER = re.compile(r"\{[^{}]*\}")


def _norm(label: str) -> str:
    """A label as compared: no step number ("4. A 结束" = "A 结束"), no spaces, lower case,
    and a placeholder stands for any text."""
    return re.sub(r"\s+", "", _NUMBERED.sub("", label.strip())).casefold()


def _matches(quote: str, label: str) -> bool:
    if "{" not in label:
        return _norm(quote) == _norm(label)
    parts = [re.escape(_norm(p)) for p in _PLACEHOLDER.split(label)]
    return re.fullmatch(".+?".join(parts), _norm(quote)) is not None


def widget_labels() -> tuple[list[str], dict[str, str]]:
    """(every label the Chinese widgets show, {English label: its Chinese} where they differ)."""
    zh, en_to_zh = [], {}
    pairs = catalog_strings("widgets")
    for path in WIDGET_SOURCES:
        rel = path.relative_to(ROOT).as_posix()
        source = path.read_text(encoding="utf-8")
        pairs += lang.source_strings(source, rel)
    for s in pairs:
        zh.append(s.zh)
        if s.en and _norm(s.en) != _norm(s.zh):
            en_to_zh[s.en] = s.zh
    for path in WIDGET_SOURCES:
        source = path.read_text(encoding="utf-8")
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.keyword) and node.arg == "description":
                if isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
                    zh.append(node.value.value)  # the same text in both languages
            elif _is_control_row(node):  # a row of `controls_of`'s table: (kind, label, ...)
                zh.append(node.elts[1].value)
    return zh, en_to_zh


def _is_control_row(node: ast.AST) -> bool:
    """A literal label in a widget table row `(kind, label, *limits)` ("IntSlider", "batch", ...)."""
    return (
        isinstance(node, ast.Tuple)
        and len(node.elts) >= 2
        and all(isinstance(e, ast.Constant) and isinstance(e.value, str) for e in node.elts[:2])
        and node.elts[0].value.endswith(("Slider", "Dropdown", "Checkbox", "Text"))
    )


QUOTE = re.compile(r"「([^」\n]{1,40})」|“([^”\n]{1,40})”")
# words right before a quote that say it names a control or a readout of a widget
CUE = re.compile(
    r"(标签|勾选|点击|按钮|滑块|下拉|复选框|图例|选项|标为|显示为|写着)[^。！？\n]{0,6}$"
)


def _chinese_cells():
    """(chapter, cell id, Chinese text without code, formulas and source-chapter quotes)."""
    for path in NOTEBOOKS:
        cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
        store = json.loads((STORE / f"{path.stem}.json").read_text(encoding="utf-8"))["cells"]
        for c in cells:
            text = str(store.get(c["id"], {}).get("text", ""))
            text = re.sub(r"```.*?```|`[^`\n]*`|\$\$.*?\$\$|\$[^$\n]+\$", "", text, flags=re.S)
            text = SOURCE_QUOTE.sub("", text)
            yield path.stem[:2], c["id"], text


def quoted_label_problems() -> list[tuple[str, str, str]]:
    """(chapter, the quote or English label, what is wrong) for every quoted widget label that
    the Chinese widget does not show, and every English label named where Chinese differs."""
    zh, en_to_zh = widget_labels()
    problems = []
    for chapter, cell, text in _chinese_cells():
        for m in QUOTE.finditer(text):
            quote = m.group(1) or m.group(2)
            if any(_matches(quote, label) for label in zh):
                continue
            english = next((en for en in en_to_zh if _matches(quote, en)), None)
            if english is not None:
                problems.append(
                    (
                        chapter,
                        english,
                        f"{cell}: quotes {quote!r}; the widget shows {en_to_zh[english]!r}",
                    )
                )
            elif CUE.search(text[max(0, m.start() - 16) : m.start()]):
                problems.append((chapter, quote, f"{cell}: quotes {quote!r}, no widget shows it"))
        for en, label in en_to_zh.items():
            if _named(en, text):
                problems.append(
                    (chapter, en, f"{cell}: names {en!r}; the Chinese widget shows {label!r}")
                )
    return problems


def _named(english: str, text: str) -> bool:
    """True when a multi-word English label ("max batch", "arrivals / step") stands in `text`
    outside a bracketed gloss."""
    if not re.search(r"[\s/]", english.strip()) or "{" in english:
        return False
    words = [re.escape(w) for w in re.split(r"\s*/\s*|\s+", _NUMBERED.sub("", english.strip()))]
    pattern = r"(?<![A-Za-z_.])" + r"\s*/?\s*".join(words) + r"(?![A-Za-z_])"
    plain = re.sub(r"[(（][^()（）\n]*[)）]", "", text)
    return re.search(pattern, plain, re.IGNORECASE) is not None


def test_the_label_set_holds_what_the_chinese_widgets_show():
    zh, en_to_zh = widget_labels()
    for label in ("每步到达数", "最大 batch", "4. A 结束", "把这个预设的 BF16 权重也放到 GPU 上"):
        assert label in zh, label
    assert "batch" in zh and "KV dtype" in zh  # shown as written in both languages
    assert en_to_zh["4. A finishes"] == "4. A 结束"
    assert _matches("A 结束", "4. A 结束") and not _matches("A finishes", "4. A 结束")
    assert _named("max batch", "把 max batch 一格一格调大")
    assert not _named("max batch", "把最大 batch（max batch）调大")


def test_chinese_cells_quote_widget_labels_as_the_chinese_widgets_show_them():
    found, pending = [], set()
    for chapter, label, what in quoted_label_problems():
        if (chapter, label) in PENDING_LABELS:
            pending.add((chapter, label))
        else:
            found.append(f"{chapter} {what}")
    for stale in sorted(k for k in PENDING_LABELS - pending if len(k[0]) == 2):
        print(f"pending entry no longer found (take it off PENDING_LABELS): {stale}")
    assert not found, "\n".join(found)


def test_chinese_package_strings_name_controls_by_their_chinese_labels(strings):
    _, en_to_zh = widget_labels()
    found, pending = [], set()
    for s in strings:
        for en, label in en_to_zh.items():
            if _named(en, s.zh):
                if (s.path, en) in PENDING_LABELS:
                    pending.add((s.path, en))
                else:
                    found.append(f"{s}: names {en!r}; the Chinese widget shows {label!r}")
    assert not found, "\n".join(found)


def test_terms_outside_the_glossary_are_linted_too():
    """The house terms (`data/glossary.json` "house_terms") hold Chinese to one name where the
    A–Z table has no entry: benchmark, draft token, engine core, greedy, scale factor."""
    from llmlab.course.glossary import house_terms, lint_terms

    names = {e.term: e.primary_zh for e in house_terms()}
    assert names == {
        "benchmark": "基准测试",
        "draft token": "草稿 token",
        "engine core": "引擎核心",
        "greedy": "贪心",
        "scale factor": "缩放因子",
    }
    terms = lint_terms()
    found = [u.primary for u in zh_synonym_uses("用 greedy 跑 benchmark，缩放系数取 2。", terms)]
    assert found == ["基准测试", "贪心", "缩放因子"]
    assert zh_synonym_uses("贪心解码（greedy）的基准测试", terms) == []


def test_the_aliases_readers_search_for_are_glosses_only():
    entries = load_glossary()
    assert [u.primary for u in zh_synonym_uses("推测解码很快。", entries)] == ["投机解码"]
    assert zh_synonym_uses("投机解码（推测解码）很快。", entries) == []
    found = [u.found for u in zh_synonym_uses("引导解码和约束解码", entries)]
    assert found == ["引导解码", "约束解码"]
    assert [u.primary for u in zh_synonym_uses("roofline 探索器", entries)] == ["控件"]


def test_the_chinese_glossary_lists_the_aliases_beside_the_term(monkeypatch):
    from llmlab import i18n
    from llmlab.course.glossary import glossary_markdown

    monkeypatch.setattr(i18n, "_chosen", "zh")
    table = glossary_markdown()
    assert "| 投机解码（亦作 推测解码） |" in table
    assert "| 结构化输出（亦作 引导解码、约束解码） |" in table
