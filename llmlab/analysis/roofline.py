"""The roofline model: how fast an operation *can* run on a device, from two numbers.

An operation does `flops` floating-point operations and moves `bytes` between main memory and
the chip. Its arithmetic intensity (算术强度) is flops / bytes (FLOP per byte). A device
streams at most `mem_bw` bytes/s and computes at most `peak` FLOP/s, so the operation takes
at least

    time_floor = max(bytes / mem_bw, flops / peak)

and reaches at most `attainable = min(peak, intensity * mem_bw)` FLOP/s. The two limits cross
at the ridge point (拐点) `peak / mem_bw`: below it an operation is memory-bound (访存受限),
above it compute-bound (计算受限). H100 SXM in bf16: 989.4e12 / 3.35e12 ≈ 295 FLOP/byte
(the source chapter's round 1000 TFLOPS / 3 TB/s gives ≈ 330).

LLM operations placed on the roof (costs from `llmlab.analysis.costs`):
- decode GEMV at batch B: every weight is read once and used B times → intensity ≈ 2B / dtype_bytes;
- prefill GEMM over n prompt tokens → intensity ≈ 2n / dtype_bytes;
- decode attention with GQA: each cached K/V byte is used by num_heads / num_kv_heads queries,
  → intensity ≈ 2 · group / dtype_bytes, whatever the batch (each sequence has its own cache).

The module also measures the real model's step times (`measure_decode_step`,
`measure_prefill`) so they can be drawn against the measured roof of this machine; the drawings
are chapter 07's figures (`llmlab.course.figures.ch07`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Sequence

import numpy as np

from llmlab.analysis import costs
from llmlab.analysis.hardware import PRESETS, Hardware, get_hardware
from llmlab.config import ModelConfig
from llmlab.i18n import tr
from llmlab.utils import best_of

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


def _check_int(name: str, value: int, minimum: int = 1) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(
            tr(
                f"{name} must be an int >= {minimum}, got {value!r}",
                f"{name} 必须是不小于 {minimum} 的整数，你给了 {value!r}",
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


def _matmul_weight_bytes(cfg: ModelConfig, dtype_bytes: float) -> float:
    return costs.matmul_params_per_token(cfg) * dtype_bytes


def decode_gemv(cfg: ModelConfig, batch: int, dtype_bytes: float = 2) -> Operation:
    """The linear layers of one decode step at `batch` sequences (a GEMV at batch 1).

    FLOPs: 2 × weights × batch. Bytes: every weight once, plus each token's input and output
    activations of every linear layer (small until the batch is in the hundreds).
    """
    _check_int("batch", batch)
    return _linear_layers(
        cfg,
        batch,
        dtype_bytes,
        tr(f"decode GEMV, batch {batch}", f"decode GEMV，batch {batch}"),
        {"batch": batch},
    )


def _linear_layers(
    cfg: ModelConfig, tokens: int, dtype_bytes: float, name: str, details: dict
) -> Operation:
    """Every linear layer over `tokens` tokens: weights read once, activations per token."""
    _check_positive("dtype_bytes", dtype_bytes)
    w = costs.matmul_params_per_token(cfg)
    act = tokens * _activation_elems_per_token(cfg) * dtype_bytes
    return Operation(name, flops=2.0 * w * tokens, bytes=w * dtype_bytes + act, details=details)


def _activation_elems_per_token(cfg: ModelConfig) -> int:
    """Inputs + outputs of every linear layer for one token (elements)."""
    h, i = cfg.hidden_size, cfg.intermediate_size
    q = cfg.num_attention_heads * cfg.head_dim
    kv = cfg.num_key_value_heads * cfg.head_dim
    per_layer = (h + q + 2 * kv) + (q + h) + (h + 2 * i) + (i + h)  # qkv, o, gate+up, down
    return cfg.num_hidden_layers * per_layer + h + cfg.vocab_size  # + lm_head


def prefill_gemm(cfg: ModelConfig, prompt_len: int, dtype_bytes: float = 2) -> Operation:
    """The linear layers of one prefill over `prompt_len` tokens (a GEMM)."""
    _check_int("prompt_len", prompt_len)
    return _linear_layers(
        cfg,
        prompt_len,
        dtype_bytes,
        tr(f"prefill GEMM, {prompt_len} tokens", f"prefill GEMM，{prompt_len} 个 token"),
        {"prompt_len": prompt_len},
    )


def decode_attention(
    cfg: ModelConfig, batch: int, context: int, dtype_bytes: float = 2
) -> Operation:
    """Attention of one decode step: each of `batch` queries reads its own `context`-token KV cache.

    With GQA, num_heads / num_kv_heads query heads share each K/V head, so each cached byte is
    used that many times: intensity ≈ 2 × group / dtype_bytes, independent of batch and context.
    """
    _check_int("batch", batch)
    _check_int("context", context)
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
    _check_int("batch", batch)
    _check_int("context", context)
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
    _check_int("prompt_len", prompt_len)
    _check_int("batch", batch)
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


# ----------------------------------------------------------------------------- measuring the real model


@dataclass(frozen=True)
class StepMeasurement:
    """One measured forward of the real model and its roofline floor on a device."""

    kind: str  # "decode" or "prefill"
    batch: int
    tokens: int  # context per sequence (decode) or prompt length (prefill)
    seconds: float  # fastest measured time
    op: Operation  # FLOPs and bytes of that forward

    @property
    def achieved_flops(self) -> float:
        return self.op.flops / self.seconds

    def vs_floor(self, hw: Hardware, dtype: str = "fp32") -> dict:
        """Measured time over the memory floor, over the compute floor, and over the roofline floor."""
        p = place(self.op, hw, dtype)
        return {
            "memory_floor": p.memory_time,
            "compute_floor": p.compute_time,
            "floor": p.time_floor,
            "bound": p.bound,
            "x_memory_floor": self.seconds / p.memory_time,
            "x_compute_floor": self.seconds / p.compute_time,
            "x_floor": self.seconds / p.time_floor,
        }


@dataclass
class PairedRatios:
    """A step timed in rounds, each right after a probe of the roof (bandwidth or matmul peak):
    `ratios[i] = seconds[i] / (work / roofs[i])`, the step against the roof of its own moment."""

    roofs: list[float]
    seconds: list[float]
    ratios: list[float]

    @property
    def median(self) -> float:
        return float(np.median(self.ratios))


def measure_paired(
    fn: Callable[[], Any],
    probe: Callable[[], float],
    work: float,
    rounds: int = 20,
    budget_s: float = 10.0,
    clock: Callable[[], float] = time.perf_counter,
) -> PairedRatios:
    """Time `fn` against a roof measured next to it: each round runs `probe()` (a roof: bytes/s or
    FLOP/s) and then one timed `fn()`, whose floor at that roof is `work / roof`.

    On a shared or throttled machine the roof drifts (this course's 2-core VM reads 40 to
    85 GB/s within a minute): a best step divided by a best roof measured minutes apart can
    come out anywhere, even below 1. Pairing each step with the roof of its own moment removes
    the drift; the median of the per-round ratios is the figure to compare with a target.
    `clock` is injectable so tests can drive the rounds without real timing.
    """
    _check_int("rounds", rounds)
    _check_positive("work", work)
    fn()  # warm-up
    roofs, seconds, ratios = [], [], []
    start = clock()
    for _ in range(rounds):
        roof = probe()
        t0 = clock()
        fn()
        dt = clock() - t0
        roofs.append(roof)
        seconds.append(dt)
        ratios.append(dt / (work / roof))
        if clock() - start > budget_s:
            break
    return PairedRatios(roofs, seconds, ratios)


def step_fn(
    model: Any, kind: str, n: int, context: int = 128, backend: str = "torch"
) -> Callable[[], None]:
    """One step of `model` as a closure, for timing or profiling.

    kind "decode": `n` sequences of `context` cached tokens bring one token each (forward +
    logits); the cache is a `ContiguousKVCache` whose first `context` slots count as filled
    (their values do not change the time) and every call writes the same new slot.
    kind "prefill": one prompt of `n` tokens (forward + logits of the last token).
    backend "cpu" runs the engine's C fast path (`llmlab.model.cpu`): pass a model already
    converted with `cpu_model` to time many steps without preparing its weights each time.
    """
    import torch

    from llmlab.kvcache import ContiguousKVCache
    from llmlab.model.cpu import CpuDecoderLayer, cpu_model

    if backend == "cpu" and not isinstance(model.layers[0], CpuDecoderLayer):
        model = cpu_model(model)

    cfg = model.config
    if kind == "decode":
        cache = ContiguousKVCache(
            cfg, batch_size=n, max_len=context + 1, dtype=model.dtype, device=model.device
        )
        cache.lengths = [context] * n
        new = [1] * n
    elif kind == "prefill":
        cache = ContiguousKVCache(
            cfg, batch_size=1, max_len=n, dtype=model.dtype, device=model.device
        )
        new = [n]
    else:
        raise ValueError(
            tr(
                f"kind must be 'decode' or 'prefill', got {kind!r}",
                f"kind 必须是 'decode' 或 'prefill'，你给了 {kind!r}",
            )
        )
    metadata = cache.context(new, backend=backend)
    positions = cache.positions(new).to(model.device)  # [n]
    gen = torch.Generator().manual_seed(n)
    input_ids = torch.randint(0, cfg.vocab_size, (n,), generator=gen).to(model.device)  # [n]

    def step() -> None:
        hidden = model(input_ids, positions, metadata)  # [n, hidden]
        model.compute_logits(hidden if kind == "decode" else hidden[-1:])
        if model.device.type == "cuda":
            torch.cuda.synchronize()

    return step


def measure_decode_step(
    model: Any,
    batch: int,
    context: int = 128,
    repeats: int = 5,
    budget_s: float = 5.0,
    backend: str = "torch",
) -> StepMeasurement:
    """Time one decode step of `model` (forward + logits) for `batch` sequences of `context`
    cached tokens (see `step_fn`). Fastest of `repeats`."""
    import torch

    _check_int("batch", batch)
    _check_int("context", context, minimum=0)
    seconds = best_of(
        step_fn(model, "decode", batch, context, backend), repeats, budget_s=budget_s, warmup=1
    )
    dtype_bytes = torch.tensor([], dtype=model.dtype).element_size()
    return StepMeasurement(
        "decode",
        batch,
        context,
        seconds,
        decode_step(model.config, batch, context + 1, dtype_bytes),
    )


def measure_prefill(
    model: Any, prompt_len: int, repeats: int = 3, budget_s: float = 5.0, backend: str = "torch"
) -> StepMeasurement:
    """Time one prefill forward of one prompt of `prompt_len` tokens (logits for the last token only)."""
    import torch

    _check_int("prompt_len", prompt_len)
    seconds = best_of(
        step_fn(model, "prefill", prompt_len, 0, backend), repeats, budget_s=budget_s, warmup=1
    )
    dtype_bytes = torch.tensor([], dtype=model.dtype).element_size()
    return StepMeasurement(
        "prefill", 1, prompt_len, seconds, prefill_step(model.config, prompt_len, 1, dtype_bytes)
    )


def quick_roof(device: str = "cpu") -> Hardware:
    """This machine's roof, measured roughly in well under a second: the read bandwidth of a
    64 MiB buffer and an fp32 matmul of 384 × 384 (a checker's measured line; for the chapter's
    careful numbers use `hardware.this_machine`)."""
    from llmlab.analysis import hardware

    bw = hardware.measure_bandwidth(device, nbytes=64 * 2**20, kind="read", repeats=3)
    peak = hardware.measure_matmul_flops(device, "fp32", n=384, repeats=3, library="aten")
    return Hardware(
        name=tr(f"this machine ({device}, quick)", f"本机（{device}，快速测量）"),
        mem_bw=bw,
        peak_flops={"fp32": peak},
        mem_size=0.0,
        kind="gpu" if device.startswith("cuda") else "cpu",
        measured=True,
        sources={"mem_bw": "quick_roof: 64 MiB read", "peak_flops": "quick_roof: 384^3 matmul"},
    )


@dataclass(frozen=True)
class EngineStep:
    """One step the real engine ran: its batch shape and the measured time of its forward."""

    batch: tuple[tuple[int, int], ...]  # (new_tokens, context) per scheduled sequence
    seconds: float  # the model runner's time: inputs, forward, logits, sampling
    sampled: int  # sequences that sampled a token (a partial prompt chunk samples none)

    @property
    def kind(self) -> str:
        """ "prefill", "decode" or "mixed"."""
        decode = [n == 1 and c > 1 for n, c in self.batch]
        return "decode" if all(decode) else "prefill" if not any(decode) else "mixed"


def record_engine_steps(
    llm: Any,
    prompts: Sequence[list[int]],
    params: Any,
    arrive_at: Sequence[int] | None = None,
) -> list[EngineStep]:
    """Run token-id `prompts` through the engine of `llm` (an `llmlab.LLM`) one step at a time
    and record each step's batch shape and measured forward time.

    arrive_at[i]: the step before which prompt i is added (default: all before the first), so
    that a later prompt can meet earlier ones decoding (a mixed step) or find its prefix in
    their cached blocks.
    """
    import uuid

    engine = llm.llm_engine
    arrive_at = list(arrive_at) if arrive_at is not None else [0] * len(prompts)
    if len(arrive_at) != len(prompts):
        raise ValueError(
            tr(
                f"arrive_at needs one step per prompt ({len(prompts)}), got {len(arrive_at)}",
                f"arrive_at 需要每个 prompt 一个步号（{len(prompts)} 个），你给了 {len(arrive_at)} 个",
            )
        )
    tag = uuid.uuid4().hex[:8]
    steps: list[EngineStep] = []
    added = 0
    order = sorted(range(len(prompts)), key=lambda i: arrive_at[i])
    while added < len(order) or engine.has_unfinished_requests():
        while added < len(order) and arrive_at[order[added]] <= len(steps):
            i = order[added]
            engine.add_request(f"steps-{tag}-{i}", list(prompts[i]), params)
            added += 1
        before = engine.forward_seconds
        engine.step()
        out = engine.last_scheduler_output
        if out is None or out.is_empty:
            if added < len(order):  # nothing to run until the next arrival: let it come
                arrive_at = [min(a, len(steps)) for a in arrive_at]
                continue
            break
        batch = tuple((n, done + n) for n, done in zip(out.num_new_tokens, out.num_computed_tokens))
        steps.append(
            EngineStep(
                batch, engine.forward_seconds - before, out.num_requests - out.num_prefill_chunks
            )
        )
    return steps


__all__ = [
    "PRESETS",
    "Operation",
    "Placement",
    "StepMeasurement",
    "attainable",
    "ridge_point",
    "place",
    "decode_gemv",
    "prefill_gemm",
    "decode_attention",
    "decode_step",
    "prefill_step",
    "engine_step",
    "EngineStep",
    "record_engine_steps",
    "quick_roof",
    "decode_step_floor",
    "decode_batch_sweep",
    "weight_read_time",
    "crossover_batch",
    "measure_decode_step",
    "measure_prefill",
    "dtype_for_bytes",
]
