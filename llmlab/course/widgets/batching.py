"""Batching simulator: arrival rate, output-length spread and max batch → Gantt charts of static
and continuous batching, throughput and mean latency (all from `llmlab.analysis.sim`).

`batching_text(...)` gives lines of which the first is
"Continuous/static throughput: <x>x, mean latency <a> vs <b> steps" (`BATCHING_TEXT_PATTERN`
parses the English line; in Chinese the same numbers stand in a Chinese line).
"""

from __future__ import annotations

import re
from typing import Any

from llmlab.analysis.sim import batching_results
from llmlab.course.check.catalog import catalog
from llmlab.course.figures.ch08 import plot_compare
from llmlab.course.widgets._show import controls_of, defaults, explorer

M = catalog("widgets.batching")


BATCHING_TEXT_PATTERN = re.compile(
    r"Continuous/static throughput: ([0-9.]+)x, mean latency ([0-9.]+) vs ([0-9.]+) steps"
)


def batching_text(**trace: Any) -> str:
    """Throughput ratio and mean latencies (continuous vs static), in steps, on the trace
    `batching_results(**trace)` simulates."""
    r = batching_results(**trace)
    c, s = r["continuous"], r["static"]
    return M(
        "batching_text.continuous_static_throughput",
        ratio=c.throughput / s.throughput,
        continuous=c,
        static=s,
    )


def plot_batching_simulator(**trace: Any) -> Any:
    """Gantt charts of both policies on the trace `batching_results(**trace)` simulates, plus
    batch occupancy per step."""
    return plot_compare(batching_results(**trace), time_unit="steps")


def batching_simulator(**trace: Any) -> Any:
    """Sliders for the batching simulator, starting at `trace` (the arguments of
    `llmlab.analysis.sim.batching_results`; its defaults for those not given); the result line
    updates on every change."""
    start = defaults(batching_results) | trace
    table = {
        "arrival_rate": ("FloatSlider", M("batching_simulator.arrivals_step"), 0.05, 4.0, 0.05),
        "output_spread": ("FloatSlider", M("batching_simulator.length_spread"), 0.0, 1.0, 0.05),
        "max_batch": ("IntSlider", M("batching_simulator.max_batch"), 1, 32),
        "num_requests": ("IntSlider", M("batching_simulator.requests"), 4, 64),
    }
    return explorer(
        controls_of(table, start, "120px"),
        [("arrival_rate", "output_spread"), ("max_batch", "num_requests")],
        "llmlab-batching-result",
        batching_text,
        plot_batching_simulator,
        fixed={"mean_output": start["mean_output"], "seed": start["seed"]},
    )
