"""llmlab.analysis.roofline: ridge points and decode floors from the presets (the seed's numbers), where
LLM operations sit, and the real-shape measurement helpers on the tiny model."""

from __future__ import annotations

import numpy as np
import pytest

from llmlab.analysis import costs, roofline
from llmlab.analysis.hardware import PRESETS
from llmlab.config import get_config

L70 = get_config("llama-3-70b")


@pytest.mark.parametrize(
    "hw, expected", [("H100-SXM", 295), ("H100-SXM-source", 330), ("H200", 206), ("A100-80GB", 153)]
)
def test_ridge_points_bf16(hw, expected):
    assert roofline.ridge_point(hw, "bf16") == pytest.approx(expected, rel=0.02)


@pytest.mark.parametrize(
    "hw, expected_ms", [("H100-SXM", 42), ("H100-SXM-source", 47), ("H200", 29)]
)
def test_70b_bf16_decode_floor_batch1(hw, expected_ms):
    t = roofline.decode_step_floor(L70, hw, batch=1, context=1, dtype_bytes=2)
    assert t * 1e3 == pytest.approx(expected_ms, rel=0.02)


def test_weight_read_time_of_the_seed():
    assert roofline.weight_read_time(70e9, 2, 3e12) == pytest.approx(0.0467, rel=0.01)


def test_attainable_is_min_of_two_roofs():
    hw = PRESETS["H100-SXM"]
    r = roofline.ridge_point(hw)
    assert roofline.attainable(hw, r / 10) == pytest.approx(r / 10 * hw.mem_bw)
    assert roofline.attainable(hw, r * 10) == pytest.approx(hw.peak_flops["bf16"])
    assert roofline.attainable(hw, r) == pytest.approx(hw.peak_flops["bf16"])
    arr = roofline.attainable(hw, np.array([1.0, 1e4]))
    assert (
        arr.shape == (2,)
        and arr[0] == pytest.approx(hw.mem_bw)
        and arr[1] == pytest.approx(989.4e12)
    )
    with pytest.raises(ValueError, match="intensity"):
        roofline.attainable(hw, -1.0)


@pytest.mark.parametrize("batch", [1, 8, 32])
def test_decode_gemv_intensity_is_about_batch_in_bf16(batch):
    op = roofline.decode_gemv(L70, batch, dtype_bytes=2)
    assert op.intensity == pytest.approx(batch, rel=0.01)
    assert op.flops == 2 * costs.matmul_params_per_token(L70) * batch


def test_prefill_gemm_intensity_grows_with_prompt():
    a, b = roofline.prefill_gemm(L70, 128), roofline.prefill_gemm(L70, 2048)
    assert a.intensity == pytest.approx(128, rel=0.05)
    assert b.intensity > 5 * a.intensity
    assert roofline.place(b, "H100-SXM").bound == "compute"


@pytest.mark.parametrize("batch, context", [(1, 128), (16, 4096)])
def test_gqa_decode_attention_intensity_is_group_size(batch, context):
    group = L70.num_attention_heads // L70.num_key_value_heads  # 8
    op = roofline.decode_attention(L70, batch, context, dtype_bytes=2)
    assert op.intensity == pytest.approx(2 * group / 2)
    mha = L70.replace(num_key_value_heads=L70.num_attention_heads)
    assert roofline.decode_attention(mha, batch, context, 2).intensity == pytest.approx(1.0)


def test_batch32_gives_about_32x_throughput_while_memory_bound():
    rows = roofline.decode_batch_sweep(L70, "H100-SXM-source", [1, 32], context=1024)
    assert all(r["bound"] == "memory" for r in rows)
    ratio = rows[1]["tokens_per_s"] / rows[0]["tokens_per_s"]
    assert 28 < ratio < 32  # KV reads make batch 32 a little slower
    assert rows[1]["step_time"] / rows[0]["step_time"] < 1.1


def test_crossover_batch_is_first_compute_bound_batch():
    b = roofline.crossover_batch(L70, "H100-SXM", context=1)
    assert b == pytest.approx(roofline.ridge_point("H100-SXM"), rel=0.05)
    assert roofline.place(roofline.decode_step(L70, b, 1, 2), "H100-SXM").bound == "compute"
    assert roofline.place(roofline.decode_step(L70, b - 1, 1, 2), "H100-SXM").bound == "memory"


def test_long_context_keeps_decode_memory_bound_at_large_batch():
    # KV reads grow with batch, so with 8K context even batch 512 never reaches the ridge
    p = roofline.place(roofline.decode_step(L70, 512, 8192, 2), "H100-SXM")
    assert p.bound == "memory"


def test_placement_floor_is_the_larger_time():
    op = roofline.Operation("x", flops=1e12, bytes=1e9)
    p = roofline.place(op, "H100-SXM", "bf16")
    assert p.time_floor == max(1e9 / 3.35e12, 1e12 / 989.4e12)
    assert p.bound == "compute" and "compute-bound" in p.summary()


def test_bad_arguments_name_themselves():
    with pytest.raises(ValueError, match="batch"):
        roofline.decode_step_floor(L70, "H100-SXM", batch=0)
    with pytest.raises(ValueError, match="dtype_bytes"):
        roofline.decode_step_floor(L70, "H100-SXM", dtype_bytes=3)
    with pytest.raises(ValueError, match="fp8"):
        roofline.decode_step_floor(L70, "A100-80GB", dtype_bytes=1)  # no FP8 on Ampere
    from llmlab.model import tiny_model

    with pytest.raises(ValueError, match="kind"):
        roofline.step_fn(tiny_model(seed=0), "train", 4)


def test_measure_decode_step_on_tiny_model():
    from llmlab.model import tiny_model

    m = tiny_model(seed=0)
    s = roofline.measure_decode_step(m, batch=4, context=16, repeats=2)
    assert s.kind == "decode" and s.seconds > 0
    assert s.op.flops == costs.decode_flops(m.config, 4, 17)
    assert s.op.bytes == costs.decode_bytes_per_step(m.config, 4, 17, 4)  # float32 model
    hw = PRESETS["laptop-cpu"]
    v = s.vs_floor(hw, "fp32")
    assert v["x_floor"] == pytest.approx(s.seconds / max(v["memory_floor"], v["compute_floor"]))


def test_measure_prefill_on_tiny_model():
    from llmlab.model import tiny_model

    m = tiny_model(seed=0)
    s = roofline.measure_prefill(m, 32, repeats=2)
    cfg = m.config
    logits_saved = 31 * 2 * cfg.vocab_size * cfg.hidden_size
    assert s.op.flops == pytest.approx(costs.prefill_flops(cfg, 32) - logits_saved)


def test_roofline_widget_line_is_parseable_and_follows_the_sliders():
    import matplotlib

    matplotlib.use("Agg")
    from llmlab.course.widgets import roofline_explorer
    from llmlab.course.widgets.roofline import (
        ROOFLINE_TEXT_PATTERN,
        roofline_summary,
        roofline_text,
    )

    line = roofline_text(roofline_summary("H100-SXM", "llama-3-70b", "bf16", 1, 1))
    ms, bound = ROOFLINE_TEXT_PATTERN.search(line).groups()
    assert float(ms) == pytest.approx(42.1, abs=0.1) and bound == "memory"
    box = roofline_explorer(context=1)
    result = box.children[2]
    hw_dropdown, batch_slider = box.children[0].children[0], box.children[1].children[0]
    hw_dropdown.value = "H200"
    assert float(ROOFLINE_TEXT_PATTERN.search(result.value).group(1)) == pytest.approx(
        29.4, abs=0.1
    )
    assert (batch_slider.min, batch_slider.max, batch_slider.step) == (1, 1024, 1)  # one by one
    batch_slider.value = 1024
    ms, bound = ROOFLINE_TEXT_PATTERN.search(result.value).groups()
    assert bound == "compute"
    assert float(ms) == pytest.approx(
        roofline.decode_step_floor(L70, "H200", 1024, 1, 2) * 1e3, abs=0.1
    )
    hw_dropdown.value = "laptop-cpu"  # no bf16 peak: says so instead of failing
    assert "no bf16 peak" in result.value


def test_weight_read_widget_line():
    import matplotlib

    matplotlib.use("Agg")
    from llmlab.course.widgets import weight_read_explorer
    from llmlab.course.widgets.memory import WEIGHT_READ_PATTERN, weight_read_text

    assert float(
        WEIGHT_READ_PATTERN.search(weight_read_text(70, "bf16", 3.0)).group(1)
    ) == pytest.approx(46.7)
    box = weight_read_explorer()
    box.children[0].children[2].value = 4.8  # bandwidth slider, TB/s
    assert float(WEIGHT_READ_PATTERN.search(box.children[1].value).group(1)) == pytest.approx(
        70e9 * 2 / 4.8e12 * 1e3, abs=0.05
    )


def test_paired_ratios_use_the_roof_of_their_own_round():
    """Each round's step is divided by the floor at the roof probed just before it, so a roof that
    drifts with the step's time gives a steady ratio (here 1.25 in every round, although the
    roof doubles and halves); the median is the verdict, bad arguments are named."""
    now = [0.0]
    roofs = iter([40e9, 80e9, 40e9, 80e9, 80e9, 40e9])
    work = 1e9  # bytes per step
    current = {}

    def probe():
        current["roof"] = next(roofs)
        return current["roof"]

    def step():  # takes 1.25x its floor at the current roof
        if "roof" in current:
            now[0] += 1.25 * work / current["roof"]

    paired = roofline.measure_paired(
        step, probe, work, rounds=6, budget_s=100.0, clock=lambda: now[0]
    )
    assert paired.roofs == [40e9, 80e9, 40e9, 80e9, 80e9, 40e9]
    assert paired.ratios == pytest.approx([1.25] * 6)
    assert paired.median == pytest.approx(1.25)
    # unpaired, the best step (at 80 GB/s) over the worst roof (40 GB/s) would read 0.625
    assert min(paired.seconds) / (work / min(paired.roofs)) == pytest.approx(0.625)
    with pytest.raises(ValueError, match="rounds"):
        roofline.measure_paired(step, probe, work, rounds=0)
    with pytest.raises(ValueError, match="work"):
        roofline.measure_paired(step, probe, 0.0)


def test_paired_rounds_stop_at_the_budget():
    now = [0.0]

    def step():
        now[0] += 1.0

    paired = roofline.measure_paired(
        step, lambda: 1.0, 1.0, rounds=50, budget_s=3.5, clock=lambda: now[0]
    )
    assert len(paired.ratios) == 4  # 1 s per round, stop once past 3.5 s
