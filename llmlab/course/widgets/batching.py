"""Batching simulator: arrival rate, output-length spread and max batch → Gantt charts of static
and continuous batching, throughput and mean latency (all from `llmlab.analysis.sim`).

`batching_text(...)` gives lines of which the first is
"Continuous/static throughput: <x>x, mean latency <a> vs <b> steps" (`BATCHING_TEXT_PATTERN`
parses the English line; in Chinese the same numbers stand in a Chinese line).
"""

from __future__ import annotations

import re
from typing import Any

from llmlab.analysis import sim
from llmlab.analysis.sim import batching_results  # noqa: F401
from llmlab.course.widgets._show import show_figure
from llmlab.i18n import tr

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
    return tr(
        f"Continuous/static throughput: {c.throughput / s.throughput:.2f}x, mean latency "
        f"{c.mean_latency:.1f} vs {s.mean_latency:.1f} steps\n"
        f"continuous: {c.throughput:.2f} tok/step, mean batch {c.mean_batch:.1f} of {max_batch}; "
        f"static: {s.throughput:.2f} tok/step, mean batch {s.mean_batch:.1f} of {max_batch}",
        f"continuous/static 吞吐之比：{c.throughput / s.throughput:.2f}x，平均延迟 "
        f"{c.mean_latency:.1f} 步对 {s.mean_latency:.1f} 步\n"
        f"continuous：{c.throughput:.2f} tok/步，平均 batch {c.mean_batch:.1f}（上限 {max_batch}）；"
        f"static：{s.throughput:.2f} tok/步，平均 batch {s.mean_batch:.1f}（上限 {max_batch}）",
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
    return sim.plot_compare(r, time_unit="steps")


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
        description=tr("arrivals / step", "每步到达数"),
        style=style,
    )
    spread = w.FloatSlider(
        value=output_spread,
        min=0.0,
        max=1.0,
        step=0.05,
        description=tr("length spread", "长度的离散度"),
        style=style,
    )
    batch = w.IntSlider(
        value=max_batch, min=1, max=32, description=tr("max batch", "最大 batch"), style=style
    )
    n = w.IntSlider(
        value=num_requests, min=4, max=64, description=tr("requests", "请求数"), style=style
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
