"""The GPU fast path: the Llama of `llmlab.model` with about nine kernel launches per layer.

`llmlab.model` is the definition and stays plain. On a GPU its layer is slow for a reason that
has nothing to do with arithmetic: it launches about 43 small kernels (RMSNorm as 6-8, RoPE on
q and k 14, three q/k/v and two gate/up GEMMs, ...), each costing the host a few microseconds
while the GPU moves a few kilobytes, so a decode step of SmolLM2-135M kept an H200 idle 80-90 %
of the time. This module is a second implementation of the decoder layer, chosen once by the
engine's model runner for a model on a CUDA device (`gpu_model(model)`), as `llmlab.model.cpu`
is for the CPU, and tested against the readable model. A layer is:

    fused add + RMSNorm        residual += x; x = rmsnorm(residual)   (`ops.fused`)
    qkv GEMM                   one matrix [q | k | v]                  (weights merged at load)
    rotary + KV-cache write    q rotated out; k rotated, v copied into their slots
    attention                  decode or prefill kernel reading the cache (`ops.paged_attention`)
    o_proj GEMM
    fused add + RMSNorm
    gate_up GEMM               one matrix [gate | up]
    SiLU x up
    down GEMM

What it does differently, and what it costs:

- **Merged projections, prepared once at load** (vLLM's `QKVParallelLinear` and
  `MergedColumnParallelLinear`; nano-vllm packs them too): q, k and v read the same input, so
  their weights become one matrix, as do gate and up. The readable modules' weights are
  re-pointed at rows of the merged matrices (`llmlab.model.cpu.stack_linears`), so both
  implementations share one copy: **no extra weight memory**. int8 weights
  (`llmlab.model.quantization.Int8Linear`) merge their int8 rows the same way, and copy their
  per-channel scales (4 bytes per output row). **Change a weight after `gpu_model`, and call it
  again.**
- **The residual stream rides beside the hidden state** (vLLM's `fused_add_rms_norm`): the add
  that ends a sublayer is done by the norm that starts the next one, in one kernel.
- **RoPE from a table**: cos and sin of every position are computed once at load into
  `cos_sin_cache` [max_position_embeddings, head_dim] float32 (vLLM's `RotaryEmbedding`):
  2 MiB for SmolLM2 (8,192 positions x 64), shared by every layer.
- **Checked once per step**: the metadata was checked when it was built, the step's inputs
  and caches are checked by `GpuLlamaModel.forward`; the layers call unchecked kernels.
- **Capturable in a CUDA graph**: nothing in `forward` reads a value from the device (no
  `.item()`, `.tolist()`, no tensor built from a list, no shape that depends on values); the
  kernels' grids come from shapes and the host's `metadata.max_query_len`.

Numerically it follows the readable model's roundings step for step (the residual add, the
norm before its weight, SiLU before the product are rounded to the model's dtype where the
readable code rounds them); RoPE is computed in float32 and rounded once, where the readable
model rounds cos, sin and each product to the model's dtype (the same arithmetic in float32).
The fp8 KV cache is written by the same rotary kernel (e4m3 rounding in the kernel).

Its layers take and return the residual as vLLM's do, `(positions, hidden, residual, metadata,
layer)`, not the readable layer's `(x, cos, sin, metadata, layer)`: code that runs only the first
layers (the early-exit draft of speculative decoding) calls `forward(..., num_layers=n)`, which
both implementations take. Not a speed path yet: int8 weights are widened per call as `Int8Linear`
does (three launches per GEMM, and more bytes read than bf16). The cost in code: this module,
the launchers of `llmlab.ops.fused` and three Triton kernels with their helpers, about
650 lines.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from llmlab import ops
from llmlab.model.cpu import stack_linears
from llmlab.model.llama import (
    DecoderLayer,
    LlamaModel,
    check_num_layers,
    inference,
    rope_cos_sin_cache,
)
from llmlab.ops import fused
from llmlab.ops.metadata import AttentionMetadata


class RotaryEmbedding(nn.Module):
    """The cos/sin table every layer's rotary kernel reads, computed once (a buffer, so
    `.to(device)` moves it; one object shared by all layers). vLLM:
    `vllm/model_executor/layers/rotary_embedding/base.py`."""

    def __init__(self, inv_freq: torch.Tensor, max_positions: int):
        super().__init__()
        self.register_buffer(
            "cos_sin_cache", rope_cos_sin_cache(inv_freq, max_positions), persistent=False
        )


class GpuLinear(nn.Module):
    """y = x Wᵀ (+ b) on a weight prepared once: float weights through cuBLAS (`F.linear`), or
    int8 weights with a scale per output row, widened for the product and scaled after, as
    `llmlab.model.quantization.Int8Linear` does (the scales kept in the activations' dtype). vLLM's
    merged linears: `vllm/model_executor/layers/linear.py`."""

    def __init__(
        self,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        scale: torch.Tensor | None,
        dtype: torch.dtype,
    ):
        super().__init__()
        self.register_buffer("weight", weight.detach(), persistent=False)  # [out, in]
        self.register_buffer("bias", None if bias is None else bias.detach(), persistent=False)
        self.register_buffer(
            "scale", None if scale is None else scale.detach().to(dtype), persistent=False
        )  # [out]

    @classmethod
    def merged(cls, modules: list[nn.Module], dtype: torch.dtype) -> GpuLinear:
        """One linear over the concatenated outputs of `modules` (their weights re-pointed at
        its rows: one copy)."""
        return cls(*stack_linears(modules), dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.scale is None:
            return F.linear(x, self.weight, self.bias)  # [T, out]
        y = F.linear(x, self.weight.to(x.dtype)) * self.scale  # [T, out]
        return y if self.bias is None else y + self.bias


class GpuDecoderLayer(nn.Module):
    """`llmlab.model.DecoderLayer`'s math in nine launches; built from one (see the module's
    docstring). vLLM's `LlamaDecoderLayer.forward` (`vllm/model_executor/models/llama.py`) takes
    and returns the residual the same way."""

    def __init__(self, layer: DecoderLayer, rotary: RotaryEmbedding, dtype: torch.dtype):
        super().__init__()
        attn, mlp = layer.self_attn, layer.mlp
        self.num_heads, self.head_dim, self.scale = attn.num_heads, attn.head_dim, attn.scale
        self.input_layernorm = layer.input_layernorm
        self.post_attention_layernorm = layer.post_attention_layernorm
        self.qkv_proj = GpuLinear.merged([attn.q_proj, attn.k_proj, attn.v_proj], dtype)
        self.o_proj = GpuLinear.merged([attn.o_proj], dtype)
        self.gate_up_proj = GpuLinear.merged([mlp.gate_proj, mlp.up_proj], dtype)
        self.down_proj = GpuLinear.merged([mlp.down_proj], dtype)
        self.rotary = rotary

    def forward(
        self,
        positions: torch.Tensor,
        hidden: torch.Tensor,
        residual: torch.Tensor | None,
        metadata: AttentionMetadata,
        layer: int,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """hidden [T, hidden_size]: the last sublayer's output (the embeddings for the first
        layer, whose residual is None); residual [T, hidden_size]: the stream before it.
        Returns this layer's MLP output and the stream before it; the caller's next norm adds
        them. Checked by `GpuLlamaModel.forward` once per step; nothing here checks."""
        T = hidden.shape[0]
        norm1, norm2 = self.input_layernorm, self.post_attention_layernorm
        if residual is None:
            residual, hidden = hidden, fused._rms_norm(hidden, norm1.weight, norm1.eps)
        else:
            fused._fused_add_rms_norm(hidden, residual, norm1.weight, norm1.eps)  # in place
        q = fused._rotary_embedding_and_cache(
            self.qkv_proj(hidden),  # [T, (heads + 2 kv_heads) * head_dim]
            positions,
            self.rotary.cos_sin_cache,
            metadata.paged_kv(layer),
            metadata.slot_mapping,
        )  # [T, heads, head_dim]; k and v are in the cache now
        out = ops.paged_attention(q, metadata, layer, self.scale)  # [T, heads, head_dim]
        hidden = self.o_proj(out.view(T, self.num_heads * self.head_dim))  # [T, hidden_size]
        fused._fused_add_rms_norm(hidden, residual, norm2.weight, norm2.eps)
        gate_up = self.gate_up_proj(hidden)  # [T, 2 * intermediate]
        return self.down_proj(fused._silu_and_mul(gate_up)), residual


class GpuLlamaModel(LlamaModel):
    """The fast path's model: `LlamaModel`'s interface (`forward`, `compute_logits`,
    `allocate_kv_caches`, `device`, `dtype`, `config`) over `GpuDecoderLayer`s."""

    @inference
    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        metadata: AttentionMetadata,
        num_layers: int | None = None,
    ) -> torch.Tensor:
        """input_ids [T], positions [T] int64 -> hidden states [T, hidden] after the final norm.
        `num_layers`: only the first that many layers run (the early-exit draft of speculation)."""
        self._check_step(input_ids, positions, metadata)
        hidden = self.embed_tokens(input_ids)  # [T, hidden]
        residual = None
        for i in range(check_num_layers(num_layers, len(self.layers))):
            hidden, residual = self.layers[i](positions, hidden, residual, metadata, i)
        fused._fused_add_rms_norm(hidden, residual, self.norm.weight, self.norm.eps)
        return hidden

    def _check_step(
        self, input_ids: torch.Tensor, positions: torch.Tensor, metadata: AttentionMetadata
    ) -> None:
        """What every layer then relies on (shapes, dtypes and devices only: nothing read from
        the device). The metadata checked itself against its caches when it was built."""
        cfg = self.config
        T = input_ids.shape[0] if input_ids.dim() == 1 else -1
        if T < 0 or positions.shape != input_ids.shape or positions.dtype != torch.int64:
            raise ValueError(
                f"input_ids and positions: got {tuple(input_ids.shape)} and "
                f"{tuple(positions.shape)} {positions.dtype}, expected both [T], positions int64"
            )
        if metadata.num_tokens != T or len(metadata.kv_caches) != len(self.layers):
            raise ValueError(
                f"metadata: got {metadata.num_tokens} tokens and {len(metadata.kv_caches)} "
                f"cache pairs, expected {T} tokens (input_ids) and {len(self.layers)} pairs"
            )
        key_cache = metadata.kv_caches[0][0]
        want = (cfg.num_key_value_heads, cfg.head_dim)
        if (
            tuple(key_cache.shape[2:]) != want
            or key_cache.dtype not in (self.dtype, torch.float8_e4m3fn)
            or key_cache.device != self.device
            or input_ids.device != self.device
            or positions.device != self.device
        ):
            raise ValueError(
                f"metadata.kv_caches: got {tuple(key_cache.shape)} {key_cache.dtype} on "
                f"{key_cache.device} (input_ids on {input_ids.device}), expected "
                f"[num_blocks, block_size, {want[0]}, {want[1]}] of {self.dtype} or "
                f"float8_e4m3fn, everything on {self.device}"
            )


def gpu_model_applies(model: LlamaModel, interpret: bool = False) -> tuple[bool, str]:
    """(True, "") when `gpu_model` can run `model` here, else (False, why). `interpret`: accept a
    model on the CPU, whose kernels then run through the Triton interpreter (tests, teaching)."""
    ok, why = ops.backend_available("triton")
    if not ok:
        return False, f"the fused layer's kernels are Triton kernels: {why}"
    if model.dtype not in fused.FLOAT_DTYPES:
        return False, f"the fused kernels take float32, float16 or bfloat16; got {model.dtype}"
    if model.config.head_dim % 2:
        return False, f"RoPE rotates pairs: head_dim must be even, got {model.config.head_dim}"
    from llmlab.ops import triton_backend

    triton_backend._load()  # settles whether Triton compiles or interprets in this process
    interpreting = triton_backend.interpreting()
    device = model.device.type
    if (device == "cuda" and not interpreting) or (device == "cpu" and interpret and interpreting):
        return True, ""
    if device == "cpu" and interpret:
        return False, (
            "interpret=True, but Triton compiles for the GPU in this process (export "
            "TRITON_INTERPRET=1 before start to run CPU tensors through the interpreter)"
        )
    return False, (
        f"the model is on {model.device}; the fused Triton kernels compile for a CUDA device "
        "(on the CPU they run only through the interpreter: interpret=True)"
        + (", and Triton interprets in this process (TRITON_INTERPRET=1)" if interpreting else "")
    )


def gpu_model(model: LlamaModel, interpret: bool = False) -> LlamaModel:
    """`model` with every decoder layer swapped for a `GpuDecoderLayer`; the embedding, norms
    and LM head are shared, not copied, and so are the weights (merged matrices whose rows the
    readable modules now point at). `interpret`: as in `gpu_model_applies`."""
    ok, why = gpu_model_applies(model, interpret)
    if not ok:
        raise ValueError(f"the GPU fast path cannot run this model: {why}")
    cfg = model.config
    with torch.device("meta"):  # no memory, no init: every module is swapped
        fast = GpuLlamaModel(cfg)
    fast.embed_tokens = model.embed_tokens
    fast.norm = model.norm
    fast.lm_head = model.lm_head
    fast.inv_freq = model.inv_freq
    rotary = RotaryEmbedding(model.inv_freq, cfg.max_position_embeddings)
    dtype = model.dtype
    fast.layers = nn.ModuleList(GpuDecoderLayer(layer, rotary, dtype) for layer in model.layers)
    return fast.eval()
