"""Chapter 00 self-checks: finding your way around the course, and two predictions made before
any measurement (which phase of a request dominates; which chapter explains a symptom)."""

from __future__ import annotations

from typing import Any

from llmlab.course.check.catalog import catalog
from llmlab.course.check.core import (
    NOT_ANSWERED,
    CheckResult,
    check_choice,
    check_matching,
    not_yet,
    passed,
    staged,
)
from llmlab.course.check.question import Expected, choice, matching, numeric

M = catalog("ch00")

CHAPTERS = 13  # notebooks 00 … 12, the source chapter's path (13 on: the Going further part)

LETTERS = "abcdefgh"


def _lettered(options: tuple[tuple[str, bool], ...]) -> tuple[list[str], set[str]]:
    """The letters of `options` (shown in this order) and the letters of the right ones.

    The letters are computed from the order, so no answer is written out in this module."""
    letters = list(LETTERS[: len(options)])
    return letters, {letter for letter, (_, right) in zip(letters, options) if right}


# ----------------------------------------------------------------------------- the series' question

# Exercise 00.1: the two goals of the series' question, and what pulls them apart.
GOALS_OPTIONS = (
    ("a GPU whose memory is faster", False),
    (
        "keeping the keys and values of earlier tokens instead of recomputing them (a KV cache)",
        False,
    ),
    ("putting more users' requests into each step of the model (batching)", True),
    ("a smaller model", False),
)


def throughput_vs_wait(answer: Any) -> CheckResult:
    """The series' question pits two goals against each other: as many users as possible at once,
    and each user's wait as short as possible. Which change serves the first and can hurt the
    second? One letter of GOALS_OPTIONS."""
    ex = "ch00.throughput_vs_wait"
    letters, right = _lettered(GOALS_OPTIONS)
    both = M("throughput_vs_wait.helps_both")
    then = M("throughput_vs_wait.then")
    hints = {
        letters[0]: staged(ex, both, then),
        letters[1]: staged(
            ex,
            M("throughput_vs_wait.kv_cache"),
            then,
        ),
        letters[3]: staged(
            ex,
            M("throughput_vs_wait.smaller_model"),
            then,
        ),
    }
    return check_choice(ex, answer, right, options=letters, hints=hints)


# Exercise 00.2: how the course treats a number, as the top of the chapter says.
NUMBER_KINDS = ("derive", "measure", "compute")
# how the course gets each number (the answer); the keys are what the student answers with
_NUMBER_KIND = {
    "head_size_of_hidden_4096_and_32_heads": "derive",
    "tokens_per_english_word": "measure",
    "decode_step_ms_70b_on_h100": "compute",
    "kv_bytes_per_token_llama3_70b": "derive",
    "ms_per_token_smollm2_here": "measure",
}
# each number (NUMBERS, the notebook prints it) and the hint for it, in the language in use
NUMBERS = M.texts("numbers", tuple(_NUMBER_KIND))
_NUMBER_HINTS = M.texts("number_kinds", tuple(_NUMBER_KIND))


@matching(NUMBER_KINDS, _NUMBER_HINTS)
def number_kinds() -> dict[str, str]:
    """For each number in NUMBERS, how the course gets it: "derive" (from a model's configuration),
    "measure" (on this machine) or "compute" (from published GPU specifications)."""
    return dict(_NUMBER_KIND)


# ----------------------------------------------------------------------------- predictions

# The request the prediction is about (the notebook prints these).
DOMINANT_MODEL, DOMINANT_GPU = "llama-3-8b", "H100-SXM"
PROMPT_TOKENS, REPLY_TOKENS = 1000, 200

DOMINANT_OPTIONS = (
    ("the prefill: one forward over the prompt tokens", False),
    ("the decode: one forward per reply token", True),
    ("about the same (within a factor of 2)", False),
)


def phase_floors() -> tuple[float, float]:
    """(prefill, all decode steps) least times in seconds on DOMINANT_GPU, from the presets."""
    from llmlab.analysis import roofline
    from llmlab.config import get_config

    cfg = get_config(DOMINANT_MODEL)
    prefill = roofline.place(roofline.prefill_step(cfg, PROMPT_TOKENS), DOMINANT_GPU).time_floor
    decode = sum(
        roofline.decode_step_floor(cfg, DOMINANT_GPU, 1, PROMPT_TOKENS + i)
        for i in range(REPLY_TOKENS)
    )
    return prefill, decode


def dominant_step(answer: Any) -> CheckResult:
    """One request alone on the GPU: PROMPT_TOKENS prompt tokens, REPLY_TOKENS reply tokens.
    Which phase takes longer in total? One letter of DOMINANT_OPTIONS."""
    ex = "ch00.dominant_step"
    letters, _ = _lettered(DOMINANT_OPTIONS)
    prefill, decode = phase_floors()
    if decode > 2 * prefill:
        right = {letters[1]}
    elif prefill > 2 * decode:
        right = {letters[0]}
    else:
        right = {letters[2]}
    first = {
        letters[0]: M("dominant_step.by_token_count"),
        letters[2]: M("dominant_step.far_apart"),
        letters[1]: M("dominant_step.count_flops"),
    }
    then = M("dominant_step.then")
    if isinstance(answer, str) and answer.strip().lower() in right:
        return passed(
            ex,
            M(
                "dominant_step.success",
                prefill_ms=prefill * 1e3,
                decode_ms=decode * 1e3,
            ),
        )
    return check_choice(
        ex, answer, right, options=letters, hints={k: staged(ex, v, then) for k, v in first.items()}
    )


# Symptoms a reader of the source chapter meets in practice → the chapter whose idea explains it.
CHAPTER_CHOICES = tuple(f"{n:02d}" for n in range(1, 13))
# Every defensible chapter for each symptom; the keys are what the student answers with.
_SYMPTOM_CHAPTERS = {
    "first_word_late": frozenset({"05", "10"}),
    "memory_runs_out": frozenset({"04", "11"}),
    "batch_is_free": frozenset({"07", "08"}),
    "needs_nvlink": frozenset({"09"}),
    "chinese_costs_more": frozenset({"01"}),
}
# each symptom (SYMPTOMS, the notebook prints it) and the hint for it, in the language in use
SYMPTOMS = M.texts("symptoms", tuple(_SYMPTOM_CHAPTERS))
_SYMPTOM_HINTS = M.texts("symptom_to_chapter", tuple(_SYMPTOM_CHAPTERS))


def _chapter_label(value: Any) -> Any:
    """5, "5" and "05" all name chapter 05."""
    text = str(value).strip()
    return f"{int(text):02d}" if text.isdigit() else value


def symptom_to_chapter(answer: Any) -> CheckResult:
    """A dict: each key of SYMPTOMS → the chapter ("01" … "12") whose idea explains it."""
    if isinstance(answer, dict):
        answer = {k: _chapter_label(v) for k, v in answer.items()}
    return check_matching(
        "ch00.symptom_to_chapter",
        answer,
        dict(_SYMPTOM_CHAPTERS),
        choices=CHAPTER_CHOICES,
        hints=_SYMPTOM_HINTS,
        success=M("symptom_to_chapter.success"),
    )


EXERCISES = M.exercises()  # kind, source question, mistakes: the catalog's "exercises"


# ----------------------------------------------------------------------------- the grader's fixtures

# Three checkers no chapter asks any more (the chapter count, a module's name, the fast mode: course
# trivia, not ideas). The grader's own tests keep using them: together they take a number, a letter
# and a module, the three shapes of answer a grader has to carry out of a kernel.


@numeric(rel=0)
def num_chapters() -> Expected:
    """How many notebooks make up the source chapter's path (00 … 12), counting this one?"""
    return Expected(
        CHAPTERS,
        mistakes=[
            (CHAPTERS - 1, M("num_chapters.chapter_00_forgotten")),
            (11, M("num_chapters.flowchart_steps")),
        ],
    )


def module_for_paged_attention(answer) -> CheckResult:
    """Which llmlab module holds the paged-attention kernels (the `backend=` switch)?"""
    import llmlab.ops as target

    name = "ch00.module_for_paged_attention"
    if answer is None:
        return not_yet(name, NOT_ANSWERED)
    text = str(getattr(answer, "__name__", answer)).strip().lower()
    if text in (target.__name__, target.__name__.rsplit(".", 1)[-1]):
        return passed(name)
    if "kvcache" in text:
        return not_yet(name, M("module_for_paged_attention.kvcache"))
    if "engine" in text:
        return not_yet(name, M("module_for_paged_attention.engine"))
    return not_yet(name, M("module_for_paged_attention.default_hint"))


# Shown in this order in the notebook; the right one is marked True.
FAST_MODE_OPTIONS = (
    ("skips the figures", False),
    ("shrinks workloads (fewer requests, shorter sweeps) but keeps every figure and check", True),
    ("switches to a smaller model", False),
    ("turns the self-checks off", False),
)


_FAST_MODE_LETTERS = _lettered(FAST_MODE_OPTIONS)[0]
_FAST_MODE_HINTS = {  # the catalog key of the hint per wrong option
    _FAST_MODE_LETTERS[0]: M.key("fast_mode.skips_figures"),
    _FAST_MODE_LETTERS[2]: M.key("fast_mode.smaller_model"),
    _FAST_MODE_LETTERS[3]: M.key("fast_mode.checks_off"),
}


@choice(_FAST_MODE_LETTERS, _FAST_MODE_HINTS)
def fast_mode() -> set[str]:
    """What does LLMLAB_FAST=1 do? One letter of FAST_MODE_OPTIONS."""
    return _lettered(FAST_MODE_OPTIONS)[1]
