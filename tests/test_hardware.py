"""llmlab.analysis.hardware: the presets' figures and sources, and measurements of this machine."""

from __future__ import annotations

import json

import pytest
import torch

from llmlab.analysis import hardware, timing
from llmlab.analysis.hardware import DATA_DIR, PRESETS, Hardware

GPUS = ["H100-SXM", "H100-SXM-source", "H200", "A100-80GB", "L4", "RTX-4090"]
FIGURES = ["mem_bw", "peak_flops", "mem_size", "l2_size", "smem_per_sm", "num_sms", "interconnect"]


def test_every_required_preset_exists():
    assert set(GPUS + ["laptop-cpu"]) <= set(PRESETS)


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_figure_names_its_source(name):
    hw = PRESETS[name]
    missing = [f for f in FIGURES if not hw.sources.get(f)]
    assert not missing, f"{name}: no source for {missing}"


@pytest.mark.parametrize("name", GPUS)
def test_gpu_presets_have_bf16_and_sane_sizes(name):
    hw = PRESETS[name]
    assert hw.peak_flops["bf16"] == hw.peak_flops["fp16"]
    assert hw.peak_flops["bf16"] > hw.peak_flops["fp32"]  # tensor cores beat plain FP32
    assert hw.l2_size < hw.mem_size and hw.smem_per_sm < hw.l2_size
    assert 1e11 < hw.mem_bw < 1e13  # 0.1 .. 10 TB/s


def test_h100_datasheet_against_source_round_figures():
    dat, source = PRESETS["H100-SXM"], PRESETS["H100-SXM-source"]
    assert dat.mem_bw == pytest.approx(3.35e12) and source.mem_bw == pytest.approx(3.0e12)
    assert dat.peak_flops["bf16"] == pytest.approx(989.4e12) and source.peak_flops[
        "bf16"
    ] == pytest.approx(1e15)
    # the seed's other H100 figures: 50 MB L2, 228 KB SRAM per SM, NVLink 900 GB/s, PCIe 5.0 128 GB/s
    assert dat.l2_size == 50e6 and dat.smem_per_sm == 228e3
    assert dat.interconnect == {"nvlink": 900e9, "pcie": 128e9}


def test_h200_differs_from_h100_in_memory_only():
    h100, h200 = PRESETS["H100-SXM"], PRESETS["H200"]
    assert h200.peak_flops == h100.peak_flops
    assert h200.mem_bw / h100.mem_bw == pytest.approx(4.8 / 3.35)
    assert h200.mem_size == 141e9


def test_json_is_the_source_of_presets():
    raw = json.loads((DATA_DIR / "hardware.json").read_text())["presets"]
    assert set(raw) == set(PRESETS)
    assert PRESETS["A100-80GB"].mem_bw == raw["A100-80GB"]["mem_bw"]
    assert "fp8" not in PRESETS["A100-80GB"].peak_flops  # Ampere has no FP8


def test_h100_hierarchy_per_sm_levels_are_smaller_than_l2_and_hbm():
    levels = {lv["level"].split()[0]: lv for lv in PRESETS["H100-SXM"].hierarchy}
    # per SM, the register file (256 KB) is even a little larger than the shared memory (228 KB)
    assert levels["registers"]["size"] > levels["shared"]["size"]
    assert levels["shared"]["size"] * 100 < levels["L2"]["size"] < levels["HBM3"]["size"] / 1000
    assert levels["HBM3"]["bandwidth"] > levels["NVLink"]["bandwidth"] > levels["PCIe"]["bandwidth"]


def test_bad_values_name_the_field():
    with pytest.raises(ValueError, match="mem_bw"):
        Hardware(name="x", mem_bw=-1, peak_flops={"fp32": 1.0}, mem_size=1)
    with pytest.raises(ValueError, match="fp64"):
        Hardware(name="x", mem_bw=1, peak_flops={"fp64": 1.0}, mem_size=1)
    with pytest.raises(ValueError, match="laptop-cpu.*fp32"):
        PRESETS["laptop-cpu"].flops("bf16")
    with pytest.raises(ValueError, match="H999"):
        hardware.get_hardware("H999")


def test_measurements_reject_bad_arguments():
    with pytest.raises(ValueError, match="kind"):
        hardware.measure_bandwidth(kind="write")
    with pytest.raises(ValueError, match="nbytes"):
        hardware.measure_bandwidth(nbytes=10)
    with pytest.raises(ValueError, match="dtype"):
        hardware.measure_matmul_flops(dtype="fp64")
    with pytest.raises(ValueError, match="threads"):
        hardware.measure_matmul_flops(n=64, threads=0)
    with pytest.raises(ValueError, match="library"):
        hardware.measure_matmul_flops(n=64, library="blas")


def test_the_peak_is_the_fastest_library(monkeypatch):
    """None takes the best of every library this machine has: each library's call is timed on
    its own (here with planted times, drawn fresh, so the pick is checked without the noise of
    a shared machine; `test_measured_bandwidth_and_flops_are_physical` times real matmuls)."""
    import random

    libraries = timing.matmul_libraries(timing.resolve_device("cpu"), None)
    assert "aten" in libraries
    seconds = {lib: random.uniform(0.01, 1.0) for lib in libraries}
    timed = []

    def linear_fn(library, w):
        return lambda x: timed.append(library)

    def best_time(fn, dev, repeats, budget_s=None):
        fn()
        return seconds[timed[-1]]

    monkeypatch.setattr(timing, "linear_fn", linear_fn)
    monkeypatch.setattr(timing, "best_time", best_time)
    n = 64
    one = {lib: hardware.measure_matmul_flops("cpu", n=n, library=lib) for lib in libraries}
    for lib in libraries:
        assert one[lib] == pytest.approx(2 * n**3 / seconds[lib])
    timed.clear()
    best = hardware.measure_matmul_flops("cpu", n=n)
    assert set(timed) == set(libraries)  # every library was tried
    assert best == pytest.approx(max(one.values()))


def test_measured_bandwidth_and_flops_are_physical():
    bw = hardware.measure_bandwidth("cpu", nbytes=16 * 1024**2, repeats=3)
    copy = hardware.measure_bandwidth("cpu", nbytes=16 * 1024**2, kind="copy", repeats=3)
    flops = hardware.measure_matmul_flops("cpu", n=256, repeats=3)
    for x in (bw, copy):
        assert 1e8 < x < 5e12  # 0.1 GB/s .. 5 TB/s for any CPU
    assert 1e8 < flops < 1e14


def test_memory_mountain_shows_a_cache_step():
    # 32 KiB sits in L1 of any current CPU; 128 MiB is beyond every last-level cache we know
    m = hardware.memory_mountain(
        "cpu", sizes=[32 * 1024, 128 * 1024**2], traffic_bytes=64 * 1024**2
    )
    assert m.threads == 1 and len(m.bandwidths) == 2
    assert m.bandwidths[0] > 1.5 * m.bandwidths[1], m.bandwidths


def test_this_machine_names_cpu_and_threads(monkeypatch):
    import torch

    monkeypatch.setenv("LLMLAB_FAST", "1")
    hardware.this_machine.cache_clear()
    hw = hardware.this_machine("cpu")
    assert hw.measured and hw.kind == "cpu"
    assert hw.name == f"{hardware.cpu_name()}, {torch.get_num_threads()} threads"
    assert hw.mem_bw > 0 and hw.peak_flops["fp32"] > 0 and hw.extra["copy_bw"] > 0
    assert hw.mem_size > 1e9


def test_gemv_bandwidth_is_positive_and_validated():
    bw = hardware.measure_gemv_bandwidth("cpu", rows=4096, cols=256, repeats=3)
    assert 1e8 < bw < 5e12
    with pytest.raises(ValueError, match="rows"):
        hardware.measure_gemv_bandwidth(rows=0)


@pytest.mark.parametrize("huge", [False, True])
def test_the_read_roof_reads_from_huge_pages_when_asked(monkeypatch, huge):
    """decode_profile's roof reads from 2 MB pages, as the fast path's weights do."""
    from llmlab.model import huge_pages

    asked = []
    real = huge_pages.huge_page_tensors

    def recording(specs):
        asked.append(specs)
        return real(specs)

    monkeypatch.setattr(huge_pages, "huge_page_tensors", recording)
    monkeypatch.setattr(huge_pages, "huge_pages_available", lambda: True)
    bw = hardware.measure_bandwidth("cpu", nbytes=8 * 1024**2, repeats=2, huge_pages=huge)
    assert bw > 0
    assert asked == ([[((2 * 1024**2,), torch.float32)]] if huge else [])
