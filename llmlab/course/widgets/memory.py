"""Weight-read time: model size × bandwidth → the per-token floor of decoding at batch 1.

`weight_read_summary(...)`, `weight_read_text(...)` (first line "Per-token floor: <x> ms",
parse the English text with `WEIGHT_READ_PATTERN`; the Chinese one holds the same numbers),
`plot_weight_read(...)` and the slider box `weight_read_explorer()`.
"""

from __future__ import annotations

import re
from typing import Any

from llmlab.analysis.hardware import PRESETS
from llmlab.analysis.roofline import weight_read_time
from llmlab.course.check.catalog import catalog
from llmlab.course.widgets._show import controls_of, explorer

M = catalog("widgets.memory")

WEIGHT_READ_PATTERN = re.compile(r"Per-token floor: ([0-9.]+) ms")
DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp8": 1, "int4": 0.5}


def weight_read_text(
    params_billion: float = 70.0, dtype: str = "bf16", bandwidth_tb_s: float = 3.0
) -> str:
    """'Per-token floor: 46.7 ms' plus the bytes and the tokens/s bound at batch 1."""
    if dtype not in DTYPE_BYTES:
        raise ValueError(
            M(
                "weight_read_text.dtype_must_one",
                dtypes=sorted(DTYPE_BYTES),
                dtype=dtype,
            )
        )
    nbytes = params_billion * 1e9 * DTYPE_BYTES[dtype]
    t = weight_read_time(params_billion * 1e9, DTYPE_BYTES[dtype], bandwidth_tb_s * 1e12)
    return M(
        "weight_read_text.per_token_floor",
        floor_ms=t * 1e3,
        params_billion=params_billion,
        bytes_per_weight=DTYPE_BYTES[dtype],
        dtype=dtype,
        weight_gb=nbytes / 1e9,
        bandwidth_tb_s=bandwidth_tb_s,
        tokens_per_s=1 / t,
    )


def plot_weight_read(
    params_billion: float = 70.0, dtype: str = "bf16", bandwidth_tb_s: float | None = None
) -> Any:
    """Per-token floor of a model on every hardware preset (and at `bandwidth_tb_s` if given)."""
    import matplotlib.pyplot as plt

    names = list(PRESETS)
    bws = [PRESETS[n].mem_bw for n in names]
    if bandwidth_tb_s is not None:
        names.append(M("plot_weight_read.your_choice_tb", bandwidth_tb_s=bandwidth_tb_s))
        bws.append(bandwidth_tb_s * 1e12)
    times = [weight_read_time(params_billion * 1e9, DTYPE_BYTES[dtype], bw) * 1e3 for bw in bws]
    fig, ax = plt.subplots(figsize=(8, 3.8))
    bars = ax.barh(names, times, color="#2563eb")
    for bar, t, bw in zip(bars, times, bws):
        ax.text(
            bar.get_width(),
            bar.get_y() + bar.get_height() / 2,
            f" {t:,.1f} ms ({bw / 1e12:.2f} TB/s)",
            va="center",
            fontsize=8,
        )
    ax.set_xscale("log")
    ax.set_xlabel(M("plot_weight_read.time_read_weights"))
    ax.set_title(M("plot_weight_read.b_parameters_one", params_billion=params_billion, dtype=dtype))
    ax.invert_yaxis()
    fig.tight_layout()
    return fig


def weight_read_explorer(
    params_billion: float = 70.0, dtype: str = "bf16", bandwidth_tb_s: float = 3.0
) -> Any:
    """Sliders: model size, dtype, bandwidth → per-token floor."""
    start = {"params_billion": params_billion, "dtype": dtype, "bandwidth_tb_s": bandwidth_tb_s}
    table = {
        "params_billion": ("FloatLogSlider", M("weight_read_explorer.params_b"), -1, 3, 0.01),
        "dtype": ("Dropdown", "dtype", list(DTYPE_BYTES)),
        "bandwidth_tb_s": (
            "FloatSlider",
            M("weight_read_explorer.bandwidth_tb_s"),
            0.05,
            8.0,
            0.05,
        ),
    }
    controls = controls_of(table, start, "120px")
    return explorer(
        controls,
        [("params_billion", "dtype", "bandwidth_tb_s")],
        "llmlab-weight-read-result",
        weight_read_text,
        plot_weight_read,
    )
