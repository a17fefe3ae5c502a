"""Chapter 13 (dtypes and quantization): the quantizer's solution is the package's, its rule comes
from the second try, odd answers are named (the planted bugs: tests/test_planted_bugs.py), and
the number exercises answer what the package computes; `llmlab.analysis.dtypes` reads the formats
from torch and counts the bytes a step reads; the chapter's figures label their axes."""

from __future__ import annotations

import matplotlib
import pytest
import torch

matplotlib.use("Agg")

from llmlab import i18n  # noqa: E402
from llmlab.analysis import costs, dtypes  # noqa: E402
from llmlab.analysis.kv_budget import kv_summary  # noqa: E402
from llmlab.config import get_config  # noqa: E402
from llmlab.course.check import ch13  # noqa: E402
from llmlab.model.quantization import dequantize_int8, quantize_int8  # noqa: E402

pytestmark = pytest.mark.usefixtures("first_try")  # each test: a first try, in English


def solution(w):
    w = w.float()
    amax = w.abs().amax(dim=1)
    scale = torch.where(amax > 0, amax / 127, torch.ones_like(amax))
    return torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8), scale


def truncated(w):  # a planted bug (tests/planted/ch13.py has them all)
    q, scale = solution(w)
    return torch.trunc(w / scale[:, None]).clamp(-127, 127).to(torch.int8), scale


def test_the_solution_is_the_package_quantizer():
    w = torch.randn(33, 70) * torch.logspace(-2, 0, 33)[:, None]
    q, scale = solution(w)
    ref_q, ref_scale = quantize_int8(w)
    assert torch.equal(q, ref_q) and torch.allclose(scale, ref_scale)


def test_the_second_try_adds_the_rule():
    first = ch13.quantize_per_channel(truncated).message
    second = ch13.quantize_per_channel(truncated).message
    assert "max_k |w[n, k]| / 127" not in first and "max_k |w[n, k]| / 127" in second


def test_wrong_shapes_are_not_yet():  # what is not a function: test_build.py
    assert "pair (q, scale)" in ch13.quantize_per_channel(lambda w: solution(w)[0]).message
    assert (
        "shape of w"
        in ch13.quantize_per_channel(lambda w: (solution(w)[0].T, solution(w)[1])).message
    )


def test_bytes_per_weight_counts_the_scales():
    assert ch13.int8_bytes_per_weight((576 * 576 + 576 * 4) / (576 * 576)).passed
    assert "float32 scale per output row" in ch13.int8_bytes_per_weight(1.0).message
    assert "one scale per output row" in ch13.int8_bytes_per_weight(5.0).message
    assert not ch13.int8_bytes_per_weight(1.0 + 4 / (576 * 576)).passed


def test_fp8_kv_requests_is_the_calculators_and_twice_bf16():
    """Chapter 04's budget: utilisation × memory − weights − activations (1 GB, as its task); a
    student who follows chapter 04 answers the key, one who drops the activations is told so."""
    cfg = get_config("llama-3-8b")
    shape = dict(num_layers=32, num_kv_heads=8, head_dim=128, context=ch13.CONTEXT, gpu="L4")
    weights = costs.weight_bytes(cfg, 2)
    fp8 = kv_summary(dtype="fp8", weight_bytes=weights, activation_bytes=1e9, **shape).max_requests
    bf16 = kv_summary(
        dtype="bf16", weight_bytes=weights, activation_bytes=1e9, **shape
    ).max_requests
    no_activations = kv_summary(dtype="fp8", weight_bytes=weights, **shape).max_requests
    assert fp8 in (2 * bf16, 2 * bf16 + 1) and 0 < fp8 < no_activations
    assert ch13.fp8_kv_requests(fp8).passed
    assert "fp8 cache stores 1 byte" in ch13.fp8_kv_requests(bf16).message
    assert "activations" in ch13.fp8_kv_requests(no_activations).message


def test_why_not_4x_takes_the_fixed_costs_and_explains_the_others():
    assert set(ch13.SPEEDUP_OPTIONS) == {"scales", "fixed_costs", "kv_cache", "gpu_only"}
    assert ch13.why_not_4x("fixed_costs").passed
    assert "under 1 %" in ch13.why_not_4x("scales").message
    assert "costs.kv_bytes" in ch13.why_not_4x("kv_cache").message
    i18n.set_language("zh")
    assert "固定" not in ch13.SPEEDUP_OPTIONS["scales"] and "字节" in ch13.SPEEDUP_OPTIONS["scales"]


# ------------------------------------------------------------------ llmlab.analysis.dtypes


def test_formats_come_from_torch():
    fmts = {f.name: f for f in dtypes.formats()}
    assert list(fmts) == list(dtypes.FORMATS)
    for f in fmts.values():
        assert f.bits == 1 + f.exponent_bits + f.mantissa_bits + f.integer_bits
    # int8 has no exponent and no mantissa: 7 value bits beside the sign; a float has no such bits
    assert (fmts["int8"].exponent_bits, fmts["int8"].mantissa_bits) == (0, 0)
    assert fmts["int8"].integer_bits == 7
    assert fmts["bfloat16"].mantissa_bits == 7 and fmts["bfloat16"].integer_bits == 0
    assert fmts["bfloat16"].max == pytest.approx(torch.finfo(torch.bfloat16).max)
    assert fmts["float8_e4m3fn"].max == 448 and fmts["float16"].max == 65504
    assert fmts["bfloat16"].eps == 2**-7 and fmts["int8"].max == 127
    with pytest.raises(ValueError, match="name must be one of"):
        dtypes.rounding_error(torch.ones(2, 2), "float64")


@pytest.mark.parametrize("shape", [(1, 1), (3, 7), (64, 33)])
def test_rounding_errors_order_as_the_mantissas(shape):
    g = torch.Generator().manual_seed(sum(shape))
    w = torch.randn(*shape, generator=g) * torch.logspace(-2, 0, shape[0])[:, None] + 0.01
    err = {name: dtypes.rounding_error(w, name) for name in dtypes.FORMATS}
    assert err["float32"] == 0
    assert err["float16"] <= err["bfloat16"] <= 2**-8 * 1.01
    # int8: every element within half a step of its row
    q, scale = quantize_int8(w)
    assert ((dequantize_int8(q, scale) - w).abs() <= scale[:, None] / 2 + 1e-7).all()
    assert err["int8"] == pytest.approx(dtypes.relative_error(w, dequantize_int8(q, scale)))


def test_per_channel_beats_per_tensor_when_rows_differ():
    g = torch.Generator().manual_seed(0)
    w = torch.randn(16, 64, generator=g) * torch.logspace(-3, 0, 16)[:, None]
    q, scale = dtypes.per_tensor_int8(w)
    assert q.dtype == torch.int8 and scale.numel() == 1
    assert dtypes.rounding_error(w, "int8") < dtypes.relative_error(w, q.float() * scale) / 2
    small = slice(0, 8)  # the rows of small weights: per-tensor crushes them to a few steps
    per_row = dequantize_int8(*quantize_int8(w))
    assert dtypes.relative_error(w[small], per_row[small]) < 0.1 * dtypes.relative_error(
        w[small], (q.float() * scale)[small]
    )


def test_step_weight_bytes_per_precision():
    cfg = get_config("smollm2-135m")
    params = costs.param_count(cfg)
    assert dtypes.step_weight_bytes(cfg) == 4 * params
    assert dtypes.step_weight_bytes(cfg, "bfloat16") == 2 * params
    int8 = dtypes.step_weight_bytes(cfg, quantization="int8")
    assert params < int8 < 1.02 * params
    with pytest.raises(ValueError, match="dtype"):
        dtypes.step_weight_bytes(cfg, "int4")
    with pytest.raises(ValueError, match="quantization"):
        dtypes.step_weight_bytes(cfg, quantization="int4")


def test_decode_speed_runs_the_engine_at_each_precision():
    from llmlab.model import tiny_model

    model = tiny_model(seed=3)
    plain = dtypes.decode_speed(model, [1, 2, 3], gen_len=4, rounds=1)
    int8 = dtypes.decode_speed(model, [1, 2, 3], gen_len=4, rounds=1, quantization="int8")
    assert plain.tokens_per_s > 0 and int8.tokens_per_s > 0
    assert "int8" in int8.precision and "int8" not in plain.precision
    with pytest.raises(ValueError, match="gen_len"):
        dtypes.decode_speed(model, [1], gen_len=1)


def test_the_figures_label_their_axes():
    from llmlab.course.figures import ch13 as fig13

    fig = fig13.plot_formats(dtypes.formats())
    ax = fig.axes[0]
    assert ax.get_title() and ax.get_xlabel() == "bits per number"
    widths = [p.get_width() for p in ax.patches]
    assert sum(widths) == sum(f.bits for f in dtypes.formats())
    fig = fig13.plot_decode_speeds(["float32", "int8"], [538.0, 135.0], [30.0, 45.0])
    left, right = fig.axes
    assert [p.get_height() for p in right.patches] == [30.0, 45.0]
    assert "measured" in right.get_ylabel() and left.get_title()
    table = fig13.quality_table(
        {"rows": {"float32": {"perplexity": 10.0, "top1_agreement": 1.0, "greedy_agreement": 1.0}}},
        {"float32": 538.0},
    )
    assert "float32" in table and "10.00" in table and "100.0%" in table
