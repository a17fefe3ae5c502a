"""Figures of chapter 16 (a step on a GPU). They present; the numbers come from
`llmlab.analysis.step_time` (measured here) and `data/gpu_runs.json` (measured by this project
on a GPU, shown as such)."""

from __future__ import annotations

from typing import Any

from llmlab.i18n import tr
from llmlab.utils import format_table

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
            tr("this CPU\n(measured here)", "本机 CPU\n（在此实测）"),
            1e3 * here["compute"],
            1e3 * here["host"],
        ),
        (
            tr(
                f"{card}\n(llmlab's first run, before {date})",
                f"{card}\n（llmlab 首次实测，早于 {date}）",
            ),
            step["gpu_busy_ms"],
            step["wall_ms"] - step["gpu_busy_ms"],
        ),
    ]
    names = {
        "eager": tr("this GPU, eager\n(measured here)", "本机 GPU，eager\n（在此实测）"),
        "graphs": tr(
            "this GPU, CUDA graphs\n(measured here)", "本机 GPU，CUDA graph\n（在此实测）"
        ),
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
        label=tr("computing (CPU arithmetic, GPU busy)", "在算（CPU 算术、GPU 忙）"),
    )
    ax.barh(
        labels,
        waiting,
        left=busy,
        color=WAITING,
        label=tr(
            "waiting on the host (Python, scheduler, launches)", "等主机（Python、调度器、启动）"
        ),
    )
    for y, (b, w) in enumerate(zip(busy, waiting)):
        share = w / (b + w) if b + w > 0 else 0.0
        ax.text(
            (b + w) * 1.01,
            y,
            tr(f"host {100 * share:.0f} %", f"主机 {100 * share:.0f} %"),
            va="center",
            fontsize=8,
        )
    ax.set_xlim(0, max(b + w for b, w in zip(busy, waiting)) * 1.2)
    ax.invert_yaxis()
    ax.set_xlabel(tr("ms per decode step", "每个 decode step 的 ms"))
    ax.set_title(
        tr(
            "A batch-1 decode step of SmolLM2-135M's shape: computing or waiting",
            "SmolLM2-135M 形状的 batch 1 decode step：在算，还是在等",
        )
    )
    ax.legend(fontsize=8, loc="best", frameon=False)
    fig.tight_layout()
    return fig


def gpu_run_table(gpu_run: dict[str, Any]) -> str:
    """The figures of a recorded GPU run (`llmlab.analysis.step_time.gpu_run`) as a printed
    table, its card, date and software in the first line: measured there, not here."""
    step, per_token = gpu_run["decode_step"], gpu_run["ms_per_token_batch1"]
    card, date, model = gpu_run["card"], gpu_run["measured_before"], gpu_run["model"]
    software, dtype = gpu_run["software"], gpu_run["dtype"]
    head = tr(
        f"Measured by llmlab on an {card} before {date} ({software}), random weights of "
        f"{model}'s shape, {dtype}:",
        f"llmlab 在 {card} 上实测，早于 {date}（{software}），{model} 形状的随机权重，{dtype}：",
    )
    rows = [
        (
            tr("kernels per decode step", "每个 decode step 的 kernel 数"),
            f"{gpu_run['kernels_per_decode_step']:,}",
        ),
        (
            tr(
                f"decode step at batch {step['batch']} ({step['attention_backend']})",
                f"batch {step['batch']} 的 decode step（{step['attention_backend']}）",
            ),
            tr(
                f"{step['wall_ms']:.1f} ms, GPU busy {step['gpu_busy_ms']:.1f} ms",
                f"{step['wall_ms']:.1f} ms，GPU 忙 {step['gpu_busy_ms']:.1f} ms",
            ),
        ),
        *(
            (
                tr(f"ms per token at batch 1, {name}", f"batch 1 每个 token 的 ms，{name}"),
                f"{ms:.1f}",
            )
            for name, ms in per_token.items()
        ),
        (
            tr("HBM floor, ms per token at batch 1", "HBM 下限，batch 1 每个 token 的 ms"),
            f"{gpu_run['hbm_floor_ms_per_token']:.3f}",
        ),
    ]
    return head + "\n" + format_table(rows, rule=False)
