"""Chapter 09's figures (parallelism).

`dp_replicas` draws what a second data-parallel replica does to throughput and latency as the
arrival rate grows; `allreduce_cpu_vs_gpu` sets the all-reduce this machine measured (gloo over
local TCP) beside what the same message costs on an H100's NVLink and PCIe by the ring model.
"""
from __future__ import annotations

from typing import Any, Sequence

from llmlab.parallel import cost


def dp_replicas(rows: Sequence[dict]) -> Any:
    """Two panels against the arrival rate: output tokens/s and mean latency (s), one line per
    replica count. `rows`: dicts with "arrivals/s", "replicas", "tokens/s", "mean latency s"."""
    import matplotlib.pyplot as plt

    if not rows:
        raise ValueError("rows must not be empty")
    fig, (a0, a1) = plt.subplots(1, 2, figsize=(11, 3.8))
    for n in sorted({r["replicas"] for r in rows}):
        mine = sorted((r for r in rows if r["replicas"] == n), key=lambda r: r["arrivals/s"])
        x = [r["arrivals/s"] for r in mine]
        label = f"{n} replica{'s' if n > 1 else ''}"
        a0.plot(x, [r["tokens/s"] for r in mine], "o-", label=label)
        a1.plot(x, [r["mean latency s"] for r in mine], "o-", label=label)
    a0.set_ylabel("output tokens / s")
    a0.set_title("Throughput: set by the arrivals until a replica saturates")
    a1.set_ylabel("mean latency per request (s)")
    a1.set_title("Latency: flat until the queue builds up")
    for ax in (a0, a1):
        ax.set_xlabel("arrival rate (requests / s)")
        ax.grid(True, alpha=0.3)
        ax.legend()
    fig.suptitle("Data parallelism behind a round-robin router (simulated: Llama-3-8B, one H100 "
                 "per replica, roofline step times)", fontsize=10)
    fig.tight_layout()
    return fig


def allreduce_times(nbytes: float, world_size: int, hardware: str = "H100-SXM") -> dict[str, float]:
    """Seconds of one ring all-reduce of `nbytes` over `world_size` GPUs, per link of `hardware`."""
    return {link: cost.ring_all_reduce_time(nbytes, world_size, cost.get_interconnect(link, hardware))
            for link in ("nvlink", "pcie")}


def allreduce_cpu_vs_gpu(measured_s: float, nbytes: float, world_size: int = 2,
                         machine: str = "this machine") -> Any:
    """Bars (log scale, µs) of one all-reduce of `nbytes`: measured here, and the ring model on
    an H100's NVLink and PCIe (preset figures, not measurements)."""
    import matplotlib.pyplot as plt

    if measured_s <= 0:
        raise ValueError(f"measured_s must be > 0 seconds, got {measured_s}")
    model = allreduce_times(nbytes, world_size)
    labels = [f"{machine}\n(measured, gloo over TCP)", "H100 NVLink\n(ring model)",
              "H100 PCIe 5.0\n(ring model)"]
    values = [measured_s * 1e6, model["nvlink"] * 1e6, model["pcie"] * 1e6]
    fig, ax = plt.subplots(figsize=(7, 3.6))
    bars = ax.bar(labels, values, color=["#6b7280", "#2563eb", "#b45309"])
    for b, v in zip(bars, values):
        ax.text(b.get_x() + b.get_width() / 2, v, f"{v:,.1f} µs", ha="center", va="bottom", fontsize=8)
    ax.set_yscale("log")
    ax.set_ylabel("one all-reduce (µs, log scale)")
    ax.set_title(f"One all-reduce of {nbytes / 1e3:,.1f} kB over {world_size} ranks")
    fig.tight_layout()
    return fig
