"""Serving-metric plots (latency CDFs, request timelines, percentiles vs load, the
throughput–latency curve) and an arrival process explorer (rate, burstiness → arrival times),
all from `llmlab.analysis.metrics` (serving on a GPU preset, priced: `widgets.serving`).

`arrivals_text(...)` gives a line "<n> arrivals at <r> req/s, burstiness <b>: mean gap <g> s,
CV <c>" (`ARRIVALS_TEXT_PATTERN` reads the English line; the Chinese one holds the same numbers).
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from llmlab.analysis import metrics
from llmlab.course.check.catalog import catalog
from llmlab.course.figures._axes import finish
from llmlab.course.widgets._show import controls_of, explorer
from llmlab.i18n import notebook_text

M = catalog("widgets.metrics")

ARRIVALS_TEXT_PATTERN = re.compile(
    r"(\d+) arrivals at ([0-9.]+) req/s, burstiness ([0-9.]+): mean gap ([0-9.]+) s, CV ([0-9.]+)"
)
METRIC_LABELS = {"ttft": "TTFT", "tpot": "TPOT", "itl": "ITL", "e2el": "E2EL"}


def _unit(seconds: float) -> tuple[float, str]:
    """(scale, unit) that keeps tick labels short: ms below 10 s, s above."""
    return (1.0, "s") if seconds >= 10 else (1e3, "ms")


def _check_metric(metric: str) -> None:
    if metric not in METRIC_LABELS:
        raise ValueError(M("values.metric_must_one", metrics=sorted(METRIC_LABELS), metric=metric))


def _scaled(values: list[float | None], scale: float) -> list[float]:
    """`values` times `scale`, a missing one (None) as NaN so a line skips it."""
    return [np.nan if v is None else v * scale for v in values]


def _plot_percentiles(
    ax: Any,
    summaries: dict[float, metrics.BenchmarkSummary],
    metric: str,
    lines: tuple[tuple[str, str, str], ...],
) -> None:
    """`metric` against the request rate on `ax`: a line per (statistic, style, label), y in
    ms below 10 s."""
    _check_metric(metric)
    rates = sorted(summaries)
    scale, unit = _unit(max((getattr(summaries[r], metric).p99 or 0.0) for r in rates))
    for field, style, label in lines:
        ys = [getattr(getattr(summaries[r], metric), field) for r in rates]
        ax.plot(rates, _scaled(ys, scale), style, label=label)
    ax.set_ylabel(f"{METRIC_LABELS[metric]} ({unit})")
    ax.grid(alpha=0.3)


def _values(summary: metrics.BenchmarkSummary, metric: str) -> list[float]:
    _check_metric(metric)
    if metric == "itl":
        return [g for t in summary.timelines for g in t.itls]
    return [v for v in (getattr(t, metric) for t in summary.timelines) if v is not None]


def plot_latency_cdfs(
    summaries: dict[str, metrics.BenchmarkSummary],
    metrics_to_plot: tuple[str, ...] = ("ttft", "tpot", "e2el"),
    title: str | None = None,
) -> Any:
    """One panel per metric, one CDF per labelled run (e.g. per request rate); x in ms. `title`
    by default "latency CDFs (measured)"."""
    import matplotlib.pyplot as plt

    # a title a notebook cell wrote, in the language in use
    title = M("plot_latency_cdfs.latency_cdfs_measured") if title is None else notebook_text(title)
    fig, axes = plt.subplots(1, len(metrics_to_plot), figsize=(4.2 * len(metrics_to_plot), 3.6))
    axes = np.atleast_1d(axes)
    for ax, metric in zip(axes, metrics_to_plot):
        top = max((max(_values(s, metric), default=0.0) for s in summaries.values()), default=0.0)
        scale, unit = _unit(top)
        for label, s in summaries.items():
            x, y = metrics.cdf(_values(s, metric))
            if x.size:
                ax.step(x * scale, y, where="post", label=label)
        ax.set_xlabel(f"{METRIC_LABELS[metric]} ({unit})")
        ax.set_ylabel(
            M("plot_latency_cdfs.fraction_requests")
            if metric != "itl"
            else M("plot_latency_cdfs.fraction_gaps")
        )
        ax.set_ylim(0, 1.02)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig


def plot_percentiles_vs_rate(
    summaries: dict[float, metrics.BenchmarkSummary], metric: str = "ttft", title: str | None = None
) -> Any:
    """Mean, p50, p90, p99 of one metric against the request rate (x: req/s, y: ms)."""
    import matplotlib.pyplot as plt

    title = notebook_text(title)  # a title a notebook cell wrote, in the language in use

    fig, ax = plt.subplots(figsize=(6, 3.6))
    lines = (
        ("mean", "o-", M("plot_percentiles_vs_rate.mean")),
        ("median", "s--", "p50"),
        ("p90", "^-.", "p90"),
        ("p99", "v:", "p99"),
    )
    _plot_percentiles(ax, summaries, metric, lines)
    ax.set_xlabel(M("plot_percentiles_vs_rate.request_rate_req"))
    ax.set_title(
        title or M("plot_percentiles_vs_rate.vs_offered_load", metric_label=METRIC_LABELS[metric])
    )
    ax.legend()
    fig.tight_layout()
    return fig


def plot_request_timelines(
    summary: metrics.BenchmarkSummary, max_requests: int = 16, title: str | None = None
) -> Any:
    """A row per request: waiting for the first token (TTFT) then the decode phase, token ticks;
    `title` by default "request timelines (measured)"."""
    import matplotlib.pyplot as plt

    # a title a notebook cell wrote, in the language in use
    title = (
        M("plot_request_timelines.request_timelines_measured")
        if title is None
        else notebook_text(title)
    )
    ts = sorted(summary.timelines, key=lambda t: t.arrival_time)[:max_requests]
    t0 = min(t.arrival_time for t in ts)
    scale, unit = _unit(max(t.token_times[-1] for t in ts) - t0)
    fig, ax = plt.subplots(figsize=(8, 1.0 + 0.3 * len(ts)))
    for row, t in enumerate(ts):
        a = (t.arrival_time - t0) * scale
        first = (t.token_times[0] - t0) * scale
        last = (t.token_times[-1] - t0) * scale
        ax.barh(row, first - a, left=a, color="#f59e0b", label="TTFT" if row == 0 else None)
        ax.barh(
            row,
            last - first,
            left=first,
            color="#2563eb",
            label=M("plot_request_timelines.decode_n_1") if row == 0 else None,
        )
        ax.plot(
            [(x - t0) * scale for x in t.token_times],
            [row] * t.num_output_tokens,
            "|",
            color="white",
            markersize=6,
        )
    ax.set_yticks(
        range(len(ts)), [M("plot_request_timelines.req", i=i) for i in range(len(ts))], fontsize=7
    )
    ax.invert_yaxis()
    ax.set_xlabel(M("plot_request_timelines.time_since_first", unit=unit))
    ax.set_title(title)
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
    fig.tight_layout()
    return fig


def arrivals_text(
    rate: float = 2.0, burstiness: float = 1.0, num_requests: int = 200, seed: int = 0
) -> str:
    """Mean gap and coefficient of variation of the generated arrivals."""
    gaps = np.diff(metrics.arrival_times(num_requests, rate, burstiness, seed))
    return M(
        "arrivals_text.arrivals_req_s",
        num_requests=num_requests,
        rate=rate,
        burstiness=burstiness,
        gaps_mean=gaps.mean(),
        cv=gaps.std() / gaps.mean(),
        v_1_rate=1 / rate,
        cv_expected=1 / np.sqrt(burstiness),
    )


def plot_arrivals(
    rate: float = 2.0, burstiness: float = 1.0, num_requests: int = 200, seed: int = 0
) -> Any:
    """Arrival instants on a time line and the histogram of gaps, against Poisson's."""
    import matplotlib.pyplot as plt

    arr = metrics.arrival_times(num_requests, rate, burstiness, seed)
    pois = metrics.arrival_times(num_requests, rate, 1.0, seed)
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 3.2), gridspec_kw={"width_ratios": [3, 2]})
    a1.eventplot([pois, arr], lineoffsets=[1, 0], colors=["#9ca3af", "#2563eb"], linelengths=0.8)
    a1.set_yticks(
        [0, 1],
        [
            M("plot_arrivals.burstiness", burstiness=burstiness),
            M("plot_arrivals.poisson_1"),
        ],
    )
    a1.set_xlabel(M("plot_arrivals.arrival_time_s"))
    a1.set_title(M("plot_arrivals.requests_req_s", num_requests=num_requests, rate=rate))
    gaps = np.diff(arr)
    a2.hist(
        gaps,
        bins=30,
        density=True,
        color="#2563eb",
        alpha=0.7,
        label=M("plot_arrivals.gaps_drawn"),
    )
    x = np.linspace(0, max(gaps.max(), 1e-9), 200)
    a2.plot(
        x,
        rate * np.exp(-rate * x),
        "k--",
        label=M("plot_arrivals.exponential_poisson"),
    )
    return finish(
        a2, M("plot_arrivals.gap_between_arrivals"), M("plot_arrivals.density_1_s"), legend=8
    )


def arrival_explorer(
    rate: float = 2.0, burstiness: float = 1.0, num_requests: int = 200, seed: int = 0
) -> Any:
    """Sliders for request rate and burstiness; the arrival plot and summary line update."""
    start = {"rate": rate, "burstiness": burstiness, "num_requests": num_requests}
    table = {
        "rate": ("FloatLogSlider", M("arrival_explorer.rate_req_s"), -1, 2, 0.05),  # 0.1 to 100
        "burstiness": ("FloatLogSlider", M("arrival_explorer.burstiness"), -1, 1, 0.05),
        "num_requests": ("IntSlider", M("arrival_explorer.requests"), 20, 1000, 20),
    }
    controls = controls_of(table, start, "90px")
    return explorer(
        controls,
        [("rate", "burstiness", "num_requests")],
        "llmlab-arrivals-result",
        arrivals_text,
        plot_arrivals,
        fixed={"seed": seed},
    )


def plot_latency_vs_load(
    summaries: dict[float, metrics.BenchmarkSummary],
    metrics_to_plot: tuple[str, ...] = ("ttft", "tpot"),
    title: str | None = None,
) -> Any:
    """One panel per metric: p50, p90 and p99 against the request rate (x: req/s, y: ms); `title`
    by default "latency percentiles vs offered load (measured)"."""
    import matplotlib.pyplot as plt

    # a title a notebook cell wrote, in the language in use
    title = (
        M("plot_latency_vs_load.latency_percentiles_vs") if title is None else notebook_text(title)
    )
    fig, axes = plt.subplots(1, len(metrics_to_plot), figsize=(4.6 * len(metrics_to_plot), 3.6))
    for ax, metric in zip(np.atleast_1d(axes), metrics_to_plot):
        lines = (("median", "o-", "p50"), ("p90", "s--", "p90"), ("p99", "^:", "p99"))
        _plot_percentiles(ax, summaries, metric, lines)
        ax.set_xlabel(M("plot_latency_vs_load.offered_request_rate"))
        ax.legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig


def plot_throughput_latency(
    curves: dict[str, dict[float, metrics.BenchmarkSummary]],
    metric: str = "tpot",
    title: str | None = None,
) -> Any:
    """Output tokens/s against the median (filled) and p99 (hollow) of `metric`, one line per
    system (e.g. "over HTTP", "in process"), one point per request rate, labelled; `title` by
    default "throughput–latency curve (measured)"."""
    import matplotlib.pyplot as plt

    title = notebook_text(title)  # a title a notebook cell wrote, in the language in use

    _check_metric(metric)
    if title is None:
        title = M("plot_throughput_latency.throughput_latency_curve")
    top = max((getattr(s, metric).p99 or 0.0) for c in curves.values() for s in c.values())
    scale, unit = _unit(top)
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    for (label, curve), color in zip(
        curves.items(), plt.rcParams["axes.prop_cycle"].by_key()["color"]
    ):
        rates = sorted(curve)
        x = [curve[r].output_throughput for r in rates]
        med = [getattr(curve[r], metric).median for r in rates]
        p99 = [getattr(curve[r], metric).p99 for r in rates]
        ax.plot(
            x,
            _scaled(med, scale),
            "o-",
            color=color,
            label=M("plot_throughput_latency.p50", label=label),
        )
        ax.plot(
            x,
            _scaled(p99, scale),
            "o--",
            color=color,
            mfc="none",
            label=M("plot_throughput_latency.p99", label=label),
        )
        for r, xi, yi in zip(rates, x, med):
            if yi is not None:
                ax.annotate(
                    f"{r:.2g}/s",
                    (xi, yi * scale),
                    fontsize=7,
                    xytext=(3, 3),
                    textcoords="offset points",
                    color=color,
                )
    ax.set_xlabel(M("plot_throughput_latency.output_throughput_tokens"))
    ax.set_ylabel(f"{METRIC_LABELS[metric]} ({unit})")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig
