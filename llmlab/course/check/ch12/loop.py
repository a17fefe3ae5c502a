"""Chapter 12's question 1: the steps of one generation step in order, each with what it does to
the KV cache, and where the next (decode) step starts."""

from __future__ import annotations

from typing import Any

from llmlab.course.check.catalog import catalog
from llmlab.course.check.core import (
    CheckResult,
    check_dict_keys,
    labelled,
    not_yet,
    passed,
    staged,
)

M = catalog("ch12")

# ---- question 1: the loop in order, each step with what it does to the KV cache ---------------
# The steps of one generation step in order (the names the exercise asks for).
LOOP_STEPS = (
    "tokenize",
    "embed",
    "qkv_projection",
    "attention",
    "ffn",
    "lm_head",
    "sample",
    "append",
)
# The step names to choose from (one of them belongs to no loop with a cache), in a fixed order
# that is not the loop's.
LOOP_STEP_CHOICES = M.choices(
    "loop_step",
    (
        "sample",
        "qkv_projection",
        "append",
        "recompute_past_kv",
        "lm_head",
        "tokenize",
        "ffn",
        "embed",
        "attention",
    ),
)
CACHE_MARKS = M.choices(
    "cache_mark",
    ("read", "none", "write_then_read", "write"),
)
# One prefill step: (step, what it does to the KV cache). Steps 3-5 run once per layer.
LOOP_WITH_CACHE = (
    ("tokenize", "none"),
    ("embed", "none"),
    ("qkv_projection", "none"),
    ("attention", "write_then_read"),
    ("ffn", "none"),
    ("lm_head", "none"),
    ("sample", "none"),
    ("append", "none"),
)
DECODE_STARTS_AT = "embed"

_MARK_HINTS = M.texts(
    "generation_loop_steps.mark",
    ("qkv_projection", "attention_read", "attention_write", "attention_none", "attention", "other"),
)
_DECODE_HINTS = M.texts(
    "generation_loop_steps.decode", ("tokenize", "qkv_projection", "attention", "append")
)


def _loop_pairs(steps: Any) -> list[tuple[str, str]] | None:
    """The answer's (step, mark) pairs, lower-cased and with marks as keys; None when they are
    not pairs of strings."""
    if not isinstance(steps, (list, tuple)) or not all(
        isinstance(p, (list, tuple)) and len(p) == 2 and all(isinstance(x, str) for x in p)
        for p in steps
    ):
        return None
    return [
        (a.strip().lower(), b.strip().lower().replace(" ", "_").replace(",", "")) for a, b in steps
    ]


def _mark_hint(step: str, given: str) -> str:
    """The hint of a step marked with the wrong effect on the KV cache."""
    if step == "qkv_projection":
        key = step
    elif step == "attention":
        key = f"attention_{given}" if f"attention_{given}" in _MARK_HINTS else step
    else:
        key = "other"
    return _MARK_HINTS[key]


def _loop_step_problem(ex: str, got: list[tuple[str, str]], i: int) -> str | None:
    """What is wrong with the answer's step `i` (it is missing, out of place, or wrongly
    marked), as a hint; None when it is LOOP_WITH_CACHE's."""
    want, mark = LOOP_WITH_CACHE[i]
    if i >= len(got):
        stops = (
            M("generation_loop_steps.stops_early", i=i, last=got[-1][0])
            if got
            else M("generation_loop_steps.empty")
        )
        return staged(ex, stops, M("generation_loop_steps.stops_then"))
    step, given = got[i]
    if step != want:
        later = [n for n, _ in LOOP_WITH_CACHE[i:]]
        why = (
            M("generation_loop_steps.too_early", step=step)
            if step in later
            else M("generation_loop_steps.twice_or_late", step=step)
        )
        return staged(
            ex,
            M("generation_loop_steps.out_of_place", n=i + 1, step=step, why=why),
            M("generation_loop_steps.out_of_place_then"),
        )
    if given != mark:
        hint = _mark_hint(step, given)
        return M("generation_loop_steps.wrong_mark", n=i + 1, step=step, hint=hint)
    return None


def _loop_problem(ex: str, got: list[tuple[str, str]]) -> str | None:
    """What is wrong with the answer's steps of the prefill, as a hint; None when right."""
    unknown = sorted({a for a, _ in got} - set(LOOP_STEP_CHOICES))
    bad_marks = sorted({b for _, b in got} - set(CACHE_MARKS))
    if unknown or bad_marks:
        return M(
            "generation_loop_steps.unknown_names",
            steps=list(LOOP_STEP_CHOICES),
            marks=list(CACHE_MARKS),
            got=unknown + bad_marks,
        )
    if "recompute_past_kv" in {a for a, _ in got}:
        return M("generation_loop_steps.recomputed")
    for i in range(len(LOOP_WITH_CACHE)):
        problem = _loop_step_problem(ex, got, i)
        if problem is not None:
            return problem
    if len(got) > len(LOOP_WITH_CACHE):
        return M("generation_loop_steps.too_long", last=LOOP_WITH_CACHE[-1][0])
    return None


def generation_loop_steps(answer: Any) -> CheckResult:
    """The source chapter's question 1 drawn: a dict with "prefill", the steps of one generation
    step in order, each a pair (step from LOOP_STEP_CHOICES, mark from CACHE_MARKS: what the step
    does to the KV cache), and "decode_starts_at", the step the next (decode) step starts from."""
    ex = "ch12.generation_loop_steps"
    missing = check_dict_keys(ex, answer, ("prefill", "decode_starts_at"))
    if missing is not None:
        return missing
    got = _loop_pairs(answer["prefill"])
    if got is None:
        return not_yet(ex, M("generation_loop_steps.not_pairs"))
    problem = _loop_problem(ex, got)
    if problem is not None:
        return not_yet(ex, problem)
    start = str(answer["decode_starts_at"]).strip().lower()
    if start != DECODE_STARTS_AT:
        if start in _DECODE_HINTS:
            hint = _DECODE_HINTS[start]
        else:
            hint = M("generation_loop_steps.unknown_start", steps=list(LOOP_STEP_CHOICES))
        return not_yet(ex, labelled("decode_starts_at", hint))
    return passed(ex, M("generation_loop_steps.success"))
