"""Fewer bytes per number: int8 weights with per-channel scales, and an fp8 KV cache.

Decode is memory-bound: every step streams every weight once, so the bytes per weight set the
speed. Three ways to spend fewer, as vLLM offers them:

- `dtype="bfloat16"` (vLLM's `--dtype`): 2 bytes per weight and activation; float32's 8-bit
  exponent (its range) with 7 mantissa bits instead of 23 (its precision). Converting is
  `model.to(torch.bfloat16)`; nothing here.
- `quantization="int8"` (vLLM's `--quantization`, `vllm/model_executor/layers/quantization/`):
  weight-only, symmetric, one float32 scale per output channel (row of W):
  `scale[n] = max_k |W[n, k]| / 127`, `q[n, k] = round(W[n, k] / scale[n])`. A matmul never
  needs the float matrix back: `y[n] = scale[n] * sum_k q[n, k] x[k]`, the scale of a row
  commutes out of its dot product. `Int8Linear` below is the readable form; the C fast path
  (`kernels/cpu_quant.c`) widens int8 to float32 inside its dot products.
- `kv_cache_dtype="fp8"` (vLLM's `--kv-cache-dtype fp8`): keys and values stored as fp8 e4m3
  (1 byte: 4 exponent bits, 3 mantissa bits, largest value 448) with one float32 scale per
  layer for K and one for V (vLLM's per-tensor `k_scale`, `v_scale`): stored = value / scale,
  read back as stored * scale, in float32, inside attention. The format is the attention
  backends' (`llmlab.ops.fp8`); `kv_scales` here calibrates the scales from a short text.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from llmlab.ops.fp8 import FP8_DTYPE, FP8_MAX, dequantize_fp8, quantize_fp8  # noqa: F401

INT8_MAX = 127  # symmetric: -127 .. 127 (no -128, so the range is symmetric)
KV_SCALE_HEADROOM = 2.0  # calibrated amax x this maps to FP8_MAX: room for larger values


# ---- int8 weights --------------------------------------------------------------------------


def quantize_int8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-output-channel symmetric int8: weight [out, in] -> (q int8 [out, in], scale
    float32 [out]) with weight ~= q * scale[:, None]. A row of zeros gets scale 1."""
    w = weight.detach().float()
    amax = w.abs().amax(dim=1)  # [out]
    scale = torch.where(amax > 0, amax / INT8_MAX, torch.ones_like(amax))
    q = torch.round(w / scale[:, None]).clamp(-INT8_MAX, INT8_MAX).to(torch.int8)
    return q, scale


def dequantize_int8(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """The float32 matrix `q` stands for (for checks and teaching; the engine never builds it)."""
    return q.float() * scale[:, None]


class Int8Linear(nn.Module):
    """`nn.Linear`'s y = x Wᵀ (+ b) with W stored as int8 and a scale per output channel.

    The readable form: the int8 matrix is widened for the product and each output column scaled
    afterwards (the scale commutes out of the dot product). Only int8 is kept; the widened
    matrix lives for one call. The C fast path does the same widening inside its kernel.
    """

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None):
        super().__init__()
        q, scale = quantize_int8(weight)
        self.register_buffer("weight", q)  # [out, in] int8
        self.register_buffer("weight_scale", scale)  # [out] float32
        self.bias = (
            None if bias is None else nn.Parameter(bias.detach().clone(), requires_grad=False)
        )
        self.in_features, self.out_features = weight.shape[1], weight.shape[0]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.nn.functional.linear(x, self.weight.to(x.dtype))  # [T, out], unscaled
        y = y * self.weight_scale.to(x.dtype)
        return y if self.bias is None else y + self.bias


class Int8Embedding(nn.Module):
    """The tied embedding / LM head matrix as int8: a row of the LM head is one output channel,
    and the same row is that token's embedding, so one scale per token serves both uses."""

    def __init__(self, weight: torch.Tensor, dtype: torch.dtype):
        super().__init__()
        q, scale = quantize_int8(weight)
        self.register_buffer("weight", q)  # [vocab, hidden] int8
        self.register_buffer("weight_scale", scale)  # [vocab] float32
        self.out_dtype = dtype

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        rows = self.weight[ids].float() * self.weight_scale[ids, None]  # [T, hidden]
        return rows.to(self.out_dtype)


class TiedInt8Head(nn.Module):
    """The LM head reading the int8 matrix of an `Int8Embedding` (tied weights stay one copy)."""

    def __init__(self, embedding: Int8Embedding):
        super().__init__()
        self.embedding = embedding
        self.in_features = embedding.weight.shape[1]
        self.out_features = embedding.weight.shape[0]
        self.bias = None

    @property
    def weight(self) -> torch.Tensor:
        return self.embedding.weight

    @property
    def weight_scale(self) -> torch.Tensor:
        return self.embedding.weight_scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.nn.functional.linear(x, self.weight.to(x.dtype))
        return y * self.weight_scale.to(x.dtype)


def quantize_model_int8(model):
    """A copy of `model` (an `llmlab.model.LlamaModel`) with every linear layer's weight in
    int8 with per-output-channel scales (`Int8Linear`), the LM head too (tied to the embedding:
    one int8 matrix for both). Norms stay in the model's dtype. `model` is not changed."""
    q = copy.deepcopy(model)
    dtype = model.dtype
    for layer in q.layers:
        for parent in (layer.self_attn, layer.mlp):
            for name, child in list(parent.named_children()):
                if isinstance(child, nn.Linear):
                    setattr(parent, name, Int8Linear(child.weight, child.bias))
    if model.config.tie_word_embeddings:
        q.embed_tokens = Int8Embedding(model.embed_tokens.weight, dtype)
        q.lm_head = TiedInt8Head(q.embed_tokens)
    else:
        q.lm_head = Int8Linear(model.lm_head.weight, model.lm_head.bias)
    return q.eval()


# ---- fp8 KV cache --------------------------------------------------------------------------


@torch.inference_mode()
def kv_scales(model, token_ids: list[int]) -> list[tuple[float, float]]:
    """Per-layer (k_scale, v_scale) for an fp8 cache, from one pass over `token_ids`:
    the largest |k| (|v|) the layer produced, times KV_SCALE_HEADROOM, maps to 448.
    (vLLM reads scales from a checkpoint, or with `calculate_kv_scales` measures them on the
    first batch the same way.)"""
    from llmlab.ops.metadata import single_sequence_metadata

    ids = torch.as_tensor(token_ids, dtype=torch.long, device=model.device)
    T = ids.shape[0]
    kv = model.allocate_kv_caches(num_blocks=1, block_size=T)
    metadata = single_sequence_metadata(kv, num_cached=0, num_new=T, max_len=T)
    model(ids, torch.arange(T, device=model.device), metadata)
    scales = []
    for k, v in kv:
        pair = []
        for t in (k, v):
            amax = float(t.float().abs().max())
            pair.append(max(amax, 1e-6) * KV_SCALE_HEADROOM / FP8_MAX)
        scales.append((pair[0], pair[1]))
    return scales
