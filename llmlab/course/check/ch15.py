"""Self-checks for chapter 15 (structured output): a grammar's token mask written by the student
and compared, token for token, with xgrammar's for the same grammar; which token the mask of a
JSON schema forbids; what the mask costs a step; why vLLM's costs it almost nothing."""

from __future__ import annotations

import functools
from typing import Any

from llmlab.analysis.structured import AGE_REGEX
from llmlab.course.build import drive
from llmlab.course.check.build_guard import refuse_build_answer, run_student_code
from llmlab.course.check.catalog import catalog
from llmlab.course.check.core import (
    CheckResult,
    not_yet,
    passed,
    staged,
)
from llmlab.course.check.question import Expected, choice, numeric

M = catalog("ch15")
BUILDS = {"ch15.allowed_tokens": "allowed_tokens"}  # exercise -> the student's name
DRIVER = "llmlab.course.build.ch15:allowed_ids"

# the outputs so far at which the student's mask is compared with xgrammar's
STATES = ("", '{"', '{"age', '{"age": ', '{"age": 4', '{"age": 42', '{"age": 42}')


@functools.lru_cache(maxsize=1)
def _grammar() -> tuple[list[str], int, Any]:
    """(every token's text, the EOS id, a manager holding AGE_REGEX compiled by xgrammar)."""
    from llmlab.sampling.grammar import vocab_texts
    from llmlab.sampling.structured_output import StructuredOutputManager
    from llmlab.tokenizer import real_tokenizer

    tok = real_tokenizer()
    eos = tok.eos_token_id
    manager = StructuredOutputManager(tok, len(tok), frozenset([eos]))
    return vocab_texts(tok, len(tok)), eos, manager


def _matcher_at(text: str):
    """xgrammar's matcher for AGE_REGEX after `text`, or None when `text` cannot be a prefix."""
    from llmlab.sampling.structured_output import StructuredOutputsParams

    _, _, manager = _grammar()
    m = manager.matcher(StructuredOutputsParams(regex=AGE_REGEX))
    return m if (text == "" or m.accept_string(text)) else None


def reference_allowed(text: str) -> set[int]:
    """The token ids xgrammar allows after `text` under AGE_REGEX."""
    _, _, manager = _grammar()
    return set(manager.allowed(_matcher_at(text)).nonzero().flatten().tolist())


def allowed_tokens(answer: Any) -> CheckResult:
    """The student's allowed_tokens(generated, pieces, eos_id), called at each of STATES over
    the real vocabulary: it must allow exactly the tokens xgrammar allows for AGE_REGEX."""
    ex = "ch15.allowed_tokens"
    hint = M("allowed.not_a_function", got_type=type(answer).__name__)
    refused = refuse_build_answer(ex, answer, hint=hint)
    if refused is not None:
        return refused
    pieces, eos, _ = _grammar()
    raised = functools.partial(M, M.key("allowed.raised"))
    got = run_student_code(ex, lambda: drive(answer, DRIVER, (pieces, eos, STATES)), raised=raised)
    if isinstance(got, CheckResult):
        return got
    if got["bad"] is not None:
        return not_yet(ex, M(_BAD_RETURN[got["bad"]], **got))
    for text, ids in zip(STATES, got["allowed"]):
        problem = _problem(text, set(ids), pieces, eos)
        if problem is not None:
            return not_yet(ex, staged(ex, problem, M("allowed.rule")))
    return passed(ex, M("allowed.success", n=len(STATES), vocab=len(pieces)))


_BAD_RETURN = {
    "not_a_mask": M.key("allowed.not_a_mask"),
    "shape": M.key("allowed.shape"),
    "dtype": M.key("allowed.dtype"),
}


def _problem(text: str, mine: set[int], pieces: list[str], eos: int) -> str | None:
    """What differs between the student's allowed ids after `text` and xgrammar's, in words."""
    ref = reference_allowed(text)
    if mine == ref:
        return None
    extra, missing = sorted(mine - ref), sorted(ref - mine)
    if eos in extra:
        return M("allowed.eos_early", state=text)
    if eos in missing:
        return M("allowed.eos_never", state=text)
    if extra and ref == {eos}:
        return M("allowed.after_complete", state=text, piece=pieces[extra[0]])
    if missing:
        piece = pieces[missing[0]]
        return M("allowed.prefix_forbidden", state=text, piece=piece, grown=text + piece)
    # a token allowed that xgrammar forbids: name the likeliest slip
    longer = [t for t in extra if len(pieces[t]) > 1 and _matcher_at(text + pieces[t][0])]
    if longer:
        piece = pieces[longer[0]]
        return M("allowed.first_char_only", state=text, piece=piece, grown=text + piece)
    piece = pieces[extra[0]]
    if piece == "":
        return M("allowed.empty_piece", state=text, token=extra[0])
    if text.endswith(" ") and piece.startswith("}"):
        return M("allowed.no_digit", state=text, piece=piece)
    return M("allowed.cannot_grow", state=text, piece=piece, grown=text + piece)


# Exercise 2: the one token the mask of chapter 15's schema forbids after `{"name": "`
NEXT_STATE = '{"name": "'
NEXT_OPTIONS = {"a": "Alice", "b": "},", "c": '"}', "d": '",'}
_NEXT_HINTS = M.texts("next", ("a", "b", "d"))


@choice(NEXT_OPTIONS, _NEXT_HINTS)
def forbidden_next() -> str:
    """Under PERSON_SCHEMA (name and age required), the output so far is NEXT_STATE. Which one
    of NEXT_OPTIONS does the mask forbid?"""
    return "c"


# Exercise 3: the mask's share of a step when the fill and the forward take turns
FILL_MS_PER_REQUEST, BATCH, REST_MS = 0.05, 64, 60.0


@numeric(rel=0.01)
def mask_share() -> Expected:
    """Filling one request's bitmask takes FILL_MS_PER_REQUEST ms; a step of BATCH requests
    spends REST_MS ms on everything else. What share of the step is the fill (0 to 1)?"""
    fill = FILL_MS_PER_REQUEST * BATCH
    return Expected(
        fill / (fill + REST_MS),
        mistakes=[
            (FILL_MS_PER_REQUEST / (FILL_MS_PER_REQUEST + REST_MS), M("mask_share.one_request")),
            (fill / REST_MS, M("mask_share.over_the_rest")),
            (100 * fill / (fill + REST_MS), M("mask_share.percent")),
            (REST_MS / (fill + REST_MS), M("mask_share.upside_down")),
        ],
    )


# Exercise 4: why the mask costs vLLM's step almost nothing
HIDDEN_OPTIONS = M.texts("hidden_options", ("overlap", "gpu_fill", "cached_masks", "smaller_vocab"))
_HIDDEN_HINTS = M.texts("hidden_hints", ("gpu_fill", "cached_masks", "smaller_vocab"))


@choice(HIDDEN_OPTIONS, _HIDDEN_HINTS)
def why_vllm_hides_it() -> str:
    """On a GPU server the same bitmask fill adds almost nothing to vLLM's step. The main
    reason: one key of HIDDEN_OPTIONS."""
    return "overlap"


EXERCISES = M.exercises()  # kind, source question, mistakes: the catalog's "exercises"
