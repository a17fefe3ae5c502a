"""Number formats and what fewer bytes per number do: the numbers behind chapter 13.

- `formats()`: each format's bits (sign, exponent, mantissa; an integer's value bits), its largest
  value and its step just above 1.0, read from `torch.finfo` / `torch.iinfo`, never typed in.
- `rounding_error(w, name)`: the relative error of a tensor stored in a format (int8 as the
  engine stores it: symmetric, one scale per output channel, `llmlab.model.quantization`).
- `per_tensor_int8(w)`: int8 with one scale for the whole matrix, the simpler scheme that
  per-channel scales improve on.
- `decode_speed(model, prompt, gen_len, **precision)`: batch-1 decode tokens/s of the engine
  at a precision, measured.
- `precision_label(engine)`: what an engine computes in, in words (the benches print it too).
- `step_weight_bytes(cfg, precision)`: the bytes of weights one batch-1 decode step reads at
  that precision (each weight once, int8's scales included): the memory floor's numerator.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from llmlab.i18n import tr
from llmlab.model.quantization import FP8_DTYPE, INT8_MAX, dequantize_int8, quantize_int8

# the formats the chapter compares, by torch's names
FORMATS = ("float32", "bfloat16", "float16", "float8_e4m3fn", "int8")
# exponent bits of the floating-point formats (the rest after the sign is the mantissa)
_EXPONENT_BITS = {"float32": 8, "bfloat16": 8, "float16": 5, "float8_e4m3fn": 4}


@dataclass(frozen=True)
class Format:
    """A number format's bits: bits = 1 (sign) + exponent_bits + mantissa_bits + integer_bits.
    A floating-point format has an exponent and a mantissa (its stored fraction bits) and no
    integer bits; an integer format (int8) has neither exponent nor mantissa, only value bits."""

    name: str
    bits: int
    exponent_bits: int  # 0 for an integer format
    mantissa_bits: int  # the stored fraction bits of a float; 0 for an integer format
    max: float  # the largest finite value
    eps: float  # the step from 1.0 to the next value (an integer's step is 1, at a scale)
    integer_bits: int = 0  # an integer format's value bits (int8: 7); 0 for a float


def _dtype(name: str) -> torch.dtype:
    if name not in FORMATS:
        raise ValueError(f"name must be one of {FORMATS}, got {name!r}")
    return getattr(torch, name)


def formats() -> list[Format]:
    """The formats of `FORMATS`, largest first, as torch knows them."""
    out = []
    for name in FORMATS:
        dtype = _dtype(name)
        if dtype.is_floating_point:
            info = torch.finfo(dtype)
            exp = _EXPONENT_BITS[name]
            out.append(Format(name, info.bits, exp, info.bits - 1 - exp, info.max, info.eps))
        else:
            info = torch.iinfo(dtype)
            out.append(Format(name, info.bits, 0, 0, float(info.max), 1.0, info.bits - 1))
    return out


def per_tensor_int8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric int8 with one scale for the whole matrix: (q int8, scale float32 []) with
    weight ~= q * scale."""
    w = weight.detach().float()
    amax = w.abs().max()
    scale = amax / INT8_MAX if amax > 0 else torch.tensor(1.0)
    return torch.round(w / scale).clamp(-INT8_MAX, INT8_MAX).to(torch.int8), scale


def relative_error(weight: torch.Tensor, approx: torch.Tensor) -> float:
    """‖approx − weight‖ / ‖weight‖ (Frobenius), in float64."""
    w = weight.detach().double()
    return float((approx.detach().double() - w).norm() / w.norm())


def rounding_error(weight: torch.Tensor, name: str) -> float:
    """The relative error of `weight` stored in the format `name`: a float format by rounding
    to nearest (fp8 with one scale that maps the largest |w| to the format's largest value, as
    an fp8 KV cache does), int8 by per-channel quantization as the engine does it."""
    dtype = _dtype(name)
    w = weight.detach().float()
    if name == "int8":
        return relative_error(w, dequantize_int8(*quantize_int8(w)))
    if dtype == FP8_DTYPE:
        scale = float(w.abs().max()) / torch.finfo(dtype).max or 1.0
        return relative_error(w, (w / scale).to(dtype).float() * scale)
    return relative_error(w, w.to(dtype).float())


def precision_label(engine) -> str:
    """What an engine computes in, for the benches' headers: weights, their matmul kernel
    on the C path, activations, KV cache."""
    model = engine.model_runner.model
    weights = getattr(model, "weight_dtype", None) or model.lm_head.weight.dtype
    cache = engine.model_runner.kv_caches[0][0].dtype
    name = lambda d: str(d).replace("torch.", "")  # noqa: E731
    w, c = name(weights), name(cache)
    if engine.config.attention_backend == "cpu":
        from llmlab.ops import cpu_matmul_choice

        kernel = cpu_matmul_choice.matmul_kernel(weights)
        return tr(
            f"weights {w}, KV cache {c} (matmul {kernel}; activations float32)",
            f"权重 {w}，KV cache {c}（矩阵乘：{kernel}，激活值 float32）",
        )
    a = name(model.dtype)
    return tr(f"weights {w}, KV cache {c}, activations {a}", f"权重 {w}，KV cache {c}，激活值 {a}")


@dataclass(frozen=True)
class DecodeSpeed:
    precision: str  # what the engine computes in (`precision_label`)
    tokens_per_s: float  # batch-1 decode, best of the rounds (measured)


def decode_speed(
    model, prompt: list[int], gen_len: int = 32, rounds: int = 2, **precision
) -> DecodeSpeed:
    """Batch-1 decode tokens/s of the engine on `model` at `precision` (EngineConfig's dtype,
    quantization, kv_cache_dtype): greedy, `gen_len` tokens after `prompt`, the prefill step
    left out; the best of `rounds` runs after one warm-up (measured)."""
    from llmlab import LLM, SamplingParams

    if gen_len < 2:
        raise ValueError(f"gen_len must be >= 2 (one prefill, then decode steps), got {gen_len}")
    llm = LLM(model, max_num_seqs=1, max_model_len=len(prompt) + gen_len, **precision)
    engine = llm.llm_engine
    params = SamplingParams(temperature=0.0, max_tokens=gen_len, ignore_eos=True)
    best = float("inf")
    for i in range(rounds + 1):
        engine.add_request(f"r{i}", prompt, params)
        engine.step()  # the prefill
        t0 = time.perf_counter()
        while engine.has_unfinished_requests():
            engine.step()
        if i > 0:  # the first run warms the kernels and caches up
            best = min(best, time.perf_counter() - t0)
    return DecodeSpeed(precision_label(engine), (gen_len - 1) / best)


def step_weight_bytes(cfg, dtype: str = "float32", quantization: str | None = None) -> float:
    """Bytes of weights one batch-1 decode step reads, counted as `costs.weight_bytes` counts
    them (every parameter once): in `dtype`'s bytes, or one byte each plus a float32 scale per
    output channel with `quantization="int8"`."""
    from llmlab.analysis import costs

    per = {"float32": 4, "bfloat16": 2, "float16": 2}
    if dtype not in per:
        raise ValueError(f"dtype must be one of {sorted(per)}, got {dtype!r}")
    if quantization not in (None, "int8"):
        raise ValueError(f"quantization must be None or 'int8', got {quantization!r}")
    params = costs.param_count(cfg)
    if quantization is None:
        return float(params * per[dtype])
    # one float32 scale per output row: each matrix of the step has `out` rows
    rows = _output_rows(cfg)
    return float(params + 4 * rows)


def _output_rows(cfg) -> int:
    """Output channels of all the matrices a decode step multiplies by (layers and LM head)."""
    head = cfg.head_dim
    q, kv = cfg.num_attention_heads * head, cfg.num_key_value_heads * head
    per_layer = q + 2 * kv + cfg.hidden_size + 2 * cfg.intermediate_size + cfg.hidden_size
    return cfg.num_hidden_layers * per_layer + cfg.vocab_size
