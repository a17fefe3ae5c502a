"""Chapter 08's figures (batching) and the table beside them.

`batch_scaling` sets this machine's measured decode steps beside an H100's roofline floor for
the same model: step time and throughput, each relative to batch 1, so a CPU effect (the step
growing with the batch) is never taken for a GPU one. `cpu_vs_gpu_table` is the same comparison
in numbers, and `sim_vs_engine` the chapter's simulator-against-engine table; both return rows
(dicts) that `text_table` prints as plain text.
"""
from __future__ import annotations

from typing import Any, Sequence

from llmlab import roofline
from llmlab.hardware import Hardware, get_hardware

GPU = "H100-SXM"


def _cell(v: Any) -> str:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return str(v)
    if isinstance(v, int):
        return f"{v:,}"
    if v == 0 or abs(v) >= 100:
        return f"{v:,.0f}"
    return f"{v:.2f}" if abs(v) >= 1 else f"{v:.3g}"


def text_table(rows: Sequence[dict], transpose: bool = False) -> str:
    """Rows of dicts (same keys) as an aligned plain-text table; `transpose` puts one row per key."""
    if not rows:
        raise ValueError("rows must not be empty")
    keys = list(rows[0])
    grid = [keys] + [[_cell(r[k]) for k in keys] for r in rows]
    if transpose:
        grid = [list(col) for col in zip(*grid)]
    widths = [max(len(row[i]) for row in grid) for i in range(len(grid[0]))]
    lines = ["  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths)))
             for row in grid]
    return "\n".join(lines)


def _gpu_floor(cfg: Any, gpu: str | Hardware, batch: int, context: int, dtype_bytes: int = 2):
    return roofline.place(roofline.decode_step(cfg, batch, context, dtype_bytes), gpu,
                          roofline.dtype_for_bytes(dtype_bytes))


def batch_scaling(steps: Sequence[roofline.StepMeasurement], hw: Hardware, cfg: Any,
                  gpu: str = GPU) -> Any:
    """Two panels against the batch: step time / step time at batch 1, and tokens/s / tokens/s at
    batch 1, for the measured `steps` (on `hw`) and for the roofline floor of the same model
    (`cfg`, bf16, same context) on the preset `gpu`. The dotted line is free batching (ratio = batch)."""
    import matplotlib.pyplot as plt

    steps = sorted(steps, key=lambda m: m.batch)
    if not steps or steps[0].batch != 1:
        raise ValueError("steps must include a batch-1 measurement (the baseline)")
    bs = [m.batch for m in steps]
    context = steps[0].tokens + 1
    gpu_t = [_gpu_floor(cfg, gpu, b, context).time_floor for b in bs]
    cpu_rel = [m.seconds / steps[0].seconds for m in steps]
    gpu_rel = [t / gpu_t[0] for t in gpu_t]
    fig, (a0, a1) = plt.subplots(1, 2, figsize=(11, 4))
    a0.plot(bs, cpu_rel, "o-", label=f"measured: {hw.name}")
    a0.plot(bs, gpu_rel, "s--", label=f"{gpu} roofline floor (preset)")
    a0.set_ylabel("step time / step time at batch 1")
    a0.set_title("Per-token latency: how much slower each step gets")
    a1.plot(bs, [b / r for b, r in zip(bs, cpu_rel)], "o-", label=f"measured: {hw.name}")
    a1.plot(bs, [b / r for b, r in zip(bs, gpu_rel)], "s--", label=f"{gpu} roofline floor (preset)")
    a1.plot(bs, bs, ":", color="grey", label="free batching (= batch)")
    a1.set_ylabel("tokens/s / tokens/s at batch 1")
    a1.set_title("Throughput gained by batching")
    for ax in (a0, a1):
        ax.set_xscale("log", base=2)
        ax.set_xticks(bs, [str(b) for b in bs])
        ax.set_xlabel("batch size (sequences)")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"{cfg.name} decode, context {context}: this machine measured vs {gpu} floor",
                 fontsize=10)
    fig.tight_layout()
    return fig


def cpu_vs_gpu_table(steps: Sequence[roofline.StepMeasurement], hw: Hardware, cfg: Any,
                     batch: int = 32, gpu: str = GPU, dtype: str = "fp32"):
    """One row (dict) per device: step ms at batch 1 and at `batch`, the throughput ratio, the
    step's FLOP per byte at `batch`, the device's ridge point and the bound."""
    by_batch = {m.batch: m for m in steps}
    if 1 not in by_batch or batch not in by_batch:
        raise ValueError(f"steps must include batch 1 and batch {batch}, got {sorted(by_batch)}")
    m1, mb = by_batch[1], by_batch[batch]
    here = roofline.place(mb.op, hw, dtype)
    context = m1.tokens + 1
    g1, gb = _gpu_floor(cfg, gpu, 1, context), _gpu_floor(cfg, gpu, batch, context)
    rows = [
        {"device": f"{hw.name} (measured, {dtype})", "step ms, batch 1": m1.seconds * 1e3,
         f"step ms, batch {batch}": mb.seconds * 1e3, "throughput ratio": batch * m1.seconds / mb.seconds,
         f"FLOP/B at {batch}": here.op.intensity, "ridge FLOP/B": roofline.ridge_point(hw, dtype),
         f"bound at {batch}": here.bound},
        {"device": f"{gpu} (roofline floor, bf16)", "step ms, batch 1": g1.time_floor * 1e3,
         f"step ms, batch {batch}": gb.time_floor * 1e3,
         "throughput ratio": batch * g1.time_floor / gb.time_floor,
         f"FLOP/B at {batch}": gb.op.intensity, "ridge FLOP/B": roofline.ridge_point(gpu, "bf16"),
         f"bound at {batch}": gb.bound},
    ]
    return rows


def sim_vs_engine(simulated: dict, real: dict) -> list[dict]:
    """Rows (dicts): steps, tokens/s, mean batch and mean latency of each policy, simulator
    against engine."""
    rows = []
    for policy in real:
        for source, res in (("simulator", simulated[policy]), ("real engine", real[policy])):
            rows.append({"policy": policy, "source": source, "steps": res.num_steps,
                         "tokens/s": res.throughput, "mean batch": res.mean_batch,
                         "mean latency s": res.mean_latency})
    return rows
