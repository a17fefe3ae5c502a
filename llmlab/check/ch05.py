"""Self-checks of chapter 05 (prefill vs decode): which steps of a forward write and read the
KV cache (the seed's self-check question 1), FLOPs of a decode step, arithmetic intensity at a
batch, and which phase is compute-bound."""
from __future__ import annotations

from typing import Any

from llmlab import costs
from llmlab.check.core import CheckResult, check_choice, check_number
from llmlab.config import get_config

# the steps of one generation step, in order (the seed's self-check question 1)
STEPS = ["tokenize", "embed", "qkv_projection", "attention", "ffn", "lm_head", "sample"]
PRESET = "llama-3-70b"
DECODE_CONTEXT = 1                       # "a short context": the KV term is negligible
BATCH = 32

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
    ], default_hint="every weight a token meets costs one multiply-add (2 FLOPs); at a short "
                    "context attention adds almost nothing.")


def decode_intensity(answer: Any) -> CheckResult:
    """Llama-3-70B, BF16, decode at batch BATCH, short context: FLOPs per byte read from memory
    (arithmetic intensity). Count the weights as the only bytes."""
    cfg = get_config(PRESET)
    flops = costs.decode_flops(cfg, BATCH, DECODE_CONTEXT)
    bytes_ = costs.weight_bytes(cfg, 2)
    expected = flops / bytes_
    return check_number("ch05.decode_intensity", answer, expected, rel=0.05, mistakes=[
        (expected / BATCH, "that is batch 1: the weights are read once for the whole batch, but "
                           "every sequence in it does its own FLOPs."),
        (expected * 2, "that divides by parameters, not bytes: BF16 stores each in 2 bytes."),
        (bytes_ / flops, "upside down: intensity is FLOPs divided by bytes."),
        (expected * BATCH, "the bytes are read once per step, not once per sequence: do not "
                           "divide them by the batch again."),
    ], default_hint="FLOPs of the step (batch × 2 FLOPs per weight) ÷ bytes of the weights.")


def compute_bound_phase(answer: Any) -> CheckResult:
    """On a GPU, which phase is usually compute-bound: "prefill" or "decode"?"""
    return check_choice("ch05.compute_bound_phase", answer, "prefill", options=["prefill", "decode"],
                        hints={"decode": "decode does little arithmetic per byte it reads; it waits "
                                         "on memory. Look at the intensities computed above."})
