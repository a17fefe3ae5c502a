"""The fp8 KV cache's storage format: e4m3 (1 sign, 4 exponent, 3 mantissa bits; no infinities),
stored = value / scale with a float32 scale per layer for K and one for V (vLLM's `k_scale`,
`v_scale`). Every attention backend writes and reads it through these two functions or their
equivalents in its kernels; `llmlab.model.quantization` measures the scales."""

from __future__ import annotations

import torch

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = 448.0  # the largest finite e4m3 value


def quantize_fp8(x: torch.Tensor, scale: float) -> torch.Tensor:
    """x / scale as fp8 e4m3, clamped to +-448 (a value beyond the range saturates instead of
    becoming NaN)."""
    return (x.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)


def dequantize_fp8(x: torch.Tensor, scale: float) -> torch.Tensor:
    """fp8 values back to float32: stored * scale."""
    return x.float() * scale
