"""The roof and the LLM operations placed on it: the ridge point, what an operation can attain
and its time floor (`place`), and the FLOPs and bytes of decode, prefill and engine steps of a
model (costs from `llmlab.analysis.costs`). See `llmlab.analysis.roofline` for the idea."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Sequence

import numpy as np

from llmlab.analysis import costs
from llmlab.analysis.costs import check_int
from llmlab.analysis.hardware import Hardware, get_hardware
from llmlab.config import ModelConfig, get_config
from llmlab.i18n import tr

DTYPE_FOR_BYTES = {4: "fp32", 2: "bf16", 1: "fp8"}


def _hw(hw: Hardware | str) -> Hardware:
    return get_hardware(hw) if isinstance(hw, str) else hw


def _check_positive(name: str, value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(
            tr(
                f"{name} must be a number > 0, got {value!r}",
                f"{name} 必须是正数，你给了 {value!r}",
            )
        )


def dtype_for_bytes(dtype_bytes: float) -> str:
    """The dtype whose peak applies to data of `dtype_bytes` bytes: 4 → fp32, 2 → bf16, 1 → fp8."""
    if dtype_bytes not in DTYPE_FOR_BYTES:
        raise ValueError(
            tr(
                f"dtype_bytes must be one of {sorted(DTYPE_FOR_BYTES)}, got {dtype_bytes!r}",
                f"dtype_bytes 必须是 {sorted(DTYPE_FOR_BYTES)} 之一，你给了 {dtype_bytes!r}",
            )
        )
    return DTYPE_FOR_BYTES[dtype_bytes]


# ----------------------------------------------------------------------------- the roof


def ridge_point(hw: Hardware | str, dtype: str = "bf16") -> float:
    """Arithmetic intensity (FLOP/byte) where the bandwidth roof meets the compute roof."""
    hw = _hw(hw)
    return hw.flops(dtype) / hw.mem_bw


def attainable(hw: Hardware | str, intensity: Any, dtype: str = "bf16") -> Any:
    """Highest FLOP/s an operation of `intensity` FLOP/byte can reach: min(peak, intensity × bw).

    `intensity` may be a number or a numpy array (then an array comes back).
    """
    hw = _hw(hw)
    peak = hw.flops(dtype)
    if isinstance(intensity, (list, tuple)) or hasattr(intensity, "shape"):
        arr = np.asarray(intensity, dtype=float)
        if (arr < 0).any():
            raise ValueError(
                tr("intensity must be >= 0 FLOP/byte", "intensity 必须 >= 0 FLOP/byte")
            )
        return np.minimum(peak, arr * hw.mem_bw)
    if isinstance(intensity, bool) or not isinstance(intensity, (int, float)) or intensity < 0:
        raise ValueError(
            tr(
                f"intensity must be a number >= 0 FLOP/byte, got {intensity!r}",
                f"intensity 必须是非负数（FLOP/byte），你给了 {intensity!r}",
            )
        )
    return min(peak, intensity * hw.mem_bw)


@dataclass(frozen=True)
class Operation:
    """An operation's total work: `flops` FLOP and `bytes` moved to or from main memory."""

    name: str
    flops: float
    bytes: float
    details: dict = field(default_factory=dict)

    @property
    def intensity(self) -> float:
        """Arithmetic intensity in FLOP/byte."""
        return self.flops / self.bytes


@dataclass(frozen=True)
class Placement:
    """Where an operation sits on a device's roof."""

    op: Operation
    hardware: str
    dtype: str
    memory_time: float  # seconds: bytes / mem_bw
    compute_time: float  # seconds: flops / peak
    ridge: float  # FLOP/byte

    @property
    def time_floor(self) -> float:
        """The least time the operation can take on this device, seconds."""
        return max(self.memory_time, self.compute_time)

    @property
    def bound(self) -> str:
        """ "memory" or "compute": which roof the operation sits under."""
        return "memory" if self.memory_time >= self.compute_time else "compute"

    @property
    def attainable_flops(self) -> float:
        return self.op.flops / self.time_floor

    def summary(self) -> str:
        return tr(
            f"{self.op.name}: intensity {self.op.intensity:.1f} FLOP/B "
            f"(ridge {self.ridge:.0f}) -> {self.bound}-bound, floor {self.time_floor * 1e3:.3g} ms",
            f"{self.op.name}：算术强度 {self.op.intensity:.1f} FLOP/B"
            f"（拐点 {self.ridge:.0f}）-> {self.bound}-bound，下限 {self.time_floor * 1e3:.3g} ms",
        )


def place(op: Operation, hw: Hardware | str, dtype: str = "bf16") -> Placement:
    """Put `op` on `hw`'s roof for `dtype`'s peak."""
    hw = _hw(hw)
    return Placement(
        op=op,
        hardware=hw.name,
        dtype=dtype,
        memory_time=op.bytes / hw.mem_bw,
        compute_time=op.flops / hw.flops(dtype),
        ridge=ridge_point(hw, dtype),
    )


# ----------------------------------------------------------------------------- LLM operations


def decode_gemv(cfg: ModelConfig, batch: int, dtype_bytes: float = 2) -> Operation:
    """The linear layers of one decode step at `batch` sequences (a GEMV at batch 1).

    FLOPs: 2 × weights × batch. Bytes: every weight once, plus each token's input and output
    activations of every linear layer (small until the batch is in the hundreds).
    """
    name = tr(f"decode GEMV, batch {batch}", f"decode GEMV，batch {batch}")
    return _linear_layers(cfg, "batch", batch, dtype_bytes, name)


def _linear_layers(
    cfg: ModelConfig, argument: str, tokens: int, dtype_bytes: float, name: str
) -> Operation:
    """Every linear layer over `tokens` tokens: weights read once, activations per token.
    `argument` is the caller's name for `tokens` ("batch", "prompt_len"): the one a bad value's
    error names, and the key of the operation's details."""
    check_int(argument, tokens)
    _check_positive("dtype_bytes", dtype_bytes)
    w = costs.matmul_params_per_token(cfg)
    act = tokens * _activation_elems_per_token(cfg) * dtype_bytes
    return Operation(
        name, flops=2.0 * w * tokens, bytes=w * dtype_bytes + act, details={argument: tokens}
    )


def _activation_elems_per_token(cfg: ModelConfig) -> int:
    """Inputs + outputs of every linear layer for one token (elements)."""
    h, i = cfg.hidden_size, cfg.intermediate_size
    q = cfg.num_attention_heads * cfg.head_dim
    kv = cfg.num_key_value_heads * cfg.head_dim
    per_layer = (h + q + 2 * kv) + (q + h) + (h + 2 * i) + (i + h)  # qkv, o, gate+up, down
    return cfg.num_hidden_layers * per_layer + h + cfg.vocab_size  # + lm_head


def prefill_gemm(cfg: ModelConfig, prompt_len: int, dtype_bytes: float = 2) -> Operation:
    """The linear layers of one prefill over `prompt_len` tokens (a GEMM)."""
    name = tr(f"prefill GEMM, {prompt_len} tokens", f"prefill GEMM，{prompt_len} 个 token")
    return _linear_layers(cfg, "prompt_len", prompt_len, dtype_bytes, name)


def decode_attention(
    cfg: ModelConfig, batch: int, context: int, dtype_bytes: float = 2
) -> Operation:
    """Attention of one decode step: each of `batch` queries reads its own `context`-token KV cache.

    With GQA, num_heads / num_kv_heads query heads share each K/V head, so each cached byte is
    used that many times: intensity ≈ 2 × group / dtype_bytes, independent of batch and context.
    """
    check_int("batch", batch)
    check_int("context", context)
    flops = batch * costs.attention_flops_per_token(cfg, context)
    nbytes = batch * costs.kv_bytes(cfg, context, dtype_bytes)
    return Operation(
        tr(
            f"decode attention, batch {batch}, context {context}",
            f"decode 注意力，batch {batch}，上下文 {context}",
        ),
        flops=float(flops),
        bytes=float(nbytes),
        details={"batch": batch, "context": context},
    )


def decode_step(cfg: ModelConfig, batch: int, context: int, dtype_bytes: float = 2) -> Operation:
    """A whole decode step: all weights once + every sequence's KV cache; all matmuls + attention."""
    check_int("batch", batch)
    check_int("context", context)
    return Operation(
        tr(
            f"decode step, batch {batch}, context {context}",
            f"decode 一步，batch {batch}，上下文 {context}",
        ),
        flops=costs.decode_flops(cfg, batch, context),
        bytes=costs.decode_bytes_per_step(cfg, batch, context, dtype_bytes),
        details={"batch": batch, "context": context},
    )


def prefill_step(
    cfg: ModelConfig,
    prompt_len: int,
    batch: int = 1,
    dtype_bytes: float = 2,
    last_token_logits: bool = True,
) -> Operation:
    """A prefill forward of `batch` prompts of `prompt_len` tokens: weights read once, KV written.

    With `last_token_logits` (what an engine does) the lm_head runs for the last token only.
    """
    check_int("prompt_len", prompt_len)
    check_int("batch", batch)
    flops = batch * costs.prefill_flops(cfg, prompt_len)
    if last_token_logits:
        flops -= batch * (prompt_len - 1) * 2.0 * cfg.vocab_size * cfg.hidden_size
    nbytes = costs.weight_bytes(cfg, dtype_bytes) + batch * costs.kv_bytes(
        cfg, prompt_len, dtype_bytes
    )
    return Operation(
        tr(f"prefill, {batch} x {prompt_len} tokens", f"prefill，{batch} x {prompt_len} 个 token"),
        flops=float(flops),
        bytes=float(nbytes),
        details={"batch": batch, "prompt_len": prompt_len},
    )


def engine_step(
    cfg: ModelConfig,
    batch: Sequence[tuple[int, int]],
    dtype_bytes: float = 2,
    *,
    step_cost: Callable[..., dict] | None = None,
) -> Operation:
    """One engine step of any shape as one operation: the FLOPs and bytes of its operations
    summed, its roofline point at their ratio.

    batch: one (new_tokens, context) pair per sequence (prefill, decode and prefix-cached
    prompts mixed; see `costs.step_costs`). `step_cost` counts the operations, a function with
    `costs.step_costs`'s signature and result ({op: (flops, bytes)}); None is the package's own
    (chapter 07's build exercise passes the student's). details["ops"] keeps its counts.
    """
    ops = (step_cost or costs.step_costs)(cfg, batch, dtype_bytes)
    if not isinstance(ops, dict) or not ops:
        raise ValueError(
            tr(
                f"step_cost must return a non-empty dict {{op: (flops, bytes)}}, got {ops!r}",
                f"step_cost 必须返回非空 dict {{op: (flops, bytes)}}，实际返回 {ops!r}",
            )
        )
    flops = float(sum(f for f, _ in ops.values()))
    nbytes = float(sum(b for _, b in ops.values()))
    shape = ", ".join(f"{n}/{c}" for n, c in batch)
    return Operation(
        tr(f"engine step [{shape}]", f"引擎一步 [{shape}]"),
        flops=flops,
        bytes=nbytes,
        details={"batch": [tuple(p) for p in batch], "ops": dict(ops)},
    )


def decode_step_floor(
    cfg: ModelConfig,
    hw: Hardware | str,
    batch: int = 1,
    context: int = 1,
    dtype_bytes: float = 2,
    dtype: str | None = None,
) -> float:
    """Least time (seconds) of one decode step: max(bytes / bandwidth, FLOPs / peak).

    Llama-3-70B in bf16 at batch 1: ≈ 42 ms on H100 SXM (3.35 TB/s), ≈ 47 ms at the source chapter's
    3 TB/s. `dtype` picks the compute peak; by default the one matching `dtype_bytes` (2 → bf16).
    """
    op = decode_step(cfg, batch, context, dtype_bytes)
    return place(op, hw, dtype or dtype_for_bytes(dtype_bytes)).time_floor


def prefill_floor(
    cfg: ModelConfig,
    hw: Hardware | str,
    prompt_len: int,
    dtype_bytes: float = 2,
    dtype: str | None = None,
) -> float:
    """Least time (seconds) of one prefill over `prompt_len` tokens (one prompt, last-token
    logits as an engine computes them): `decode_step_floor`'s rule on `prefill_step`."""
    op = prefill_step(cfg, prompt_len, dtype_bytes=dtype_bytes)
    return place(op, hw, dtype or dtype_for_bytes(dtype_bytes)).time_floor


def prefill_decode_floors(
    cfg: ModelConfig | str,
    prompt_lens: Sequence[int],
    contexts: Sequence[int],
    hw: Hardware | str = "H100-SXM",
    dtype_bytes: float = 2,
) -> tuple[list[float], list[float]]:
    """The floors (seconds) of a prefill of each prompt length (`prefill_floor`) and of one
    batch-1 decode step at each context (`decode_step_floor`) on `hw`: a step without a KV cache
    (a prefill-like forward over all T tokens) against one with it (a decode step at context T)."""
    cfg = get_config(cfg) if isinstance(cfg, str) else cfg
    prefill = [prefill_floor(cfg, hw, n, dtype_bytes) for n in prompt_lens]
    decode = [decode_step_floor(cfg, hw, 1, T, dtype_bytes) for T in contexts]
    return prefill, decode


def decode_batch_sweep(
    cfg: ModelConfig,
    hw: Hardware | str,
    batches: Iterable[int],
    context: int = 1,
    dtype_bytes: float = 2,
    dtype: str | None = None,
) -> list[dict]:
    """For each batch: step-time floor, tokens/s, and the bound — the source chapter's
    "batch 32 ≈ 32× throughput"."""
    dtype = dtype or dtype_for_bytes(dtype_bytes)
    rows = []
    for b in batches:
        p = place(decode_step(cfg, b, context, dtype_bytes), hw, dtype)
        rows.append(
            {
                "batch": b,
                "step_time": p.time_floor,
                "tokens_per_s": b / p.time_floor,
                "bound": p.bound,
                "intensity": p.op.intensity,
            }
        )
    return rows


def weight_read_time(num_params: float, dtype_bytes: float, mem_bw: float) -> float:
    """Seconds to read `num_params` weights of `dtype_bytes` once at `mem_bw` bytes/s (70e9, 2, 3e12 → 47 ms)."""
    _check_positive("num_params", num_params)
    _check_positive("dtype_bytes", dtype_bytes)
    _check_positive("mem_bw", mem_bw)
    return num_params * dtype_bytes / mem_bw


def crossover_batch(
    cfg: ModelConfig,
    hw: Hardware | str,
    context: int = 1,
    dtype_bytes: float = 2,
    dtype: str | None = None,
    max_batch: int = 1 << 16,
) -> int | None:
    """Smallest batch at which a decode step becomes compute-bound (None if not up to `max_batch`)."""
    dtype = dtype or dtype_for_bytes(dtype_bytes)
    lo, hi = 1, max_batch
    if place(decode_step(cfg, hi, context, dtype_bytes), hw, dtype).bound == "memory":
        return None
    while lo < hi:
        mid = (lo + hi) // 2
        if place(decode_step(cfg, mid, context, dtype_bytes), hw, dtype).bound == "compute":
            hi = mid
        else:
            lo = mid + 1
    return lo
