"""Self-checks of chapter 05 (prefill vs decode): which steps of a forward write and read the
KV cache (the seed's self-check question 1: both happen inside the attention step, as in
`llmlab.ops.attention` and vLLM's attention backends), FLOPs of a decode step, arithmetic
intensity at a batch, where a prefill turns compute-bound on another card, and which phase is
compute-bound."""
from __future__ import annotations

from typing import Any

from llmlab import costs, roofline
from llmlab.check.core import CheckResult, ExerciseInfo, check_choice, check_number
from llmlab.config import get_config

# the steps of one generation step, in order (the seed's self-check question 1)
STEPS = ["tokenize", "embed", "qkv_projection", "attention", "ffn", "lm_head", "sample"]
PRESET = "llama-3-70b"
DECODE_CONTEXT = 1                       # "a short context": the KV term is negligible
BATCH = 24                               # decode_intensity: FP8 weights (1 byte each) at this batch
WEIGHT_BYTES = 1
RIDGE_MODEL, RIDGE_GPU = "llama-3-8b", "H200"   # prefill_ridge_tokens: BF16 on an H200

_NO_CACHE = {
    "tokenize": "tokenizing turns text into ids before the model runs; no K or V exists yet.",
    "embed": "the embedding looks up one row per token; it works on each token alone.",
    "ffn": "the FFN (MLP) transforms each token on its own and never looks at other tokens.",
    "lm_head": "the lm_head maps the last hidden state to logits; it works on each token alone.",
    "sample": "sampling picks a token from the logits; the model's layers are done by then.",
}


def cache_writes(answer: Any) -> CheckResult:
    """Which step(s) of STEPS write new entries into the KV cache? A name or a list of names."""
    hints = dict(_NO_CACHE)
    hints["qkv_projection"] = ("the projections compute this token's k and v, but they only hand "
                               "them on: find the step that stores them and then reads them back "
                               "with all earlier ones (llmlab/model.py; vLLM does the same).")
    return check_choice("ch05.cache_writes", answer, {"attention"}, options=STEPS, hints=hints)


def cache_reads(answer: Any) -> CheckResult:
    """Which step(s) of STEPS read the KV cache? A name or a list of names."""
    hints = dict(_NO_CACHE)
    hints["qkv_projection"] = ("the projections compute this token's own q, k, v from its hidden "
                               "state; they need nothing from earlier tokens.")
    return check_choice("ch05.cache_reads", answer, {"attention"}, options=STEPS, hints=hints)


def decode_flops(answer: Any) -> CheckResult:
    """Llama-3-70B: FLOPs for one decode token at a short context (counting the lm_head)."""
    cfg = get_config(PRESET)
    expected = costs.flops_per_token(cfg, DECODE_CONTEXT, "decode")
    n = costs.param_count(cfg)
    return check_number("ch05.decode_flops", answer, expected, rel=0.03, mistakes=[
        (n, "that is the number of parameters: each weight costs one multiply and one add, 2 FLOPs."),
        (2 * n * 2, "that doubles it again: 2 FLOPs per weight, not 2 per byte."),
        (2 * n / 1e12, "that is a TFLOP figure; the question asks for FLOPs."),
    ], default_hint="not the FLOPs of one decode token; think about what one weight costs a token "
                    "passing through it.",
       formula="every weight a token meets costs one multiply-add (2 FLOPs); at a short context "
               "attention adds almost nothing.")


def decode_intensity(answer: Any) -> CheckResult:
    """Llama-3-70B with FP8 weights (WEIGHT_BYTES byte each), decode at batch BATCH, short context:
    FLOPs per byte read from memory (arithmetic intensity). Count the weights as the only bytes."""
    cfg = get_config(PRESET)
    flops = costs.decode_flops(cfg, BATCH, DECODE_CONTEXT)
    bytes_ = costs.weight_bytes(cfg, WEIGHT_BYTES)
    expected = flops / bytes_
    return check_number("ch05.decode_intensity", answer, expected, rel=0.05, mistakes=[
        (expected / BATCH, "that is batch 1: the weights are read once for the whole batch, but "
                           "every sequence in it does its own FLOPs."),
        (expected / 2, "that counts 2 bytes per weight (BF16); these weights are FP8, 1 byte each."),
        (bytes_ / flops, "upside down: intensity is FLOPs divided by bytes."),
        (expected * BATCH, "the bytes are read once per step, not once per sequence: do not "
                           "divide them by the batch again."),
        (expected / 2 / BATCH, "that is one multiply-add per 2 bytes at batch 1; count the whole "
                               "batch and 1 byte per FP8 weight."),
    ], default_hint="not the intensity of this step; count the step's FLOPs and the bytes it reads.",
       formula="FLOPs of the step (batch × 2 FLOPs per weight) ÷ bytes of the weights (1 per FP8 weight).")


def _prefill_ridge(gpu: str, model: str = RIDGE_MODEL) -> int:
    cfg = get_config(model)
    return next(n for n in range(1, 1 << 16)
                if roofline.place(roofline.prefill_step(cfg, n), gpu, "bf16").bound == "compute")


def prefill_ridge_tokens(answer: Any) -> CheckResult:
    """Llama-3-8B in BF16 on an H200: from about how many prompt tokens is a prefill
    compute-bound (its arithmetic intensity past the card's ridge point)?"""
    expected = _prefill_ridge(RIDGE_GPU)
    h100 = _prefill_ridge("H100-SXM")
    return check_number("ch05.prefill_ridge_tokens", answer, expected, rel=0.15, mistakes=[
        (h100, "that is the H100: the H200 has the same arithmetic but faster memory, so its ridge "
               "point, and with it this length, is lower."),
        (1.0, "a prefill of one token is a decode step; it is memory-bound."),
    ], default_hint="not where this card's prefill turns compute-bound; compare the card's FLOP/s "
                    "with its bandwidth.",
       formula="a prefill of n tokens does about 2n FLOPs per weight and reads each BF16 weight "
               "(2 bytes) once, so its intensity is about n FLOP/byte: find n where it passes "
               "the H200's peak FLOP/s ÷ bandwidth.")


def compute_bound_phase(answer: Any) -> CheckResult:
    """On a GPU, which phase is usually compute-bound: "prefill" or "decode"?"""
    return check_choice("ch05.compute_bound_phase", answer, "prefill", options=["prefill", "decode"],
                        hints={"decode": "decode does little arithmetic per byte it reads; it waits "
                                         "on memory. Look at the intensities computed above."})


EXERCISES: dict[str, ExerciseInfo] = {
    "cache_writes": ExerciseInfo("reasoning", ("the qkv projection (computes k, v but does not store "
                                               "them)", "the FFN", "the embedding"), seed=1),
    "cache_reads": ExerciseInfo("recall", ("the qkv projection", "the FFN", "the lm_head"), seed=1),
    "decode_flops": ExerciseInfo("plug-in", ("parameters, not FLOPs", "2 per byte", "TFLOP vs FLOP")),
    "decode_intensity": ExerciseInfo("reasoning", ("batch 1", "BF16 bytes for FP8 weights",
                                                   "upside down", "bytes divided by the batch")),
    "prefill_ridge_tokens": ExerciseInfo("reasoning", ("the H100's ridge", "one token")),
    "compute_bound_phase": ExerciseInfo("recall", ("decode",)),
}
