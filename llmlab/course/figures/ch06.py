"""Chapter 06's figures: the memory of a whole GPU chip, level by level."""

from __future__ import annotations

from typing import Any, Sequence

from llmlab.analysis.hardware import PRESETS, get_hardware
from llmlab.course.figures.headers import header
from llmlab.i18n import tr
from llmlab.utils import format_table

# the levels as the legend names them, (English, Chinese)
_LEVEL_NAMES = (
    ("shared memory / L1, all SMs", "共享内存 / L1，所有 SM 合计"),
    ("L2 cache", "L2 缓存"),
    ("HBM", "HBM"),
)
CHIP_LEVELS = tuple(en for en, _ in _LEVEL_NAMES)


def chip_levels(name: str) -> list[float]:
    """Bytes of each of CHIP_LEVELS on the whole chip of preset `name`: every SM's shared memory
    added up (the per-SM figure times the SM count), the L2, the HBM."""
    hw = get_hardware(name)
    return [float(hw.smem_per_sm * hw.num_sms), float(hw.l2_size), float(hw.mem_size)]


def chip_memory(names: Sequence[str] = ("H100-SXM", "H200", "A100-80GB")) -> Any:
    """Grouped bars (log scale) of CHIP_LEVELS per preset: one chip's memories side by side."""
    import matplotlib.pyplot as plt
    import numpy as np

    unknown = [n for n in names if n not in PRESETS]
    if unknown:
        raise ValueError(
            tr(
                f"unknown presets {unknown}; choose from {list(PRESETS)}",
                f"没有这些预设：{unknown}；请从 {list(PRESETS)} 中选",
            )
        )
    fig, ax = plt.subplots(figsize=(8, 3.8))
    x = np.arange(len(names))
    width = 0.8 / len(CHIP_LEVELS)
    for i, level in enumerate(_LEVEL_NAMES):
        sizes = [chip_levels(n)[i] for n in names]
        ax.bar(x + (i - 1) * width, sizes, width, label=tr(*level))
    ax.set_yscale("log")
    ax.set_xticks(x, list(names))
    ax.set_ylabel(tr("bytes on the whole chip (log scale)", "整颗芯片上的字节数（对数坐标）"))
    ax.set_title(
        tr(
            "One chip's memory, level by level (presets: datasheet figures)",
            "一颗芯片的各级存储（预设：数据手册上的数字）",
        )
    )
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def table_text(rows: dict[str, dict[str, Any]], corner: str = "") -> str:
    """A plain-text table: one line per key of `rows`, one column per key of its dict (the
    columns of the first row, in order); numbers as given, missing cells as "-". The corner,
    the column headers and the row labels are printed in the language in use
    (`llmlab.course.figures.headers`)."""
    if not rows:
        raise ValueError(tr("rows is empty", "rows 是空的"))
    columns = list(next(iter(rows.values())))
    body = [
        [header(str(name)), *("-" if r.get(c) is None else r[c] for c in columns)]
        for name, r in rows.items()
    ]
    return format_table(body, [header(corner), *(header(str(c)) for c in columns)], align="lr")


def print_table(rows: dict[str, dict[str, Any]], corner: str = "") -> None:
    """Print `table_text(rows, corner)`."""
    print(table_text(rows, corner))
