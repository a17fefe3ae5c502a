"""Chapter 09's figures (parallelism).

`dp_replicas` draws what a second data-parallel replica does to throughput and latency as the
arrival rate grows; `allreduce_cpu_vs_gpu` sets the all-reduce this machine measured (gloo over
local TCP) beside what the same message costs on an H100's NVLink and PCIe by the ring model.
"""

from __future__ import annotations

from typing import Any, Sequence

from llmlab.i18n import tr
from llmlab.parallel import cost


def dp_replicas(rows: Sequence[dict]) -> Any:
    """Two panels against the arrival rate: output tokens/s and mean latency (s), one line per
    replica count. `rows`: dicts with "arrivals/s", "replicas", "tokens/s", "mean latency s"."""
    import matplotlib.pyplot as plt

    if not rows:
        raise ValueError(tr("rows must not be empty", "rows 不能为空"))
    fig, (a0, a1) = plt.subplots(1, 2, figsize=(11, 3.8))
    for n in sorted({r["replicas"] for r in rows}):
        mine = sorted((r for r in rows if r["replicas"] == n), key=lambda r: r["arrivals/s"])
        x = [r["arrivals/s"] for r in mine]
        label = tr(f"{n} replicas", f"{n} 个副本") if n > 1 else tr(f"{n} replica", f"{n} 个副本")
        a0.plot(x, [r["tokens/s"] for r in mine], "o-", label=label)
        a1.plot(x, [r["mean latency s"] for r in mine], "o-", label=label)
    a0.set_ylabel(tr("output tokens / s", "输出 token / s"))
    a0.set_title(
        tr(
            "Throughput: set by the arrivals until a replica saturates",
            "吞吐：副本饱和之前，由到达的请求决定",
        )
    )
    a1.set_ylabel(tr("mean latency per request (s)", "每个请求的平均延迟（s）"))
    a1.set_title(tr("Latency: flat until the queue builds up", "延迟：排起队之前一直平稳"))
    for ax in (a0, a1):
        ax.set_xlabel(tr("arrival rate (requests / s)", "到达速率（请求 / s）"))
        ax.grid(True, alpha=0.3)
        ax.legend()
    fig.suptitle(
        tr(
            "Data parallelism behind a round-robin router (simulated: Llama-3-8B, one H100 "
            "per replica, roofline step times)",
            "轮询路由器后面的数据并行（模拟：Llama-3-8B，每个副本一块 H100，每步时间取 roofline 值）",
        ),
        fontsize=10,
    )
    fig.tight_layout()
    return fig


def allreduce_times(nbytes: float, world_size: int, hardware: str = "H100-SXM") -> dict[str, float]:
    """Seconds of one ring all-reduce of `nbytes` over `world_size` GPUs, per link of `hardware`."""
    return {
        link: cost.ring_all_reduce_time(nbytes, world_size, cost.get_interconnect(link, hardware))
        for link in ("nvlink", "pcie")
    }


def allreduce_cpu_vs_gpu(
    measured_s: float, nbytes: float, world_size: int = 2, machine: str | None = None
) -> Any:
    """Bars (log scale, µs) of one all-reduce of `nbytes`: measured here (`machine`, default "this
    machine"), and the ring model on an H100's NVLink and PCIe (preset figures, not measurements)."""
    import matplotlib.pyplot as plt

    if measured_s <= 0:
        raise ValueError(
            tr(
                f"measured_s must be > 0 seconds, got {measured_s}",
                f"measured_s 必须 > 0 秒，你给的是 {measured_s}",
            )
        )
    if machine is None:
        machine = tr("this machine", "本机")
    model = allreduce_times(nbytes, world_size)
    labels = [
        tr(f"{machine}\n(measured, gloo over TCP)", f"{machine}\n（实测，gloo 走 TCP）"),
        tr("H100 NVLink\n(ring model)", "H100 NVLink\n（ring 模型）"),
        tr("H100 PCIe 5.0\n(ring model)", "H100 PCIe 5.0\n（ring 模型）"),
    ]
    values = [measured_s * 1e6, model["nvlink"] * 1e6, model["pcie"] * 1e6]
    fig, ax = plt.subplots(figsize=(7, 3.6))
    bars = ax.bar(labels, values, color=["#6b7280", "#2563eb", "#b45309"])
    for b, v in zip(bars, values):
        ax.text(
            b.get_x() + b.get_width() / 2, v, f"{v:,.1f} µs", ha="center", va="bottom", fontsize=8
        )
    ax.set_yscale("log")
    ax.set_ylabel(tr("one all-reduce (µs, log scale)", "一次 all-reduce（µs，对数坐标）"))
    ax.set_title(
        tr(
            f"One all-reduce of {nbytes / 1e3:,.1f} kB over {world_size} ranks",
            f"{world_size} 个 rank 之间一次 {nbytes / 1e3:,.1f} kB 的 all-reduce",
        )
    )
    fig.tight_layout()
    return fig
