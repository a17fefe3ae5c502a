"""`/metrics`: the server's counters and histograms in Prometheus' text format.

Names are vLLM V1's (`vllm/v1/metrics/loggers.py`) where vLLM has one, so a dashboard built for
vLLM reads llmlab too; each carries the label `model_name`. Gauges (running, waiting, KV usage)
are read from `LLMEngine.stats()` taken between steps; counters and histograms are fed by the
async engine loop as tokens come out and requests finish. Latencies here are the server's own
(arrival in the engine → token), not the client's: a benchmark client adds the network.

Written by hand rather than with `prometheus_client`: the format is a few lines of text, and a
registry object per server keeps two servers in one process (tests) apart.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Any

# vLLM's buckets (seconds) for request latencies and for the gaps between tokens
LATENCY_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
)
ITL_BUCKETS = (
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
)
FINISHED_REASONS = ("stop", "length", "abort", "error")


@dataclass
class Histogram:
    """Cumulative-bucket histogram: counts of observations ≤ each upper bound, sum and count."""

    buckets: tuple[float, ...]
    counts: list[int] = field(default_factory=list)
    total: float = 0.0
    count: int = 0

    def __post_init__(self) -> None:
        self.counts = [0] * (len(self.buckets) + 1)  # the last one is +Inf

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, value)] += 1
        self.total += value
        self.count += 1

    def lines(self, name: str, labels: str) -> list[str]:
        out, running = [], 0
        for le, c in zip([*map(repr, self.buckets), "+Inf"], self.counts):
            running += c
            out.append(f'{name}_bucket{{{labels},le="{le}"}} {running}')
        out += [f"{name}_sum{{{labels}}} {self.total!r}", f"{name}_count{{{labels}}} {self.count}"]
        return out


class ServerMetrics:
    """What `/metrics` reports for one served model."""

    HISTOGRAMS = {
        "vllm:time_to_first_token_seconds": ("Time to first token in seconds.", LATENCY_BUCKETS),
        "vllm:inter_token_latency_seconds": (
            "Time between consecutive output tokens in seconds.",
            ITL_BUCKETS,
        ),
        "vllm:e2e_request_latency_seconds": (
            "End to end request latency in seconds.",
            LATENCY_BUCKETS,
        ),
        "vllm:request_queue_time_seconds": (
            "Time from arrival to first scheduling in seconds.",
            LATENCY_BUCKETS,
        ),
    }

    def __init__(self, model_name: str) -> None:
        self.labels = f'model_name="{model_name}"'
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.finished = {reason: 0 for reason in FINISHED_REASONS}
        self.rejected_queue_full = 0
        self.client_disconnects: dict[str, int] = {}  # kind -> clients that left early
        self.grammars_refused: dict[str, int] = {}  # why -> grammars refused or stopped
        self.hist = {name: Histogram(b) for name, (_, b) in self.HISTOGRAMS.items()}

    # ---- fed by the engine loop -----------------------------------------------------------

    def on_tokens(
        self, num_new: int, first: bool, num_prompt_tokens: int, metrics: Any = None
    ) -> None:
        """New tokens of a request; on its first, TTFT is recorded (as vLLM does: a request
        aborted later still counts)."""
        self.generation_tokens += num_new
        if first:
            self.prompt_tokens += num_prompt_tokens
            if metrics is not None and metrics.first_token_time is not None:
                self.hist["vllm:time_to_first_token_seconds"].observe(
                    metrics.first_token_time - metrics.arrival_time
                )

    def on_finished(self, reason: str, metrics: Any) -> None:
        """A request ended ("stop" | "length" | "abort" | "error"); `metrics`: its
        RequestMetrics."""
        self.finished[reason] = self.finished.get(reason, 0) + 1
        if reason == "abort" or metrics is None or not metrics.token_times:
            return
        times = metrics.token_times
        itl = self.hist["vllm:inter_token_latency_seconds"]
        for a, b in zip(times, times[1:]):
            itl.observe(b - a)
        self.hist["vllm:e2e_request_latency_seconds"].observe(times[-1] - metrics.arrival_time)
        if metrics.first_scheduled_time is not None:
            self.hist["vllm:request_queue_time_seconds"].observe(
                metrics.first_scheduled_time - metrics.arrival_time
            )

    # ---- the text format ------------------------------------------------------------------

    def _by_label_lines(self) -> list[str]:
        """The counters kept per label value: finish reasons, disconnects, refused grammars."""
        lb = self.labels
        lines: list[str] = []
        for name, help_, label, counts in (
            (
                "vllm:request_success_total",
                "Count of finished requests by finish reason.",
                "finished_reason",
                self.finished,
            ),
            (
                "llmlab:client_disconnects_total",
                "Clients that left before their answer, by when they left.",
                "kind",
                self.client_disconnects,
            ),
            (
                "llmlab:grammars_refused_total",
                "Grammars refused or stopped because they cost too much, by why.",
                "why",
                self.grammars_refused,
            ),
        ):
            lines += [f"# HELP {name} {help_}", f"# TYPE {name} counter"]
            lines += [f'{name}{{{lb},{label}="{k}"}} {n}' for k, n in counts.items()]
        return lines

    def render(self, stats: dict[str, Any], queued: int = 0) -> str:
        """Prometheus text exposition (format 0.0.4) from the counters and an engine snapshot."""
        lb = self.labels
        lines: list[str] = []

        def metric(name: str, kind: str, help_: str, value: float) -> None:
            lines.extend(
                [f"# HELP {name} {help_}", f"# TYPE {name} {kind}", f"{name}{{{lb}}} {value}"]
            )

        metric(
            "vllm:num_requests_running",
            "gauge",
            "Number of requests in model execution batches.",
            stats["running"],
        )
        metric(
            "vllm:num_requests_waiting",
            "gauge",
            "Number of requests waiting to be processed.",
            stats["waiting"] + queued,
        )
        metric(
            "vllm:kv_cache_usage_perc",
            "gauge",
            "KV-cache usage. 1 means 100 percent usage.",
            stats["kv_usage"],
        )
        metric(
            "llmlab:kv_cache_free_blocks", "gauge", "Free KV-cache blocks.", stats["free_blocks"]
        )
        metric(
            "llmlab:kv_cache_num_blocks",
            "gauge",
            "KV-cache blocks in the pool.",
            stats["num_kv_blocks"],
        )
        metric(
            "vllm:num_preemptions_total",
            "counter",
            "Cumulative number of preemptions.",
            stats["preemptions"],
        )
        metric(
            "vllm:prefix_cache_queries_total",
            "counter",
            "Prefix cache queries, in tokens.",
            stats["prefix_cache_queries"],
        )
        metric(
            "vllm:prefix_cache_hits_total",
            "counter",
            "Prefix cache hits, in tokens.",
            stats["prefix_cache_hits"],
        )
        metric(
            "vllm:prompt_tokens_total",
            "counter",
            "Number of prefill tokens processed.",
            self.prompt_tokens,
        )
        metric(
            "vllm:generation_tokens_total",
            "counter",
            "Number of generation tokens processed.",
            self.generation_tokens,
        )
        metric(
            "llmlab:requests_rejected_queue_full_total",
            "counter",
            "Requests answered 503 because the waiting queue was full.",
            self.rejected_queue_full,
        )
        if "spec_decode_num_drafts" in stats:  # an engine that speculates
            lines += _spec_decode_lines(stats, lb)
        lines += self._by_label_lines()
        for name, (help_, _) in self.HISTOGRAMS.items():
            lines += [f"# HELP {name} {help_}", f"# TYPE {name} histogram"]
            lines += self.hist[name].lines(name, lb)
        return "\n".join(lines) + "\n"


def _spec_decode_lines(stats: dict[str, Any], lb: str) -> list[str]:
    """vLLM's speculative-decoding counters, from an engine that speculates."""
    lines: list[str] = []

    def metric(name: str, help_: str, value: float) -> None:
        lines.extend(
            [f"# HELP {name} {help_}", f"# TYPE {name} counter", f"{name}{{{lb}}} {value}"]
        )

    metric(
        "vllm:spec_decode_num_drafts_total",
        "Number of spec decoding drafts.",
        stats["spec_decode_num_drafts"],
    )
    metric(
        "vllm:spec_decode_num_draft_tokens_total",
        "Number of draft tokens.",
        stats["spec_decode_num_draft_tokens"],
    )
    metric(
        "vllm:spec_decode_num_accepted_tokens_total",
        "Number of accepted tokens.",
        stats["spec_decode_num_accepted_tokens"],
    )
    name = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
    lines += [
        f"# HELP {name} Accepted tokens per draft position.",
        f"# TYPE {name} counter",
    ]
    lines += [
        f'{name}{{{lb},position="{i}"}} {n}'
        for i, n in enumerate(stats["spec_decode_num_accepted_tokens_per_pos"])
    ]
    return lines


def parse_prometheus(text: str) -> dict[str, float]:
    """`{'name{labels}': value}` from exposition text (for tests and the benchmark client)."""
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            out[key] = float(value)
    return out
