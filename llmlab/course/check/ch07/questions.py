"""Chapter 07's questions: the ridge point, a decode GEMV's and attention's arithmetic intensity,
what bounds a decode step, the batch at which a step turns compute-bound on the explorer's
card, and why that crossover grows with the context."""

from __future__ import annotations

from typing import Any

from llmlab.analysis import roofline
from llmlab.analysis.hardware import PRESETS
from llmlab.config import get_config
from llmlab.course.check.catalog import catalog
from llmlab.course.check.ch01 import combine_mistakes
from llmlab.course.check.core import (
    CheckResult,
    as_number,
    check_choice,
    check_number,
    not_yet,
    record_expected,
    record_expected_word,
    staged,
)
from llmlab.course.check.question import Expected, choice, numeric

M = catalog("ch07")

GEMV_BATCH = 8  # decode_gemv_intensity: batch size
BOUND_BATCH = 64  # decode_bound: batch size of the Llama-3-70B decode step on H100 SXM
BOUND_CONTEXT = 1024
TASK_HARDWARE = "H100-SXM"  # compute_bound_batch: the roofline explorer's defaults
TASK_MODEL = "llama-3-70b"
TASK_CONTEXT = 1024

# why_crossover_grows: keys of the options (the notebook lists them in another order)
CROSSOVER_OPTIONS = (
    "ridge_moves",
    "attention_flops",
    "kv_bytes_per_sequence",
    "weights_per_sequence",
    "hbm_capacity",
)
# the hint per wrong option, in the language in use
CROSSOVER_WHY_WRONG = M.texts(
    "crossover_why_wrong",
    ("ridge_moves", "attention_flops", "weights_per_sequence", "hbm_capacity"),
)


@numeric(rel=0.02)
def ridge_point() -> Expected:
    """Ridge point of the H100-SXM preset (datasheet) in BF16, in FLOP/byte."""
    h = PRESETS["H100-SXM"]
    expected = roofline.ridge_point(h, "bf16")
    return Expected(
        expected,
        mistakes=combine_mistakes(
            (
                roofline.ridge_point(PRESETS["H100-SXM-source"], "bf16"),
                M("ridge_point.source_chapter_s"),
            ),
            (1 / expected, M("ridge_point.upside_down_ridge")),
            (roofline.ridge_point(h, "fp32"), M("ridge_point.fp32_peak_question")),
            (roofline.ridge_point(h, "fp8"), M("ridge_point.fp8_peak_question")),
            (2 * h.peak_flops["bf16"] / h.mem_bw, M("ridge_point.uses_sparsity_peak")),
        ),
    )


@numeric(rel=0.05)
def decode_gemv_intensity() -> Expected:
    """Arithmetic intensity (FLOP/byte) of a decode step's linear layers at batch GEMV_BATCH, BF16
    weights, counting only the weight bytes (a large model: activations are negligible)."""
    b = GEMV_BATCH
    return Expected(
        2 * b / 2,  # 2 FLOP per weight per token, 2 bytes per weight
        mistakes=combine_mistakes(
            (2 * b, M("decode_gemv_intensity.forgets_each_bf16")),
            (b / 2, M("decode_gemv_intensity.multiply_add_flop")),
            (1.0, M("decode_gemv_intensity.batch_batch_every")),
            (2 * b / 4, M("decode_gemv_intensity.uses_bytes_per")),
        ),
    )


@numeric(rel=0.02)
def attention_intensity() -> Expected:
    """Arithmetic intensity (FLOP/byte) of Llama-3-70B's decode attention (GQA, BF16 KV cache)."""
    cfg = get_config("llama-3-70b")
    op = roofline.decode_attention(cfg, batch=1, context=1024, dtype_bytes=2)
    expected = op.intensity
    group = cfg.num_attention_heads // cfg.num_key_value_heads
    return Expected(
        expected,
        mistakes=combine_mistakes(
            (expected / group, M("attention_intensity.plain_multi_head")),
            (expected * 2, M("attention_intensity.each_cached_number")),
            (expected / 2, M("attention_intensity.multiply_add_flop")),
            (
                expected * cfg.num_attention_heads / group,
                M("attention_intensity.count_query_heads"),
            ),
        ),
    )


def decode_bound(answer: Any) -> CheckResult:
    """Llama-3-70B, BF16, on the H100-SXM preset: is a decode step at batch BOUND_BATCH (context
    BOUND_CONTEXT) "memory"- or "compute"-bound?"""
    cfg = get_config("llama-3-70b")
    p = roofline.place(roofline.decode_step(cfg, BOUND_BATCH, BOUND_CONTEXT, 2), "H100-SXM", "bf16")
    wrong = "compute" if p.bound == "memory" else "memory"
    record_expected_word("ch07.decode_bound", p.bound, (BOUND_BATCH, BOUND_CONTEXT), [wrong])
    hint = staged(
        "ch07.decode_bound",
        M("decode_bound.compare_step_s"),
        M("decode_bound.weights_intensity_about"),
    )
    return check_choice(
        "ch07.decode_bound", answer, p.bound, options=["memory", "compute"], hints={wrong: hint}
    )


def _crossover(hardware: str = TASK_HARDWARE, context: int = TASK_CONTEXT) -> int | None:
    return roofline.crossover_batch(get_config(TASK_MODEL), hardware, context=context)


def compute_bound_batch(answer: Any) -> CheckResult:
    """The smallest batch at which a decode step of Llama-3-70B (BF16, TASK_CONTEXT tokens of
    context per sequence) on the H100-SXM preset is no longer memory-bound: the roofline
    explorer's task."""
    expected = _crossover()
    mistakes = combine_mistakes(
        (_crossover(context=1), M("compute_bound_batch.crossover_without_kv")),
        (roofline.ridge_point(TASK_HARDWARE), M("compute_bound_batch.ridge_point_intensity")),
        (_crossover("H100-SXM-source"), M("compute_bound_batch.source_chapter_s")),
        (_crossover("H200"), M("compute_bound_batch.h200_question_about")),
        (expected - 1, M("compute_bound_batch.batch_step_still")),
        (1024, M("compute_bound_batch.batch_slider_moves")),
    )
    record_expected("ch07.compute_bound_batch", expected)
    x = as_number(answer)
    if x is not None and expected < x < 1024 and x == int(x):
        return not_yet("ch07.compute_bound_batch", M("compute_bound_batch.batch_compute_bound"))
    return check_number(
        "ch07.compute_bound_batch",
        answer,
        expected,
        rel=0.1 / expected,
        mistakes=mistakes,
        default_hint=M("compute_bound_batch.default_hint"),
        formula=M("compute_bound_batch.formula"),
    )


@choice(CROSSOVER_OPTIONS, CROSSOVER_WHY_WRONG)
def why_crossover_grows() -> str:
    """Why does the batch at which decode turns compute-bound grow with the context, and at long
    contexts never come? One of CROSSOVER_OPTIONS."""
    return "kv_bytes_per_sequence"
