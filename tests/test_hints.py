"""No hint gives the answer away: every string in a checker module (every hint it can show) is fed
back to that chapter's exercises as an answer, and every `backticked` snippet in it is evaluated
as code (with the checker module's names, math, numpy and torch at hand; a snippet with free
names becomes a function of them) and its value fed back: none may pass. Numeric exercises are
also answered wrong on purpose, twice over, and no hint they show may contain the expected
number in any form a student would read; the formula comes only from the second wrong try on."""

from __future__ import annotations

import ast
import contextlib
import importlib
import inspect
import io
import json
import math
import re
import string
from pathlib import Path

import pytest
from checker_modules import checker_files, checker_modules

from llmlab.course.check import core
from llmlab.course.instructor.leaks import number_forms

ROOT = Path(__file__).resolve().parent.parent
MODULES = sorted(p.stem for p in (ROOT / "llmlab" / "course" / "check").glob("ch[0-9][0-9]*"))
SNIPPET = re.compile(r"`([^`\n]+)`")
CALL = re.compile(r"[A-Za-z_][\w.]*\([^()]*\)")  # a call written in prose: mod.f(...)


HINT_ARGS = {  # call -> (positional indices, keyword names) that carry hint text
    "not_yet": ({1}, {"hint"}),
    "staged": ({1, 2}, {"first", "then"}),
    "check_number": (set(), {"default_hint", "formula", "mistakes"}),
    "Expected": ({1, 2, 3}, {"mistakes", "default_hint", "formula"}),  # a question's answer
    "check_choice": (set(), {"hints"}),
    "check_matching": (set(), {"hints", "why_wrong"}),
    "check_callable": (set(), {"hint"}),
}
HINT_NAME = re.compile(r"HINT|WHY|MISTAKE|FALLBACK", re.I)


def _texts(node) -> list[str]:
    return [
        n.value
        for n in ast.walk(node)
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and len(n.value.strip()) >= 3
    ]


def _literal_parts(template: str) -> list[str]:
    """The text of a catalog template between its placeholders ("{{" read as "{")."""
    parts = [""]
    for literal, field, _, _ in string.Formatter().parse(template):
        parts[-1] += literal
        if field is not None:
            parts.append("")
    return parts


def strings_of(module_name: str) -> list[str]:
    """The texts a checker module can show as hints: the hint arguments of its calls to the
    checking helpers (`not_yet`, `staged`, `check_number`'s default_hint/formula/mistakes, ...),
    and the values it assigns to names that say they are hints (`*HINT*`, `*WHY*`, `*MISTAKE*`);
    f-strings contribute their constant parts. A module that keeps its texts in a catalog
    (`llmlab.course.check.catalog`) contributes every text of it, in both languages, each
    template's parts between its placeholders."""
    tree = ast.Module(
        [
            node
            for path in checker_files(module_name)
            for node in ast.parse(path.read_text(encoding="utf-8")).body
        ],
        [],
    )
    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            f = node.func
            name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", None)
            if name in HINT_ARGS:
                positions, keywords = HINT_ARGS[name]
                for i, arg in enumerate(node.args):
                    if i in positions:
                        found += _texts(arg)
                for kw in node.keywords:
                    if kw.arg in keywords:
                        found += _texts(kw.value)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if (
                any(isinstance(t, ast.Name) and HINT_NAME.search(t.id) for t in targets)
                and node.value
            ):
                found += _texts(node.value)
        elif isinstance(node, ast.FunctionDef) and "hint" in node.name.lower():
            for sub in node.body:
                if isinstance(sub, ast.Return) and sub.value is not None:
                    found += _texts(sub.value)
    messages = ROOT / "llmlab" / "course" / "check" / "messages" / f"{module_name}.json"
    if messages.exists():
        for entry in json.loads(messages.read_text(encoding="utf-8"))["messages"].values():
            for text in (entry["en"], entry["zh"]):
                found += [p for p in _literal_parts(text) if len(p.strip()) >= 3]
    return sorted(set(found))


def one_answer_exercises(module):
    """(name, function) of the module's exercises that take a single answer."""
    out = []
    for name in getattr(module, "EXERCISES", {}):
        fn = getattr(module, name)
        params = [
            p
            for p in inspect.signature(fn).parameters.values()
            if p.default is inspect.Parameter.empty
            and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        ]
        if len(params) == 1:
            out.append((name, fn))
    return out


def quiet(fn, *args):
    with contextlib.redirect_stdout(io.StringIO()):
        try:
            return fn(*args)
        except Exception:  # a checker that refuses the value outright has not passed it
            return None


def namespace(module) -> dict:
    import numpy as np
    import torch
    import torch.nn.functional as F

    ns = {"math": math, "np": np, "numpy": np, "torch": torch, "F": F, "sqrt": math.sqrt}
    for part in checker_modules(module.__name__.rpartition(".")[2]):
        ns.update({k: v for k, v in vars(part).items() if not k.startswith("__")})
    return ns


def values_of_snippet(snippet: str, ns: dict) -> list:
    """What a snippet evaluates to: itself as an expression, or, when it uses names the
    namespace lacks, a function of those names (in order of first use)."""
    snippet = snippet.strip().rstrip(".").strip()
    rest = "..." in snippet  # `f(..., is_causal=True)`: the dots take any arguments
    if rest:
        snippet = snippet.replace("...", "*__rest")
    try:
        tree = ast.parse(snippet, mode="eval")
    except SyntaxError:
        return []
    free = []
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Name)
            and node.id not in ns
            and node.id not in dir(__builtins__)
            and node.id not in free
            and node.id != "__rest"
        ):
            free.append(node.id)
    params = free + (["*__rest"] if rest else [])
    src = snippet if not params else f"lambda {', '.join(params)}: ({snippet})"
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            return [eval(compile(src, "<hint>", "eval"), dict(ns))]  # noqa: S307 - our own hint text
    except Exception:
        return []


def giveaways(prefix: str, exercises, strings, ns) -> list[str]:
    """The (exercise <- hint) pairs where a string, or a snippet of it run as code, passes."""
    candidates = [(s, s) for s in strings]
    for s in strings:
        # the backticked snippets, the whole text, and each of its clauses, run as code
        pieces = (
            SNIPPET.findall(s)
            + [s]
            + [p for p in re.split(r"[;:]\s|,\s(?![^()]*\))", s) if p != s]
            + CALL.findall(s)
        )
        for snippet in pieces:
            candidates += [(f"`{snippet}`", v) for v in values_of_snippet(snippet, ns)]
    passing = []
    for name, fn in exercises:
        for label, value in candidates:
            result = quiet(fn, value)
            if result is not None and getattr(result, "passed", False):
                passing.append(f"{prefix}.{name} <- {label[:80]!r}")
    return passing


@pytest.mark.parametrize("module_name", MODULES)
def test_no_hint_passes_as_an_answer_or_as_code(module_name):
    module = importlib.import_module(f"llmlab.course.check.{module_name}")
    exercises = one_answer_exercises(module)
    if not exercises:
        pytest.skip(f"{module_name} describes no single-answer exercise")
    passing = giveaways(module_name, exercises, strings_of(module_name), namespace(module))
    assert not passing, "hints that pass as answers:\n" + "\n".join(passing)


WRONG_FACTORS = (1.37, 0.61, 2, 0.5, 8, 0.125, 1000, 1e-3, 4, 0.25, -1)


def test_hints_to_wrong_numbers_never_show_the_number():
    numeric = []
    for module_name in MODULES:
        module = importlib.import_module(f"llmlab.course.check.{module_name}")
        for name, fn in one_answer_exercises(module):
            ex = f"{module_name}.{name}"
            quiet(fn, None)
            expected = core.expected_values(ex)
            if expected and len(expected) == 1 and expected[0] != 0:
                numeric.append((name, fn, ex, expected[0]))
    assert len(numeric) >= 10, f"only {len(numeric)} single-number exercises found: {numeric}"
    shown = []
    for _name, fn, ex, x in numeric:
        forms = number_forms(x)
        for factor in WRONG_FACTORS:
            for _ in range(2):  # the second try shows the formula stage
                result = quiet(fn, x * factor)
                assert result is not None and not result.passed, f"{ex} passed {x * factor}"
                for form in forms:
                    if re.search(
                        r"(?<![\d.,])" + re.escape(form) + r"(?![\d]|[.,]\d)", result.message
                    ):
                        shown.append(
                            f"{ex}: hint for {x * factor:g} shows {form!r}: {result.message}"
                        )
                again = quiet(fn, result.message)
                assert again is None or not again.passed, (
                    f"{ex}: its own hint passes: {result.message}"
                )
    assert not shown, "\n".join(shown)


def test_formula_comes_only_from_the_second_wrong_try():
    ex = "test.staged_formula"
    first = core.check_number(ex, 7, 10, default_hint="not yet.", formula="multiply a by b.")
    second = core.check_number(ex, 7, 10, default_hint="not yet.", formula="multiply a by b.")
    assert "multiply" not in first.message and "multiply" in second.message
    none = core.check_number("test.staged_none", None, 10, formula="multiply a by b.")
    assert core.wrong_tries("test.staged_none") == 0 and "multiply" not in none.message


def test_planted_giveaway_hints_are_caught():
    """A hint that is the answer's expression, or the call that computes it, is reported."""

    def kv_bytes(answer):
        return core.check_number(
            "test.kv_bytes",
            answer,
            2 * 80 * 8 * 128 * 2,
            default_hint="multiply `2 * 80 * 8 * 128 * 2`.",
        )

    def scale(answer):
        return core.check_callable("test.scale", answer, [((3, 4), 12), ((2, 5), 10)])

    def fused(answer):
        return core.check_callable("test.fused", answer, [((3, 4), 12)])

    hints = [
        "multiply `2 * 80 * 8 * 128 * 2`.",
        "try `a * b`",
        "nothing to run here",
        "compare with operator.mul(...) here.",
    ]
    import operator

    found = giveaways(
        "test",
        [("kv_bytes", kv_bytes), ("scale", scale), ("fused", fused)],
        hints,
        {"math": math, "operator": operator},
    )
    assert any("kv_bytes" in f and "2 * 80" in f for f in found)
    assert any("scale" in f and "a * b" in f for f in found)
    assert any("fused" in f and "operator.mul" in f for f in found), found
    assert not any("nothing" in f for f in found)


# (checker, a wrong answer no listed mistake explains, a word of the formula its hint adds)
STAGED = [
    ("ch01.utf8_bytes", 99, "ASCII"),
    ("ch01.id_bits", 99, "2**n"),
    ("ch01.embedding_bytes", 99, "row"),
    ("ch10.tpot", 0.9, "(E2EL − TTFT) / (n − 1)"),
    ("ch10.mean_tpot", 0.9, "n ≥ 2"),
    ("ch10.ttlt", 0.9, "TTFT + (n − 1) · TPOT"),
    ("ch10.goodput", 0.9, "/ duration"),
]


@pytest.mark.parametrize("exercise, wrong, formula", STAGED, ids=[s[0] for s in STAGED])
def test_the_formula_comes_only_from_the_second_wrong_try(exercise, wrong, formula):
    chapter, name = exercise.split(".")
    checker = getattr(importlib.import_module(f"llmlab.course.check.{chapter}"), name)
    core._WRONG_TRIES.pop(exercise, None)
    first, second = quiet(checker, wrong), quiet(checker, wrong)
    assert not first.passed and formula not in first.message
    assert formula in second.message and second.message.startswith(first.message)
