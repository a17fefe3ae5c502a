"""The self-checks of chapters 00–05 (and the shared core and predictions) in Chinese: with
`set_language("zh")` every verdict and hint a student reads is Chinese, a wrong answer's hint
still never shows the expected number, the formula still waits for the second wrong try, and
English stays what it was. The pairs themselves (the `tr` pairs left in the code; the catalogs'
entries are checked in test_check_catalogs.py): both halves of an f-string pair use the same
placeholders, no pair is resolved at import time, and the Chinese uses the glossary's terms."""

from __future__ import annotations

import ast
import importlib
import inspect
import re
from pathlib import Path

import matplotlib
import pytest
from checker_modules import chapter_exercises, checker_files, checker_modules, quiet
from test_zh_terms import PENDING_TERMS

from llmlab import i18n
from llmlab.course.check import core, predict
from llmlab.course.check.catalog import catalog
from llmlab.course.glossary import zh_synonym_uses
from llmlab.course.instructor.leaks import number_forms
from llmlab.utils import width

ROOT = Path(__file__).resolve().parent.parent
CHAPTERS = [f"ch0{i}" for i in range(6)]
FILES = [p for m in ["core", "predict", *CHAPTERS] for p in checker_files(m)]
CJK = re.compile(r"[\u4e00-\u9fff]")


@pytest.fixture
def zh(monkeypatch):
    """Chinese for one test, with a fresh count of wrong tries; English again afterwards."""
    monkeypatch.setattr(core, "_WRONG_TRIES", {})
    with matplotlib.rc_context():
        i18n.set_language("zh")
        try:
            yield
        finally:
            i18n.set_language("en")


@pytest.fixture
def en(monkeypatch):
    monkeypatch.setattr(core, "_WRONG_TRIES", {})
    i18n.set_language("en")
    yield


def single_answer_exercises():
    out = []
    for name in CHAPTERS:
        for ex, fn in chapter_exercises(name):
            defaults = [p.default for p in inspect.signature(fn).parameters.values()]
            if defaults.count(inspect.Parameter.empty) == 1:
                out.append((ex, fn))
    return out


# ---------------------------------------------------------------------------- the pairs in the code


def _tr_calls(path: Path, tree: ast.AST | None = None) -> list[ast.Call]:
    tree = tree or ast.parse(path.read_text(encoding="utf-8"))
    return [
        n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "id", None) == "tr"
    ]


def _placeholders(node: ast.AST) -> list[str]:
    return sorted(ast.unparse(v.value) for v in ast.walk(node) if isinstance(v, ast.FormattedValue))


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_pair_has_the_same_placeholders_and_chinese_on_the_right(path):
    for call in _tr_calls(path):  # a module whose texts are all in its catalog has none
        if len(call.args) != 2:  # tr(*PAIR): the pair is checked where it is written
            continue
        en_arg, zh_arg = call.args
        assert _placeholders(en_arg) == _placeholders(zh_arg), ast.unparse(call)[:200]
        en_text = "".join(
            c.value
            for c in ast.walk(en_arg)
            if isinstance(c, ast.Constant) and isinstance(c.value, str)
        )
        zh_text = "".join(
            c.value
            for c in ast.walk(zh_arg)
            if isinstance(c, ast.Constant) and isinstance(c.value, str)
        )
        assert not CJK.search(en_text), ast.unparse(call)[:200]
        if len(en_text.strip()) > 3:  # separators (" ", ": ") need no Chinese characters
            assert CJK.search(zh_text), ast.unparse(call)[:200]


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_no_pair_is_resolved_at_import_time(path):
    """tr is called inside functions only: a module constant would be fixed before the
    student's first cell chooses the language."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    inside = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            inside |= {id(n) for n in ast.walk(node)}
    outside = [ast.unparse(c)[:80] for c in _tr_calls(path, tree) if id(c) not in inside]
    assert not outside, outside


@pytest.mark.parametrize("name", CHAPTERS)
def test_hint_dicts_hold_english_chinese_pairs(name):
    dicts = {
        k: (v, module)
        for module in checker_modules(name)
        for k, v in vars(module).items()
        if re.search(r"HINT|WHY|NO_CACHE", k) and isinstance(v, dict)
    }
    for dname, (d, module) in dicts.items():
        for key, pair in d.items():
            if isinstance(pair, str):  # a key of the chapter's catalog: its two texts
                assert pair in module.M.entries, (dname, key)
                pair = (module.M.template(pair), module.M.template(pair, "zh"))
            assert isinstance(pair, tuple) and len(pair) == 2, (dname, key)
            assert not CJK.search(pair[0]) and CJK.search(pair[1]), (dname, key)


def test_chinese_uses_the_glossary_terms():
    found = []
    for path in FILES:
        if (path.parent / "messages" / f"{path.stem}.json").exists():
            for key, entry in catalog(path.stem).entries.items():
                found += [f"{path.stem}.json {key}: {u}" for u in zh_synonym_uses(entry["zh"])]
                assert "内核" not in entry["zh"] and "对数几率" not in entry["zh"], key
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Constant)
                and isinstance(node.value, str)
                and CJK.search(node.value)
            ):
                found += [
                    f"{path.name}:{node.lineno}: {u}"
                    for u in zh_synonym_uses(node.value)
                    if (path.relative_to(ROOT).as_posix(), u.found) not in PENDING_TERMS
                ]
                assert "内核" not in node.value and "对数几率" not in node.value, node.value
    assert not found, "\n".join(found)


# ---------------------------------------------------------------------------- core in Chinese


def test_not_answered_is_chinese_and_not_a_wrong_try(zh):
    result = quiet(importlib.import_module("llmlab.course.check.ch00").num_chapters, None)
    assert result.message == core.NOT_ANSWERED_ZH and not result.passed
    assert core.wrong_tries("ch00.num_chapters") == 0
    assert result.line() == f"[check ch00.num_chapters] 还不对：{core.NOT_ANSWERED_ZH}"


def test_not_answered_stays_english_in_english(en):
    result = quiet(importlib.import_module("llmlab.course.check.ch00").num_chapters, None)
    assert result.message == core.NOT_ANSWERED
    assert result.line() == f"[check ch00.num_chapters] NOT YET: {core.NOT_ANSWERED}"


def test_core_messages_in_chinese(zh):
    not_a_number = quiet(core.check_number, "t.n", "x", 10).message
    assert CJK.search(not_a_number) and "str" in not_a_number
    assert "8 倍" in quiet(core.check_number, "t.n", 80, 10).message
    assert "单位前缀（k）" in quiet(core.check_number, "t.n", 10000, 10).message
    assert CJK.search(quiet(core.check_number, "t.n", 7, 10).message)
    assert quiet(core.check_number, "t.n", 10, 10).message == core.M.template("correct", "zh")
    assert "请从" in quiet(core.check_choice, "t.c", "z", "a", options=["a", "b"]).message
    assert CJK.search(quiet(core.check_choice, "t.c", "b", "a", options=["a", "b"]).message)
    assert (
        "抛出了 ZeroDivisionError"
        in quiet(core.check_callable, "t.f", lambda a: 1 / 0, [((1,), 1)]).message
    )
    assert CJK.search(quiet(core.check_callable, "t.f", lambda a: 2, [((1,), 1)]).message)
    assert "这里要一个函数" in quiet(core.check_callable, "t.f", 3, [((1,), 1)]).message
    assert "dict" in quiet(core.check_dict_keys, "t.d", 3, ["a"]).message
    for answer, message in (
        ({"a": "x", "b": "q"}, "b：请从 ['x', 'y'] 中选一个。"),
        ({"a": "x", "b": "x"}, core.M.template("correct", "zh")),
    ):
        right = {"a": "x", "b": "x"}
        hints = {"a": "甲。", "b": "乙。"}
        got = quiet(core.check_matching, "t.m", answer, right, choices=("x", "y"), hints=hints)
        assert got.message == message, answer


def test_staged_hint_in_chinese_waits_for_the_second_try(zh):
    first = quiet(core.check_number, "t.s", 7, 10, default_hint="不对。", formula="把 a 乘以 b。")
    second = quiet(core.check_number, "t.s", 7, 10, default_hint="不对。", formula="把 a 乘以 b。")
    assert first.message == "不对。" and second.message == "不对。把 a 乘以 b。"


def test_english_core_messages_unchanged(en):
    assert quiet(core.check_number, "t.n", 80, 10).message == "off by a factor of 8: bits vs bytes?"
    assert (
        quiet(core.check_number, "t.n", 7, 10).message
        == "not the value we expect; re-derive it step by step."
    )
    assert quiet(core.check_number, "t.n", 10, 10).message == "correct."
    assert (
        quiet(core.check_callable, "t.f", lambda a: 2, [((1,), 1)]).message
        == "your function returns a wrong value on at least one test case."
    )
    assert (
        quiet(
            core.check_matching,
            "t.m",
            {"a": "y"},
            {"a": "x"},
            choices=("x", "y"),
            hints={"a": "think again."},
        ).message
        == "a: think again."
    )


# ---------------------------------------------------------------------------- chapters in Chinese

WRONG_FACTORS = (1.37, 0.61, 2, 0.5, 8, 0.125, 1000, 1e-3, -1)


def test_wrong_numbers_get_chinese_hints_without_the_answer(zh):
    checked, shown, english = 0, [], []
    for ex, fn in single_answer_exercises():
        quiet(fn, None)
        expected = core.expected_values(ex)
        if len(expected) != 1 or expected[0] == 0:
            continue
        x, forms = expected[0], number_forms(expected[0])
        checked += 1
        for factor in WRONG_FACTORS:
            for _ in range(2):  # the second try shows the formula stage
                result = quiet(fn, x * factor)
                assert not result.passed, (ex, x * factor)
                if not CJK.search(result.message):
                    english.append(f"{ex} <- {x * factor:g}: {result.message}")
                for form in forms:
                    if re.search(
                        r"(?<![\d.,])" + re.escape(form) + r"(?![\d]|[.,]\d)", result.message
                    ):
                        shown.append(f"{ex} <- {x * factor:g} shows {form!r}: {result.message}")
                assert "还不对：" in result.line()
    assert checked >= 15, checked
    assert not english, "\n".join(english)
    assert not shown, "\n".join(shown)


def test_choice_matching_and_set_exercises_in_chinese(zh):
    from llmlab.course.check import ch00, ch01, ch02, ch05

    assert CJK.search(quiet(ch00.fast_mode, "a").message)
    assert "请从" in quiet(ch00.fast_mode, "z").message
    wrong = quiet(ch00.symptom_to_chapter, {k: "12" for k in ch00.SYMPTOMS})
    assert (
        "first_word_late：" in wrong.message
        and ch00.M.template("symptom_to_chapter.first_word_late", "zh") in wrong.message
    )
    right = {k: sorted(v)[0] for k, v in ch00._SYMPTOM_CHAPTERS.items()}
    success = ch00.M.template("symptom_to_chapter.success", "zh")
    assert quiet(ch00.symptom_to_chapter, right).message == success
    flipped = {k: "unchanged" for k in ch01._EFFECTS_RIGHT}
    hint = ch01.M.template("vocab_tradeoff.prompt_kv_bytes", "zh")
    assert hint in quiet(ch01.vocab_tradeoff, flipped).message
    miss = quiet(ch02.gqa_consequences, ["q_proj_weights_x3"])
    assert miss.message.startswith("q_proj_weights_x3：") and CJK.search(miss.message)
    assert CJK.search(quiet(ch02.rope_relative, ["s(8, 4)"]).message)
    assert ch05.M.template(ch05._NO_CACHE["ffn"], "zh") == quiet(ch05.cache_reads, "ffn").message
    assert CJK.search(quiet(ch05.cache_reads, "qkv_projection").message)
    assert CJK.search(quiet(ch05.short_prefill_bound, "compute").message)


def test_function_exercises_in_chinese(zh):
    from llmlab.course.check import ch01, ch02, ch03

    assert "这里要一个函数" in quiet(ch01.merge_function, 3).message
    assert "函数返回了 None" in quiet(ch01.merge_function, lambda ids, pair, new: None).message
    assert CJK.search(quiet(ch01.merge_function, lambda ids, pair, new: list(ids)).message)
    assert "抛出了" in quiet(ch03.top_p_function, lambda probs, p: 1 / 0).message
    assert CJK.search(quiet(ch02.rms_norm, lambda x, w, eps: x).message)
    assert CJK.search(quiet(ch02.attention, lambda q, k, v: v).message)


def test_english_chapter_hints_unchanged(en):
    from llmlab.course.check import ch00, ch01, ch05

    assert quiet(ch00.num_chapters, 12).message == "close: did you count chapter 00 itself?"
    assert quiet(ch01.id_bits, 15).message == (
        "rounded down: that many bits cannot count up to the vocabulary size; round up."
    )
    assert quiet(ch05.cache_reads, "ffn").message == (
        "the FFN (MLP) transforms each token on its own and never looks at other tokens."
    )
    assert (
        quiet(
            ch00.symptom_to_chapter, {k: sorted(v)[0] for k, v in ch00._SYMPTOM_CHAPTERS.items()}
        ).message
        == "correct: each of these symptoms has its own chapter."
    )


# ---------------------------------------------------------------------------- predictions in Chinese


def test_predictions_in_chinese(zh, capsys):
    high = predict.compare(40.0, 3.1, quantity="step", unit="ms", if_high="额外说明。")
    assert (
        high.verdict == "too high" and high.message == "高了大约 1.1 个数量级。额外说明。"
    )  # no space after a full stop in Chinese
    out = capsys.readouterr().out
    assert "你的预测" in out and "你测得" in out and "预测 / 测量" in out
    rows = [ln for ln in out.splitlines() if ln.startswith("  ") and ("ms" in ln or "x" in ln)]
    columns = {width(ln[: ln.rindex("  ")]) for ln in rows if "  " in ln.strip()}
    assert len(columns) == 1, out  # the values line up under CJK labels too
    assert (
        predict.compare(2.5, 3.0, quantity="r", baseline=1.0).message
        == "相差不到 3 倍：数量级和方向都对。"
    )
    assert "上升" in predict.compare(0.9, 3.0, quantity="r", baseline=1.0).message
    assert predict.compare(None, 3.0, quantity="q").message == predict.NO_PREDICTION_ZH
    assert "预测必须是一个数" in predict.compare("fast", 3.0, quantity="q").message
    choice = predict.compare_choice(
        "compute", "memory", quantity="b", options=("memory", "compute")
    )
    assert choice.verdict == "not as observed" and "测量结果是 'memory'" in choice.message


def test_predictions_stay_english(en, capsys):
    assert predict.compare(None, 3.0, quantity="q").message == predict.NO_PREDICTION
    assert (
        predict.compare(2.5, 3.0, quantity="r", baseline=1.0).message
        == "within a factor 3: right order of magnitude and direction."
    )
    out = capsys.readouterr().out
    assert "  you predicted             2.5" in out
