"""Serving metrics from request timings: TTFT, TPOT, ITL, E2EL, throughput, goodput; arrivals.

Definitions (the same as vLLM's benchmark client, `benchmarks/benchmark_serving.py`):

- TTFT (time to first token, 首 token 延迟) = first_token_time − arrival_time.
- E2EL (end-to-end latency, 端到端延迟; the source chapter's TTLT) = time of the last token −
  arrival.
- TPOT (time per output token, 每 token 时间) = (E2EL − TTFT) / (n − 1): the mean gap after the
  first token. Undefined for n = 1; such a request is left out of TPOT's statistics (never
  counted as 0 or NaN). For goodput a request with no second token cannot break a TPOT SLO.
- ITL (inter-token latency, token 间延迟): every gap between consecutive tokens, pooled across
  all requests, so a long request weighs more than a short one (TPOT weighs each request once).
- throughput: completed requests / duration and output tokens / duration.
- goodput (有效吞吐): requests per second that met every SLO given (TTFT, TPOT, E2EL).

`summarize(outputs)` takes `RequestOutput`s of `llmlab.LLM` (or `Request`s, or `RequestMetrics`,
or `Timeline`s written by hand, or the records of a raw trace) and returns mean / median / p90 /
p99 of each metric. Units: seconds; only `BenchmarkSummary.table()` prints milliseconds.

A raw *trace* is what a streaming client writes down before any metric: per request a dict
`{"sent": t, "scheduled": t or None, "chunks": [(arrival time, tokens it carried), ...], "ok":
bool}` (`trace_of` makes one from finished requests). `summarize(trace, ..., metrics_fn=f)` lets
another function compute the per-request metrics and the goodput from it (chapter 10's build
exercise plugs the student's in there) while the statistics and the table stay this module's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Sequence

import numpy as np

from llmlab.i18n import tr
from llmlab.utils import format_table

PERCENTILES = (50, 90, 99)
SLO_KEYS = ("ttft", "tpot", "e2el")


@dataclass(frozen=True)
class Timeline:
    """One request's timestamps (seconds, any common clock). `token_times`: one per output token.

    A client that reads a stream sees chunks, not tokens: `token_times` then holds one time per
    chunk and `num_tokens` the output length the server reported (`usage.completion_tokens`),
    as in vLLM's client: TPOT divides by the tokens, ITL is the gaps between chunks.
    """

    arrival_time: float
    token_times: tuple[float, ...]
    num_prompt_tokens: int = 0
    first_scheduled_time: float | None = None
    finished_time: float | None = None
    num_tokens: int | None = None  # output tokens, when a time may stand for several

    def __post_init__(self) -> None:
        times = tuple(float(t) for t in self.token_times)
        object.__setattr__(self, "token_times", times)
        if not times:
            raise ValueError(
                "Timeline.token_times must hold at least one time (a request "
                "that produced no token has no TTFT)"
            )
        if times[0] < self.arrival_time:
            raise ValueError(
                f"Timeline: first token at {times[0]} is before arrival at {self.arrival_time}"
            )
        if any(b < a for a, b in zip(times, times[1:])):
            raise ValueError(f"Timeline.token_times must be non-decreasing, got {list(times)}")
        if self.num_tokens is not None and (
            not isinstance(self.num_tokens, int) or self.num_tokens < len(times)
        ):
            raise ValueError(
                f"Timeline.num_tokens must be an int >= len(token_times)="
                f"{len(times)} (each time stands for at least one token), "
                f"got {self.num_tokens!r}"
            )

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_times) if self.num_tokens is None else self.num_tokens

    @property
    def ttft(self) -> float:
        return self.token_times[0] - self.arrival_time

    @property
    def e2el(self) -> float:
        """Arrival to last token (the source chapter's TTLT)."""
        return self.token_times[-1] - self.arrival_time

    @property
    def tpot(self) -> float | None:
        """(E2EL − TTFT) / (n − 1); None when there is a single output token."""
        n = self.num_output_tokens
        return None if n < 2 else (self.e2el - self.ttft) / (n - 1)

    @property
    def itls(self) -> list[float]:
        """The gaps between consecutive tokens (n − 1 of them; between chunks if streamed)."""
        return [b - a for a, b in zip(self.token_times, self.token_times[1:])]

    @property
    def queue_time(self) -> float | None:
        """Arrival to first scheduling (waiting in the queue), when the engine recorded it."""
        if self.first_scheduled_time is None:
            return None
        return self.first_scheduled_time - self.arrival_time


def timeline_of(item: Any) -> Timeline:
    """A `Timeline` from a RequestOutput / Request (with `.metrics`), a RequestMetrics, a Timeline,
    or a successful record of a raw trace (see `trace_of`)."""
    if isinstance(item, Timeline):
        return item
    if isinstance(item, dict):
        return _timeline_of_record(item)
    metrics = getattr(item, "metrics", item)
    if not hasattr(metrics, "arrival_time") or not hasattr(metrics, "token_times"):
        raise ValueError(
            f"expected a RequestOutput, Request, RequestMetrics or Timeline, got "
            f"{type(item).__name__} (no .metrics.arrival_time / .token_times)"
        )
    times = list(metrics.token_times or [])
    if not times and getattr(metrics, "first_token_time", None) is not None:
        times = [metrics.first_token_time]
    prompt = getattr(item, "prompt_token_ids", None)
    return Timeline(
        arrival_time=float(metrics.arrival_time),
        token_times=tuple(times),
        num_prompt_tokens=len(prompt) if prompt is not None else 0,
        first_scheduled_time=getattr(metrics, "first_scheduled_time", None),
        finished_time=getattr(metrics, "finished_time", None),
    )


@dataclass(frozen=True)
class Stats:
    """mean, median, p90, p99 (and count) of one metric; all None when there are no values."""

    count: int
    mean: float | None
    median: float | None
    p90: float | None
    p99: float | None
    std: float | None

    @classmethod
    def of(cls, values: Iterable[float]) -> "Stats":
        v = np.asarray([x for x in values if x is not None], dtype=np.float64)
        if v.size == 0:
            return cls(0, None, None, None, None, None)
        # numpy's default (linear interpolation between order statistics), as vLLM uses
        p50, p90, p99 = (float(np.percentile(v, q)) for q in PERCENTILES)
        return cls(int(v.size), float(v.mean()), p50, p90, p99, float(v.std()))


@dataclass(frozen=True)
class BenchmarkSummary:
    """Everything `summarize` computes. Times in seconds, throughputs per second."""

    num_requests: int
    duration: float
    total_input_tokens: int
    total_output_tokens: int
    request_throughput: float
    output_throughput: float
    total_token_throughput: float
    ttft: Stats
    tpot: Stats
    itl: Stats
    e2el: Stats
    slo: dict[str, float] | None = None
    num_good: int | None = None
    goodput: float | None = None  # good requests per second (None without an SLO)
    timelines: tuple[Timeline, ...] = field(default=(), repr=False)

    def table(self) -> str:
        """A printable table (milliseconds), one row per latency metric."""
        n, seconds = self.num_requests, self.duration
        req_s, tok_s = self.request_throughput, self.output_throughput
        title = tr(
            f"requests {n}, duration {seconds:.2f} s, {req_s:.2f} req/s, {tok_s:.1f} output tok/s",
            f"{n} 个请求，历时 {seconds:.2f} s，{req_s:.2f} req/s，输出 {tok_s:.1f} tok/s",
        )
        if self.goodput is not None:
            title += tr(
                f", goodput {self.goodput:.2f} req/s ({self.num_good} met the SLO)",
                f"，goodput {self.goodput:.2f} req/s（{self.num_good} 个达到 SLO）",
            )
        rows = []
        for name in ("ttft", "tpot", "itl", "e2el"):
            s: Stats = getattr(self, name)
            cells = [
                "—" if x is None else f"{x * 1e3:.1f}" for x in (s.mean, s.median, s.p90, s.p99)
            ]
            rows.append([name.upper(), s.count, *cells])
        headers = [
            tr("metric", "指标"),
            "n",
            tr("mean ms", "平均 ms"),
            tr("median ms", "中位数 ms"),
            "p90 ms",
            "p99 ms",
        ]
        return title + "\n" + format_table(rows, headers, rule=False)

    def __str__(self) -> str:
        return self.table()


def _check_slo(slo: dict[str, float] | None) -> dict[str, float] | None:
    if slo is None:
        return None
    if not isinstance(slo, dict) or not slo:
        raise ValueError(
            f"slo must be a non-empty dict with keys from {SLO_KEYS} (seconds), got {slo!r}"
        )
    for k, v in slo.items():
        if k not in SLO_KEYS:
            raise ValueError(f"slo key {k!r} is not one of {SLO_KEYS}")
        if not isinstance(v, (int, float)) or not v > 0:
            raise ValueError(f"slo[{k!r}] must be a positive number of seconds, got {v!r}")
    return dict(slo)


def meets_slo(t: Timeline, slo: dict[str, float]) -> bool:
    """True when the request met every target in `slo` (seconds). No TPOT (one token) passes TPOT."""
    values = {"ttft": t.ttft, "tpot": t.tpot, "e2el": t.e2el}
    return all(values[k] is None or values[k] <= limit for k, limit in slo.items())


def summarize(
    outputs: Sequence[Any],
    duration: float | None = None,
    slo: dict[str, float] | None = None,
    *,
    metrics_fn: Callable[..., dict] | None = None,
) -> BenchmarkSummary:
    """TTFT / TPOT / ITL / E2EL statistics, throughput and goodput of finished requests.

    `duration`: the benchmark's wall time in seconds; default first arrival → last token.
    `slo`: e.g. {"ttft": 0.5, "tpot": 0.05} (seconds); goodput counts requests meeting all.
    Records of a raw trace that failed (`"ok": False`) are left out, as vLLM's client does.
    `metrics_fn(trace, slo, duration)`, when given, computes the per-request metrics and the
    goodput instead of this module, from the raw trace of `outputs` (`trace_of`, failed records
    included; `slo` {} when there is none): it returns {"ttft", "tpot", "itl", "e2el"}, one entry
    per successful request (TPOT None without a second token, ITL a list of gaps), and
    "goodput" (requests/s); the statistics of the summary are then taken over its values.
    """
    timelines = [timeline_of(o) for o in outputs if not (isinstance(o, dict) and _failed(o))]
    if not timelines:
        raise ValueError("outputs must hold at least one finished request, got none")
    slo = _check_slo(slo)
    if duration is None:
        duration = max(t.token_times[-1] for t in timelines) - min(
            t.arrival_time for t in timelines
        )
    if not isinstance(duration, (int, float)) or not duration > 0 or math.isinf(duration):
        raise ValueError(f"duration must be a positive number of seconds, got {duration!r}")
    n_in = sum(t.num_prompt_tokens for t in timelines)
    n_out = sum(t.num_output_tokens for t in timelines)
    num_good = sum(meets_slo(t, slo) for t in timelines) if slo else None
    per_request = {
        "ttft": [t.ttft for t in timelines],
        "tpot": [t.tpot for t in timelines],  # one-token requests drop out of the stats
        "itl": [t.itls for t in timelines],  # pooled over every request below
        "e2el": [t.e2el for t in timelines],
    }
    goodput = None if slo is None else num_good / duration
    if metrics_fn is not None:
        per_request, goodput = _from_metrics_fn(
            metrics_fn, trace_of(outputs), slo, float(duration), len(timelines)
        )
        num_good = None if slo is None else round(goodput * duration)
    return BenchmarkSummary(
        num_requests=len(timelines),
        duration=float(duration),
        total_input_tokens=n_in,
        total_output_tokens=n_out,
        request_throughput=len(timelines) / duration,
        output_throughput=n_out / duration,
        total_token_throughput=(n_in + n_out) / duration,
        ttft=Stats.of(per_request["ttft"]),
        tpot=Stats.of(per_request["tpot"]),
        itl=Stats.of(g for gaps in per_request["itl"] for g in gaps),
        e2el=Stats.of(per_request["e2el"]),
        slo=slo,
        num_good=num_good,
        goodput=goodput,
        timelines=tuple(timelines),
    )


def _from_metrics_fn(
    metrics_fn: Callable[..., dict],
    trace: list[dict[str, Any]],
    slo: dict[str, float] | None,
    duration: float,
    num_ok: int,
) -> tuple[dict[str, list], float | None]:
    """The per-request values and goodput `metrics_fn` computes, checked for shape."""
    got = metrics_fn(trace, dict(slo or {}), duration)
    expected = f"one entry per successful request ({num_ok})"
    if not isinstance(got, dict):
        raise ValueError(
            f"metrics_fn must return a dict with 'ttft', 'tpot', 'itl', 'e2el' and 'goodput', "
            f"got {type(got).__name__}"
        )
    per_request = {}
    for key in ("ttft", "tpot", "itl", "e2el"):
        values = got.get(key)
        if not isinstance(values, (list, tuple)) or len(values) != num_ok:
            raise ValueError(f"metrics_fn's {key!r} must be a list with {expected}, got {values!r}")
        per_request[key] = list(values)
    if not all(isinstance(gaps, (list, tuple)) for gaps in per_request["itl"]):
        raise ValueError("metrics_fn's 'itl' must hold a list of gaps for each request")
    goodput = got.get("goodput")
    if slo is not None and (isinstance(goodput, bool) or not isinstance(goodput, (int, float))):
        raise ValueError(f"metrics_fn's 'goodput' must be a number of requests/s, got {goodput!r}")
    return per_request, None if slo is None else float(goodput)


# --- raw traces ------------------------------------------------------------------------------

TRACE_KEYS = ("sent", "scheduled", "chunks", "ok")


def _failed(record: dict[str, Any]) -> bool:
    _check_record(record)
    return not record["ok"]


def _check_record(record: dict[str, Any]) -> None:
    if set(record) != set(TRACE_KEYS):
        raise ValueError(
            f"a trace record must have exactly the keys {TRACE_KEYS}, got {sorted(record)}"
        )
    chunks = record["chunks"]
    if not isinstance(chunks, (list, tuple)) or not all(
        isinstance(c, (list, tuple)) and len(c) == 2 for c in chunks
    ):
        raise ValueError(f"a trace record's chunks must be (time, tokens) pairs, got {chunks!r}")
    if any(isinstance(k, bool) or not isinstance(k, int) or k < 1 for _, k in chunks):
        raise ValueError(f"each chunk carries an int >= 1 of tokens, got {chunks!r}")


def _timeline_of_record(record: dict[str, Any]) -> Timeline:
    if _failed(record):
        raise ValueError("a failed request (ok False) has no timeline; summarize leaves it out")
    return Timeline(
        arrival_time=float(record["sent"]),
        token_times=tuple(t for t, _ in record["chunks"]),
        first_scheduled_time=record["scheduled"],
        num_tokens=sum(k for _, k in record["chunks"]),
    )


def trace_of(outputs: Sequence[Any]) -> list[dict[str, Any]]:
    """The raw trace of `outputs`, as a streaming client writes it down: one dict per request,
    {"sent": arrival time, "scheduled": first scheduled time (None when not recorded), "chunks":
    [(arrival time, tokens it carried), ...], "ok": True}. Tokens stamped at the same time (one
    engine step, e.g. accepted drafts) make one chunk, as the server would stream them; a
    Timeline's tokens beyond its times (`num_tokens`) go to its last chunk. Trace records are
    passed through (failed ones too)."""
    trace = []
    for item in outputs:
        if isinstance(item, dict):
            _check_record(item)
            trace.append(item)
            continue
        t = timeline_of(item)
        chunks: list[tuple[float, int]] = []
        for time in t.token_times:
            if chunks and chunks[-1][0] == time:
                chunks[-1] = (time, chunks[-1][1] + 1)
            else:
                chunks.append((time, 1))
        extra = t.num_output_tokens - len(t.token_times)
        chunks[-1] = (chunks[-1][0], chunks[-1][1] + extra)
        trace.append(
            {
                "sent": t.arrival_time,
                "scheduled": t.first_scheduled_time,
                "chunks": chunks,
                "ok": True,
            }
        )
    return trace


def cdf(values: Iterable[float]) -> tuple[np.ndarray, np.ndarray]:
    """Empirical CDF: sorted values and the fraction of values ≤ each (for latency plots)."""
    x = np.sort(np.asarray([v for v in values if v is not None], dtype=np.float64))
    return x, np.arange(1, x.size + 1) / max(x.size, 1)


# --- arrival processes ---------------------------------------------------------------------


def arrival_times(
    num_requests: int, rate: float, burstiness: float = 1.0, seed: int = 0
) -> np.ndarray:
    """Arrival offsets (seconds from the start) of `num_requests` requests at `rate` req/s.

    Gaps are gamma-distributed with shape = `burstiness` and mean 1/rate (scale =
    1 / (rate · burstiness)), as in vLLM's benchmark client: burstiness 1 is a Poisson process
    (exponential gaps), < 1 burstier, > 1 more regular. The first request arrives at 0.
    rate = inf sends everything at once.
    """
    if not isinstance(num_requests, int) or num_requests < 1:
        raise ValueError(f"num_requests must be an int >= 1, got {num_requests!r}")
    if not isinstance(rate, (int, float)) or not rate > 0:
        raise ValueError(f"rate must be > 0 requests/s (inf allowed), got {rate!r}")
    if not isinstance(burstiness, (int, float)) or not 0 < burstiness < math.inf:
        raise ValueError(f"burstiness must be a finite number > 0, got {burstiness!r}")
    if math.isinf(rate):
        return np.zeros(num_requests)
    rng = np.random.default_rng(seed)
    gaps = rng.gamma(shape=burstiness, scale=1.0 / (rate * burstiness), size=num_requests - 1)
    return np.concatenate([[0.0], np.cumsum(gaps)])


# --- driving the engine with arrivals --------------------------------------------------------


def run_with_arrivals(
    engine: Any,
    prompts: Sequence[Any],
    params: Any,
    arrivals: Sequence[float],
    *,
    max_seconds: float = 600.0,
) -> tuple[list, float]:
    """Feed `prompts` to an `LLMEngine` at `arrivals` (offsets, s) in real time; step until done.

    Each request is added when the wall clock passes its arrival offset, with
    `arrival_time` = the scheduled arrival, so TTFT includes any time it waited for the engine
    to finish the step in progress (as a client's would). Returns (finished outputs, duration).
    """
    import time

    if len(prompts) != len(arrivals):
        raise ValueError(
            f"arrivals must have one entry per prompt ({len(prompts)}), got {len(arrivals)}"
        )
    order = sorted(range(len(prompts)), key=lambda i: arrivals[i])
    params_list = params if isinstance(params, (list, tuple)) else [params] * len(prompts)
    finished: dict[str, Any] = {}
    start = time.perf_counter()
    nxt = 0
    while len(finished) < len(prompts):
        now = time.perf_counter()
        if now - start > max_seconds:
            raise RuntimeError(f"benchmark did not finish within max_seconds={max_seconds}")
        while nxt < len(order) and arrivals[order[nxt]] <= now - start:
            i = order[nxt]
            engine.add_request(
                f"req-{i}", prompts[i], params_list[i], arrival_time=start + float(arrivals[i])
            )
            nxt += 1
        if engine.has_unfinished_requests():
            for out in engine.step():
                if getattr(out, "finished", False):
                    finished[out.request_id] = out
        elif nxt < len(order):
            time.sleep(max(0.0, start + arrivals[order[nxt]] - time.perf_counter()))
    duration = time.perf_counter() - start
    return [finished[f"req-{i}"] for i in range(len(prompts))], duration
