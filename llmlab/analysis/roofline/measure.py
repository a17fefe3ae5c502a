"""The real model's step times measured on this machine, to set against the roof
(`measure_decode_step`, `measure_prefill`, `measure_paired`), a quick measured roof
(`quick_roof`) and a real engine's steps recorded one by one (`record_engine_steps`)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from llmlab.analysis.costs import check_int
from llmlab.analysis.hardware import Hardware
from llmlab.analysis.roofline.model import (
    Operation,
    _check_positive,
    decode_step,
    place,
    prefill_step,
)
from llmlab.i18n import tr
from llmlab.utils import best_of


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
    check_int("rounds", rounds)
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

    check_int("batch", batch)
    check_int("context", context, minimum=0)
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

    check_int("prompt_len", prompt_len)
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
