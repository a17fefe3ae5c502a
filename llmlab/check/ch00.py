"""Chapter 00 self-checks: finding your way around the course."""
from __future__ import annotations

from llmlab.check.core import CheckResult, check_choice, check_number, not_yet, passed, report, NOT_ANSWERED

CHAPTERS = 13  # notebooks 00 … 12


def num_chapters(answer) -> CheckResult:
    """How many notebooks make up the series, counting this one?"""
    return check_number("ch00.num_chapters", answer, CHAPTERS,
                        mistakes=[(CHAPTERS - 1, "close: did you count chapter 00 itself?"),
                                  (11, "the seed's flowchart has 11 steps, but the series adds a setup chapter and a review chapter.")],
                        rel=0)


def module_for_paged_attention(answer) -> CheckResult:
    """Which llmlab module holds the paged-attention kernels (the `backend=` switch)?"""
    name = "ch00.module_for_paged_attention"
    if answer is None:
        return report(not_yet(name, NOT_ANSWERED))
    text = str(getattr(answer, "__name__", answer)).strip().lower()
    if text in ("llmlab.ops", "ops"):
        return report(passed(name))
    if "kvcache" in text:
        return report(not_yet(name, "kvcache decides *where* blocks go; the kernels that read them live elsewhere."))
    if "engine" in text:
        return report(not_yet(name, "the engine schedules and calls the model; look one level lower, at the ops the attention layer calls."))
    return report(not_yet(name, "look at the module table in the chapter map above."))


def fast_mode(answer) -> CheckResult:
    """What does LLMLAB_FAST=1 do? (a) skips figures, (b) shrinks workloads but keeps every figure and check, (c) uses a smaller model."""
    return check_choice("ch00.fast_mode", answer, "b", options=["a", "b", "c"],
                        hints={"a": "no: every figure is still drawn, headless runs included.",
                               "c": "no: the model is the same SmolLM2 in both modes."})
