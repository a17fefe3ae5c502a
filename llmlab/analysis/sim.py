"""Simulators for chapters 08 and 11: batching policies and KV-cache memory waste.

Batching (`simulate`). An engine runs in steps; every step each running request produces one
token (its first step is its prefill, which also yields its first token). Requests arrive over
time and want `output_len` tokens each. Two policies, both first come, first served:

- static batching (静态批处理): when the engine is idle it admits up to `max_batch` waiting
  requests and runs them until the *last* of them finishes; slots freed early stay empty;
- continuous batching (连续批处理): before every step, finished requests leave and waiting
  ones take their slots at once.

Time per step is `step_time(batch)` (default 1.0, so times are in steps). With a memory-bound
step time (nearly flat in the batch) a fuller batch is almost free, which is why continuous
batching wins on throughput as well as on latency.

KV memory waste (`kv_memory_waste`): on one schedule, the KV memory a max-length contiguous
reservation holds against what paged allocation in blocks of `block_size` holds, and how much
of each actually stores tokens (the vLLM paper's Figure 2 shape: most of a contiguous
reservation is waste, paging wastes at most one partial block per request).
"""

from __future__ import annotations

import math
import random
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

POLICIES = ("static", "continuous")


@dataclass(frozen=True)
class SimRequest:
    """A request of the simulation: when it arrives and how many tokens it will generate."""

    request_id: int
    arrival: float  # time it arrives (seconds, or steps when step_time is 1)
    output_len: int  # tokens it generates (= steps it runs)
    prompt_len: int = 16  # tokens of its prompt (used by the KV memory simulator)
    max_tokens: int | None = None  # the cap it asked for (≥ output_len); None: output_len

    def __post_init__(self) -> None:
        if not (isinstance(self.output_len, int) and self.output_len >= 1):
            raise ValueError(f"output_len must be an int >= 1, got {self.output_len!r}")
        if not (isinstance(self.prompt_len, int) and self.prompt_len >= 0):
            raise ValueError(f"prompt_len must be an int >= 0, got {self.prompt_len!r}")
        if not (isinstance(self.arrival, (int, float)) and self.arrival >= 0):
            raise ValueError(f"arrival must be a time >= 0, got {self.arrival!r}")
        if self.max_tokens is not None and self.max_tokens < self.output_len:
            raise ValueError(
                f"max_tokens ({self.max_tokens}) must be >= output_len ({self.output_len})"
            )


@dataclass
class RequestTimeline:
    """What happened to one request: waiting from `arrival` to `start`, running until `finish`."""

    request_id: int
    arrival: float
    output_len: int
    start: float = math.nan  # beginning of its first step
    first_token: float = math.nan  # end of its first step
    finish: float = math.nan  # end of its last step
    start_step: int = -1
    finish_step: int = -1
    generated: int = 0

    @property
    def latency(self) -> float:
        """End-to-end latency: finish − arrival."""
        return self.finish - self.arrival

    @property
    def ttft(self) -> float:
        """Time to first token: first_token − arrival."""
        return self.first_token - self.arrival

    @property
    def queue_time(self) -> float:
        return self.start - self.arrival


@dataclass
class SimResult:
    """A simulated run: per-request timelines and per-step batch sizes."""

    policy: str
    max_batch: int
    requests: list[RequestTimeline]
    step_start: list[float] = field(default_factory=list)
    step_end: list[float] = field(default_factory=list)
    step_batch: list[int] = field(default_factory=list)  # requests producing a token that step
    step_members: list[tuple[int, ...]] = field(default_factory=list)  # their ids

    @property
    def total_tokens(self) -> int:
        return sum(r.generated for r in self.requests)

    @property
    def makespan(self) -> float:
        """From the first arrival to the last finish."""
        return max(r.finish for r in self.requests) - min(r.arrival for r in self.requests)

    @property
    def throughput(self) -> float:
        """Output tokens per unit time over the makespan."""
        return self.total_tokens / self.makespan

    @property
    def mean_latency(self) -> float:
        return sum(r.latency for r in self.requests) / len(self.requests)

    @property
    def mean_ttft(self) -> float:
        return sum(r.ttft for r in self.requests) / len(self.requests)

    @property
    def num_steps(self) -> int:
        return len(self.step_batch)

    @property
    def mean_batch(self) -> float:
        """Average number of requests per step (how full the batch was)."""
        return sum(self.step_batch) / max(1, len(self.step_batch))

    def summary(self) -> dict:
        return {
            "policy": self.policy,
            "max_batch": self.max_batch,
            "steps": self.num_steps,
            "tokens": self.total_tokens,
            "makespan": self.makespan,
            "throughput": self.throughput,
            "mean_latency": self.mean_latency,
            "mean_ttft": self.mean_ttft,
            "mean_batch": self.mean_batch,
        }


def _step_time_fn(step_time: Callable[[int], float] | float | None) -> Callable[[int], float]:
    if step_time is None:
        return lambda b: 1.0
    if callable(step_time):
        return step_time
    if isinstance(step_time, (int, float)) and step_time > 0:
        value = float(step_time)
        return lambda b: value
    raise ValueError(
        f"step_time must be a positive number or a function of the batch size, got {step_time!r}"
    )


def simulate(
    requests: Sequence[SimRequest],
    policy: str = "continuous",
    max_batch: int = 8,
    step_time: Callable[[int], float] | float | None = None,
) -> SimResult:
    """Run `requests` through an engine with the given batching `policy`; see the module doc.

    `step_time(b)` is the duration of a step that runs b requests (default: 1.0 for every step).
    """
    if policy not in POLICIES:
        raise ValueError(f"policy must be one of {POLICIES}, got {policy!r}")
    if not (isinstance(max_batch, int) and max_batch >= 1):
        raise ValueError(f"max_batch must be an int >= 1, got {max_batch!r}")
    if not requests:
        raise ValueError("requests must not be empty")
    ids = [r.request_id for r in requests]
    if len(set(ids)) != len(ids):
        raise ValueError("request_id values must be unique")
    duration = _step_time_fn(step_time)

    order = sorted(requests, key=lambda r: (r.arrival, r.request_id))
    timelines = {
        r.request_id: RequestTimeline(r.request_id, float(r.arrival), r.output_len) for r in order
    }
    result = SimResult(policy, max_batch, [timelines[r.request_id] for r in order])
    pending = deque(order)  # not yet arrived
    queue: deque[SimRequest] = deque()  # arrived, waiting for a slot
    running: list[SimRequest] = []
    t = 0.0
    done = 0
    step = 0
    while done < len(order):
        while pending and pending[0].arrival <= t:
            queue.append(pending.popleft())
        if policy == "continuous" or not running:
            while queue and len(running) < max_batch:
                req = queue.popleft()
                tl = timelines[req.request_id]
                tl.start, tl.start_step = t, step
                running.append(req)
        if not running:
            t = max(t, pending[0].arrival)  # idle until the next arrival
            continue
        dt = duration(len(running))
        if not dt > 0:
            raise ValueError(f"step_time({len(running)}) must be > 0, got {dt!r}")
        result.step_start.append(t)
        result.step_end.append(t + dt)
        result.step_batch.append(len(running))
        result.step_members.append(tuple(r.request_id for r in running))
        t += dt
        still = []
        for req in running:
            tl = timelines[req.request_id]
            tl.generated += 1
            if tl.generated == 1:
                tl.first_token = t
            if tl.generated == req.output_len:
                tl.finish, tl.finish_step = t, step
                done += 1
            else:
                still.append(req)
        running = still
        step += 1
    return result


def make_trace(
    num_requests: int = 32,
    arrival_rate: float = 1.0,
    mean_output: int = 32,
    output_spread: float = 0.5,
    prompt_len: int | tuple[int, int] = 16,
    seed: int = 0,
    integer_arrivals: bool = False,
    max_tokens: int | None = None,
) -> list[SimRequest]:
    """A random trace: Poisson arrivals at `arrival_rate` per unit time, output lengths uniform in
    mean_output × [1 − spread, 1 + spread].

    `prompt_len` is a fixed length or a (low, high) range; `integer_arrivals` floors arrival times
    (so that with step_time 1 everything happens on step boundaries); `max_tokens` records the
    cap each request asked for (for the KV waste simulator; must be ≥ every output length).
    """
    if not (isinstance(num_requests, int) and num_requests >= 1):
        raise ValueError(f"num_requests must be an int >= 1, got {num_requests!r}")
    if not arrival_rate > 0:
        raise ValueError(f"arrival_rate must be > 0 requests per unit time, got {arrival_rate!r}")
    if not (isinstance(mean_output, int) and mean_output >= 1):
        raise ValueError(f"mean_output must be an int >= 1, got {mean_output!r}")
    if not 0 <= output_spread <= 1:
        raise ValueError(f"output_spread must be in [0, 1], got {output_spread!r}")
    rng = random.Random(seed)
    t = 0.0
    out = []
    lo = max(1, round(mean_output * (1 - output_spread)))
    hi = max(lo, round(mean_output * (1 + output_spread)))
    if max_tokens is not None and max_tokens < hi:
        raise ValueError(f"max_tokens ({max_tokens}) must be >= the longest output ({hi})")
    for i in range(num_requests):
        if i:
            t += rng.expovariate(arrival_rate)
        n = rng.randint(lo, hi)
        p = prompt_len if isinstance(prompt_len, int) else rng.randint(*prompt_len)
        out.append(SimRequest(i, float(math.floor(t)) if integer_arrivals else t, n, p, max_tokens))
    return out


def compare(
    requests: Sequence[SimRequest],
    max_batch: int = 8,
    step_time: Callable[[int], float] | float | None = None,
) -> dict[str, SimResult]:
    """Static and continuous batching on the same requests."""
    return {p: simulate(requests, p, max_batch, step_time) for p in POLICIES}


# ----------------------------------------------------------------------------- KV memory waste


@dataclass
class WasteResult:
    """KV slots (tokens) reserved and used, summed over the steps of one schedule."""

    block_size: int
    max_model_len: int
    contiguous_policy: str
    used: list[int]  # per step: tokens actually stored
    contiguous: list[int]  # per step: token slots a contiguous allocator reserves
    paged: list[int]  # per step: token slots held in blocks

    @property
    def contiguous_waste(self) -> float:
        """Fraction of the contiguous reservation that holds no token (time-averaged)."""
        return 1 - sum(self.used) / sum(self.contiguous)

    @property
    def paged_waste(self) -> float:
        """Fraction of the paged blocks that holds no token (time-averaged)."""
        return 1 - sum(self.used) / sum(self.paged)


def kv_memory_waste(
    requests: Sequence[SimRequest],
    max_model_len: int = 2048,
    block_size: int = 16,
    max_batch: int = 16,
    contiguous_policy: str = "max_len",
) -> WasteResult:
    """KV memory waste of contiguous vs paged allocation on the continuous-batching schedule of `requests`.

    A running request that has produced k tokens stores prompt_len + k tokens.
    Contiguous: each request reserves `max_model_len` slots ("max_len") or prompt_len + max_tokens
    ("max_tokens", its own cap) for its whole life. Paged: ceil(stored / block_size) blocks.
    """
    if contiguous_policy not in ("max_len", "max_tokens"):
        raise ValueError(
            f"contiguous_policy must be 'max_len' or 'max_tokens', got {contiguous_policy!r}"
        )
    if not (isinstance(block_size, int) and block_size >= 1):
        raise ValueError(f"block_size must be an int >= 1, got {block_size!r}")
    by_id = {r.request_id: r for r in requests}
    for r in requests:
        if r.prompt_len + (r.max_tokens or r.output_len) > max_model_len:
            raise ValueError(
                f"request {r.request_id} needs {r.prompt_len + (r.max_tokens or r.output_len)} "
                f"tokens, more than max_model_len={max_model_len}"
            )
    sched = simulate(requests, "continuous", max_batch)
    timelines = {tl.request_id: tl for tl in sched.requests}
    used, contiguous, paged = [], [], []
    for step, members in enumerate(sched.step_members):
        u = c = p = 0
        for rid in members:
            req = by_id[rid]
            k = step - timelines[rid].start_step + 1  # tokens produced once this step ends
            stored = req.prompt_len + k
            u += stored
            c += (
                max_model_len
                if contiguous_policy == "max_len"
                else req.prompt_len + (req.max_tokens or req.output_len)
            )
            p += math.ceil(stored / block_size) * block_size
        used.append(u)
        contiguous.append(c)
        paged.append(p)
    return WasteResult(block_size, max_model_len, contiguous_policy, used, contiguous, paged)


# ----------------------------------------------------------------------------- plots


def result_from_outputs(outputs: Sequence[Any], policy: str, max_batch: int) -> SimResult:
    """A `SimResult` from a real engine run (`LLM.generate` outputs), in seconds from the first arrival.

    Each request's `metrics` gives arrival, first scheduled, first token, every token and finish
    times; tokens stamped with the same time came out of the same engine step, which gives the
    batch size of every step. The result draws with `plot_gantt` / `plot_compare` like a simulated one.
    """
    if not outputs:
        raise ValueError("outputs must not be empty")
    t0 = min(o.metrics.arrival_time for o in outputs)
    steps: dict[float, list] = {}
    timelines = []
    for o in outputs:
        m = o.metrics
        if not m.token_times:
            raise ValueError(f"request {o.request_id!r} has no token times; was it finished?")
        tl = RequestTimeline(o.request_id, m.arrival_time - t0, len(m.token_times))
        tl.start = (
            m.first_scheduled_time if m.first_scheduled_time is not None else m.token_times[0]
        ) - t0
        tl.first_token = m.token_times[0] - t0
        tl.finish = (m.finished_time if m.finished_time is not None else m.token_times[-1]) - t0
        tl.generated = len(m.token_times)
        timelines.append(tl)
        for t in m.token_times:
            steps.setdefault(t, []).append(o.request_id)
    result = SimResult(policy, max_batch, timelines)
    ends = sorted(steps)
    index = {t: i for i, t in enumerate(ends)}
    prev = min(tl.start for tl in timelines)
    for t in ends:
        result.step_start.append(prev)
        result.step_end.append(t - t0)
        result.step_batch.append(len(steps[t]))
        result.step_members.append(tuple(steps[t]))
        prev = t - t0
    for o, tl in zip(outputs, timelines):
        tl.start_step = index[o.metrics.token_times[0]]
        tl.finish_step = index[o.metrics.token_times[-1]]
    return result


def batching_results(
    arrival_rate: float = 0.5,
    output_spread: float = 0.8,
    max_batch: int = 8,
    num_requests: int = 24,
    mean_output: int = 24,
    seed: int = 0,
) -> dict[str, SimResult]:
    """Both policies on the widget's random trace (what chapter 08's sliders show; its checker
    computes its task from the same function)."""
    trace = make_trace(num_requests, arrival_rate, mean_output, output_spread, seed=seed)
    return compare(trace, max_batch)
