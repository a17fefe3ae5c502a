"""Chapter 06's figures draw the numbers they are given: the chip-wide bars are the presets'
per-SM shared memory times the SM count, the L2 and the HBM; the tables print every cell."""

from __future__ import annotations

import matplotlib
import pytest

matplotlib.use("Agg")

from llmlab.analysis.hardware import PRESETS, MountainResult  # noqa: E402
from llmlab.course.figures import ch06  # noqa: E402


def test_chip_levels_add_up_every_sm():
    h = PRESETS["H100-SXM"]
    assert ch06.chip_levels("H100-SXM") == [h.smem_per_sm * h.num_sms, h.l2_size, h.mem_size]
    sram, _, hbm = ch06.chip_levels("H100-SXM")
    assert 1e3 < hbm / sram < 1e4  # chip-wide: about three orders of magnitude
    assert hbm / h.smem_per_sm > 1e5  # one SM against the chip: five


def test_chip_memory_bars_are_the_levels():
    import matplotlib.pyplot as plt

    names = ["H100-SXM", "A100-80GB"]
    fig = ch06.chip_memory(names)
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == names
    assert [t.get_text() for t in ax.get_legend().get_texts()] == list(ch06.CHIP_LEVELS)
    heights = [p.get_height() for p in ax.patches]
    for i, _level in enumerate(ch06.CHIP_LEVELS):
        assert heights[i * len(names) : (i + 1) * len(names)] == [
            ch06.chip_levels(n)[i] for n in names
        ]
    assert ax.get_yscale() == "log" and "bytes" in ax.get_ylabel()
    plt.close(fig)
    with pytest.raises(ValueError, match="unknown presets"):
        ch06.chip_memory(["no-such-gpu"])


def test_table_text_prints_rows_and_missing_cells():
    text = ch06.table_text({"a": {"x": 1, "y": None}, "bb": {"x": 22, "y": "z"}}, "row")
    lines = text.splitlines()
    assert lines[0].split() == ["row", "x", "y"]
    assert lines[2].split() == ["a", "1", "-"] and lines[3].split() == ["bb", "22", "z"]
    with pytest.raises(ValueError):
        ch06.table_text({})


def test_mountain_and_hierarchy_have_labelled_axes():
    m = MountainResult(
        [16384, 1 << 20], [1e11, 5e10], "cpu", 1, [{"level": 1, "type": "Data", "size": 49152}]
    )
    ax = ch06.plot_memory_mountain(m)
    assert "KiB" in ax.get_xlabel() and "GB/s" in ax.get_ylabel()
    ax = ch06.plot_hierarchy("H100-SXM")
    assert "bytes" in ax.get_xlabel()
    with pytest.raises(ValueError, match="hierarchy"):
        ch06.plot_hierarchy("L4")
