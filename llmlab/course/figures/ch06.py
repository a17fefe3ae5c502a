"""Chapter 06's figures: the memory of a whole GPU chip, level by level."""

from __future__ import annotations

from typing import Any, Sequence

from llmlab.analysis.hardware import PRESETS, Hardware, MountainResult, get_hardware, human_bytes
from llmlab.course.check.catalog import catalog
from llmlab.course.figures._axes import finish
from llmlab.course.figures.headers import header
from llmlab.i18n import notebook_text
from llmlab.utils import cpu_name, format_table

M = catalog("figures.ch06")

# the levels of a chip's memory, as the legend names them (in the catalog's section "level")
CHIP_LEVELS = ("shared memory / L1, all SMs", "L2 cache", "HBM")


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
            M("chip_memory.unknown_presets_choose", unknown=unknown, list_presets=list(PRESETS))
        )
    fig, ax = plt.subplots(figsize=(8, 3.8))
    x = np.arange(len(names))
    width = 0.8 / len(CHIP_LEVELS)
    for i, level in enumerate(CHIP_LEVELS):
        sizes = [chip_levels(n)[i] for n in names]
        ax.bar(x + (i - 1) * width, sizes, width, label=M.by_english(level, "level"))
    ax.set_yscale("log")
    ax.set_xticks(x, list(names))
    return finish(
        ax, ylabel=M("chip_memory.bytes_whole_chip"), title=M("chip_memory.one_chip_s"), legend=8
    )


def table_text(rows: dict[str, dict[str, Any]], corner: str = "") -> str:
    """A plain-text table: one line per key of `rows`, one column per key of its dict (the
    columns of the first row, in order); numbers as given, missing cells as "-". The corner,
    the column headers and the row labels are printed in the language in use
    (`llmlab.course.figures.headers`)."""
    if not rows:
        raise ValueError(M("table_text.rows_empty"))
    columns = list(next(iter(rows.values())))
    body = [
        [header(str(name)), *("-" if r.get(c) is None else r[c] for c in columns)]
        for name, r in rows.items()
    ]
    return format_table(body, [header(corner), *(header(str(c)) for c in columns)], align="lr")


def print_table(rows: dict[str, dict[str, Any]], corner: str = "") -> None:
    """Print `table_text(rows, corner)`."""
    print(table_text(rows, corner))


def plot_memory_mountain(result: MountainResult, ax: Any = None, title: str | None = None) -> Any:
    """Bandwidth (GB/s) against working-set size (log scale), cache sizes marked."""
    import matplotlib.pyplot as plt

    title = notebook_text(title)  # a title a notebook cell wrote, in the language in use

    if ax is None:
        _, ax = plt.subplots(figsize=(7, 4))
    ax.semilogx(
        [s / 1024 for s in result.sizes],
        [b / 1e9 for b in result.bandwidths],
        "o-",
        label=M("plot_memory_mountain.measured_thread_s", threads=result.threads),
    )
    for cache in result.caches:
        if cache["type"] == "Instruction":
            continue
        ax.axvline(cache["size"] / 1024, color="grey", ls=":", lw=1)
        ax.text(
            cache["size"] / 1024,
            ax.get_ylim()[1] * 0.95,
            f" L{cache['level']}",
            va="top",
            fontsize=9,
            color="grey",
        )
    ax.set_xlabel(M("plot_memory_mountain.working_set_size"))
    ax.set_ylabel(M("plot_memory_mountain.read_bandwidth_gb"))
    machine = cpu_name() if result.device == "cpu" else result.device
    ax.set_title(title or M("plot_memory_mountain.memory_mountain_machine", machine=machine))
    ax.legend()
    ax.grid(True, which="both", alpha=0.3)
    return ax


def plot_hierarchy(hw: Hardware | str = "H100-SXM", ax: Any = None) -> Any:
    """Size of each memory level (log scale) of a preset that lists its hierarchy, bandwidth annotated."""
    import matplotlib.pyplot as plt

    hw = get_hardware(hw) if isinstance(hw, str) else hw
    levels = [lv for lv in hw.hierarchy if lv.get("size")]
    if not levels:
        raise ValueError(M("plot_hierarchy.hardware_has_no", name=hw.name))
    if ax is None:
        _, ax = plt.subplots(figsize=(7, 3.5))
    # data/hardware.json names the levels in English; the catalog's sections hold their Chinese
    names = [
        M("plot_hierarchy.text", level=level, per=per)
        for level, per in (
            (M.by_english(lv["level"], "level"), M.by_english(f"per {lv['per']}", "per"))
            for lv in levels
        )
    ]
    sizes = [lv["size"] for lv in levels]
    bars = ax.barh(names, sizes, color=["#15803d", "#15803d", "#b45309", "#b91c1c"][: len(levels)])
    ax.set_xscale("log")
    for bar, lv in zip(bars, levels):
        label = human_bytes(lv["size"])
        if lv.get("latency"):
            label += f", ~{lv['latency'] * 1e9:.0f} ns"
        if lv.get("bandwidth"):
            label += f", {lv['bandwidth'] / 1e12:.2f} TB/s"
        ax.text(
            bar.get_width() * 1.2,
            bar.get_y() + bar.get_height() / 2,
            label,
            va="center",
            fontsize=9,
        )
    ax.invert_yaxis()
    ax.set_xlim(min(sizes) / 3, max(sizes) * 1e3)
    ax.set_xlabel(M("plot_hierarchy.capacity_bytes_log"))
    ax.set_title(M("plot_hierarchy.smaller_memories_sit", name=hw.name))
    return ax
