"""What every self-check exercise shares: a verdict that is returned, and printed as one line.

A checker compares a learner's answer with the package's own computation and returns a
`CheckResult`; the grader reads that returned value (in a checker process of its own, see
`llmlab.course.instructor.recheck`), never the printed text. In the notebook the learner sees a line:

    [check ch04.kv_bytes_per_token] PASS: ...
    [check ch04.kv_bytes_per_token] NOT YET: <hint that never reveals the answer>

An answer of `None` (the student version's placeholder) is always "not yet", never a crash.

The texts shown here and in the chapter checkers live in catalogs (`messages/core.json`,
`messages/chNN.json`; see `llmlab.course.check.catalog`); `sentences`, `labelled`, `clauses` and
`listed` join them as each language punctuates.
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping

from llmlab.course.check.catalog import catalog
from llmlab.i18n import tr

M = catalog("core")

PASS_WORD = "PASS"
FAIL_WORD = "NOT YET"
PASS_WORD_ZH = "通过"
FAIL_WORD_ZH = "还不对"
LINE_PREFIX = "[check "


@dataclass(frozen=True)
class CheckResult:
    exercise: str  # e.g. "ch04.kv_bytes_per_token"
    passed: bool
    message: str

    def line(self) -> str:
        word = tr(PASS_WORD, PASS_WORD_ZH) if self.passed else tr(FAIL_WORD, FAIL_WORD_ZH)
        return labelled(f"{LINE_PREFIX}{self.exercise}] {word}", self.message)

    def __str__(self) -> str:
        return self.line()

    def __repr__(self) -> str:
        return self.line()

    def __bool__(self) -> bool:
        return self.passed

    def _ipython_display_(self) -> None:
        """`passed`/`not_yet` already printed the line; showing the returned result again would repeat it."""


# What an unanswered exercise says. Checkers pass the English text to `not_yet`, which shows it in
# the language in use (and does not count it as a wrong try).
NOT_ANSWERED = M.template("not_answered")
NOT_ANSWERED_ZH = M.template("not_answered", "zh")


def sentences(*parts: str) -> str:
    """Sentences run on as the language in use writes them: a space between English ones,
    nothing after a Chinese full stop."""
    return tr(" ", "").join(parts)


def labelled(label: str, text: str) -> str:
    """`text` after `label` and a colon, a full-width one in Chinese ("key: text", "key：text")."""
    return f"{label}{tr(': ', '：')}{text}"


def clauses(parts: Iterable[str]) -> str:
    """Clauses of one sentence as the language in use separates them: "a; b" in English,
    "a；b" in Chinese."""
    return tr("; ", "；").join(parts)


def listed(parts: Iterable[str]) -> str:
    """Items of a list as the language in use separates them: "a, b" in English, "a、b" in
    Chinese."""
    return tr(", ", "、").join(parts)


# Wrong tries per exercise in this process: a hint comes in stages (the mistake first, the
# formula only from the second wrong try on); see `staged`.
_WRONG_TRIES: dict[str, int] = {}


def wrong_tries(exercise: str) -> int:
    """How many times `exercise` has answered "not yet" to a real answer in this process."""
    return _WRONG_TRIES.get(exercise, 0)


def carry_wrong_tries(counts: dict[str, int]) -> None:
    """Count the wrong tries of an earlier process too (`python -m llmlab check` starts a fresh
    process on every run and keeps its counts in a file beside the notebook): each exercise's
    count becomes the larger of the two, so its hints escalate as in a notebook's kernel."""
    for exercise, n in counts.items():
        _WRONG_TRIES[exercise] = max(_WRONG_TRIES.get(exercise, 0), n)


SOLUTIONS_DIR = "solutions"
_CHAPTER_EXERCISE = re.compile(r"ch(\d\d)\.\w+")
# The wrong try from which a hint's last stage (where the worked solution is) is shown: the first
# names the mistake, the second adds the way to the answer (`staged`), the third points to the
# worked solution.
SOLUTION_AFTER = 3


def solutions_notebook(exercise: str) -> str:
    """The path, relative to the chapter notebooks of an edition, of the notebook holding the
    worked solution of `exercise`: "ch04.kv_bytes_per_token" -> "solutions/04-solutions.ipynb"
    (named by the chapter's number only, so that no word of a chapter's title, which may be an
    answer, is in a hint)."""
    m = _CHAPTER_EXERCISE.fullmatch(exercise)
    if m is None:
        raise ValueError(f"exercise must look like 'chNN.name', got {exercise!r}")
    return f"{SOLUTIONS_DIR}/{m[1]}-solutions.ipynb"


def solution_pointer(exercise: str) -> str:
    """The last stage of every hint: where the worked solution of `exercise` is."""
    where, name = solutions_notebook(exercise), exercise
    return M("solution_pointer", where=where, name=name)


def staged(exercise: str, first: str, then: str) -> str:
    """A hint in two stages: `first` (names the mistake, no formula) on the first wrong try,
    `first` followed by `then` (the formula, never the answer) from the second wrong try on."""
    return first if wrong_tries(exercise) == 0 else sentences(first, then)


# The value a numeric exercise expects, appended as one JSON line to the file that the
# environment variable names (the notebook tests read it to find answers printed above the
# exercise that asks for them). Nothing is written when it is unset.
EXPECTED_LOG_ENV = "LLMLAB_EXPECTED_LOG"
_EXPECTED: dict[str, list[float]] = {}


def record_expected(exercise: str, value: Any) -> None:
    """Note that `exercise` expects the number `value` (check_number does it itself; a checker
    that compares numbers any other way calls it for each number it expects)."""
    x = as_number(value)
    if x is None:
        return
    seen = _EXPECTED.setdefault(exercise, [])
    if x in seen:
        return
    seen.append(x)
    path = os.environ.get(EXPECTED_LOG_ENV)
    if path:
        try:
            with open(path, "a", encoding="utf-8") as f:
                f.write(json.dumps({"exercise": exercise, "expected": x}) + "\n")
        except OSError:
            pass


def record_expected_word(
    exercise: str, word: str, case: Iterable[float] = (), others: Iterable[str] = ()
) -> None:
    """Note that `exercise` expects the word `word` (a choice such as "memory", against the
    `others` it may be confused with) for the case its question sets with the numbers `case`
    (batch 64, context 1024): a line above the exercise that shows the word beside every one of
    those numbers, and none of the others, answers it (see `llmlab.course.instructor.leaks`).
    Written to the same log as `record_expected`."""
    path = os.environ.get(EXPECTED_LOG_ENV)
    if path:
        record = {
            "exercise": exercise,
            "word": str(word),
            "case": [float(x) for x in case],
            "others": [str(o) for o in others],
        }
        try:
            with open(path, "a", encoding="utf-8") as f:
                f.write(json.dumps(record) + "\n")
        except OSError:
            pass


def expected_values(exercise: str) -> list[float]:
    """The numbers `exercise` has expected so far in this process (see `record_expected`)."""
    return list(_EXPECTED.get(exercise, ()))


# A verdict is made to be shown: no checker decides a verdict it does not show the learner at
# once, so `passed` and `not_yet` print the result's line themselves and return the result (the
# grader reads the returned value) instead of every checker wrapping each verdict in a print.


def _shown(result: CheckResult) -> CheckResult:
    """Print the result's line for the learner and hand the result back."""
    print(result.line())
    return result


def passed(exercise: str, message: str | None = None) -> CheckResult:
    """A pass, printed and returned; `message` defaults to "correct." in the language in use."""
    return _shown(CheckResult(exercise, True, M("correct") if message is None else message))


def not_yet(exercise: str, hint: str) -> CheckResult:
    """A "not yet" with `hint`, printed and returned; `NOT_ANSWERED` is shown in the language in
    use and is not counted as a wrong try. From the `SOLUTION_AFTER`-th wrong try on, the hint
    ends with its last stage: where the exercise's worked solution is (`solution_pointer`)."""
    if hint in (NOT_ANSWERED, NOT_ANSWERED_ZH):
        hint = M("not_answered")
    else:
        _WRONG_TRIES[exercise] = _WRONG_TRIES.get(exercise, 0) + 1
        if _WRONG_TRIES[exercise] >= SOLUTION_AFTER and _CHAPTER_EXERCISE.fullmatch(exercise):
            hint = sentences(hint, solution_pointer(exercise))
    return _shown(CheckResult(exercise, False, hint))


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


def check_number(
    exercise: str,
    answer: Any,
    expected: float,
    *,
    rel: float = 0.01,
    mistakes: list[tuple[float, str]] = (),
    default_hint: str | None = None,
    formula: str | None = None,
) -> CheckResult:
    """Compare a numeric answer with `expected` (relative tolerance `rel`).

    `mistakes` lists (value a typical mistake produces, hint naming that mistake); a matching
    wrong answer gets its hint. A wrong answer no mistake explains gets `default_hint`, and from
    the second wrong try on also `formula` (the way to the answer, never the answer itself).
    Hints never include `expected`. The default hint is in the language in use.
    """
    record_expected(exercise, expected)
    if answer is None:
        return not_yet(exercise, NOT_ANSWERED)
    x = as_number(answer)
    if x is None:
        return not_yet(exercise, M("check_number.not_a_number", got_type=type(answer).__name__))
    if close(x, expected, rel):
        return passed(exercise)
    for wrong, hint in mistakes:
        if close(x, wrong, rel):
            return not_yet(exercise, hint)
    if close(x, expected * 8, rel) or close(x, expected / 8, rel):
        return not_yet(exercise, M("check_number.bits_vs_bytes"))
    for factor, unit in (
        (1e3, "k"),
        (1e6, "M"),
        (1e9, "G"),
        (2**10, "Ki"),
        (2**20, "Mi"),
        (2**30, "Gi"),
    ):
        if close(x * factor, expected, rel) or close(x, expected * factor, rel):
            return not_yet(exercise, M("check_number.unit_prefix", unit=unit))
    if default_hint is None:
        default_hint = M("check_number.default_hint")
    hint = staged(exercise, default_hint, formula) if formula else default_hint
    return not_yet(exercise, hint)


def check_choice(
    exercise: str,
    answer: Any,
    correct: set[str] | str,
    *,
    options: list[str],
    hints: Mapping[str, str] | None = None,
) -> CheckResult:
    """A multiple-choice answer (case-insensitive letter or option text)."""
    if answer is None:
        return not_yet(exercise, NOT_ANSWERED)
    correct = {correct} if isinstance(correct, str) else set(correct)
    got = {
        str(a).strip().lower()
        for a in (answer if isinstance(answer, (list, tuple, set)) else [answer])
    }
    unknown = got - {o.lower() for o in options}
    if unknown:
        return not_yet(
            exercise,
            M("check_choice.unknown_option", options=options, got=sorted(unknown)),
        )
    if got == {c.lower() for c in correct}:
        return passed(exercise)
    for g in sorted(got):
        if hints and g in {k.lower() for k in hints} and g not in {c.lower() for c in correct}:
            hint = next(v for k, v in hints.items() if k.lower() == g)
            return not_yet(exercise, hint)
    return not_yet(exercise, M("check_choice.default_hint"))


def check_callable(
    exercise: str,
    fn: Any,
    cases: list[tuple[tuple, Any]],
    compare: Callable[[Any, Any], bool] | None = None,
    hint: str | None = None,
) -> CheckResult:
    """Call the learner's function on `cases` [(args, expected)] and compare results; a wrong
    result gets `hint` (by default a generic one, in the language in use)."""
    if fn is None:
        return not_yet(exercise, NOT_ANSWERED)
    if not callable(fn):
        return not_yet(exercise, M("check_callable.not_a_function", got_type=type(fn).__name__))
    compare = compare or (lambda a, b: a == b)
    for args, expected in cases:
        try:
            got = fn(*args)
        except Exception as e:  # the learner's code: report, never crash the notebook
            return not_yet(
                exercise, M("check_callable.raised", error_type=type(e).__name__, error=e)
            )
        if not compare(got, expected):
            if hint is None:
                hint = M("check_callable.default_hint")
            return not_yet(exercise, hint)
    return passed(exercise)


def check_dict_keys(exercise: str, answer: Any, keys) -> CheckResult | None:
    """The reported "not yet" for an unanswered or keyless dict answer, or None when `answer` is
    a dict with every one of `keys` (the checker then marks the values)."""
    if answer is None:
        return not_yet(exercise, NOT_ANSWERED)
    if not isinstance(answer, dict) or set(keys) - set(answer):
        return not_yet(exercise, M("check_dict_keys.missing_keys", keys=list(keys)))
    return None


def check_matching(
    exercise: str,
    answer: Any,
    right: dict[str, str | frozenset[str]],
    *,
    choices: tuple[str, ...],
    hints: Mapping[str, str],
    success: str | None = None,
    why_wrong: Mapping[str, str] | None = None,
) -> CheckResult:
    """A dict answer pairing each key of `right` with one of `choices`.

    `right[key]` is the one choice accepted, or a set of defensible ones. Every wrong pair gets
    its own hint: why that choice is wrong (`why_wrong`, keyed by choice) where given, else the
    key's hint (`hints`); choices are compared case-insensitively with spaces and dashes read as
    underscores. `success` (the message of a pass) defaults to "correct." in the language in use.
    """
    missing = check_dict_keys(exercise, answer, right)
    if missing is not None:
        return missing
    problems = []
    for key, expected in right.items():
        value = str(answer[key]).strip().lower().replace("-", "_").replace(" ", "_")
        accepted = {expected} if isinstance(expected, str) else expected
        if value not in choices:
            problems.append(M("check_matching.unknown_choice", key=key, choices=list(choices)))
        elif value not in accepted:
            why = (why_wrong or {}).get(value, hints[key])
            problems.append(labelled(key, why))
    if problems:
        return not_yet(exercise, sentences(*problems))
    return passed(exercise, success)
