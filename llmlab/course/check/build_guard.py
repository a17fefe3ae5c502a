"""What the checkers of build exercises share: the opening of every check (an unanswered
exercise, the package's own piece handed in, an answer that is not the piece asked for), the run
of the student's piece through its driver (the two together: `run_build_answer`), a function
called in the notebook on case after case (`check_cases`), and the names a function's code
refers to."""

from __future__ import annotations

import re
import types
from typing import Any, Callable, Iterable

from llmlab.course.check.catalog import catalog
from llmlab.course.check.core import NOT_ANSWERED, CheckResult, not_yet, passed

M = catalog("core")


def code_names(code: types.CodeType) -> set[str]:
    """Every global, attribute and free-variable name a function's code (and the code nested in
    it: comprehensions, inner functions) refers to."""
    names = set(code.co_names) | set(code.co_freevars)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= code_names(const)
    return names


def refuse_package_piece(
    exercise: str, answer: Any, must_define: tuple[str, ...] = ()
) -> CheckResult | None:
    """The reported "not yet" when a build exercise's answer is the package's own function or
    class (what the student's piece is compared with, so it passes trivially) or a class that
    leaves one of `must_define` to the package's base class; None for the student's own piece.
    Works on the grader's stand-in too (a package function travels by reference, a class of the
    notebook by its source)."""
    spec = getattr(answer, "spec", None) if getattr(answer, "grader_stand_in", False) else None
    name = str(getattr(answer, "__name__", type(answer).__name__))
    if isinstance(spec, dict):
        own = "module" in spec and str(spec["module"]).split(".")[0] == "llmlab"
        source = str(spec.get("source", ""))
        missing = [m for m in must_define if not re.search(rf"\bdef {m}\(", source)]
    else:
        module = getattr(answer, "__module__", None)
        own = isinstance(module, str) and module.split(".")[0] == "llmlab"
        missing = (
            [m for m in must_define if m not in vars(answer)] if isinstance(answer, type) else []
        )
    if own:
        return not_yet(exercise, M("build.package_piece", name=name))
    if missing and "module" not in (spec or {}):
        return not_yet(exercise, M("build.must_define", name=name, missing=", ".join(missing)))
    return None


def refuse_build_answer(
    exercise: str,
    answer: Any,
    must_define: tuple[str, ...] = (),
    *,
    fits: Callable[[Any], bool] = callable,
    hint: str,
) -> CheckResult | None:
    """The reported "not yet" that opens every build exercise's check: for an unanswered one, for
    the package's own piece (`refuse_package_piece`), or for an answer that is not the kind of
    piece asked for (`fits(answer)` false; `hint` says what was expected). None for the student's
    own piece. The grader's stand-in always fits (it stands for the notebook's piece)."""
    if answer is None:
        return not_yet(exercise, NOT_ANSWERED)
    refused = refuse_package_piece(exercise, answer, must_define)
    if refused is not None:
        return refused
    if not getattr(answer, "grader_stand_in", False) and not fits(answer):
        return not_yet(exercise, hint)
    return None


def run_student_code(exercise: str, run: Callable[[], Any], *, raised: Callable[..., str]) -> Any:
    """What `run()` returns (the student's piece driven through its driver,
    `llmlab.course.build.drive`), or the reported "not yet" (a `CheckResult`) when the student's
    code raised: `raised(error_type=..., error=...)` is its hint. A TimeoutError is not the
    student's error: it goes on up (the grader's stand-in is dead after one, and the grader
    reports it)."""
    try:
        return run()
    except TimeoutError:
        raise
    except Exception as e:  # the student's code: report, never crash the notebook
        return not_yet(exercise, raised(error_type=type(e).__name__, error=e))


def run_build_answer(
    exercise: str,
    answer: Any,
    run: Callable[[], Any],
    *,
    hint: str,
    raised: Callable[..., str],
    fits: Callable[[Any], bool] = callable,
) -> Any:
    """What `run()` returns (the student's piece `answer` driven through its driver), or the
    reported "not yet" (a `CheckResult`): the refusal every build check opens with
    (`refuse_build_answer`, with `fits` and `hint`), or the student's code raised
    (`run_student_code`, with `raised`)."""
    refused = refuse_build_answer(exercise, answer, fits=fits, hint=hint)
    if refused is not None:
        return refused
    return run_student_code(exercise, run, raised=raised)


def check_cases(
    exercise: str,
    fn: Any,
    cases: Iterable,
    *,
    call: Callable[[Any, Any], Any],
    judge: Callable[[Any, Any], str | None],
    hint: str,
    raised: Callable[..., str],
    success: str,
) -> CheckResult:
    """The check of a function the student writes and runs in the notebook's own process, case
    after case: the opening refusal (`refuse_build_answer`; `hint` says a function was expected),
    then for each of `cases` the student's result `got = call(fn, case)` and `judge(case, got)`,
    the hint naming what is wrong with it (None when it is right). The first case the function
    gets wrong, or raises on (`raised(case, error_type=..., error=...)` is then the hint), is the
    "not yet"; every case right is a pass with `success`."""
    refused = refuse_build_answer(exercise, fn, hint=hint)
    if refused is not None:
        return refused
    for case in cases:
        try:
            got = call(fn, case)
        except Exception as e:  # the learner's code: report, never crash the notebook
            return not_yet(exercise, raised(case, error_type=type(e).__name__, error=e))
        problem = judge(case, got)
        if problem is not None:
            return not_yet(exercise, problem)
    return passed(exercise, success)
