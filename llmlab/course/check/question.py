"""An exercise declared by what it expects: the three kinds of question every chapter asks.

A chapter states a question as a function that computes its answer, and one decorator turns
that function into the checker the notebook calls:

    @numeric(rel=1e-3)
    def kv_bytes_per_token() -> Expected:
        \"\"\"Llama-3-70B, BF16: KV cache bytes of one token over the whole model.\"\"\"
        cfg = get_config(PRESET)
        return Expected(costs.kv_bytes_per_token(cfg, 2), mistakes=[...])

    check.ch04.kv_bytes_per_token(answer)   # -> CheckResult of "ch04.kv_bytes_per_token"

The exercise's id is the chapter of the module it is written in and the function's name, so it
is written once. Its texts come from the chapter's catalog by the same name where the function
gives none: "<name>.default_hint" and "<name>.formula" for a number, "<name>.success" for a
matching. The answer is computed when the learner checks, from the package's own functions, as
a hand-written checker does.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from llmlab.course.check.catalog import Catalog, catalog, placeholders
from llmlab.course.check.core import CheckResult, check_choice, check_matching, check_number

_CHAPTER = re.compile(r"\.(ch\d\d)(?:\.|$)")


@dataclass(frozen=True)
class Expected:
    """What a numeric question expects: `value`, the (value, hint) pairs of the mistakes its
    checker names, and, where the catalog's "<name>.default_hint" / "<name>.formula" will not
    do (a text with values filled in), the default hint and the formula."""

    value: float
    mistakes: Sequence[tuple[float, str]] = ()
    default_hint: str | None = None
    formula: str | None = None


def exercise_of(question: Callable) -> tuple[str, Catalog]:
    """("chNN.name", the chapter's catalog) for the question function `question`."""
    m = _CHAPTER.search(question.__module__)
    if m is None:
        raise ValueError(f"a question must live in a chapter's module, not {question.__module__}")
    return f"{m[1]}.{question.__name__}", catalog(m[1])


def _optional(texts: Catalog, key: str) -> str | None:
    """The catalog's text for `key` in the language in use, or None where it holds none or one
    with values to fill in (the question gives that one itself)."""
    if key not in texts.entries or placeholders(texts.entries[key]["en"]):
        return None
    return texts(key)


def _read(texts: Catalog, table: Mapping[str, str] | None) -> Mapping[str, str] | None:
    """A table of catalog keys read in the language in use (a `Texts` is read already)."""
    return None if table is None else texts.table(table)


def as_checker(question: Callable, check: Callable[[Any], CheckResult]) -> Callable:
    """`check` dressed as the question: its name, module and docstring (the notebook's `help`)."""
    for attr in ("__name__", "__qualname__", "__module__", "__doc__"):
        setattr(check, attr, getattr(question, attr))
    check.question = question
    return check


def numeric(rel: float = 0.01) -> Callable[[Callable[[], Expected]], Callable]:
    """A numeric question: the function returns an `Expected`; the answer passes within the
    relative tolerance `rel` (see `check_number`)."""

    def declare(question: Callable[[], Expected]) -> Callable:
        exercise, texts = exercise_of(question)
        name = question.__name__

        def check(answer: Any) -> CheckResult:
            want = question()
            return check_number(
                exercise,
                answer,
                want.value,
                rel=rel,
                mistakes=list(want.mistakes),
                default_hint=want.default_hint or _optional(texts, f"{name}.default_hint"),
                formula=want.formula or _optional(texts, f"{name}.formula"),
            )

        return as_checker(question, check)

    return declare


def choice(
    options: Mapping[str, str] | Sequence[str], hints: Mapping[str, str] | None = None
) -> Callable[[Callable[[], str | set[str]]], Callable]:
    """A multiple-choice question: the function returns the right option (or the set of them)
    among `options`; `hints` maps a wrong option to the catalog key of why it is wrong."""

    def declare(question: Callable[[], str | set[str]]) -> Callable:
        exercise, texts = exercise_of(question)

        def check(answer: Any) -> CheckResult:
            return check_choice(
                exercise, answer, question(), options=list(options), hints=_read(texts, hints)
            )

        return as_checker(question, check)

    return declare


def matching(
    choices: tuple[str, ...],
    hints: Mapping[str, str],
    why_wrong: Mapping[str, str] | None = None,
) -> Callable[[Callable[[], dict]], Callable]:
    """A matching question: the function returns {item: the right one of `choices`, or the set
    of defensible ones}; `hints` (per item) and `why_wrong` (per wrong choice) are catalog keys;
    a pass says the catalog's "<name>.success" where it has one (see `check_matching`)."""

    def declare(question: Callable[[], dict]) -> Callable:
        exercise, texts = exercise_of(question)
        success = f"{question.__name__}.success"

        def check(answer: Any) -> CheckResult:
            return check_matching(
                exercise,
                answer,
                question(),
                choices=choices,
                hints=_read(texts, hints),
                why_wrong=_read(texts, why_wrong),
                success=_optional(texts, success),
            )

        return as_checker(question, check)

    return declare
