"""Serving-metric plots (latency CDFs, request timelines, percentiles vs load, the
throughput–latency curve) and an arrival
process explorer (rate, burstiness → arrival times), all from `llmlab.analysis.metrics`.

`arrivals_text(...)` gives a line "<n> arrivals at <r> req/s, burstiness <b>: mean gap <g> s,
CV <c>" (`ARRIVALS_TEXT_PATTERN` reads the English line; the Chinese one holds the same numbers).
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from llmlab.analysis import metrics
from llmlab.course.widgets._show import show_figure
from llmlab.i18n import notebook_text, tr

ARRIVALS_TEXT_PATTERN = re.compile(
    r"(\d+) arrivals at ([0-9.]+) req/s, burstiness ([0-9.]+): mean gap ([0-9.]+) s, CV ([0-9.]+)"
)
METRIC_LABELS = {"ttft": "TTFT", "tpot": "TPOT", "itl": "ITL", "e2el": "E2EL"}


def _unit(seconds: float) -> tuple[float, str]:
    """(scale, unit) that keeps tick labels short: ms below 10 s, s above."""
    return (1.0, "s") if seconds >= 10 else (1e3, "ms")


def _values(summary: metrics.BenchmarkSummary, metric: str) -> list[float]:
    if metric not in METRIC_LABELS:
        raise ValueError(
            tr(
                f"metric must be one of {sorted(METRIC_LABELS)}, got {metric!r}",
                f"metric 必须是 {sorted(METRIC_LABELS)} 之一，你给的是 {metric!r}",
            )
        )
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

    title = notebook_text(title)  # a title a notebook cell wrote, in the language in use

    if title is None:
        title = tr("latency CDFs (measured)", "延迟的 CDF（实测）")
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
            tr("fraction of requests", "请求的比例")
            if metric != "itl"
            else tr("fraction of gaps", "间隔的比例")
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

    rates = sorted(summaries)
    fig, ax = plt.subplots(figsize=(6, 3.6))
    scale, unit = _unit(max((getattr(summaries[r], metric).p99 or 0.0) for r in rates))
    for field, style in (("mean", "o-"), ("median", "s--"), ("p90", "^-."), ("p99", "v:")):
        ys = [getattr(getattr(summaries[r], metric), field) for r in rates]
        ax.plot(
            rates,
            [np.nan if y is None else y * scale for y in ys],
            style,
            label={"median": "p50", "mean": tr("mean", "平均值")}.get(field, field),
        )
    ax.set_xlabel(tr("request rate (req/s)", "请求速率（req/s）"))
    ax.set_ylabel(f"{METRIC_LABELS[metric]} ({unit})")
    ax.set_title(
        title
        or tr(
            f"{METRIC_LABELS[metric]} vs offered load (measured)",
            f"{METRIC_LABELS[metric]} 随负载的变化（实测）",
        )
    )
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    return fig


def plot_request_timelines(
    summary: metrics.BenchmarkSummary, max_requests: int = 16, title: str | None = None
) -> Any:
    """A row per request: waiting for the first token (TTFT) then the decode phase, token ticks;
    `title` by default "request timelines (measured)"."""
    import matplotlib.pyplot as plt

    title = notebook_text(title)  # a title a notebook cell wrote, in the language in use

    if title is None:
        title = tr("request timelines (measured)", "请求的时间线（实测）")
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
            label=tr("decode: (n−1)·TPOT", "decode：(n−1)·TPOT") if row == 0 else None,
        )
        ax.plot(
            [(x - t0) * scale for x in t.token_times],
            [row] * t.num_output_tokens,
            "|",
            color="white",
            markersize=6,
        )
    ax.set_yticks(range(len(ts)), [tr(f"req {i}", f"请求 {i}") for i in range(len(ts))], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel(
        tr(
            f"time since the first arrival ({unit}); ticks: output tokens",
            f"从第一个请求到达起的时间（{unit}）；刻线：输出的 token",
        )
    )
    ax.set_title(title)
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
    fig.tight_layout()
    return fig


def arrivals_text(
    rate: float = 2.0, burstiness: float = 1.0, num_requests: int = 200, seed: int = 0
) -> str:
    """Mean gap and coefficient of variation of the generated arrivals."""
    gaps = np.diff(metrics.arrival_times(num_requests, rate, burstiness, seed))
    return tr(
        f"{num_requests} arrivals at {rate:g} req/s, burstiness {burstiness:g}: mean gap "
        f"{gaps.mean():.3f} s, CV {gaps.std() / gaps.mean():.2f} "
        f"(expected: mean {1 / rate:.3f} s, CV {1 / np.sqrt(burstiness):.2f})",
        f"{num_requests} 个请求以 {rate:g} req/s 到达，突发性 {burstiness:g}：平均间隔 "
        f"{gaps.mean():.3f} s，CV {gaps.std() / gaps.mean():.2f}"
        f"（理论值：平均 {1 / rate:.3f} s，CV {1 / np.sqrt(burstiness):.2f}）",
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
            tr(f"burstiness {burstiness:g}", f"突发性 {burstiness:g}"),
            tr("Poisson (1)", "泊松（1）"),
        ],
    )
    a1.set_xlabel(tr("arrival time (s)", "到达时刻（s）"))
    a1.set_title(
        tr(f"{num_requests} requests at {rate:g} req/s", f"{num_requests} 个请求，{rate:g} req/s")
    )
    gaps = np.diff(arr)
    a2.hist(
        gaps,
        bins=30,
        density=True,
        color="#2563eb",
        alpha=0.7,
        label=tr("gaps drawn", "抽到的间隔"),
    )
    x = np.linspace(0, max(gaps.max(), 1e-9), 200)
    a2.plot(
        x,
        rate * np.exp(-rate * x),
        "k--",
        label=tr("exponential (Poisson)", "指数分布（泊松过程）"),
    )
    a2.set_xlabel(tr("gap between arrivals (s)", "到达间隔（s）"))
    a2.set_ylabel(tr("density (1/s)", "密度（1/s）"))
    a2.legend(fontsize=8)
    fig.tight_layout()
    return fig


def arrival_explorer(
    rate: float = 2.0, burstiness: float = 1.0, num_requests: int = 200, seed: int = 0
) -> Any:
    """Sliders for request rate and burstiness; the arrival plot and summary line update."""
    import ipywidgets as w

    style = {"description_width": "90px"}
    rate_w = w.FloatLogSlider(
        value=rate,
        base=10,
        min=-1,
        max=2,
        step=0.05,
        description=tr("rate (req/s)", "速率（req/s）"),
        style=style,
    )
    burst_w = w.FloatLogSlider(
        value=burstiness,
        base=10,
        min=-1,
        max=1,
        step=0.05,
        description=tr("burstiness", "突发性"),
        style=style,
    )
    n_w = w.IntSlider(
        value=num_requests,
        min=20,
        max=1000,
        step=20,
        description=tr("requests", "请求数"),
        style=style,
    )
    result = w.HTML()
    out = w.Output()

    def redraw(*_: Any) -> None:
        args = dict(rate=rate_w.value, burstiness=burst_w.value, num_requests=n_w.value, seed=seed)
        result.value = f'<pre class="llmlab-arrivals-result">{arrivals_text(**args)}</pre>'
        show_figure(out, plot_arrivals(**args))

    for c in (rate_w, burst_w, n_w):
        c.observe(redraw, names="value")
    redraw()
    return w.VBox([w.HBox([rate_w, burst_w, n_w]), result, out])


def plot_latency_vs_load(
    summaries: dict[float, metrics.BenchmarkSummary],
    metrics_to_plot: tuple[str, ...] = ("ttft", "tpot"),
    title: str | None = None,
) -> Any:
    """One panel per metric: p50, p90 and p99 against the request rate (x: req/s, y: ms); `title`
    by default "latency percentiles vs offered load (measured)"."""
    import matplotlib.pyplot as plt

    title = notebook_text(title)  # a title a notebook cell wrote, in the language in use

    if title is None:
        title = tr(
            "latency percentiles vs offered load (measured)", "延迟的百分位数随负载的变化（实测）"
        )
    rates = sorted(summaries)
    fig, axes = plt.subplots(1, len(metrics_to_plot), figsize=(4.6 * len(metrics_to_plot), 3.6))
    for ax, metric in zip(np.atleast_1d(axes), metrics_to_plot):
        if metric not in METRIC_LABELS:
            raise ValueError(
                tr(
                    f"metric must be one of {sorted(METRIC_LABELS)}, got {metric!r}",
                    f"metric 必须是 {sorted(METRIC_LABELS)} 之一，你给的是 {metric!r}",
                )
            )
        scale, unit = _unit(max((getattr(summaries[r], metric).p99 or 0.0) for r in rates))
        for field, style, label in (
            ("median", "o-", "p50"),
            ("p90", "s--", "p90"),
            ("p99", "^:", "p99"),
        ):
            ys = [getattr(getattr(summaries[r], metric), field) for r in rates]
            ax.plot(rates, [np.nan if y is None else y * scale for y in ys], style, label=label)
        ax.set_xlabel(tr("offered request rate (req/s)", "发来的请求速率（req/s）"))
        ax.set_ylabel(f"{METRIC_LABELS[metric]} ({unit})")
        ax.grid(alpha=0.3)
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

    if metric not in METRIC_LABELS:
        raise ValueError(
            tr(
                f"metric must be one of {sorted(METRIC_LABELS)}, got {metric!r}",
                f"metric 必须是 {sorted(METRIC_LABELS)} 之一，你给的是 {metric!r}",
            )
        )
    if title is None:
        title = tr("throughput–latency curve (measured)", "吞吐–延迟曲线（实测）")
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
            [np.nan if y is None else y * scale for y in med],
            "o-",
            color=color,
            label=tr(f"{label}: p50", f"{label}：p50"),
        )
        ax.plot(
            x,
            [np.nan if y is None else y * scale for y in p99],
            "o--",
            color=color,
            mfc="none",
            label=tr(f"{label}: p99", f"{label}：p99"),
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
    ax.set_xlabel(tr("output throughput (tokens/s)", "输出吞吐（tokens/s）"))
    ax.set_ylabel(f"{METRIC_LABELS[metric]} ({unit})")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


# ----------------------------------------------------------------------------- serving on a GPU preset

SERVING_MODELS = ("llama-3-8b", "llama-3.2-1b", "qwen2.5-7b", "mistral-7b", "smollm2-135m")
SERVING_HARDWARE = ("H100-SXM", "H200", "A100-80GB", "L4")
SERVING_TEXT_PATTERN = re.compile(
    r"batch (\d+), context (\d+): TPOT floor ([0-9.]+) ms \((meets|misses) the ([0-9.]+) ms "
    r"target\), ([0-9,]+) output tokens/s, \$([0-9.]+) per million output tokens at \$([0-9.]+)/h"
)


def serving_point(
    model: str = "llama-3-8b",
    hardware: str = "H100-SXM",
    batch: int = 16,
    context: int = 1024,
    price_per_hour: float = 2.5,
    dtype_bytes: float = 2,
) -> dict:
    """One decode step of `batch` sequences at `context` tokens each, on a hardware preset, from
    the roofline floor: TPOT (s), output tokens/s, US$ per million output tokens at
    `price_per_hour`, and the bytes that weights + KV cache need (does it fit?)."""
    from llmlab.analysis import costs, roofline
    from llmlab.analysis.hardware import get_hardware
    from llmlab.config import PRESETS as MODELS

    cfg, hw = MODELS[model], get_hardware(hardware)
    step = roofline.decode_step_floor(cfg, hw, batch, context, dtype_bytes)
    need = costs.weight_bytes(cfg, dtype_bytes) + batch * costs.kv_bytes(cfg, context, dtype_bytes)
    tokens_per_s = batch / step
    return {
        "tpot": step,
        "tokens_per_s": tokens_per_s,
        "usd_per_million": price_per_hour / (tokens_per_s * 3600) * 1e6,
        "bytes_needed": need,
        "fits": need <= hw.mem_size,
        "mem_size": hw.mem_size,
    }


def serving_text(
    model: str = "llama-3-8b",
    hardware: str = "H100-SXM",
    batch: int = 16,
    context: int = 1024,
    price_per_hour: float = 2.5,
    tpot_target_ms: float = 20.0,
) -> str:
    """The explorer's line for one setting (`SERVING_TEXT_PATTERN`); computed from presets."""
    p = serving_point(model, hardware, batch, context, price_per_hour)
    verdict = tr("meets", "达到") if p["tpot"] * 1e3 <= tpot_target_ms else tr("misses", "达不到")
    need, size = p["bytes_needed"] / 1e9, p["mem_size"] / 1e9
    memory = tr(
        f"weights + KV cache {need:.1f} GB of {size:.0f} GB",
        f"权重 + KV cache 共 {need:.1f} GB，显存 {size:.0f} GB",
    ) + ("" if p["fits"] else tr(" — does NOT fit", "——放不下"))
    return tr(
        f"{model} on {hardware} (BF16, roofline floor from presets), batch {batch}, context "
        f"{context}: TPOT floor {p['tpot'] * 1e3:.2f} ms ({verdict} the "
        f"{tpot_target_ms:g} ms target), {p['tokens_per_s']:,.0f} output tokens/s, "
        f"${p['usd_per_million']:.3f} per million output tokens at ${price_per_hour:g}/h; {memory}",
        f"{model} 在 {hardware} 上（BF16，按预设算的 roofline 下限），batch {batch}，上下文 "
        f"{context}：TPOT 下限 {p['tpot'] * 1e3:.2f} ms（{verdict} "
        f"{tpot_target_ms:g} ms 的目标），每秒输出 {p['tokens_per_s']:,.0f} 个 token，"
        f"按 ${price_per_hour:g}/h 算，每百万输出 token ${p['usd_per_million']:.3f}；{memory}",
    )


def plot_serving(
    model: str = "llama-3-8b",
    hardware: str = "H100-SXM",
    batch: int = 16,
    context: int = 1024,
    price_per_hour: float = 2.5,
    tpot_target_ms: float = 20.0,
    max_batch: int = 512,
) -> Any:
    """TPOT floor and US$ per million output tokens against the batch (log x), the chosen batch
    marked, the TPOT target drawn; batches whose weights + KV do not fit are greyed."""
    import matplotlib.pyplot as plt

    batches = np.unique(np.geomspace(1, max_batch, 60).astype(int))
    pts = [serving_point(model, hardware, int(b), context, price_per_hour) for b in batches]
    here = serving_point(model, hardware, batch, context, price_per_hour)
    fits = np.array([p["fits"] for p in pts])
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 3.4))
    for ax, key, scale, label in (
        (a1, "tpot", 1e3, tr("TPOT floor (ms)", "TPOT 下限（ms）")),
        (
            a2,
            "usd_per_million",
            1.0,
            tr("US$ per million output tokens", "每百万输出 token 的美元数"),
        ),
    ):
        y = np.array([p[key] * scale for p in pts])
        ax.plot(
            batches,
            np.where(fits, y, np.nan),
            "-",
            color="#2563eb",
            label=tr("fits in memory", "显存放得下"),
        )
        if not fits.all():  # grey from the last batch that fits on, so the curve is unbroken
            grey = ~fits | np.append(~fits[1:], False)
            ax.plot(
                batches,
                np.where(grey, y, np.nan),
                "-",
                color="#9ca3af",
                label=tr("does not fit", "放不下"),
            )
        ax.plot([batch], [here[key] * scale], "o", color="#dc2626", label=f"batch {batch}")
        ax.set_xscale("log")
        ax.set_xlabel(tr("batch (sequences decoded together)", "batch（一起 decode 的序列数）"))
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    a1.axhline(
        tpot_target_ms,
        color="#f59e0b",
        ls="--",
        label=tr(f"target {tpot_target_ms:g} ms", f"目标 {tpot_target_ms:g} ms"),
    )
    a1.legend(fontsize=7)
    a2.set_yscale("log")
    fig.suptitle(
        tr(
            f"{model} on {hardware}, context {context}, ${price_per_hour:g}/h "
            "(computed from presets)",
            f"{model} 在 {hardware} 上，上下文 {context}，${price_per_hour:g}/h（按预设计算）",
        ),
        fontsize=10,
    )
    fig.tight_layout()
    return fig


def serving_explorer(
    model: str = "llama-3-8b",
    hardware: str = "H100-SXM",
    batch: int = 16,
    context: int = 1024,
    price_per_hour: float = 2.5,
    tpot_target_ms: float = 20.0,
) -> Any:
    """Sliders for model, GPU preset, batch, context, price per hour and a TPOT target; the line
    (TPOT, tokens/s, $ per million tokens, memory) and the two curves update."""
    import ipywidgets as w

    style = {"description_width": "110px"}
    model_w = w.Dropdown(
        options=SERVING_MODELS, value=model, description=tr("model", "模型"), style=style
    )
    hw_w = w.Dropdown(
        options=SERVING_HARDWARE,
        value=hardware,
        description=tr("GPU preset", "GPU 预设"),
        style=style,
    )
    batch_w = w.IntSlider(value=batch, min=1, max=512, step=1, description="batch", style=style)
    ctx_w = w.IntSlider(
        value=context, min=256, max=8192, step=256, description=tr("context", "上下文"), style=style
    )
    price_w = w.FloatSlider(
        value=price_per_hour,
        min=0.5,
        max=10.0,
        step=0.1,
        description=tr("US$ per hour", "每小时美元"),
        style=style,
    )
    slo_w = w.FloatSlider(
        value=tpot_target_ms,
        min=2.0,
        max=100.0,
        step=1.0,
        description=tr("TPOT target (ms)", "TPOT 目标（ms）"),
        style=style,
    )
    result = w.HTML()
    out = w.Output()

    def redraw(*_: Any) -> None:
        args = dict(
            model=model_w.value,
            hardware=hw_w.value,
            batch=batch_w.value,
            context=ctx_w.value,
            price_per_hour=price_w.value,
            tpot_target_ms=slo_w.value,
        )
        result.value = f'<pre class="llmlab-serving-result">{serving_text(**args)}</pre>'
        show_figure(out, plot_serving(**args))

    for c in (model_w, hw_w, batch_w, ctx_w, price_w, slo_w):
        c.observe(redraw, names="value")
    redraw()
    return w.VBox(
        [w.HBox([model_w, hw_w]), w.HBox([batch_w, ctx_w]), w.HBox([price_w, slo_w]), result, out]
    )
