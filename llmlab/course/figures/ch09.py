"""Chapter 09's figures (parallelism).

`dp_replicas` draws what a second data-parallel replica does to throughput and latency as the
arrival rate grows; `allreduce_cpu_vs_gpu` sets the all-reduce this machine measured (gloo over
local TCP) beside what the same message costs on an H100's NVLink and PCIe by the ring model.
"""

from __future__ import annotations

from typing import Any, Sequence

from llmlab.analysis import parallel_cost
from llmlab.course.check.catalog import catalog
from llmlab.course.figures._axes import finish

M = catalog("figures.ch09")


def dp_replicas(rows: Sequence[dict]) -> Any:
    """Two panels against the arrival rate: output tokens/s and mean latency (s), one line per
    replica count. `rows`: dicts with "arrivals/s", "replicas", "tokens/s", "mean latency s"."""
    import matplotlib.pyplot as plt

    if not rows:
        raise ValueError(M("dp_replicas.rows_must_not"))
    fig, (a0, a1) = plt.subplots(1, 2, figsize=(11, 3.8))
    for n in sorted({r["replicas"] for r in rows}):
        mine = sorted((r for r in rows if r["replicas"] == n), key=lambda r: r["arrivals/s"])
        x = [r["arrivals/s"] for r in mine]
        label = M("dp_replicas.replicas", n=n) if n > 1 else M("dp_replicas.replica", n=n)
        a0.plot(x, [r["tokens/s"] for r in mine], "o-", label=label)
        a1.plot(x, [r["mean latency s"] for r in mine], "o-", label=label)
    a0.set_ylabel(M("dp_replicas.output_tokens_s"))
    a0.set_title(M("dp_replicas.throughput_set_arrivals"))
    a1.set_ylabel(M("dp_replicas.mean_latency_per"))
    a1.set_title(M("dp_replicas.latency_flat_until"))
    for ax in (a0, a1):
        ax.set_xlabel(M("dp_replicas.arrival_rate_requests"))
        ax.grid(True, alpha=0.3)
        ax.legend()
    fig.suptitle(
        M("dp_replicas.data_parallelism_behind"),
        fontsize=10,
    )
    fig.tight_layout()
    return fig


def allreduce_times(nbytes: float, world_size: int, hardware: str = "H100-SXM") -> dict[str, float]:
    """Seconds of one ring all-reduce of `nbytes` over `world_size` GPUs, per link of `hardware`."""
    return {
        link: parallel_cost.ring_all_reduce_time(
            nbytes, world_size, parallel_cost.get_interconnect(link, hardware)
        )
        for link in ("nvlink", "pcie")
    }


def allreduce_cpu_vs_gpu(
    measured_s: float, nbytes: float, world_size: int = 2, machine: str | None = None
) -> Any:
    """Bars (log scale, µs) of one all-reduce of `nbytes`: measured here (`machine`, default "this
    machine"), and the ring model on an H100's NVLink and PCIe (preset figures, not measurements)."""
    import matplotlib.pyplot as plt

    if measured_s <= 0:
        raise ValueError(M("allreduce_cpu_vs_gpu.measured_s_must", measured_s=measured_s))
    if machine is None:
        machine = M("allreduce_cpu_vs_gpu.machine")
    model = allreduce_times(nbytes, world_size)
    labels = [
        M("allreduce_cpu_vs_gpu.measured_gloo_over", machine=machine),
        M("allreduce_cpu_vs_gpu.h100_nvlink_ring"),
        M("allreduce_cpu_vs_gpu.h100_pcie_5"),
    ]
    values = [measured_s * 1e6, model["nvlink"] * 1e6, model["pcie"] * 1e6]
    fig, ax = plt.subplots(figsize=(7, 3.6))
    bars = ax.bar(labels, values, color=["#6b7280", "#2563eb", "#b45309"])
    for b, v in zip(bars, values):
        ax.text(
            b.get_x() + b.get_width() / 2, v, f"{v:,.1f} µs", ha="center", va="bottom", fontsize=8
        )
    ax.set_yscale("log")
    return finish(
        ax,
        ylabel=M("allreduce_cpu_vs_gpu.one_all_reduce"),
        title=M(
            "allreduce_cpu_vs_gpu.one_all_reduce_2", nbytes_1e3=nbytes / 1e3, world_size=world_size
        ),
    )
