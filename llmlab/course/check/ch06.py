"""Self-checks of chapter 06 (memory hierarchy): reading 70B weights once, the per-token floor
on H200, the bandwidth a design needs (the weight-read widget's task), HBM against PCIe, weights
offloaded to CPU memory, and where a working set lives on this machine's caches."""

from __future__ import annotations

from typing import Any

from llmlab.analysis import costs
from llmlab.analysis.hardware import PRESETS, cpu_caches
from llmlab.config import get_config
from llmlab.course.check.catalog import catalog
from llmlab.course.check.ch01 import combine_mistakes
from llmlab.course.check.core import CheckResult, check_choice
from llmlab.course.check.question import Expected, numeric

M = catalog("ch06")

SOURCE_PARAMS = 70e9  # the source chapter: "70B FP16 = 140 GB"
SOURCE_BW = 3e12  # the source chapter: "~3 TB/s"
WORKING_SET = 4 * 1024**2  # bytes, for working_set_level
LEVELS = ["L1", "L2", "L3", "DRAM"]
# Where this machine does not report its caches (macOS, Windows): a reference laptop core's, so
# the question still has one right answer (the notebook prints which caches it grades against).
REFERENCE_CACHES = [
    {"level": 1, "type": "Data", "size": 48 * 1024},
    {"level": 2, "type": "Unified", "size": 1280 * 1024},
    {"level": 3, "type": "Unified", "size": 12 * 1024**2},
]
REFERENCE_NAME = M.template("graded_machine.reference")
REFERENCE_NAME_ZH = M.template("graded_machine.reference", "zh")

# bandwidth_for_speed: the weight-read widget's task
SPEED_PARAMS = 100e9  # parameters
SPEED_DTYPE_BYTES = 1  # FP8
SPEED_TOKENS_PER_S = 25  # one user, batch 1

# offload_floor_ms: vLLM's --cpu-offload-gb on one H100
OFFLOAD_MODEL = "llama-3-8b"
OFFLOAD_BYTES = 10e9  # --cpu-offload-gb 10


@numeric(rel=0.02)
def weight_read_ms() -> Expected:
    """Milliseconds to read 70e9 BF16 weights once at 3 TB/s (the source chapter's per-token
    floor)."""
    expected = SOURCE_PARAMS * 2 / SOURCE_BW * 1e3
    return Expected(
        expected,
        mistakes=combine_mistakes(
            (SOURCE_PARAMS / SOURCE_BW * 1e3, M("parameters_not_bytes")),
            (SOURCE_PARAMS * 4 / SOURCE_BW * 1e3, M("weight_read_ms.fp32")),
            (SOURCE_PARAMS * 2 / 3.35e12 * 1e3, M("weight_read_ms.datasheet_bandwidth")),
            (SOURCE_BW / (SOURCE_PARAMS * 2) * 1e3, M("weight_read_ms.upside_down")),
            (SOURCE_PARAMS * 2 / SOURCE_BW, M("weight_read_ms.seconds")),
        ),
    )


@numeric(rel=0.02)
def h200_floor_ms() -> Expected:
    """Per-token floor in ms of Llama-3-70B (`costs.param_count`) in BF16 on the H200 preset at batch 1."""
    cfg = get_config("llama-3-70b")
    params = costs.param_count(cfg)
    h200, h100 = PRESETS["H200"], PRESETS["H100-SXM"]
    expected = params * 2 / h200.mem_bw * 1e3
    return Expected(
        expected,
        mistakes=combine_mistakes(
            (params * 2 / h100.mem_bw * 1e3, M("h200_floor_ms.h100")),
            (params * 2 / 3e12 * 1e3, M("h200_floor_ms.source_bandwidth")),
            (params * 4 / h200.mem_bw * 1e3, M("h200_floor_ms.fp32")),
            (params / h200.mem_bw * 1e3, M("parameters_not_bytes")),
            (SOURCE_PARAMS * 2 / h200.mem_bw * 1e3, M("h200_floor_ms.round_params")),
            (2 * params / h200.peak_flops["bf16"] * 1e3, M("h200_floor_ms.compute_bound")),
        ),
    )


@numeric(rel=0.03)
def bandwidth_for_speed() -> Expected:
    """The memory bandwidth (TB/s) at which a 100B-parameter model in FP8 decodes 25 tokens/s for
    one user (batch 1): found with the weight-read widget's sliders, or by reasoning backwards."""
    weight_tb = SPEED_PARAMS * SPEED_DTYPE_BYTES / 1e12
    expected = SPEED_PARAMS * SPEED_DTYPE_BYTES * SPEED_TOKENS_PER_S / 1e12
    return Expected(
        expected,
        mistakes=combine_mistakes(
            (expected * 2, M("bandwidth_for_speed.bf16")),
            (expected / 2, M("bandwidth_for_speed.int4")),
            (weight_tb / SPEED_TOKENS_PER_S, M("bandwidth_for_speed.divided_by_rate")),
            (weight_tb, M("bandwidth_for_speed.one_read")),
        ),
    )


@numeric(rel=0.02)
def hbm_vs_pcie() -> Expected:
    """On an H100 (the preset's figures), reading 1 GB of weights over PCIe takes as long as reading
    how many GB from HBM? (The ratio of the two bandwidths: the price of one offloaded GB.) The
    weights cross PCIe one way, host to device, at half the preset's figure (PCIe 5.0 x16: 128 GB/s
    with both directions added, about 64 GB/s each way), as exercise 6 and chapter 09 count it."""
    h = PRESETS["H100-SXM"]
    pcie, one_way = h.interconnect["pcie"], h.interconnect["pcie"] / 2
    expected = h.mem_bw / one_way
    return Expected(
        expected,
        mistakes=combine_mistakes(
            (3e12 / one_way, M("hbm_vs_pcie.source_bandwidth")),
            (h.mem_bw / pcie, M("hbm_vs_pcie.both_directions")),
            (h.interconnect["nvlink"] / pcie, M("hbm_vs_pcie.nvlink")),
            (one_way / h.mem_bw, M("hbm_vs_pcie.upside_down")),
        ),
    )


def _offload_parts() -> tuple[float, float, float, float]:
    """(weight bytes, HBM bytes/s, one-direction PCIe bytes/s, expected ms) for offload_floor_ms."""
    h = PRESETS["H100-SXM"]
    weights = costs.weight_bytes(get_config(OFFLOAD_MODEL), 2)
    hbm, pcie_one_way = h.mem_bw, h.interconnect["pcie"] / 2
    expected = ((weights - OFFLOAD_BYTES) / hbm + OFFLOAD_BYTES / pcie_one_way) * 1e3
    return weights, hbm, pcie_one_way, expected


@numeric(rel=0.004)
def offload_floor_ms() -> Expected:
    """Llama-3-8B in BF16 on one H100-SXM with 10 GB of its weights kept in CPU memory (vLLM's
    `--cpu-offload-gb 10`): the per-token floor in ms at batch 1, when the offloaded weights cross
    PCIe host→device at one direction's bandwidth (half the preset's total) in every step."""
    weights, hbm, pcie, expected = _offload_parts()
    resident = (weights - OFFLOAD_BYTES) / hbm  # the part left in HBM, read from there
    return Expected(
        expected,
        mistakes=combine_mistakes(
            (weights / hbm * 1e3, M("offload_floor_ms.no_offload")),
            ((resident + OFFLOAD_BYTES / (2 * pcie)) * 1e3, M("offload_floor_ms.both_directions")),
            (OFFLOAD_BYTES / pcie * 1e3, M("offload_floor_ms.offloaded_only")),
            (weights / pcie * 1e3, M("offload_floor_ms.all_over_pcie")),
            ((weights / hbm + OFFLOAD_BYTES / pcie) * 1e3, M("offload_floor_ms.counted_twice")),
        ),
    )


def exercise_caches() -> list[dict]:
    """The caches `working_set_level` grades against: this machine's (`hardware.cpu_caches()`), or
    REFERENCE_CACHES, a reference laptop core's, where this machine does not report them."""
    return cpu_caches() or REFERENCE_CACHES


class _GradedMachine:
    """Whose caches `working_set_level` grades against, in words of the language in use when it
    is printed (`str(GRADED_MACHINE)`). A name, not a function: the notebook shows it, and a call
    of a checker module's function there would read as an exercise."""

    def __str__(self) -> str:
        if cpu_caches():
            return M("graded_machine.this_machine")
        return M("graded_machine.reference")

    __repr__ = __str__


GRADED_MACHINE = _GradedMachine()


def _level_of(size: int, caches: list[dict]) -> str:
    for c in sorted((c for c in caches if c["type"] != "Instruction"), key=lambda c: c["size"]):
        if size <= c["size"]:
            return f"L{c['level']}"
    return "DRAM"


def working_set_level(answer: Any, size: int = WORKING_SET) -> CheckResult:
    """Which is the smallest cache level that holds a `size`-byte working set (one core's view):
    of this machine's caches, or of REFERENCE_CACHES where this machine reports none?"""
    caches = exercise_caches()
    expected = _level_of(size, caches)
    hints = {
        lv: (
            M("working_set_level.too_small")
            if LEVELS.index(lv) < LEVELS.index(expected)
            else M("working_set_level.too_large")
        )
        for lv in LEVELS
        if lv != expected
    }
    return check_choice("ch06.working_set_level", answer, expected, options=LEVELS, hints=hints)


EXERCISES = M.exercises()  # kind, source question, mistakes: the catalog's "exercises"
