"""Chapter 10's figures (serving metrics): the TTLT prediction against the measurement, goodput
against the offered rate, and TPOT against the batch on this machine beside a GPU preset."""

from __future__ import annotations

from typing import Any, Mapping

from llmlab.analysis import metrics
from llmlab.course.check.catalog import catalog
from llmlab.course.figures._axes import finish

M = catalog("figures.ch10")


def ttlt_prediction(results: Mapping[float, metrics.BenchmarkSummary]) -> Any:
    """Each request's measured E2EL (x) against TTFT + (n − 1) × the run's mean TPOT (y), one
    marker per request rate, and the diagonal where prediction = measurement. Requests with one
    token (no TPOT) are left out."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.2, 4.2))
    top = 0.0
    for (rate, s), marker in zip(sorted(results.items()), "os^vDP*"):
        ts = [t for t in s.timelines if t.tpot is not None]
        measured = [t.e2el for t in ts]
        predicted = [t.ttft + (t.num_output_tokens - 1) * s.tpot.mean for t in ts]
        ax.plot(measured, predicted, marker, alpha=0.7, label=f"{rate:.2f} req/s")
        top = max([top, *measured, *predicted])
    ax.plot([0, top], [0, top], "k--", lw=1, label=M("ttlt_prediction.prediction_measurement"))
    return finish(ax, **M.figure("ttlt_prediction"), legend=8)


def goodput_vs_rate(
    results: Mapping[float, metrics.BenchmarkSummary], slo: Mapping[str, float]
) -> Any:
    """Throughput and goodput (requests/s) against the offered request rate, with the offered rate
    itself as a reference line; the SLO (seconds) is named in the title, in ms."""
    import matplotlib.pyplot as plt

    rates = sorted(results)
    fig, ax = plt.subplots(figsize=(6, 3.6))
    ax.plot(
        rates,
        [results[r].request_throughput for r in rates],
        "o-",
        label=M("goodput_vs_rate.throughput"),
    )
    ax.plot(
        rates,
        [results[r].goodput for r in rates],
        "s--",
        label=M("goodput_vs_rate.goodput_met_slo"),
    )
    ax.plot(rates, rates, ":", color="grey", label=M("goodput_vs_rate.offered_rate"))
    ax.set_xlabel(M("goodput_vs_rate.offered_request_rate"))
    ax.set_ylabel(M("goodput_vs_rate.completed_requests_per"))
    targets = ", ".join(f"{k.upper()} ≤ {v * 1e3:.0f} ms" for k, v in slo.items())
    ax.set_title(M("goodput_vs_rate.goodput_under_measured", targets=targets))
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    return fig


def tpot_vs_batch(
    measured: Mapping[int, float],
    presets: Mapping[str, Mapping[int, float]],
    machine: str | None = None,
) -> Any:
    """TPOT relative to batch 1 against the batch (log x): the measured series (`measured`,
    batch → TPOT in s, on `machine`, default "this machine") and one computed series per entry of
    `presets` (label → batch → TPOT in s), so a CPU that slows with the batch and a GPU that barely does sit on one scale."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.2, 3.8))
    if machine is None:
        machine = M("tpot_vs_batch.machine")
    series = {M("tpot_vs_batch.measured", machine=machine): (measured, "o-")}
    series.update({label: (vals, "s--") for label, vals in presets.items()})
    for label, (vals, style) in series.items():
        batches = sorted(vals)
        base = vals[batches[0]]
        ax.plot(batches, [vals[b] / base for b in batches], style, label=label)
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_xscale("log", base=2)
    ticks = sorted(set(measured).union(*(set(v) for v in presets.values())))
    ax.set_xticks(ticks, [str(b) for b in ticks])
    ax.set_xlabel(M("tpot_vs_batch.batch_requests_decoded"))
    ax.set_ylabel(M("tpot_vs_batch.tpot_tpot_smallest"))
    ax.set_title(M("tpot_vs_batch.does_token_get"))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig
