"""Self-checks of chapter 05 (prefill vs decode): which steps of a forward write and read the
KV cache (the source chapter's self-check question 1: both happen inside the attention step, as in
`llmlab.ops.attention` and vLLM's attention backends), FLOPs of a decode step, arithmetic
intensity at a batch, where a prefill turns compute-bound on another card, and which phase is
compute-bound."""

from __future__ import annotations

from typing import Any

from llmlab.analysis import costs, roofline
from llmlab.config import get_config
from llmlab.course.check.catalog import catalog
from llmlab.course.check.core import (
    CheckResult,
    check_choice,
    record_expected_word,
)
from llmlab.course.check.question import Expected, choice, numeric

M = catalog("ch05")

# the steps of one generation step, in order (the source chapter's self-check question 1)
STEPS = ["tokenize", "embed", "qkv_projection", "attention", "ffn", "lm_head", "sample"]
PRESET = "llama-3-70b"
DECODE_CONTEXT = 1  # "a short context": the KV term is negligible
BATCH = 24  # decode_intensity: FP8 weights (1 byte each) at this batch
WEIGHT_BYTES = 1
RIDGE_MODEL, RIDGE_GPU = "llama-3-8b", "H200"  # prefill_ridge_tokens: BF16 on an H200

# the catalog key of the hint for each step that neither writes nor reads the cache.
_NO_CACHE = {
    "tokenize": M.key("no_cache.tokenize"),
    "embed": M.key("no_cache.embed"),
    "ffn": M.key("no_cache.ffn"),
    "lm_head": M.key("no_cache.lm_head"),
    "sample": M.key("no_cache.sample"),
}


# Exercise 5: why the attention step stores this step's k and v before it reads the cache.
# the options, shown in the language in use; the keys are what the student answers with
ORDER_OPTIONS = M.texts(
    "order_options",
    ("same_result", "token_misses_itself", "cache_overflows", "earlier_keys_overwritten"),
)
_ORDER_HINTS = M.texts(
    "order_hints", ("same_result", "cache_overflows", "earlier_keys_overwritten")
)


@choice(ORDER_OPTIONS, _ORDER_HINTS)
def write_before_read() -> str:
    """The attention step stores this step's k and v in the cache, then attends over everything
    cached. What would go wrong if it attended first and stored afterwards? One key of
    ORDER_OPTIONS."""
    return "token_misses_itself"


_CACHE_READS_HINTS = {  # step -> catalog key of its hint
    **_NO_CACHE,
    "qkv_projection": M.key("cache_reads.projections_compute_token"),
}


@choice(STEPS, _CACHE_READS_HINTS)
def cache_reads() -> set[str]:
    """A decode step at a long context (many tokens already cached) against one at a short context:
    which step(s) of STEPS take longer? A name or a list of names."""
    return {"attention"}


@numeric(rel=0.03)
def decode_flops() -> Expected:
    """Llama-3-70B: FLOPs for one decode token at a short context (counting the lm_head)."""
    cfg = get_config(PRESET)
    expected = costs.flops_per_token(cfg, DECODE_CONTEXT, "decode")
    n = costs.param_count(cfg)
    return Expected(
        expected,
        mistakes=[
            (n, M("decode_flops.number_parameters_each")),
            (2 * n * 2, M("decode_flops.doubles_again_flops")),
            (2 * n / 1e12, M("decode_flops.tflop_figure_question")),
        ],
    )


@numeric(rel=0.05)
def decode_intensity() -> Expected:
    """Llama-3-70B with FP8 weights (WEIGHT_BYTES byte each), decode at batch BATCH, short context:
    FLOPs per byte read from memory (arithmetic intensity). Count the weights as the only bytes."""
    cfg = get_config(PRESET)
    flops = costs.decode_flops(cfg, BATCH, DECODE_CONTEXT)
    bytes_ = costs.weight_bytes(cfg, WEIGHT_BYTES)
    expected = flops / bytes_
    return Expected(
        expected,
        mistakes=[
            (expected / BATCH, M("decode_intensity.batch_weights_read")),
            (expected / 2, M("decode_intensity.counts_bytes_per")),
            (bytes_ / flops, M("decode_intensity.upside_down_intensity")),
            (expected * BATCH, M("decode_intensity.bytes_read_once")),
            (expected / 2 / BATCH, M("decode_intensity.multiply_add_per")),
        ],
    )


def _prefill_ridge(gpu: str, model: str = RIDGE_MODEL) -> int:
    cfg = get_config(model)
    return next(
        n
        for n in range(1, 1 << 16)
        if roofline.place(roofline.prefill_step(cfg, n), gpu, "bf16").bound == "compute"
    )


@numeric(rel=0.15)
def prefill_ridge_tokens() -> Expected:
    """Llama-3-8B in BF16 on an H200: from about how many prompt tokens is a prefill
    compute-bound (its arithmetic intensity past the card's ridge point)?"""
    expected = _prefill_ridge(RIDGE_GPU)
    h100 = _prefill_ridge("H100-SXM")
    return Expected(
        expected,
        mistakes=[
            (h100, M("prefill_ridge_tokens.h100_h200_same")),
            (1.0, M("prefill_ridge_tokens.prefill_token_decode")),
        ],
    )


# Exercise 4: a short prompt's prefill, a case the chapter's "prefill is compute-bound" does not cover
SHORT_PREFILL_MODEL, SHORT_PREFILL_GPU, SHORT_PREFILL_TOKENS = "llama-3-8b", "H100-SXM", 24


def _short_prefill_bound() -> str:
    step = roofline.prefill_step(get_config(SHORT_PREFILL_MODEL), SHORT_PREFILL_TOKENS)
    return roofline.place(step, SHORT_PREFILL_GPU, "bf16").bound


def short_prefill_bound(answer: Any) -> CheckResult:
    """A chat turn of SHORT_PREFILL_TOKENS prompt tokens, Llama-3-8B in BF16 on an H100: is its
    prefill "compute"-bound or "memory"-bound?"""
    right = _short_prefill_bound()
    wrong = "compute" if right == "memory" else "memory"
    record_expected_word("ch05.short_prefill_bound", right, (SHORT_PREFILL_TOKENS,), [wrong])
    return check_choice(
        "ch05.short_prefill_bound",
        answer,
        right,
        options=["compute", "memory"],
        hints={wrong: M("short_prefill_bound.prefill_compute_bound")},
    )


EXERCISES = M.exercises()  # kind, source question, mistakes: the catalog's "exercises"
