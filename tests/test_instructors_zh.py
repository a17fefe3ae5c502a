"""docs/instructors.zh.md, the Chinese instructors' guide: its exercise table is what
`LLMLAB_LANG=zh python -m llmlab exercises --write docs/instructors.zh.md` writes (Chinese headers
and kind names), and the English table is untouched by the language."""

from __future__ import annotations

from pathlib import Path

from llmlab import i18n
from llmlab.course.instructor.table import BEGIN, END, markdown, rewrite

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "instructors.zh.md"


def test_chinese_instructors_table_is_current(monkeypatch):
    monkeypatch.setattr(i18n, "_chosen", "zh")
    assert DOC.read_text(encoding="utf-8") == rewrite(DOC, ROOT / "notebooks"), (
        "docs/instructors.zh.md is out of date: run "
        "`LLMLAB_LANG=zh python -m llmlab exercises --write docs/instructors.zh.md`"
    )


def test_chinese_table_has_chinese_headers_and_kinds(monkeypatch):
    monkeypatch.setattr(i18n, "_chosen", "zh")
    table = DOC.read_text(encoding="utf-8").split(BEGIN, 1)[1].split(END, 1)[0]
    assert "| 章节 | 练习数 | 记忆 | 代公式 | 推理 | 能指出的错误数 |" in table
    assert "| 章节 | 练习 | 类型 | 检查器能指出的错误 | 原章节问题 | 所在部分 |" in table
    rows = [line for line in table.splitlines() if line.startswith("| `")]
    kinds = {line.split(" | ")[2] for line in rows if line.count(" | ") == 5}
    assert kinds and kinds <= {"记忆", "代公式", "推理"}, kinds
    paths = {line.rstrip(" |").split(" | ")[-1] for line in rows if line.count(" | ") == 5}
    assert paths == {"必修", "延伸学习"}, paths


def test_english_table_does_not_change_with_the_language(monkeypatch):
    monkeypatch.setattr(i18n, "_chosen", "en")
    english = markdown(ROOT / "notebooks")
    assert english.startswith(
        "| chapter | exercises | recall | plug-in | reasoning | mistakes named |"
    )
    assert "| chapter | exercise | kind | mistakes its checker names | source question |" in english
    assert not any(k in english for k in ("记忆", "代公式", "推理", "章节"))
    doc = ROOT / "docs" / "instructors.md"
    assert doc.read_text(encoding="utf-8") == rewrite(doc, ROOT / "notebooks")
