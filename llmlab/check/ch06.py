"""Self-checks of chapter 06 (memory hierarchy): reading 70B weights once, the per-token floor
on H200, HBM against PCIe, and where a working set lives on this machine's caches."""
from __future__ import annotations

from typing import Any

from llmlab import costs
from llmlab.check.ch01 import combine_mistakes
from llmlab.check.core import CheckResult, check_choice, check_number
from llmlab.config import get_config
from llmlab.hardware import PRESETS, cpu_caches

SEED_PARAMS = 70e9          # the seed: "70B FP16 = 140 GB"
SEED_BW = 3e12              # the seed: "~3 TB/s"
WORKING_SET = 4 * 1024**2   # bytes, for working_set_level
LEVELS = ["L1", "L2", "L3", "DRAM"]
# Where this machine does not report its caches (macOS, Windows): a typical laptop core's, so the
# question still has one right answer (the notebook names it: ch06.REFERENCE_CACHES).
REFERENCE_CACHES = [{"level": 1, "type": "Data", "size": 48 * 1024},
                    {"level": 2, "type": "Unified", "size": 1280 * 1024},
                    {"level": 3, "type": "Unified", "size": 12 * 1024**2}]


def weight_read_ms(answer: Any) -> CheckResult:
    """Milliseconds to read 70e9 BF16 weights once at 3 TB/s (the seed's per-token floor)."""
    expected = SEED_PARAMS * 2 / SEED_BW * 1e3
    return check_number("ch06.weight_read_ms", answer, expected, rel=0.02, mistakes=combine_mistakes(
        (SEED_PARAMS / SEED_BW * 1e3, "that counts parameters, not bytes: each BF16 weight is 2 bytes."),
        (SEED_PARAMS * 4 / SEED_BW * 1e3, "that uses 4 bytes per weight (FP32); the weights here are BF16."),
        (SEED_PARAMS * 2 / 3.35e12 * 1e3, "that uses the datasheet's 3.35 TB/s; this question uses the seed's 3 TB/s."),
        (SEED_BW / (SEED_PARAMS * 2) * 1e3, "upside down: time = bytes / (bytes per second)."),
    ), default_hint="bytes of the weights (parameters × bytes each) divided by the bandwidth, in ms.")


def h200_floor_ms(answer: Any) -> CheckResult:
    """Per-token floor in ms of Llama-3-70B (`costs.param_count`) in BF16 on the H200 preset at batch 1."""
    cfg = get_config("llama-3-70b")
    params = costs.param_count(cfg)
    h200, h100 = PRESETS["H200"], PRESETS["H100-SXM"]
    expected = params * 2 / h200.mem_bw * 1e3
    return check_number("ch06.h200_floor_ms", answer, expected, rel=0.02, mistakes=combine_mistakes(
        (params * 2 / h100.mem_bw * 1e3, "that is H100 SXM's bandwidth; use the H200 preset's mem_bw."),
        (params * 2 / 3e12 * 1e3, "that is the seed's 3 TB/s H100; use the H200 preset's mem_bw."),
        (params * 4 / h200.mem_bw * 1e3, "that uses 4 bytes per weight (FP32); the weights are BF16."),
        (params / h200.mem_bw * 1e3, "that counts parameters, not bytes: each BF16 weight is 2 bytes."),
        (2 * params / h200.peak_flops["bf16"] * 1e3,
         "that divides FLOPs by the compute peak: at batch 1 the weights' bytes over the bandwidth take far longer."),
    ), default_hint="param_count × 2 bytes / H200 bandwidth, in milliseconds.")


def hbm_vs_pcie(answer: Any) -> CheckResult:
    """How many times faster is H100 SXM's HBM than its PCIe link (the presets' figures)?"""
    h = PRESETS["H100-SXM"]
    pcie = h.interconnect["pcie"]
    expected = h.mem_bw / pcie
    return check_number("ch06.hbm_vs_pcie", answer, expected, rel=0.02, mistakes=combine_mistakes(
        (3e12 / pcie, "that is the seed's round 3 TB/s; use the preset's mem_bw."),
        (h.mem_bw / (pcie / 2), "that uses one direction of PCIe (64 GB/s); the preset lists the 128 GB/s total."),
        (h.interconnect["nvlink"] / pcie, "that is NVLink over PCIe; the question compares HBM with PCIe."),
        (pcie / h.mem_bw, "upside down: HBM bandwidth divided by PCIe bandwidth."),
    ), default_hint="PRESETS['H100-SXM'].mem_bw / PRESETS['H100-SXM'].interconnect['pcie'].")


def _level_of(size: int, caches: list[dict]) -> str:
    for c in sorted((c for c in caches if c["type"] != "Instruction"), key=lambda c: c["size"]):
        if size <= c["size"]:
            return f"L{c['level']}"
    return "DRAM"


def _exercise_caches() -> list[dict]:
    """The caches `working_set_level` asks about: this machine's (`hardware.cpu_caches()`), or
    REFERENCE_CACHES, a typical laptop core's, where this machine does not report them."""
    return cpu_caches() or REFERENCE_CACHES


def working_set_level(answer: Any, size: int = WORKING_SET) -> CheckResult:
    """Which is the smallest cache level that holds a `size`-byte working set (one core's view):
    of this machine's caches, or of REFERENCE_CACHES where this machine reports none?"""
    caches = _exercise_caches()
    expected = _level_of(size, caches)
    hints = {lv: ("too small: the working set does not fit in that cache; compare its size with "
                  "hardware.cpu_caches()." if LEVELS.index(lv) < LEVELS.index(expected) else
                  "a smaller, faster level already holds it; look at hardware.cpu_caches().")
             for lv in LEVELS if lv != expected}
    return check_choice("ch06.working_set_level", answer, expected, options=LEVELS, hints=hints)
