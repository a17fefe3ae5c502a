"""The checkers chapters 06 and 07 gained: right answers pass, the mistakes they name are
recognised, hints come in stages (no formula on the first wrong try), no message holds the
expected value, and EXERCISES describes exactly the exercises the notebooks call."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import nbformat
import pytest

from llmlab.analysis import costs, roofline
from llmlab.analysis.hardware import PRESETS
from llmlab.config import get_config
from llmlab.course.check import ch06, ch07, core
from llmlab.course.instructor import exercise_ids

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def _fresh_tries(monkeypatch):
    monkeypatch.setattr(core, "_WRONG_TRIES", {})


def _no_leak(result, value):
    for text in (
        f"{value:.1f}",
        f"{value:.2f}",
        f"{value:.3g}",
        f"{round(value)}" if abs(value) >= 10 else "\x00",
    ):
        assert text not in result.message, (text, result.message)


def test_bandwidth_for_speed_is_the_widget_task():
    from llmlab.course.widgets.memory import weight_read_text

    right = 100e9 * 1 * 25 / 1e12
    assert ch06.bandwidth_for_speed(right)
    # what the widget shows at that setting is the target speed
    assert "at most 25.0 tokens/s" in weight_read_text(100, "fp8", right)
    r = ch06.bandwidth_for_speed(2 * right)
    assert not r and "BF16" in r.message
    r = ch06.bandwidth_for_speed(100e9 / 25 / 1e12)
    assert not r and "rate" in r.message


def test_offload_floor_ms_counts_both_memories():
    w = costs.weight_bytes(get_config("llama-3-8b"), 2)
    h = PRESETS["H100-SXM"]
    right = ((w - 10e9) / h.mem_bw + 10e9 / (h.interconnect["pcie"] / 2)) * 1e3
    assert ch06.offload_floor_ms(right)
    r = ch06.offload_floor_ms(w / h.mem_bw * 1e3)
    assert not r and "without offloading" in r.message
    r = ch06.offload_floor_ms(((w - 10e9) / h.mem_bw + 10e9 / h.interconnect["pcie"]) * 1e3)
    assert not r and "one way" in r.message
    r = ch06.offload_floor_ms(10e9 / (h.interconnect["pcie"] / 2) * 1e3)
    assert not r and "only the offloaded" in r.message
    _no_leak(r, right)


def test_hints_come_in_stages():
    """First wrong try: the mistake without the formula; from the second on, the formula too."""
    first = ch06.hbm_vs_pcie(3.0)
    second = ch06.hbm_vs_pcie(3.0)
    assert not first and not second
    assert "Ratio =" not in first.message and "Ratio =" in second.message
    assert "mem_bw" not in first.message and "interconnect" not in first.message
    for check, wrong in (
        (ch06.weight_read_ms, 1.0),
        (ch06.h200_floor_ms, 1.0),
        (ch07.ridge_point, 7.0),
        (ch07.compute_bound_batch, 500),
    ):
        a, b = check(wrong), check(wrong)
        assert len(b.message) > len(a.message), (check, a.message, b.message)


def test_compute_bound_batch_is_the_crossover_and_names_near_misses():
    right = roofline.crossover_batch(get_config("llama-3-70b"), "H100-SXM", context=1024)
    assert right is not None and right not in (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
    assert ch07.compute_bound_batch(right) and ch07.compute_bound_batch(float(right))
    assert not ch07.compute_bound_batch(right + 0.4)
    r = ch07.compute_bound_batch(right - 1)
    assert not r and "still memory-bound" in r.message
    r = ch07.compute_bound_batch(right + 3)
    assert not r and "smaller one" in r.message
    r = ch07.compute_bound_batch(
        roofline.crossover_batch(get_config("llama-3-70b"), "H100-SXM", context=1)
    )
    assert not r and "context 1" in r.message
    r = ch07.compute_bound_batch(1024)
    assert not r and "power of two" in r.message
    _no_leak(r, right)
    # the explorer agrees: memory-bound one below, compute-bound at the answer
    from llmlab.course.widgets.roofline import roofline_summary

    assert roofline_summary("H100-SXM", "llama-3-70b", "bf16", right - 1, 1024).bound == "memory"
    assert roofline_summary("H100-SXM", "llama-3-70b", "bf16", right, 1024).bound == "compute"


def test_why_crossover_grows_says_why_each_wrong_option_is_wrong():
    assert ch07.why_crossover_grows("kv_bytes_per_sequence")
    for key in ch07.CROSSOVER_OPTIONS:
        if key != "kv_bytes_per_sequence":
            # each option's hint, before the last stage
            core._WRONG_TRIES.pop("ch07.why_crossover_grows", None)
            r = ch07.why_crossover_grows(key)
            assert not r and r.message == ch07.CROSSOVER_WHY_WRONG[key]


def test_decode_bound_hint_holds_no_ridge_value():
    r1, r2 = ch07.decode_bound("compute"), ch07.decode_bound("compute")
    assert not r1 and not r2 and len(r2.message) > len(r1.message)
    _no_leak(r2, roofline.ridge_point("H100-SXM"))


def test_working_set_level_names_the_reference_machine(monkeypatch):
    monkeypatch.setattr(ch06, "cpu_caches", lambda: [])
    assert str(ch06.GRADED_MACHINE) == ch06.REFERENCE_NAME
    assert ch06.exercise_caches() == ch06.REFERENCE_CACHES
    assert ch06.working_set_level("L3") and not ch06.working_set_level("DRAM")


def _string_literals(module) -> list[str]:
    tree = ast.parse(Path(module.__file__).read_text(encoding="utf-8"))
    return [
        n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)
    ]


@pytest.mark.parametrize("module", [ch06, ch07], ids=["ch06", "ch07"])
def test_no_string_or_backticked_snippet_of_the_module_passes(module, capsys):
    namespace = {"costs": costs, "roofline": roofline, "get_config": get_config, "PRESETS": PRESETS}
    for name in module.EXERCISES:
        check = getattr(module, name)
        for literal in _string_literals(module):
            candidates = [literal]
            for snippet in re.findall(r"`([^`]+)`", literal):
                try:
                    candidates.append(eval(snippet, dict(namespace)))  # noqa: S307 - our own strings
                except Exception:
                    pass
            for c in candidates:
                if name == "why_crossover_grows" and c == "kv_bytes_per_sequence":
                    continue  # the key itself is the answer's name, not a hint
                if name == "decode_bound" and c in ("memory", "compute"):
                    continue  # the options of a two-way choice
                if name == "working_set_level" and c in ch06.LEVELS:
                    continue
                assert not check(c).passed, (name, literal, c)


@pytest.mark.parametrize("stem,module", [("06-memory-hierarchy", ch06), ("07-roofline", ch07)])
def test_exercises_table_matches_the_notebook(stem, module):
    nb = nbformat.read(ROOT / "notebooks" / f"{stem}.ipynb", as_version=4)
    called = [e.split(".", 1)[1] for e in exercise_ids(nb)]
    assert sorted(called) == sorted(module.EXERCISES)
    kinds = [module.EXERCISES[n].kind for n in called]
    assert len(called) >= 4 and kinds.count("reasoning") >= 2


def test_step_cost_s_table_row_names_each_mistake_its_checker_tells_apart():
    """The instructors' table lists step_cost's mistakes from the catalog; the checker tells them
    apart by STEP_COST_MISTAKES: the same mistakes, in the same order."""
    keys = ch07.M.exercise_entries["step_cost"]["mistakes"]
    assert keys == [f"mistake.{name}" for name in ch07.STEP_COST_MISTAKES]
