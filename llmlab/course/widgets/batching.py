"""Batching simulator: arrival rate, output-length spread and max batch → Gantt charts of static
and continuous batching, throughput and mean latency (all from `llmlab.analysis.sim`).

`batching_text(...)` gives lines of which the first is
"Continuous/static throughput: <x>x, mean latency <a> vs <b> steps" (`BATCHING_TEXT_PATTERN`
parses the English line; in Chinese the same numbers stand in a Chinese line).
"""

from __future__ import annotations

import re
from typing import Any

from llmlab.analysis.sim import batching_results  # noqa: F401
from llmlab.course.check.catalog import catalog
from llmlab.course.figures.ch08 import plot_compare
from llmlab.course.widgets._show import show_figure

M = catalog("widgets.batching")

BATCHING_TEXT_PATTERN = re.compile(
    r"Continuous/static throughput: ([0-9.]+)x, mean latency ([0-9.]+) vs ([0-9.]+) steps"
)


_results = batching_results


def batching_text(
    arrival_rate: float = 0.5,
    output_spread: float = 0.8,
    max_batch: int = 8,
    num_requests: int = 24,
    mean_output: int = 24,
    seed: int = 0,
) -> str:
    """Throughput ratio and mean latencies (continuous vs static), in steps."""
    r = _results(arrival_rate, output_spread, max_batch, num_requests, mean_output, seed)
    c, s = r["continuous"], r["static"]
    return M(
        "batching_text.continuous_static_throughput",
        ratio=c.throughput / s.throughput,
        continuous_latency=c.mean_latency,
        static_latency=s.mean_latency,
        continuous_throughput=c.throughput,
        continuous_batch=c.mean_batch,
        max_batch=max_batch,
        static_throughput=s.throughput,
        static_batch=s.mean_batch,
    )


def plot_batching_simulator(
    arrival_rate: float = 0.5,
    output_spread: float = 0.8,
    max_batch: int = 8,
    num_requests: int = 24,
    mean_output: int = 24,
    seed: int = 0,
) -> Any:
    """Gantt charts of both policies on one random trace, plus batch occupancy per step."""
    r = _results(arrival_rate, output_spread, max_batch, num_requests, mean_output, seed)
    return plot_compare(r, time_unit="steps")


def batching_simulator(
    arrival_rate: float = 0.5,
    output_spread: float = 0.8,
    max_batch: int = 8,
    num_requests: int = 24,
    mean_output: int = 24,
    seed: int = 0,
) -> Any:
    """Sliders for the batching simulator; the result line updates on every change."""
    import ipywidgets as w

    style = {"description_width": "120px"}
    rate = w.FloatSlider(
        value=arrival_rate,
        min=0.05,
        max=4.0,
        step=0.05,
        description=M("batching_simulator.arrivals_step"),
        style=style,
    )
    spread = w.FloatSlider(
        value=output_spread,
        min=0.0,
        max=1.0,
        step=0.05,
        description=M("batching_simulator.length_spread"),
        style=style,
    )
    batch = w.IntSlider(
        value=max_batch, min=1, max=32, description=M("batching_simulator.max_batch"), style=style
    )
    n = w.IntSlider(
        value=num_requests, min=4, max=64, description=M("batching_simulator.requests"), style=style
    )
    result = w.HTML()
    out = w.Output()

    def redraw(*_: Any) -> None:
        args = dict(
            arrival_rate=rate.value,
            output_spread=spread.value,
            max_batch=batch.value,
            num_requests=n.value,
            mean_output=mean_output,
            seed=seed,
        )
        result.value = f'<pre class="llmlab-batching-result">{batching_text(**args)}</pre>'
        show_figure(out, plot_batching_simulator(**args))

    for c in (rate, spread, batch, n):
        c.observe(redraw, names="value")
    redraw()
    return w.VBox([w.HBox([rate, spread]), w.HBox([batch, n]), result, out])
