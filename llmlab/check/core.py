"""What every self-check exercise shares: a verdict that is returned, and printed as one line.

A checker compares a learner's answer with the package's own computation and returns a
`CheckResult`; the grader reads that returned value (in a checker process of its own, see
`llmlab.instructor.recheck`), never the printed text. In the notebook the learner sees a line:

    [check ch04.kv_bytes_per_token] PASS: ...
    [check ch04.kv_bytes_per_token] NOT YET: <hint that never reveals the answer>

An answer of `None` (the student version's placeholder) is always "not yet", never a crash.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

PASS_WORD = "PASS"
FAIL_WORD = "NOT YET"
LINE_PREFIX = "[check "


@dataclass(frozen=True)
class CheckResult:
    exercise: str      # e.g. "ch04.kv_bytes_per_token"
    passed: bool
    message: str

    def line(self) -> str:
        word = PASS_WORD if self.passed else FAIL_WORD
        return f"{LINE_PREFIX}{self.exercise}] {word}: {self.message}"

    def __str__(self) -> str:
        return self.line()

    def __repr__(self) -> str:
        return self.line()

    def __bool__(self) -> bool:
        return self.passed

    def _ipython_display_(self) -> None:
        """`report()` already printed the line; showing the returned result again would repeat it."""


NOT_ANSWERED = "not answered yet: replace None with your answer and run the cell again."


def passed(exercise: str, message: str = "correct.") -> CheckResult:
    return CheckResult(exercise, True, message)


def not_yet(exercise: str, hint: str) -> CheckResult:
    return CheckResult(exercise, False, hint)


def report(result: CheckResult) -> CheckResult:
    """Print the result's line for the learner and hand the result back (the grader's verdict)."""
    print(result.line())
    return result


def as_number(value: Any) -> float | None:
    """A float from an int, float, numpy or 0-d torch value; None when it is not a number."""
    try:
        if hasattr(value, "item"):
            value = value.item()
        if isinstance(value, bool):
            return None
        x = float(value)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


def close(a: float, b: float, rel: float = 0.01) -> bool:
    return abs(a - b) <= rel * max(abs(b), 1e-300)


def check_number(exercise: str, answer: Any, expected: float, *, rel: float = 0.01,
                 mistakes: list[tuple[float, str]] = (),
                 default_hint: str = "not the value we expect; re-derive it step by step.",
                 ) -> CheckResult:
    """Compare a numeric answer with `expected` (relative tolerance `rel`).

    `mistakes` lists (value a typical mistake produces, hint naming that mistake); a matching
    wrong answer gets its hint. Hints never include `expected`.
    """
    if answer is None:
        return report(not_yet(exercise, NOT_ANSWERED))
    x = as_number(answer)
    if x is None:
        return report(not_yet(exercise, f"expected a number, got {type(answer).__name__}."))
    if close(x, expected, rel):
        return report(passed(exercise))
    for wrong, hint in mistakes:
        if close(x, wrong, rel):
            return report(not_yet(exercise, hint))
    if close(x, expected * 8, rel) or close(x, expected / 8, rel):
        return report(not_yet(exercise, "off by a factor of 8: bits vs bytes?"))
    for factor, unit in ((1e3, "k"), (1e6, "M"), (1e9, "G"), (2**10, "Ki"), (2**20, "Mi"), (2**30, "Gi")):
        if close(x * factor, expected, rel) or close(x, expected * factor, rel):
            return report(not_yet(exercise, f"off by a unit prefix ({unit}); give the value in the unit the question asks for."))
    return report(not_yet(exercise, default_hint))


def check_choice(exercise: str, answer: Any, correct: set[str] | str, *, options: list[str],
                 hints: dict[str, str] | None = None) -> CheckResult:
    """A multiple-choice answer (case-insensitive letter or option text)."""
    if answer is None:
        return report(not_yet(exercise, NOT_ANSWERED))
    correct = {correct} if isinstance(correct, str) else set(correct)
    got = {str(a).strip().lower() for a in (answer if isinstance(answer, (list, tuple, set)) else [answer])}
    unknown = got - {o.lower() for o in options}
    if unknown:
        return report(not_yet(exercise, f"choose from {options}; got {sorted(unknown)}."))
    if got == {c.lower() for c in correct}:
        return report(passed(exercise))
    for g in sorted(got):
        if hints and g in {k.lower() for k in hints} and g not in {c.lower() for c in correct}:
            hint = next(v for k, v in hints.items() if k.lower() == g)
            return report(not_yet(exercise, hint))
    return report(not_yet(exercise, "not the right choice; reread the section above the exercise."))


def check_callable(exercise: str, fn: Any, cases: list[tuple[tuple, Any]],
                   compare: Callable[[Any, Any], bool] | None = None,
                   hint: str = "your function returns a wrong value on at least one test case.") -> CheckResult:
    """Call the learner's function on `cases` [(args, expected)] and compare results."""
    if fn is None:
        return report(not_yet(exercise, NOT_ANSWERED))
    if not callable(fn):
        return report(not_yet(exercise, f"expected a function, got {type(fn).__name__}."))
    compare = compare or (lambda a, b: a == b)
    for args, expected in cases:
        try:
            got = fn(*args)
        except Exception as e:  # the learner's code: report, never crash the notebook
            return report(not_yet(exercise, f"your function raised {type(e).__name__}: {e}"))
        if not compare(got, expected):
            return report(not_yet(exercise, hint))
    return report(passed(exercise))


def check_dict_keys(exercise: str, answer: Any, keys) -> CheckResult | None:
    """The reported "not yet" for an unanswered or keyless dict answer, or None when `answer` is
    a dict with every one of `keys` (the checker then marks the values)."""
    if answer is None:
        return report(not_yet(exercise, NOT_ANSWERED))
    if not isinstance(answer, dict) or set(keys) - set(answer):
        return report(not_yet(exercise, f"answer a dict with the keys {list(keys)}."))
    return None


def check_matching(exercise: str, answer: Any, right: dict[str, str | frozenset[str]], *,
                   choices: tuple[str, ...], hints: dict[str, str], success: str = "correct.",
                   why_wrong: dict[str, str] | None = None) -> CheckResult:
    """A dict answer pairing each key of `right` with one of `choices`.

    `right[key]` is the one choice accepted, or a set of defensible ones. Every wrong pair gets
    its own hint: why that choice is wrong (`why_wrong`, keyed by choice) where given, else the
    key's hint (`hints`); choices are compared case-insensitively with spaces and dashes read as
    underscores.
    """
    missing = check_dict_keys(exercise, answer, right)
    if missing is not None:
        return missing
    problems = []
    for key, expected in right.items():
        value = str(answer[key]).strip().lower().replace("-", "_").replace(" ", "_")
        accepted = {expected} if isinstance(expected, str) else expected
        if value not in choices:
            problems.append(f"{key}: choose one of {list(choices)}.")
        elif value not in accepted:
            problems.append(f"{key}: {(why_wrong or {}).get(value, hints[key])}")
    if problems:
        return report(not_yet(exercise, " ".join(problems)))
    return report(passed(exercise, success))
