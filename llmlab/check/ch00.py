"""Chapter 00 self-checks: finding your way around the course, and two predictions made before
any measurement (which phase of a request dominates; which chapter explains a symptom)."""
from __future__ import annotations

from typing import Any

from llmlab.check.core import (NOT_ANSWERED, CheckResult, ExerciseInfo, check_choice, check_matching,
                               check_number, not_yet, passed, report, staged)

CHAPTERS = 13  # notebooks 00 … 12

LETTERS = "abcdefgh"


def _lettered(options: tuple[tuple[str, bool], ...]) -> tuple[list[str], set[str]]:
    """The letters of `options` (shown in this order) and the letters of the right ones.

    The letters are computed from the order, so no answer is written out in this module."""
    letters = list(LETTERS[:len(options)])
    return letters, {letter for letter, (_, right) in zip(letters, options) if right}


def options_text(options: tuple[tuple[str, bool], ...]) -> str:
    """The options as the notebook lists them in markdown: "- (a) ..." one per line."""
    return "\n".join(f"- ({letter}) {text}" for letter, (text, _) in zip(LETTERS, options))


def num_chapters(answer) -> CheckResult:
    """How many notebooks make up the series, counting this one?"""
    return check_number("ch00.num_chapters", answer, CHAPTERS,
                        mistakes=[(CHAPTERS - 1, "close: did you count chapter 00 itself?"),
                                  (11, "the seed's flowchart has 11 steps, but the series adds a setup chapter and a review chapter.")],
                        default_hint="count the boxes of the map, then the chapter you are reading.",
                        rel=0)


def module_for_paged_attention(answer) -> CheckResult:
    """Which llmlab module holds the paged-attention kernels (the `backend=` switch)?"""
    import llmlab.ops as target

    name = "ch00.module_for_paged_attention"
    if answer is None:
        return report(not_yet(name, NOT_ANSWERED))
    text = str(getattr(answer, "__name__", answer)).strip().lower()
    if text in (target.__name__, target.__name__.rsplit(".", 1)[-1]):
        return report(passed(name))
    if "kvcache" in text:
        return report(not_yet(name, "kvcache decides *where* blocks go; the kernels that read them live elsewhere."))
    if "engine" in text:
        return report(not_yet(name, "the engine schedules and calls the model; look one level lower, at the ops the attention layer calls."))
    return report(not_yet(name, "that is not one of the three modules that back chapter 11 in the table above."))


# Shown in this order in the notebook; the right one is marked True.
FAST_MODE_OPTIONS = (
    ("skips the figures", False),
    ("shrinks workloads (fewer requests, shorter sweeps) but keeps every figure and check", True),
    ("switches to a smaller model", False),
    ("turns the self-checks off", False),
)


def fast_mode(answer) -> CheckResult:
    """What does LLMLAB_FAST=1 do? One letter of FAST_MODE_OPTIONS."""
    letters, right = _lettered(FAST_MODE_OPTIONS)
    return check_choice("ch00.fast_mode", answer, right, options=letters,
                        hints={letters[0]: "no: every figure is still drawn, headless runs included.",
                               letters[2]: "no: the model is the same SmolLM2 in both modes.",
                               letters[3]: "no: the tests run in fast mode precisely to run every check."})


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
    from llmlab import roofline
    from llmlab.config import get_config

    cfg = get_config(DOMINANT_MODEL)
    prefill = roofline.place(roofline.prefill_step(cfg, PROMPT_TOKENS), DOMINANT_GPU).time_floor
    decode = sum(roofline.decode_step_floor(cfg, DOMINANT_GPU, 1, PROMPT_TOKENS + i)
                 for i in range(REPLY_TOKENS))
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
        letters[0]: "you weighed the phases by their token counts. The prefill has more tokens, "
                    "but it handles all of them in one forward.",
        letters[2]: "the two phases are far apart: count how many forwards each phase runs, "
                    "and what each forward has to read.",
        letters[1]: "the other phase has far more arithmetic: count the FLOPs of each.",
    }
    then = ("Each forward reads every weight once from memory (16 GB here), however many tokens "
            "it carries; a forward takes about max(bytes read / bandwidth, FLOPs / peak).")
    if isinstance(answer, str) and answer.strip().lower() in right:
        return report(passed(ex, f"correct. The presets give at least {prefill * 1e3:.0f} ms for "
                                 f"the prefill and {decode * 1e3:.0f} ms for the decode steps; "
                                 f"chapters 05 and 07 derive why."))
    return check_choice(ex, answer, right, options=letters,
                        hints={k: staged(ex, v, then) for k, v in first.items()})


# Symptoms a reader of the seed meets in practice → the chapter whose idea explains it.
SYMPTOMS = {
    "first_word_late": "a user waits two seconds for the first word of the answer to a long "
                       "document, then the words stream quickly",
    "memory_runs_out": "the server runs out of GPU memory at 20 long conversations, although the "
                       "weights fill only half the card",
    "batch_is_free": "serving 32 users at once makes each user's stream only a little slower "
                     "than serving one",
    "needs_nvlink": "a model too big for one GPU is split layer by layer across 8 GPUs, and is "
                    "fast only when they are linked by NVLink",
    "chinese_costs_more": "the same question costs more in Chinese than in English at a price "
                          "per token",
}
CHAPTER_CHOICES = tuple(f"{n:02d}" for n in range(1, 13))
# Every defensible chapter for each symptom.
_SYMPTOM_CHAPTERS = {
    "first_word_late": frozenset({"05", "10"}),
    "memory_runs_out": frozenset({"04", "11"}),
    "batch_is_free": frozenset({"07", "08"}),
    "needs_nvlink": frozenset({"09"}),
    "chinese_costs_more": frozenset({"01"}),
}
_SYMPTOM_HINTS = {
    "first_word_late": "the first word and the later words come from two different phases of a "
                       "request; find the chapter that separates them.",
    "memory_runs_out": "the weights are not what grows with each conversation; find what does.",
    "batch_is_free": "ask what a decode step spends its time on, and whether 32 users make that "
                     "part 32 times longer.",
    "needs_nvlink": "splitting each layer across GPUs means they talk inside every layer: which "
                    "chapter counts that communication?",
    "chinese_costs_more": "a price per token depends on how many tokens a text becomes.",
}


def _chapter_label(value: Any) -> Any:
    """5, "5" and "05" all name chapter 05."""
    text = str(value).strip()
    return f"{int(text):02d}" if text.isdigit() else value


def symptom_to_chapter(answer: Any) -> CheckResult:
    """A dict: each key of SYMPTOMS → the chapter ("01" … "12") whose idea explains it."""
    if isinstance(answer, dict):
        answer = {k: _chapter_label(v) for k, v in answer.items()}
    return check_matching("ch00.symptom_to_chapter", answer, dict(_SYMPTOM_CHAPTERS),
                          choices=CHAPTER_CHOICES, hints=_SYMPTOM_HINTS,
                          success="correct: each of these symptoms has its own chapter.")


EXERCISES: dict[str, ExerciseInfo] = {
    "num_chapters": ExerciseInfo("recall", mistakes=("chapter 00 not counted",
                                                     "the seed's 11 steps taken for the chapters")),
    "module_for_paged_attention": ExerciseInfo("recall", mistakes=("kvcache (block placement) for the kernels",
                                                                   "engine (scheduling) for the kernels")),
    "fast_mode": ExerciseInfo("recall", mistakes=("figures skipped", "smaller model", "checks off")),
    "dominant_step": ExerciseInfo("reasoning", mistakes=("phases weighed by token count",
                                                         "weights read once per request, not per forward")),
    "symptom_to_chapter": ExerciseInfo("reasoning", mistakes=("TTFT taken for a decode problem",
                                                              "KV growth taken for weight size",
                                                              "batching cost taken as linear")),
}
