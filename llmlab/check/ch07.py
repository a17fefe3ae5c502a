"""Self-checks of chapter 07 (roofline): the ridge point, the intensity of a batched decode
GEMV and of GQA decode attention, and which roof a decode step sits under."""
from __future__ import annotations

from typing import Any

from llmlab import roofline
from llmlab.check.ch01 import combine_mistakes
from llmlab.check.core import CheckResult, check_choice, check_number
from llmlab.config import get_config
from llmlab.hardware import PRESETS

GEMV_BATCH = 8          # decode_gemv_intensity: batch size
BOUND_BATCH = 64        # decode_bound: batch size of the Llama-3-70B decode step on H100 SXM
BOUND_CONTEXT = 1024


def ridge_point(answer: Any) -> CheckResult:
    """Ridge point of the H100-SXM preset (datasheet) in BF16, in FLOP/byte."""
    h = PRESETS["H100-SXM"]
    expected = roofline.ridge_point(h, "bf16")
    return check_number("ch07.ridge_point", answer, expected, rel=0.02, mistakes=combine_mistakes(
        (roofline.ridge_point(PRESETS["H100-SXM-seed"], "bf16"),
         "that is the seed's round 1000 TFLOPS / 3 TB/s; use the datasheet preset H100-SXM."),
        (1 / expected, "upside down: the ridge is peak FLOP/s divided by bytes/s."),
        (roofline.ridge_point(h, "fp32"), "that is the FP32 peak; the question asks for BF16 (tensor cores)."),
        (roofline.ridge_point(h, "fp8"), "that is the FP8 peak; the question asks for BF16."),
        (2 * h.peak_flops["bf16"] / h.mem_bw, "that uses the 2:4-sparsity peak; the roofline uses the dense peak."),
    ), default_hint="peak FLOP/s (bf16) divided by memory bandwidth (bytes/s).")


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
    ), default_hint="FLOPs: 2 × weights × batch; bytes: weights × 2; divide.")


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
        (expected * cfg.num_attention_heads / group, "count the query heads per K/V head (num_heads / num_kv_heads), not all heads."),
    ), default_hint="FLOPs per cached token: 2·heads·head_dim (scores) + 2·heads·head_dim (values); "
                    "bytes per cached token: 2·kv_heads·head_dim·2. Layers and context cancel.")


def decode_bound(answer: Any) -> CheckResult:
    """Llama-3-70B, BF16, on the H100-SXM preset: is a decode step at batch BOUND_BATCH (context
    BOUND_CONTEXT) "memory"- or "compute"-bound?"""
    cfg = get_config("llama-3-70b")
    p = roofline.place(roofline.decode_step(cfg, BOUND_BATCH, BOUND_CONTEXT, 2), "H100-SXM", "bf16")
    wrong = "compute" if p.bound == "memory" else "memory"
    hint = ("compare the step's intensity (about batch FLOP per byte for the weights, lower with KV "
            "reads) with the ridge point of about 295 FLOP/byte.")
    return check_choice("ch07.decode_bound", answer, p.bound, options=["memory", "compute"],
                        hints={wrong: hint})
