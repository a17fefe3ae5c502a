"""Everything a student reads from the package comes in both languages: every text that reaches a
checker's verdict, a printed line, a widget label or a figure's title, axis or legend is a
`tr(en, zh)` pair (see llmlab.i18n), read from the source. A planted English-only hint is caught."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
STUDENT_FACING = sorted(
    [
        *(ROOT / "llmlab" / "course" / "check").rglob("*.py"),
        *(ROOT / "llmlab" / "course" / "widgets").glob("*.py"),
        *(ROOT / "llmlab" / "course" / "figures").glob("*.py"),
        *(
            ROOT / "llmlab" / "analysis" / name
            for name in (
                "roofline/model.py",
                "roofline/measure.py",
                "sim.py",
                "hardware.py",
                "kv_budget.py",
                "blocks.py",
                "distribution.py",
            )
        ),
    ]
)

# call name -> (positional indices, keyword names) whose text a student reads
SINKS = {
    "not_yet": ({1}, {"hint"}),
    "passed": ({1}, {"message"}),
    "staged": ({1, 2}, {"first", "then"}),
    "check_number": (set(), {"default_hint", "formula", "mistakes"}),
    "Expected": ({1, 2, 3}, {"mistakes", "default_hint", "formula"}),  # a question's answer
    "check_choice": (set(), {"hints"}),
    "check_callable": (set(), {"hint"}),
    "check_matching": (set(), {"hints", "why_wrong", "success"}),
    "print": ({0, 1, 2, 3}, set()),
    "set_title": ({0}, set()),
    "set_xlabel": ({0}, set()),
    "set_ylabel": ({0}, set()),
    "suptitle": ({0}, set()),
    "annotate": ({0}, set()),
    "text": ({2}, set()),
}
SINK_KEYWORDS = {"label", "description", "title", "xlabel", "ylabel"}
LOWER_WORD = re.compile(r"\b[a-z]{3,}\b")  # prose has a lowercase word of 3+ letters
IDENTIFIER = re.compile(r"^[\w.\-/%()]*$")  # "H100-SXM", "tokens/s", "GB": not prose


TAG = re.compile(r"^\s*\[\w+[^\]]*\]\s*$")  # "[predict {}]": a line's tag, as "[check ..."
CODE_WORDS = {"dtype"}


def _same_in_chinese() -> re.Pattern:
    """The glossary's terms that Chinese text keeps in English (KV cache, prefill, decode, ...)."""
    from llmlab.course.glossary import load_glossary

    kept = sorted(
        {e.primary_zh for e in load_glossary() if e.primary_zh.isascii()}, key=len, reverse=True
    )
    return re.compile("|".join(re.escape(k) for k in kept), re.IGNORECASE)


KEPT = _same_in_chinese()


def is_prose(text: str) -> bool:
    """Words a student reads as English: not a tag, a unit, a code name or a term Chinese keeps."""
    if TAG.match(text) or IDENTIFIER.match(text.strip()):
        return False
    words = LOWER_WORD.findall(KEPT.sub(" ", text))
    return any(w not in CODE_WORDS for w in words)


def _literal_text(node: ast.AST) -> str:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return " {} ".join(v.value for v in node.values if isinstance(v, ast.Constant))
    return ""


def _untranslated(node: ast.AST) -> list[ast.AST]:
    """String literals under `node` that are not inside a tr(...) call (dict keys are ids)."""
    if (
        isinstance(node, ast.Call)
        and getattr(node.func, "id", getattr(node.func, "attr", None)) == "tr"
    ):
        return []
    if isinstance(node, (ast.Constant, ast.JoinedStr)):
        return [node] if is_prose(_literal_text(node)) else []
    children = node.values if isinstance(node, ast.Dict) else list(ast.iter_child_nodes(node))
    if isinstance(node, ast.Call):
        # a call other than tr inside a sink: its arguments may be data (a format spec, a key)
        name = getattr(node.func, "id", getattr(node.func, "attr", ""))
        if name in {"join", "format", "get", "replace", "upper", "lower"}:
            children = [node.func]
    return [lit for c in children for lit in _untranslated(c)]


def untranslated_texts(source: str) -> list[tuple[int, str]]:
    """(line, text) of each English-only text that reaches a student in `source`."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        name = getattr(node.func, "id", getattr(node.func, "attr", None))
        positions, keywords = SINKS.get(name, (set(), set()))
        args = [a for i, a in enumerate(node.args) if i in positions]
        args += [k.value for k in node.keywords if k.arg in keywords | SINK_KEYWORDS]
        for arg in args:
            found += [(lit.lineno, _literal_text(lit)) for lit in _untranslated(arg)]
    return sorted(set(found))


@pytest.mark.parametrize("path", STUDENT_FACING, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_text_a_student_reads_has_its_chinese(path):
    bad = untranslated_texts(path.read_text(encoding="utf-8"))
    assert not bad, f"{path.relative_to(ROOT)}: English only, write tr(en, zh):\n" + "\n".join(
        f"  line {n}: {t[:90]!r}" for n, t in bad
    )


def test_a_planted_english_only_text_is_caught():
    planted = '''
def kv(answer):
    if answer is None:
        return not_yet(ex, tr("not answered yet.", "还没有作答。"))
    return not_yet(ex, staged(ex, "off by a factor of two: K and V?", tr("a", "甲")))

def plot(ax):
    ax.set_xlabel(f"context length ({unit})")
    ax.set_ylabel(tr("time per token", "每个 token 的时间"))
    ax.plot([1], [2], label="with cache")
    ax.set_title("GB")
'''
    assert [line for line, _ in untranslated_texts(planted)] == [5, 8, 10]
