"""Self-checks of chapter 07 (roofline): the ridge point, the intensity of a batched decode
GEMV and of GQA decode attention, which roof a decode step sits under, the batch at which it
leaves the memory roof (the roofline explorer's task), and why context moves that batch."""
from __future__ import annotations

from typing import Any

from llmlab import roofline
from llmlab.check.ch01 import combine_mistakes
from llmlab.check.core import (CheckResult, ExerciseInfo, as_number, check_choice, check_number, not_yet,
                               record_expected, report, staged)
from llmlab.config import get_config
from llmlab.hardware import PRESETS

GEMV_BATCH = 8          # decode_gemv_intensity: batch size
BOUND_BATCH = 64        # decode_bound: batch size of the Llama-3-70B decode step on H100 SXM
BOUND_CONTEXT = 1024
TASK_HARDWARE = "H100-SXM"      # compute_bound_batch: the roofline explorer's defaults
TASK_MODEL = "llama-3-70b"
TASK_CONTEXT = 1024

# why_crossover_grows: keys of the options (the notebook lists them in another order)
CROSSOVER_OPTIONS = ("ridge_moves", "attention_flops", "kv_bytes_per_sequence", "weights_per_sequence",
                     "hbm_capacity")
CROSSOVER_WHY_WRONG = {
    "ridge_moves": "the ridge is peak FLOP/s over bandwidth: a property of the device, the same at any context.",
    "attention_flops": "more attention FLOPs would push the step towards compute, so the crossover would come "
                       "sooner, not later; look at what grows in the denominator of the intensity.",
    "weights_per_sequence": "the weights are read once per step whatever the batch: that is why batching helps.",
    "hbm_capacity": "true on one card, but the roofline knows nothing of capacity: its floor moved for a "
                    "reason in the bytes each step moves.",
}


def ridge_point(answer: Any) -> CheckResult:
    """Ridge point of the H100-SXM preset (datasheet) in BF16, in FLOP/byte."""
    h = PRESETS["H100-SXM"]
    expected = roofline.ridge_point(h, "bf16")
    return check_number("ch07.ridge_point", answer, expected, rel=0.02, mistakes=combine_mistakes(
        (roofline.ridge_point(PRESETS["H100-SXM-seed"], "bf16"),
         "that is the seed's round 1000 TFLOPS / 3 TB/s; use the datasheet preset H100-SXM."),
        (1 / expected, "upside down: the ridge is in FLOP per byte."),
        (roofline.ridge_point(h, "fp32"), "that is the FP32 peak; the question asks for BF16 (tensor cores)."),
        (roofline.ridge_point(h, "fp8"), "that is the FP8 peak; the question asks for BF16."),
        (2 * h.peak_flops["bf16"] / h.mem_bw, "that uses the 2:4-sparsity peak; the roofline uses the dense peak."),
    ), default_hint="the ridge is where the slanted roof meets the flat one; which two figures of "
                    "the preset set those roofs?",
        formula="Ridge = peak FLOP/s (bf16, dense) / memory bandwidth (bytes/s).")


def decode_gemv_intensity(answer: Any) -> CheckResult:
    """Arithmetic intensity (FLOP/byte) of a decode step's linear layers at batch GEMV_BATCH, BF16
    weights, counting only the weight bytes (a large model: activations are negligible)."""
    b = GEMV_BATCH
    expected = 2 * b / 2          # 2 FLOP per weight per token, 2 bytes per weight
    return check_number("ch07.decode_gemv_intensity", answer, expected, rel=0.05, mistakes=combine_mistakes(
        (2 * b, "that forgets that each BF16 weight is 2 bytes."),
        (b / 2, "a multiply-add is 2 FLOP per weight per token, not 1."),
        (1.0, "that is batch 1: with a batch every weight read from memory is used by every sequence."),
        (2 * b / 4, "that uses 4 bytes per weight (FP32); the weights are BF16."),
    ), default_hint="count per weight: how many FLOPs does one weight take part in across the batch, "
                    "and how many bytes does reading it once cost?",
        formula="FLOPs: 2 × weights × batch; bytes: weights × 2; divide.")


def attention_intensity(answer: Any) -> CheckResult:
    """Arithmetic intensity (FLOP/byte) of Llama-3-70B's decode attention (GQA, BF16 KV cache)."""
    cfg = get_config("llama-3-70b")
    op = roofline.decode_attention(cfg, batch=1, context=1024, dtype_bytes=2)
    expected = op.intensity
    group = cfg.num_attention_heads // cfg.num_key_value_heads
    return check_number("ch07.attention_intensity", answer, expected, rel=0.02, mistakes=combine_mistakes(
        (expected / group, "that is plain multi-head attention: with GQA each K/V head serves several query heads."),
        (expected * 2, "each cached number is 2 bytes (BF16)."),
        (expected / 2, "a multiply-add is 2 FLOP; count QKᵀ and the weighted sum of V both."),
        (expected * cfg.num_attention_heads / group, "count the query heads per K/V head, not all heads."),
    ), default_hint="count per cached token and per layer: the FLOPs every query head spends on it, "
                    "and the bytes of its K and V; layers and context cancel.",
        formula="FLOPs per cached token: 2·heads·head_dim (scores) + 2·heads·head_dim (values); "
                "bytes per cached token: 2·kv_heads·head_dim·2.")


def decode_bound(answer: Any) -> CheckResult:
    """Llama-3-70B, BF16, on the H100-SXM preset: is a decode step at batch BOUND_BATCH (context
    BOUND_CONTEXT) "memory"- or "compute"-bound?"""
    cfg = get_config("llama-3-70b")
    p = roofline.place(roofline.decode_step(cfg, BOUND_BATCH, BOUND_CONTEXT, 2), "H100-SXM", "bf16")
    wrong = "compute" if p.bound == "memory" else "memory"
    hint = staged("ch07.decode_bound",
                  "compare the step's intensity with the device's ridge point.",
                  "For the weights the intensity is about the batch (FLOP per byte), and the KV reads lower it.")
    return check_choice("ch07.decode_bound", answer, p.bound, options=["memory", "compute"],
                        hints={wrong: hint})


def _crossover(hardware: str = TASK_HARDWARE, context: int = TASK_CONTEXT) -> int | None:
    return roofline.crossover_batch(get_config(TASK_MODEL), hardware, context=context)


def compute_bound_batch(answer: Any) -> CheckResult:
    """The smallest batch at which a decode step of Llama-3-70B (BF16, TASK_CONTEXT tokens of
    context per sequence) on the H100-SXM preset is no longer memory-bound: the roofline
    explorer's task."""
    expected = _crossover()
    mistakes = combine_mistakes(
        (_crossover(context=1), "that is the crossover without a KV cache (context 1); each sequence here "
                                "reads its own cache of the given context."),
        (roofline.ridge_point(TASK_HARDWARE), "that is the ridge point, an intensity; the question asks for a "
                                              "batch, and with KV reads batch and intensity differ."),
        (_crossover("H100-SXM-seed"), "that is the seed's round H100; use the H100-SXM preset."),
        (_crossover("H200"), "that is H200; the question is about H100-SXM."),
        (expected - 1, "at that batch the step is still memory-bound; the question asks for the first batch that is not."),
        (1024, "the batch slider moves one by one: the crossover lies below that power of two."),
    )
    record_expected("ch07.compute_bound_batch", expected)
    x = as_number(answer)
    if x is not None and expected < x < 1024 and x == int(x):
        return report(not_yet("ch07.compute_bound_batch", "that batch is compute-bound, but a smaller one already "
                                                          "is: move the slider down one step at a time."))
    return check_number("ch07.compute_bound_batch", answer, expected, rel=0.1 / expected, mistakes=mistakes,
                        default_hint="move the batch slider (context at its default) and watch the word "
                                     "in brackets on the result's first line; find the batch where it changes.",
                        formula="It is the first batch whose step intensity (weights' and every sequence's KV "
                                "bytes counted) reaches the ridge point.")


def why_crossover_grows(answer: Any) -> CheckResult:
    """Why does the batch at which decode turns compute-bound grow with the context, and at long
    contexts never come? One of CROSSOVER_OPTIONS."""
    return check_choice("ch07.why_crossover_grows", answer, "kv_bytes_per_sequence",
                        options=list(CROSSOVER_OPTIONS), hints=CROSSOVER_WHY_WRONG)


EXERCISES: dict[str, ExerciseInfo] = {
    "ridge_point": ExerciseInfo("plug-in", ("seed preset", "upside down", "FP32 peak", "FP8 peak", "sparse peak")),
    "decode_gemv_intensity": ExerciseInfo("plug-in", ("BF16 bytes forgotten", "1 FLOP per multiply-add",
                                                      "batch 1", "FP32 bytes")),
    "attention_intensity": ExerciseInfo("reasoning", ("MHA instead of GQA", "bytes per number",
                                                      "half the FLOPs", "all heads")),
    "decode_bound": ExerciseInfo("reasoning", ("intensity vs ridge",)),
    "compute_bound_batch": ExerciseInfo("plug-in", ("no KV cache", "ridge instead of batch", "seed preset",
                                                    "H200", "last memory-bound batch", "power of two")),
    "why_crossover_grows": ExerciseInfo("reasoning", ("ridge moves", "attention FLOPs", "weights per sequence",
                                                      "HBM capacity")),
}
