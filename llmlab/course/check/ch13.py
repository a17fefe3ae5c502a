"""Self-checks for chapter 13 (dtypes and quantization): what int8's scales cost in bytes, a
per-channel int8 quantizer written by the student, why fewer bytes did not buy the speed-up the
bytes promise, and what an fp8 KV cache does to the batch that fits."""

from __future__ import annotations

from typing import Any

import torch

from llmlab.analysis import costs
from llmlab.analysis.kv_budget import kv_summary
from llmlab.config import get_config
from llmlab.course.check.build_guard import check_cases
from llmlab.course.check.catalog import catalog
from llmlab.course.check.core import (
    CheckResult,
    staged,
)
from llmlab.course.check.question import Expected, choice, numeric
from llmlab.model.quantization import INT8_MAX, quantize_int8

M = catalog("ch13")
BUILDS = {"ch13.quantize_per_channel": "quantize_per_channel"}  # exercise -> the student's name

# Exercise 1: SmolLM2's q_proj, [out, in] = [576, 576], int8 with a float32 scale per row
Q_PROJ_SHAPE = (576, 576)
SCALE_BYTES = 4

# Exercise 3: int8 reads a quarter of float32's bytes; why is the measured step not 4x faster?
# the options, {key: text} in the language in use; the keys are the answers
SPEEDUP_OPTIONS = M.texts("why_options", ("scales", "fixed_costs", "kv_cache", "gpu_only"))
# the hint per wrong option, in the language in use
_SPEEDUP_HINTS = M.texts("why_hints", ("scales", "kv_cache", "gpu_only"))

# Exercise 2: Llama-3-8B, BF16 weights, on an L4, requests of CONTEXT tokens; the budget keeps
# chapter 04's rule (utilisation × memory − weights − activations) with its task's 1 GB of activations
KV_MODEL, KV_GPU, CONTEXT = "llama-3-8b", "L4", 2048
ACTIVATION_BYTES = 1e9


@numeric(rel=1e-4)
def int8_bytes_per_weight() -> Expected:
    """Bytes per weight of a [576, 576] matrix stored as int8 with one float32 scale per output
    row, the scales counted."""
    out, inp = Q_PROJ_SHAPE
    expected = (out * inp + SCALE_BYTES * out) / (out * inp)
    return Expected(
        expected,
        mistakes=[
            (1.0, M("int8_bytes_per_weight.scales_forgotten")),
            (1.0 + SCALE_BYTES, M("int8_bytes_per_weight.scale_per_weight")),
            ((out * inp + SCALE_BYTES) / (out * inp), M("int8_bytes_per_weight.one_scale")),
            ((out * inp + out) / (out * inp), M("int8_bytes_per_weight.one_byte_scale")),
            (4.0, M("int8_bytes_per_weight.float32")),
        ],
    )


def _quantizer_cases() -> list[torch.Tensor]:
    """Matrices [out, in] drawn afresh on each check: a grid of shapes from a single weight to a
    layer's worth, rows of very different sizes (as real weights have), a row of zeros, a row
    with one outlier and a row of negative numbers only."""
    g = torch.Generator().manual_seed(int(torch.randint(0, 2**31 - 1, ()).item()))
    cases = []
    for out, inp in ((1, 1), (2, 3), (4, 16), (16, 7), (64, 96), (128, 576)):
        w = torch.randn(out, inp, generator=g) * torch.logspace(-3, 0, out)[:, None]
        cases.append(w)
    special = torch.randn(4, 32, generator=g) * 0.05
    special[1] = 0.0  # a row of zeros
    special[2, 5] = 3.0  # an outlier
    special[3] = -special[3].abs() - 0.01  # negative only
    cases.append(special)
    return cases


def _unpack(got: Any, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | str:
    """(q, scale as [out]) from the student's return value, or the key of what is wrong."""
    if not (isinstance(got, (tuple, list)) and len(got) == 2):
        return M.key("quantizer.not_a_pair")
    q, scale = got
    if not (isinstance(q, torch.Tensor) and isinstance(scale, torch.Tensor)):
        return M.key("quantizer.not_tensors")
    if q.dtype != torch.int8:
        return M.key("quantizer.q_not_int8")
    if tuple(q.shape) != tuple(w.shape):
        return M.key("quantizer.q_shape")
    out, inp = w.shape
    if scale.numel() == 1 and out > 1:
        return M.key("quantizer.one_scale")
    if scale.numel() == inp != out:
        return M.key("quantizer.scale_per_column")
    if scale.numel() != out:
        return M.key("quantizer.scale_shape")
    return q, scale.reshape(out).double()


def _mistake(w: torch.Tensor, q: torch.Tensor, scale: torch.Tensor) -> str | None:
    """The key of the first thing the quantization of `w` gets wrong, or None."""
    if not torch.isfinite(scale).all() or (scale <= 0).any():
        return M.key("quantizer.scale_not_positive")
    wd, qd = w.double(), q.double()
    _, ref_scale = quantize_int8(w)
    amax = wd.abs().amax(dim=1)
    live = amax > 0
    if (qd.abs() > INT8_MAX).any():
        return M.key("quantizer.outside_range")
    if not torch.allclose(scale[live], ref_scale.double()[live], rtol=1e-5, atol=0):
        if live.any() and (scale[live] > ref_scale.double()[live]).all():
            return M.key("quantizer.range_unused")
        return M.key("quantizer.scale_not_amax")
    err = (qd * scale[:, None] - wd).abs()
    if (err > scale[:, None] * (0.5 + 1e-4)).any():
        truncated = torch.trunc(wd / scale[:, None]).clamp(-INT8_MAX, INT8_MAX)
        if torch.equal(qd, truncated):
            return M.key("quantizer.truncated")
        return M.key("quantizer.not_nearest")
    return None


def quantize_per_channel(fn: Any) -> CheckResult:
    """fn(w) takes a float32 weight matrix [out, in] and returns (q, scale): q int8 [out, in],
    scale float32 [out], with w ~= q * scale[:, None], each row's largest |w| mapped to 127 and
    every weight rounded to the nearest step. Checked on freshly drawn matrices."""
    cases = _quantizer_cases()
    return check_cases(
        "ch13.quantize_per_channel",
        fn,
        cases,
        call=_quantized,
        judge=_quantizer_problem,
        hint=M("quantizer.not_a_function", got_type=type(fn).__name__),
        raised=lambda w, error_type, error: M(
            "quantizer.raised", error_type=error_type, error=error
        ),
        success=M("quantizer.success", n=len(cases)),
    )


def _quantized(fn: Any, w: torch.Tensor) -> tuple[torch.Tensor, Any]:
    """(a copy of `w` taken before the call, what the student's fn(w) returned)."""
    before = w.clone()
    return before, fn(w)


def _quantizer_problem(w: torch.Tensor, result: tuple[torch.Tensor, Any]) -> str | None:
    """The hint for what the student's quantizer did to `w` (`_quantized`); None when right."""
    before, got = result
    ex = "ch13.quantize_per_channel"
    if not torch.equal(w, before):
        return M("quantizer.changed_input")
    unpacked = _unpack(got, w)
    if isinstance(unpacked, str):
        return staged(ex, M(unpacked), M("quantizer.rule"))
    key = _mistake(w, *unpacked)
    if key is None:
        return None
    where = M("quantizer.where", out=w.shape[0], inp=w.shape[1])
    return staged(ex, f"{where} {M(key)}", M("quantizer.rule"))


@choice(SPEEDUP_OPTIONS, _SPEEDUP_HINTS)
def why_not_4x() -> str:
    """int8 weights are a quarter of float32's bytes, yet the measured batch-1 step is about 2x
    faster here, not 4x. The main reason: one key of SPEEDUP_OPTIONS."""
    return "fixed_costs"


@numeric(rel=0)
def fp8_kv_requests() -> Expected:
    """Llama-3-8B with BF16 weights on an L4 (gpu_memory_utilization 0.9, ACTIVATION_BYTES of
    activations): how many requests of CONTEXT tokens fit at once with an fp8 KV cache? The budget
    is chapter 04's: utilisation × memory − weights − activations."""
    cfg = get_config(KV_MODEL)
    shape = dict(
        num_layers=cfg.num_hidden_layers,
        num_kv_heads=cfg.num_key_value_heads,
        head_dim=cfg.head_dim,
        context=CONTEXT,
        gpu=KV_GPU,
        activation_bytes=ACTIVATION_BYTES,
    )
    bf16_weights = costs.weight_bytes(cfg, 2)
    expected = kv_summary(dtype="fp8", weight_bytes=bf16_weights, **shape).max_requests
    no_activations = {**shape, "activation_bytes": 0.0}
    return Expected(
        expected,
        mistakes=[
            (
                kv_summary(dtype="fp8", weight_bytes=bf16_weights, **no_activations).max_requests,
                M("fp8_kv_requests.activations_forgotten"),
            ),
            (
                kv_summary(dtype="bf16", weight_bytes=bf16_weights, **shape).max_requests,
                M("fp8_kv_requests.bf16_cache"),
            ),
            (
                kv_summary(dtype="fp8", weight_bytes=0, **shape).max_requests,
                M("fp8_kv_requests.weights_forgotten"),
            ),
            (
                kv_summary(
                    dtype="fp8", weight_bytes=costs.weight_bytes(cfg, 1), **shape
                ).max_requests,
                M("fp8_kv_requests.fp8_weights"),
            ),
        ],
    )


EXERCISES = M.exercises()  # kind, source question, mistakes: the catalog's "exercises"
