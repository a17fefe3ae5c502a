"""How chapter 02's checkers run a student's function: with every fused attention banned (by its
source, and at run time, in the notebook or in the grader's sandbox), on cases of fresh random
inputs beside the package's own code; and how a multi-select answer is graded. A piece
(`piece`) and a multi-select question (`selection`) are declared by the function that builds
what they expect, their texts read by its name as a question's are
(`llmlab.course.check.question`)."""

from __future__ import annotations

import contextlib
import inspect
import types
from typing import Any, Callable, Iterator, Mapping

import torch

from llmlab.course.check.build_guard import code_names
from llmlab.course.check.catalog import catalog
from llmlab.course.check.ch02.exercises import ATOL
from llmlab.course.check.core import (
    NOT_ANSWERED,
    CheckResult,
    labelled,
    not_yet,
    passed,
    staged,
)
from llmlab.course.check.question import as_checker, exercise_of

M = catalog("ch02")

# ---- no fused attention ------------------------------------------------------------------------

# Words that give a fused attention away in a function's source or in the names it uses.
_BANNED_WORDS = (
    "scaled_dot_product",
    "multiheadattention",
    "multi_head_attention",
    "flash",
    "llmlab",
)


class FusedAttentionError(RuntimeError):
    """Raised by a fused attention entry point while `fused_attention_banned` is on."""


def _banned_word(text: str) -> str | None:
    low = text.lower()
    return next((w for w in _BANNED_WORDS if w in low), None)


def _ban_targets() -> list[tuple[Any, str]]:
    """(object, attribute) of every fused attention entry point a student could reach."""
    import torch.nn.functional as F
    import torch.nn.modules.activation as activation

    from llmlab import model, ops
    from llmlab.ops import reference, torch_backend

    return [
        (F, "scaled_dot_product_attention"),
        (torch._C._nn, "scaled_dot_product_attention"),
        (F, "multi_head_attention_forward"),
        (torch.nn, "MultiheadAttention"),
        (activation, "MultiheadAttention"),
        (ops, "attention"),
        (ops, "paged_attention_prefill"),
        (ops, "paged_attention_decode"),
        (torch_backend, "attend"),
        (torch_backend, "grouped_attention"),
        (torch_backend, "paged_attention"),
        (reference, "reference_paged_attention_prefill"),
        (reference, "reference_paged_attention_decode"),
        (model, "attention_probs"),
    ]


@contextlib.contextmanager
def fused_attention_banned() -> Iterator[None]:
    """While inside, every fused attention entry point (PyTorch's scaled-dot-product and
    multi-head attention, llmlab's attention ops) raises FusedAttentionError."""
    saved = []
    for owner, name in _ban_targets():
        if hasattr(owner, name):

            def refuse(*args: Any, _name: str = name, **kwargs: Any) -> Any:
                raise FusedAttentionError(M("check_function.fused_refused", name=_name))

            saved.append((owner, name, getattr(owner, name)))
            setattr(owner, name, refuse)
    try:
        yield
    finally:
        for owner, name, original in reversed(saved):
            setattr(owner, name, original)


def _scan_function(fn: Any, seen: set[int]) -> str | None:
    """A banned name in a function of this process (its source, the functions and modules it
    uses, the helpers it calls), "no source" when its source cannot be read, or None."""
    if not isinstance(fn, types.FunctionType):
        name = f"{getattr(fn, '__module__', '') or ''}.{getattr(fn, '__qualname__', type(fn).__name__)}"
        return _banned_word(name) or "no source"
    try:
        source = inspect.getsource(fn)
    except (OSError, TypeError):
        return "no source"
    found = _banned_word(source)
    if found:
        return found
    scope = dict(fn.__globals__)
    for name, cell in zip(fn.__code__.co_freevars, fn.__closure__ or ()):
        with contextlib.suppress(ValueError):
            scope[name] = cell.cell_contents
    for name in sorted(code_names(fn.__code__)):
        value = scope.get(name)
        if isinstance(value, types.ModuleType):
            found = _banned_word(value.__name__)
        elif isinstance(value, types.FunctionType) and value.__module__ == fn.__module__:
            found = None if id(value) in seen else _scan_function(value, seen | {id(fn), id(value)})
            found = None if found == "no source" else found
        elif callable(value):
            found = _banned_word(
                f"{getattr(value, '__module__', '') or ''}.{getattr(value, '__qualname__', '')}"
            )
        else:
            found = None
        if found:
            return found
    return None


def _scan_spec(spec: dict, depth: int = 0) -> str | None:
    """The same scan over a function as the grader carries it (`llmlab.course.instructor.answers`)."""
    if "module" in spec:
        return _banned_word(f"{spec.get('module')}.{spec.get('qualname')}") or "no source"
    found = _banned_word(str(spec.get("source", "")))
    if found or depth > 8:
        return found
    for value in (spec.get("globals") or {}).values():
        if not (isinstance(value, dict) and len(value) == 1):
            continue
        ((tag, body),) = value.items()
        if tag == "__module__" and isinstance(body, str):
            found = _banned_word(body)
        elif tag == "__function__" and isinstance(body, dict) and "source" in body:
            found = _scan_spec(body, depth + 1)
        elif tag == "__function__" and isinstance(body, dict):
            found = _banned_word(f"{body.get('module')}.{body.get('qualname')}")
        if found:
            return found
    return None


def fused_call_in(fn: Any) -> str | None:
    """What gives a fused attention away in `fn` (a banned word, or "no source" when its source
    cannot be read), or None. Works on a function of this process and on the grader's stand-in
    for a student's function (which carries the function's source and globals)."""
    if getattr(type(fn), "grader_stand_in", False):  # the grader's SandboxedFunction
        return _scan_spec(fn.spec)
    return _scan_function(fn, set())


# In the grader's sandbox: the student's function, called with the ban on (built there from
# this source by `llmlab.course.instructor.answers.build_function`, with the student's function as
# `_llmlab_student`).
_GUARD_SOURCE = (
    "def _llmlab_guarded(*args, **kwargs):\n"
    "    from llmlab.course.check.ch02 import fused_attention_banned\n"
    "    with fused_attention_banned():\n"
    "        return _llmlab_student(*args, **kwargs)\n"
)


@contextlib.contextmanager
def _banned_runner(fn: Callable) -> Iterator[Callable]:
    """A callable that runs `fn` with every fused attention switched off, here or in the sandbox."""
    if getattr(type(fn), "grader_stand_in", False) and "source" in fn.spec:
        spec = {
            "name": "_llmlab_guarded",
            "source": _GUARD_SOURCE,
            "globals": {"_llmlab_student": {"__function__": fn.spec}},
        }
        guarded = type(fn)(spec, timeout_s=fn.timeout_s, env=fn.env)
        try:
            yield guarded
        finally:
            guarded.close()
        return

    def guarded(*args: Any, **kwargs: Any) -> Any:
        with fused_attention_banned():
            return fn(*args, **kwargs)

    yield guarded


@contextlib.contextmanager
def _plain_runner(fn: Callable) -> Iterator[Callable]:
    yield fn


# ---- running a student's function on cases ------------------------------------------------------


def _close(got: torch.Tensor, want: torch.Tensor) -> bool:
    # NaN where a slip makes NaN (a row that masks every key) matches: no reference has one
    return got.shape == want.shape and torch.allclose(
        got.float(), want.float(), atol=ATOL, rtol=1e-4, equal_nan=True
    )


def _check_function(
    ex: str,
    fn: Any,
    cases: list[tuple[tuple, torch.Tensor]],
    diagnose: Callable[[tuple, torch.Tensor], str | None],
    *,
    default: str,
    formula: str,
    signature: str,
    success: str,
    ban: bool = False,
) -> CheckResult:
    """Run `fn` on each case's arguments; PASS when every output is allclose to the case's
    expected tensor. A wrong output gets `diagnose`'s hint (a known slip) or `default`, then
    `formula` from the second wrong try on."""
    if fn is None:
        return not_yet(ex, NOT_ANSWERED)
    if not callable(fn):
        return not_yet(
            ex,
            M(
                "check_function.not_a_function",
                signature=signature,
                got_type=type(fn).__name__,
            ),
        )
    if ban:
        found = fused_call_in(fn)
        if found == "no source":
            return not_yet(ex, M("check_function.no_source"))
        if found:
            return not_yet(ex, M("check_function.fused_in_code", found=found))
    with (_banned_runner if ban else _plain_runner)(fn) as run:
        for args, want in cases:
            try:
                got = torch.as_tensor(
                    run(*(a.clone() if isinstance(a, torch.Tensor) else a for a in args))
                )
            except Exception as e:  # the learner's code: report, never crash the notebook
                if type(e).__name__ == "FusedAttentionError":
                    return not_yet(ex, M("check_function.fused_called"))
                return not_yet(ex, M("check_function.raised", error_type=type(e).__name__, error=e))
            if tuple(got.shape) != tuple(want.shape):
                shapes = ", ".join(str(list(a.shape)) for a in args if isinstance(a, torch.Tensor))
                return not_yet(
                    ex,
                    M(
                        "check_function.wrong_shape",
                        shapes=shapes,
                        want_shape=list(want.shape),
                        got_shape=list(got.shape),
                    ),
                )
            if _close(got, want):
                continue
            hint = diagnose(args, got)
            return not_yet(ex, hint or staged(ex, default, formula))
    return passed(ex, success)


# What a piece's declaration builds: the cases [(arguments, the package's output)] and the
# diagnosis of a wrong output (the hint of the known slip it matches, or None).
Cases = tuple[list[tuple[tuple, torch.Tensor]], Callable[[tuple, torch.Tensor], str | None]]


def _named_texts(declared: Callable, names: tuple[str, ...]) -> tuple[str, Mapping[str, str]]:
    """("ch02.<name>", {n: the catalog's "<name>.<n>" in the language in use}) for the declared
    function `declared` (the texts its checker reads by its name, as a question's are)."""
    exercise, texts = exercise_of(declared)
    return exercise, texts.table({n: f"{declared.__name__}.{n}" for n in names})


def piece(signature: str, *, ban: bool = False) -> Callable[[Callable[[], Cases]], Callable]:
    """A piece of the layer the student writes, declared by the function that builds its cases
    and diagnosis: the checker "ch02.<name>" runs the student's `fn` (called as `signature`) on
    them (`_check_function`; `ban`: a fused attention is refused), its default hint, formula and
    success message the catalog's "<name>.default_hint", "<name>.formula", "<name>.success"."""

    def declare(build: Callable[[], Cases]) -> Callable:
        exercise, texts = _named_texts(build, ("default_hint", "formula", "success"))

        def check(fn: Any) -> CheckResult:
            cases, diagnose = build()
            return _check_function(
                exercise,
                fn,
                cases,
                diagnose,
                signature=signature,
                ban=ban,
                default=texts["default_hint"],
                formula=texts["formula"],
                success=texts["success"],
            )

        return as_checker(build, check)

    return declare


def _seeded(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# ---- choosing every right option -----------------------------------------------------------------


def _check_set(
    ex: str,
    answer: Any,
    options: tuple[str, ...],
    right: frozenset[str],
    why_wrong: Mapping[str, str],
    *,
    missing: str,
    success: str,
) -> CheckResult:
    """A multi-select answer (one option or a list of them), graded by content."""
    if answer is None:
        return not_yet(ex, NOT_ANSWERED)
    items = [answer] if isinstance(answer, str) else answer
    if not isinstance(items, (list, tuple, set, frozenset)) or not all(
        isinstance(a, str) for a in items
    ):
        return not_yet(ex, M("check_set.not_a_list", options=list(options)))
    norm = {" ".join(a.split()).lower(): a for a in items}
    known = {o.lower(): o for o in options}
    unknown = sorted(
        a for n, a in norm.items() if n.replace(" ", "") not in {k.replace(" ", "") for k in known}
    )
    if unknown:
        return not_yet(ex, M("check_set.unknown_option", options=list(options), unknown=unknown))
    chosen = {
        next(o for k, o in known.items() if k.replace(" ", "") == n.replace(" ", "")) for n in norm
    }
    wrong = sorted(chosen - right)
    if wrong:
        return not_yet(ex, labelled(wrong[0], why_wrong[wrong[0]]))
    if chosen != right:
        return not_yet(ex, missing)
    return passed(ex, success)


def selection(
    options: tuple[str, ...], why_wrong: Mapping[str, str]
) -> Callable[[Callable[[], frozenset[str]]], Callable]:
    """A multi-select question, declared by the function that returns the set of right options
    among `options`: the checker "ch02.<name>" grades the answer by content (`_check_set`), a
    wrong option with its hint in `why_wrong` (catalog keys), a right but incomplete answer with
    the catalog's "<name>.missing", a pass with "<name>.success"."""

    def declare(question: Callable[[], frozenset[str]]) -> Callable:
        exercise, texts = _named_texts(question, ("missing", "success"))
        why = M.table(why_wrong)

        def check(answer: Any) -> CheckResult:
            return _check_set(
                exercise,
                answer,
                options,
                question(),
                why,
                missing=texts["missing"],
                success=texts["success"],
            )

        return as_checker(question, check)

    return declare
