"""Self-checks of chapters 06-08: right answers pass, typical mistakes get a hint that names the
mistake, None is "not yet", and no message reveals the expected value."""

from __future__ import annotations

import pytest

from llmlab.analysis import costs, roofline
from llmlab.analysis.hardware import cpu_caches
from llmlab.config import get_config
from llmlab.course.check import ch06, ch07, ch08

L70 = get_config("llama-3-70b")


def _no_leak(result, *values):
    for v in values:
        for text in (f"{v:.1f}", f"{v:.2f}", f"{v:.3g}", f"{round(v)}" if abs(v) >= 10 else "\x00"):
            assert text not in result.message, (text, result.message)


def test_none_is_not_yet_everywhere(capsys):
    checks = [
        ch06.weight_read_ms,
        ch06.h200_floor_ms,
        ch06.hbm_vs_pcie,
        ch06.working_set_level,
        ch07.ridge_point,
        ch07.decode_gemv_intensity,
        ch07.attention_intensity,
        ch07.decode_bound,
        ch08.source_q3,
        ch08.continuous_mean_latency,
        ch08.why_continuous,
    ]
    for check in checks:
        r = check(None)
        assert not r.passed and "not answered" in r.message
    out = capsys.readouterr().out
    assert out.count("NOT YET") == len(checks)


def test_weight_read_ms():
    assert ch06.weight_read_ms(70e9 * 2 / 3e12 * 1e3)
    r = ch06.weight_read_ms(70e9 / 3e12 * 1e3)
    assert not r and "bytes" in r.message
    r = ch06.weight_read_ms(70e9 * 2 / 3.35e12 * 1e3)
    assert not r and "3.35" in r.message
    r = ch06.weight_read_ms(0.0467)
    assert not r and "unit" in r.message
    _no_leak(r, 46.67)


def test_h200_floor_ms():
    right = costs.param_count(L70) * 2 / 4.8e12 * 1e3
    assert ch06.h200_floor_ms(right)
    r = ch06.h200_floor_ms(costs.param_count(L70) * 2 / 3.35e12 * 1e3)
    assert not r and "H100" in r.message
    r = ch06.h200_floor_ms(2 * costs.param_count(L70) / 989.4e12 * 1e3)
    assert not r and "compute peak" in r.message
    _no_leak(r, right)


def test_hbm_vs_pcie():
    """One-way PCIe (64 GB/s: the weights cross host to device) is the physically right divisor,
    as exercise 6 and chapter 09 count it; the preset's both-directions total is the named slip."""
    assert ch06.hbm_vs_pcie(3.35e12 / 64e9)
    r = ch06.hbm_vs_pcie(3.35e12 / 128e9)
    assert not r and "direction" in r.message
    r = ch06.hbm_vs_pcie(900 / 128)
    assert not r and "NVLink" in r.message
    _no_leak(r, 52.34)


@pytest.mark.skipif(
    not cpu_caches(), reason="this OS does not report CPU cache sizes (checked: any answer passes)"
)
def test_working_set_level_follows_this_machines_caches():
    caches = sorted(
        (c for c in cpu_caches() if c["type"] != "Instruction"), key=lambda c: c["size"]
    )
    tiny = caches[0]["size"] // 2
    huge = caches[-1]["size"] * 4
    assert ch06.working_set_level(f"L{caches[0]['level']}", size=tiny)
    assert ch06.working_set_level("DRAM", size=huge)
    r = ch06.working_set_level("L1", size=huge)
    assert not r and "does not fit" in r.message
    r = ch06.working_set_level("DRAM", size=tiny)
    assert not r and "smaller" in r.message


def test_working_set_level_without_reported_caches_asks_about_the_reference_cpu(monkeypatch):
    """A machine that reports no caches (macOS, Windows) does not make every answer right: the
    question is then about the reference laptop core, which the notebook names."""
    monkeypatch.setattr(ch06, "cpu_caches", lambda: [])
    assert ch06.exercise_caches() == ch06.REFERENCE_CACHES
    assert ch06.working_set_level("L3")  # 4 MiB: past 1.25 MiB L2, inside 12 MiB L3
    for wrong in ("L1", "L2", "DRAM"):
        assert not ch06.working_set_level(wrong)


def test_ridge_point():
    right = roofline.ridge_point("H100-SXM")
    assert ch07.ridge_point(right) and ch07.ridge_point(295)
    r = ch07.ridge_point(1000 / 3)
    assert not r and "source chapter" in r.message
    r = ch07.ridge_point(3.35e12 / 989.4e12)
    assert not r and "upside down" in r.message
    r = ch07.ridge_point(67e12 / 3.35e12)
    assert not r and "FP32" in r.message
    _no_leak(r, right)


def test_decode_gemv_intensity():
    assert ch07.decode_gemv_intensity(8)
    assert "2 bytes" in ch07.decode_gemv_intensity(16).message
    assert "2 FLOP" in ch07.decode_gemv_intensity(4).message
    assert "batch 1" in ch07.decode_gemv_intensity(1).message


def test_attention_intensity():
    right = roofline.decode_attention(L70, 1, 1024, 2).intensity
    assert ch07.attention_intensity(right)
    r = ch07.attention_intensity(right / 8)
    assert not r and "GQA" in r.message
    _no_leak(r, right)


def test_decode_bound():
    assert ch07.decode_bound("memory") and ch07.decode_bound("Memory ")
    r = ch07.decode_bound("compute")
    assert not r and "ridge" in r.message
    assert not ch07.decode_bound("both")


def _q3_right():
    t1 = roofline.decode_step_floor(L70, "H100-SXM-source", 1, 1024, 2) * 1e3
    t32 = roofline.decode_step_floor(L70, "H100-SXM-source", 32, 1024, 2) * 1e3
    return {
        "step_ms_batch1": t1,
        "step_ms_batch32": t32,
        "throughput_ratio": 32 * t1 / t32,
        "bound": "memory",
    }


def test_source_q3_accepts_the_right_quantities():
    right = _q3_right()
    assert (
        46 < right["step_ms_batch1"] < 48 and 49 < right["step_ms_batch32"] < 52
    )  # the seed's 47 and 50-60
    assert ch08.source_q3(right)
    rounded = {k: (round(v, 1) if isinstance(v, float) else v) for k, v in right.items()}
    assert ch08.source_q3(rounded)


def test_source_q3_names_each_mistake():
    right = _q3_right()
    r = ch08.source_q3(
        dict(right, step_ms_batch32=32 * right["step_ms_batch1"], throughput_ratio=1.0)
    )
    assert not r and "once per step" in r.message and "tokens per second" in r.message
    r = ch08.source_q3(dict(right, step_ms_batch32=right["step_ms_batch1"], throughput_ratio=32.0))
    assert not r and "KV cache" in r.message and "equal step times" in r.message
    r = ch08.source_q3(dict(right, bound="compute"))
    assert not r and "ridge" in r.message
    r = ch08.source_q3(dict(right, step_ms_batch1=right["step_ms_batch1"] / 1e3))
    assert not r and "seconds" in r.message
    r = ch08.source_q3({"step_ms_batch1": 47})
    assert not r and "keys" in r.message
    for v in right.values():
        if isinstance(v, float):
            _no_leak(r, v)


def test_continuous_mean_latency():
    assert ch08.continuous_mean_latency((10 + 2 + 4 + 6) / 4)
    r = ch08.continuous_mean_latency((10 + 2 + 12 + 12) / 4)
    assert not r and "static" in r.message
    _no_leak(r, 5.5)


def test_why_continuous():
    assert ch08.why_continuous("b") and ch08.why_continuous("B")
    r = ch08.why_continuous("a")
    assert not r and "same batch" in r.message
    assert not ch08.why_continuous("z")
