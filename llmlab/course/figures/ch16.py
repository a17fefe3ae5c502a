"""Figures of chapter 16 (a step on a GPU). They present; the numbers come from
`llmlab.analysis.step_time` (measured here) and `data/gpu_runs.json` (measured by this project
on a GPU, shown as such)."""

from __future__ import annotations

from typing import Any

from llmlab.course.check.catalog import catalog
from llmlab.utils import format_table

M = catalog("figures.ch16")

BUSY, WAITING = "#1d4ed8", "#cbd5e1"


def step_rows(
    here: dict[str, float], gpu_run: dict[str, Any], gpu: dict | None = None
) -> list[tuple[str, float, float]]:
    """(label, ms computing, ms waiting on the host) per bar: this CPU (a `host_split`), the
    recorded GPU run, and this machine's GPU eagerly and with CUDA graphs when `gpu` (a
    `gpu_decode_split`) is given."""
    step, card, date = gpu_run["decode_step"], gpu_run["card"], gpu_run["measured_before"]
    rows = [
        (
            M("step_rows.cpu_measured_here"),
            1e3 * here["compute"],
            1e3 * here["host"],
        ),
        (
            M("step_rows.llmlab_s_first", card=card, date=date),
            step["gpu_busy_ms"],
            step["wall_ms"] - step["gpu_busy_ms"],
        ),
    ]
    names = {
        "eager": M("step_rows.gpu_eager_measured"),
        "graphs": M("step_rows.gpu_cuda_graphs"),
    }
    for key, m in (gpu or {}).items():
        rows.append((names[key], 1e3 * m["busy"], 1e3 * max(0.0, m["step"] - m["busy"])))
    return rows


def plot_step_split(
    here: dict[str, float], gpu_run: dict[str, Any], gpu: dict | None = None
) -> Any:
    """A batch-1 decode step per machine as two parts: computing (the CPU's arithmetic, or the
    GPU busy running kernels) and waiting on the host (Python, the scheduler, building inputs,
    launching operators), in ms."""
    import matplotlib.pyplot as plt

    rows = step_rows(here, gpu_run, gpu)
    fig, ax = plt.subplots(figsize=(9, 1.8 + 0.7 * len(rows)))
    labels = [r[0] for r in rows]
    busy, waiting = [r[1] for r in rows], [r[2] for r in rows]
    ax.barh(
        labels,
        busy,
        color=BUSY,
        label=M("plot_step_split.computing_cpu_arithmetic"),
    )
    ax.barh(
        labels,
        waiting,
        left=busy,
        color=WAITING,
        label=M("plot_step_split.waiting_host_python"),
    )
    for y, (b, w) in enumerate(zip(busy, waiting)):
        share = w / (b + w) if b + w > 0 else 0.0
        ax.text(
            (b + w) * 1.01,
            y,
            M("plot_step_split.host", v_100_share=100 * share),
            va="center",
            fontsize=8,
        )
    ax.set_xlim(0, max(b + w for b, w in zip(busy, waiting)) * 1.2)
    ax.invert_yaxis()
    ax.set_xlabel(M("plot_step_split.ms_per_decode"))
    ax.set_title(M("plot_step_split.batch_1_decode"))
    ax.legend(fontsize=8, loc="best", frameon=False)
    fig.tight_layout()
    return fig


def gpu_run_table(gpu_run: dict[str, Any]) -> str:
    """The figures of a recorded GPU run (`llmlab.analysis.step_time.gpu_run`) as a printed
    table, its card, date and software in the first line: measured there, not here."""
    step, per_token = gpu_run["decode_step"], gpu_run["ms_per_token_batch1"]
    card, date, model = gpu_run["card"], gpu_run["measured_before"], gpu_run["model"]
    software, dtype = gpu_run["software"], gpu_run["dtype"]
    head = M(
        "gpu_run_table.measured_llmlab_before",
        card=card,
        date=date,
        software=software,
        model=model,
        dtype=dtype,
    )
    rows = [
        (
            M("gpu_run_table.kernels_per_decode"),
            f"{gpu_run['kernels_per_decode_step']:,}",
        ),
        (
            M(
                "gpu_run_table.decode_step_batch",
                batch=step['batch'],
                attention_backend=step['attention_backend'],
            ),
            M(
                "gpu_run_table.ms_gpu_busy",
                wall_ms=step['wall_ms'],
                gpu_busy_ms=step['gpu_busy_ms'],
            ),
        ),
        *(
            (
                M("gpu_run_table.ms_per_token", name=name),
                f"{ms:.1f}",
            )
            for name, ms in per_token.items()
        ),
        (
            M("gpu_run_table.hbm_floor_ms"),
            f"{gpu_run['hbm_floor_ms_per_token']:.3f}",
        ),
    ]
    return head + "\n" + format_table(rows, rule=False)
