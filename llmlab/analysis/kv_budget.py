"""KV memory on a card: the bytes a context of a model takes, the KV budget after the weights
(vLLM's --gpu-memory-utilization), how many requests fit. Chapter 04's calculator shows it;
its checker grades with it."""

from __future__ import annotations

import math
from dataclasses import dataclass

from llmlab.analysis import costs
from llmlab.config import ModelConfig
from llmlab.i18n import tr
from llmlab.utils import check_positive_int

GPU_MEMORY_UTILIZATION = 0.9  # vLLM's default --gpu-memory-utilization


def gpu_memory_bytes(gpu: str) -> float:
    """Memory size in bytes of a hardware preset ("H100-SXM", "H200", "A100-80GB", "L4", ...)."""
    from llmlab.analysis.hardware import get_hardware

    return float(get_hardware(gpu).mem_size)


def gpu_names() -> list[str]:
    from llmlab.analysis.hardware import PRESETS

    return list(PRESETS)


def _kv_config(num_layers: int, num_kv_heads: int, head_dim: int) -> ModelConfig:
    """A config with just the fields the KV size depends on (query heads = KV heads here)."""
    return ModelConfig(
        name="kv-calculator",
        vocab_size=1,
        hidden_size=num_kv_heads * head_dim,
        intermediate_size=1,
        num_hidden_layers=num_layers,
        num_attention_heads=num_kv_heads,
        num_key_value_heads=num_kv_heads,
        head_dim=head_dim,
    )


@dataclass(frozen=True)
class KVSummary:
    bytes_per_token: float  # all layers
    kv_bytes: float  # batch × context tokens
    gpu: str
    gpu_bytes: float
    weight_bytes: float
    usable_bytes: float  # the KV budget: gpu_bytes × utilization − weights − activations
    share_of_gpu: float  # kv_bytes / gpu_bytes
    max_requests: int  # requests of `context` tokens that fit in usable_bytes
    batch: int
    context: int
    activation_bytes: float = 0.0
    gpu_memory_utilization: float = GPU_MEMORY_UTILIZATION
    dtype_bytes: float = 2.0


def kv_budget_bytes(
    gpu: str,
    gpu_memory_utilization: float = GPU_MEMORY_UTILIZATION,
    weight_bytes: float = 0.0,
    activation_bytes: float = 0.0,
) -> float:
    """The KV budget: utilization × the GPU's memory − weights − activations (0 when negative)."""
    return max(
        0.0, gpu_memory_bytes(gpu) * gpu_memory_utilization - weight_bytes - activation_bytes
    )


def kv_summary(
    num_layers: int = 80,
    num_kv_heads: int = 8,
    head_dim: int = 128,
    dtype: str | float = "bf16",
    context: int = 4096,
    batch: int = 1,
    gpu: str = "H100-SXM",
    weight_bytes: float = 0.0,
    gpu_memory_utilization: float = GPU_MEMORY_UTILIZATION,
    activation_bytes: float = 0.0,
) -> KVSummary:
    """KV cache bytes for `batch` requests of `context` tokens, and what that means on `gpu`.

    weight_bytes: memory the model's weights take on the same GPU (0: count the KV cache alone).
    activation_bytes: the forward's peak working memory (activations), also kept out of the budget.
    `max_requests` is how many `context`-token requests the KV budget holds at once.
    """
    for name, v in (
        ("num_layers", num_layers),
        ("num_kv_heads", num_kv_heads),
        ("head_dim", head_dim),
        ("context", context),
        ("batch", batch),
    ):
        check_positive_int(f"{name}", v)
    if not 0 < gpu_memory_utilization <= 1:
        raise ValueError(
            tr(
                f"gpu_memory_utilization must be in (0, 1], got {gpu_memory_utilization!r}",
                f"gpu_memory_utilization 必须在 (0, 1] 之间，你给了 {gpu_memory_utilization!r}",
            )
        )
    if weight_bytes < 0:
        raise ValueError(
            tr(
                f"weight_bytes must be >= 0, got {weight_bytes!r}",
                f"weight_bytes 必须 >= 0，你给了 {weight_bytes!r}",
            )
        )
    if activation_bytes < 0:
        raise ValueError(
            tr(
                f"activation_bytes must be >= 0, got {activation_bytes!r}",
                f"activation_bytes 必须 >= 0，你给了 {activation_bytes!r}",
            )
        )
    dtype_bytes = costs.dtype_bytes_of(dtype)
    cfg = _kv_config(num_layers, num_kv_heads, head_dim)
    per_token = costs.kv_bytes_per_token(cfg, dtype_bytes)
    per_request = costs.kv_bytes(cfg, context, dtype_bytes)
    total = batch * per_request
    mem = gpu_memory_bytes(gpu)
    usable = kv_budget_bytes(gpu, gpu_memory_utilization, weight_bytes, activation_bytes)
    return KVSummary(
        bytes_per_token=per_token,
        kv_bytes=total,
        gpu=gpu,
        gpu_bytes=mem,
        weight_bytes=weight_bytes,
        usable_bytes=usable,
        share_of_gpu=total / mem,
        max_requests=int(math.floor(usable / per_request)),
        batch=batch,
        context=context,
        activation_bytes=activation_bytes,
        gpu_memory_utilization=gpu_memory_utilization,
        dtype_bytes=dtype_bytes,
    )
