"""Fewer bytes per number (`llmlab.model.quantization`, the engine's dtype settings, the C kernels of
`kernels/cpu_quant.c` and `kernels/cpu_gemm.c`): each precision's logits against a float64 reference within a tolerance
stated per precision; the int8 and bf16 matmul kernels against the math they stand for; the fp8
KV cache's round trip; greedy tokens of the engine in bf16 against the readable model's; and
the C path's fallback where the CPU lacks the BF16 instructions (simulated by a run-time cap)."""

from __future__ import annotations

import copy
import os
import subprocess
import sys

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from llmlab import LLM, SamplingParams
from llmlab.config import PRECISIONS, EngineConfig
from llmlab.engine.generate import generate_with_cache
from llmlab.model import tiny_model
from llmlab.model.quantization import (
    FP8_MAX,
    dequantize_fp8,
    dequantize_int8,
    quantize_fp8,
    quantize_int8,
)
from llmlab.ops import cpu_backend, cpu_decode, cpu_matmul, cpu_matmul_choice
from llmlab.ops.metadata import single_sequence_metadata

HAVE_C = cpu_backend.available()[0]
needs_c = pytest.mark.skipif(not HAVE_C, reason=f"no C compiler: {cpu_backend.available()[1]}")

# max |logit - float64 logit| / max |float64 logit| allowed, per precision, on the tiny random
# model (2 layers): the format's rounding step times the growth measured over the forward
# (measured on seeds 3-5: float32 ~1e-6; bf16 1.0-2.5e-2; int8 2.9-3.6e-2; fp8 KV 5.6-13e-2).
# float32: 2^-24 per number. bfloat16: 8 significant bits, 2^-8 per number, x 16. int8: half a
# step of max|row| / 127, 2^-8 of the row's largest weight, x 16. fp8 e4m3: 3 mantissa bits,
# 2^-4 per cached K/V value, x 4.
TOLERANCES = {"float32": 1e-5, "bfloat16": 16 * 2**-8, "int8": 16 * 2**-8, "fp8-kv": 4 * 2**-4}
BACKENDS = ["torch"] + (["cpu"] if HAVE_C else [])


@pytest.fixture(autouse=True)
def _no_isa_cap():
    yield
    if HAVE_C:
        cpu_matmul.set_isa_cap(None)


def _engine_logits(model, ids: list[int], backend: str, **settings) -> torch.Tensor:
    """Logits [T, vocab] of one prompt through the model and caches an engine builds."""
    runner = LLM(model, attention_backend=backend, **settings).llm_engine.model_runner
    T = len(ids)
    kv = runner.model.allocate_kv_caches(1, T, dtype=runner.kv_caches[0][0].dtype)
    md = single_sequence_metadata(kv, 0, T, T, backend=backend, kv_scales=runner.kv_scales)
    hidden = runner.model(torch.tensor(ids), torch.arange(T), md)
    return runner.model.compute_logits(hidden)


@torch.inference_mode()
def _float64_logits(model, ids: list[int]) -> torch.Tensor:
    """The reference: the model's own layers in float64, attention dense and causal (no cache)."""
    m = copy.deepcopy(model).double()
    T = len(ids)
    angles = torch.arange(T, dtype=torch.float64)[:, None] * m.inv_freq.double()[None, :]
    cos, sin = angles.cos(), angles.sin()
    x = m.embed_tokens(torch.tensor(ids))  # [T, hidden]
    causal = torch.ones(T, T, dtype=torch.bool).triu(1)
    for layer in m.layers:
        attn = layer.self_attn
        q, k, v = attn.qkv(layer.input_layernorm(x), cos, sin)  # [T, h, d], [T, kvh, d]
        group = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
        scores = torch.einsum("qhd,khd->hqk", q, k) * attn.scale
        probs = scores.masked_fill(causal, float("-inf")).softmax(-1)
        out = torch.einsum("hqk,khd->qhd", probs, v).reshape(T, -1)
        x = x + attn.o_proj(out)
        x = x + layer.mlp(layer.post_attention_layernorm(x))
    return m.lm_head(m.norm(x))  # [T, vocab]


def test_the_float64_reference_is_the_model():
    model = tiny_model(seed=3)
    ids = list(range(5, 30))
    torch.testing.assert_close(
        _float64_logits(model, ids).float(), model.logits_for(ids), rtol=1e-4, atol=1e-4
    )


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("precision", list(TOLERANCES))
def test_logits_against_float64_within_the_precisions_tolerance(precision, backend):
    model = tiny_model(seed=3)
    ids = torch.randint(
        0, model.config.vocab_size, (40,), generator=torch.Generator().manual_seed(1)
    ).tolist()
    ref = _float64_logits(model, ids)  # [T, vocab]
    got = _engine_logits(model, ids, backend, **PRECISIONS[precision]).double()
    err = float((got - ref).abs().max() / ref.abs().max())
    assert err <= TOLERANCES[precision], (
        f"{precision} on {backend!r}: relative logit error {err:.2e} > {TOLERANCES[precision]}"
    )
    if precision != "float32":  # the tolerance is not so loose that float32 rounding passes
        assert err > TOLERANCES["float32"], f"{precision} changed nothing ({err:.1e})"


def test_bad_precision_settings_name_the_argument_and_the_allowed_values():
    for kwargs, name in (
        ({"dtype": "float16"}, "dtype"),
        ({"quantization": "int4"}, "quantization"),
        ({"kv_cache_dtype": "fp8_e5m2"}, "kv_cache_dtype"),
    ):
        with pytest.raises(ValueError, match=rf"{name} must be one of .*got"):
            EngineConfig(**kwargs)


def test_engine_settings_leave_the_callers_model_alone():
    model = tiny_model(seed=2)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    LLM(model, dtype="bfloat16", quantization="int8", attention_backend="torch")
    assert model.dtype == torch.float32
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


# ---- the matmul kernels ------------------------------------------------------------------------


ISA_CAPS = {"portable": [], "widening": ["avx512", "avx512_bf16"], "all": None}


def _int8_tolerance(x, w, got_rows: int, isa: str) -> torch.Tensor:
    """What the int8 kernel may differ from x @ wᵀ in float64 by, per output: float32 sums; and,
    where one row runs AVX-512 VNNI, half an int16 step of x (max|x| / 32767) times Σ|w| of the
    output's row (x is rounded to int16 there)."""
    K = x.shape[1]
    tol = torch.full((x.shape[0], w.shape[0]), 1e-5 * K**0.5, dtype=torch.float64)
    vnni = isa == "all" and got_rows == 1 and K % 32 == 0 and "avx512_vnni" in cpu_matmul.isa()
    if vnni:
        tol += (x.abs().amax(1, keepdim=True).double() / 32767 / 2) * w.abs().sum(1).double()
    return tol


@needs_c
@settings(max_examples=30, deadline=None)
@given(
    T=st.integers(1, 9),
    N=st.integers(1, 40),
    K16=st.integers(1, 12),
    seed=st.integers(0, 99),
    isa=st.sampled_from(sorted(ISA_CAPS)),
)
def test_int8_matmul_kernel_equals_dequantized_math(T, N, K16, seed, isa):
    """The kernel widens int8 inside its dot products; its result is x @ (q * scale)ᵀ, up to
    float32 sums, and for one row on AVX-512 VNNI up to x's rounding to int16."""
    g = torch.Generator().manual_seed(seed)
    K = 16 * K16
    x, w = torch.randn(T, K, generator=g), torch.randn(N, K, generator=g)
    q, scale = quantize_int8(w)
    cpu_matmul.set_isa_cap(ISA_CAPS[isa])
    got = cpu_matmul.qgemm(x, q, scale)
    wq = dequantize_int8(q, scale).double()
    want = x.double() @ wq.T
    err = (got.double() - want).abs()
    assert (err <= _int8_tolerance(x, wq, T, isa) + 1e-5 * want.abs()).all(), float(err.max())


@needs_c
def test_one_int8_row_on_vnni_rounds_x_to_int16_and_stays_within_half_a_step():
    """One row on a CPU with AVX-512 VNNI: x is rounded to int16 (the result is not the widening
    kernel's to the bit), and the error stays under half an int16 step of x times Σ|w|."""
    if "avx512_vnni" not in cpu_matmul.isa():
        pytest.skip(f"no AVX-512 VNNI on this CPU (it has {cpu_matmul.isa()})")
    g = torch.Generator().manual_seed(3)
    for K in (32, 576, 1536, 8192):  # 8192: the int32 sums are flushed to float on the way
        x, w = torch.randn(1, K, generator=g) * 3, torch.randn(24, K, generator=g)
        q, scale = quantize_int8(w)
        vnni = cpu_matmul.qgemm(x, q, scale).double()
        cpu_matmul.set_isa_cap(ISA_CAPS["widening"])
        widened = cpu_matmul.qgemm(x, q, scale).double()
        cpu_matmul.set_isa_cap(None)
        wq = dequantize_int8(q, scale).double()
        want = x.double() @ wq.T
        assert not torch.equal(vnni, widened)
        assert ((vnni - want).abs() <= _int8_tolerance(x, wq, 1, "all")).all()
        assert (widened - want).abs().max() < (vnni - want).abs().max()


def test_int8_quantization_is_per_output_channel():
    w = torch.randn(8, 32) * torch.logspace(-3, 1, 8)[:, None]  # rows of very different size
    q, scale = quantize_int8(w)
    assert q.dtype == torch.int8 and int(q.abs().max()) == 127
    assert torch.all(q.abs().amax(1) == 127)  # every row uses its full range
    err = (dequantize_int8(q, scale) - w).abs().amax(1)
    assert torch.all(err <= scale / 2 + 1e-7)  # half a step of its own row


@needs_c
@settings(max_examples=15, deadline=None)
@given(T=st.integers(1, 9), N=st.integers(1, 40), K32=st.integers(1, 8), seed=st.integers(0, 99))
def test_bf16_matmul_kernel_on_both_instruction_paths(T, N, K32, seed):
    g = torch.Generator().manual_seed(seed)
    K = 32 * K32
    x, w = torch.randn(T, K, generator=g), torch.randn(N, K, generator=g).bfloat16()
    wide = w.double()
    cpu_matmul.set_isa_cap([])  # the portable path: x stays float32
    torch.testing.assert_close(
        cpu_matmul.qgemm(x, w).double(), x.double() @ wide.T, rtol=1e-5, atol=1e-5 * K**0.5
    )
    cpu_matmul.set_isa_cap(None)  # vdpbf16ps where present, for 1-3 rows: x rounded to bf16
    rounded = "avx512_bf16" in cpu_matmul.isa() and T < 4
    want = (x.bfloat16().double() if rounded else x.double()) @ wide.T
    torch.testing.assert_close(cpu_matmul.qgemm(x, w).double(), want, rtol=1e-4, atol=1e-4 * K**0.5)


HAVE_BF16 = HAVE_C and "avx512_bf16" in cpu_matmul.isa()


@needs_c
@settings(max_examples=30, deadline=None)
@given(
    T=st.integers(1, 14),
    N=st.integers(1, 90),
    K32=st.integers(1, 5),
    seed=st.integers(0, 99),
    int8=st.booleans(),
    with_bias=st.booleans(),
)
def test_packed_matmul_equals_its_math_on_a_grid_of_shapes(T, N, K32, seed, int8, with_bias):
    """The batch matmul on packed weights (`kernels/cpu_gemm.c`): bf16 weights against x
    rounded to bf16 once, float32 sums; int8 weights against each row of x rounded to int16
    (its own step) with integer sums (vpdpwssd); the int8 scale and the bias per output column.
    Shapes cross every edge of its tiles: rows not a multiple of 6, columns not a multiple of 16
    or 64. x is a strided view (its rows are read with their stride)."""
    g = torch.Generator().manual_seed(seed)
    K = 32 * K32
    x = torch.randn(T, K + 16, generator=g)[:, :K]  # [T, K], row stride K + 16
    w = torch.randn(N, K, generator=g)
    bias = torch.randn(N, generator=g) if with_bias else None
    if int8:
        weight, scales = quantize_int8(w)
        wide = dequantize_int8(weight, scales).double()
    else:
        weight, scales = w.bfloat16(), None
        wide = weight.double()
    packed = _packed_here(weight, "avx512_bf16", "AVX-512 BF16")
    if packed is None:
        return
    got = cpu_matmul.packed_gemm(x, packed, N, scales, bias)
    rounded = _int16_rounded(x) if int8 else x.bfloat16().double()
    want = rounded @ wide.T + (0 if bias is None else bias.double())
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5 * K**0.5)


def _packed_here(weight: torch.Tensor, isa: str, says: str) -> torch.Tensor | None:
    """`weight` packed (its size and dtype checked), or None on a CPU without the instruction
    set `isa` the packed matmul needs for it, after checking that nothing is packed and that
    the refusal says `says`."""
    if isa not in cpu_matmul.isa():
        assert not cpu_matmul.packed_weight_applies(weight)
        with pytest.raises(ValueError, match=says):
            cpu_matmul.pack_weight(weight)
        return None
    packed = cpu_matmul.pack_weight(weight)
    n, k = weight.shape
    assert packed.numel() == -(-n // 16) * 16 * k and packed.dtype == weight.dtype
    return packed


def _int16_rounded(x: torch.Tensor) -> torch.Tensor:
    """x [T, K] as the int8 kernels use it, in float64: each row rounded to int16 steps of its
    max|x| / 32767 (the multiply in float32, as the kernel does it)."""
    amax = x.abs().amax(dim=1, keepdim=True)  # [T, 1]
    steps = (x.contiguous() * (torch.tensor(32767.0) / amax)).round()
    return steps.double() * (amax / 32767.0).double()


@pytest.mark.skipif(not HAVE_BF16, reason="packed weights need AVX-512 BF16")
@pytest.mark.parametrize("K", [32, 96, 576, 1536])  # 1536: past the int32 sums' first flush
@pytest.mark.parametrize("N", [1, 15, 16, 17, 63, 64, 65, 90])
def test_one_packed_int8_row_on_a_grid_of_shapes(N, K):
    """One int8 row on packed blocks (the batch-1 GEMV of an int8 model) against its math on
    fresh random inputs: x rounded to int16, the scale and the bias per output column. N crosses
    the edges of a block (16 columns) and of a unit (64)."""
    g = torch.Generator().manual_seed(1000 * N + K)
    x, bias = torch.randn(1, K, generator=g) * 2, torch.randn(N, generator=g)
    q, scales = quantize_int8(torch.randn(N, K, generator=g))
    got = cpu_matmul.packed_gemm(x, cpu_matmul.pack_weight(q), N, scales, bias)
    want = _int16_rounded(x) @ dequantize_int8(q, scales).double().T + bias.double()
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5 * K**0.5)


@pytest.mark.skipif(not HAVE_BF16, reason="packed weights need AVX-512 BF16")
@pytest.mark.parametrize("T", [127, 128, 133])
def test_packed_int8_rounds_x_to_int16_below_128_rows_and_to_bf16_from_there(T):
    """int8 on packed blocks up to 127 rows: each row of x rounded to int16 (integer sums);
    from 128 rows (a prompt's) the panel widened to bf16 and x rounded to bf16, as for bf16
    weights. Each is held to its own rounding, which the other's misses by far more than the
    tolerance."""
    g = torch.Generator().manual_seed(T)
    N, K = 70, 576
    x, bias = torch.randn(T, K, generator=g), torch.randn(N, generator=g)
    q, scales = quantize_int8(torch.randn(N, K, generator=g))
    got = cpu_matmul.packed_gemm(x, cpu_matmul.pack_weight(q), N, scales, bias)
    rounded = _int16_rounded(x) if T < 128 else x.bfloat16().double()
    want = rounded @ dequantize_int8(q, scales).double().T + bias.double()
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5 * K**0.5)


@pytest.mark.skipif(
    not (HAVE_BF16 and "avx512_vnni" in cpu_matmul.isa()), reason="needs AVX-512 BF16 and VNNI"
)
@pytest.mark.parametrize("T", [1, 2, 7, 64])  # the one-row GEMV; micro-tiles of 2, 6 + 1 rows
def test_packed_int8_sums_the_same_integers_with_and_without_vnni(T):
    """int8 on packed blocks: `vpdpwssd` (VNNI) and `vpmaddwd` + `vpaddd` (without) add the
    same int16 products into the same int32 sums, so the outputs are equal to the bit, and
    K = 8192 crosses the points where the int32 sums are moved to float32."""
    g = torch.Generator().manual_seed(11 + T)
    for N, K in ((24, 32), (70, 576), (576, 1536), (40, 8192)):
        x = torch.randn(T, K, generator=g) * 3
        q, scale = quantize_int8(torch.randn(N, K, generator=g))
        packed = cpu_matmul.pack_weight(q)
        vnni = cpu_matmul.packed_gemm(x, packed, N, scale)
        cpu_matmul.set_isa_cap(ISA_CAPS["widening"])  # AVX-512 and BF16, no VNNI
        without = cpu_matmul.packed_gemm(x, packed, N, scale)
        cpu_matmul.set_isa_cap(None)  # (after a failure, the autouse fixture lifts it)
        assert torch.equal(vnni, without)


HAVE_AVX2 = HAVE_C and "avx2" in cpu_matmul.isa()


@pytest.mark.skipif(not HAVE_AVX2, reason="needs AVX2 and FMA")
@pytest.mark.parametrize("T", [1, 2, 3, 4, 5, 7, 8, 13, 64, 130])
def test_avx2_packed_matmuls_equal_their_math_on_a_grid_of_shapes(T):
    """A CPU with AVX2 and FMA but no AVX-512 (the cap) packs float32, bf16 and int8 weights and
    runs `kernels/cpu_gemm.c`'s AVX2 tiles: float32 against its math; bf16 against x as it is
    (no bf16 product to round x for) times the bf16 weight; int8 against each row of x rounded
    to int16 at every row count (no bf16 path from 128 rows); the scale and bias per column.
    Where this CPU has the AVX-512 kernels, float32 and int8 below 128 rows equal them to the
    bit (the same products in the same order). T crosses the 4-row bf16 tile, the 6-row tile,
    the units of 8 rows a bf16 panel is widened to float32 for, 48-row units and 128 rows; N
    the 8-column halves, blocks and 64-column panels; K the int32 sums' moves to float32."""
    g = torch.Generator().manual_seed(T)
    shapes = ((1, 32), (9, 96), (24, 576), (70, 576), (200, 1536), (40, 8192 if T < 16 else 4096))
    for N, K in shapes:
        x = torch.randn(T, K + 16, generator=g)[:, :K] * 2  # [T, K], row stride K + 16
        w, bias = torch.randn(N, K, generator=g), torch.randn(N, generator=g)
        q, scales = quantize_int8(w)
        cases = {
            "float32": (w, None, x.double(), w.double()),
            "bfloat16": (w.bfloat16(), None, x.double(), w.bfloat16().double()),
            "int8": (q, scales, _int16_rounded(x), dequantize_int8(q, scales).double()),
        }
        for name, (weight, s, x_used, w_used) in cases.items():
            cpu_matmul.set_isa_cap(["avx2"])
            assert cpu_matmul.packed_weight_applies(weight)
            packed = cpu_matmul.pack_weight(weight)
            got = cpu_matmul.packed_gemm(x, packed, N, s, bias)
            cpu_matmul.set_isa_cap(None)
            want = x_used @ w_used.T + bias.double()
            torch.testing.assert_close(
                got.double(), want, rtol=1e-5, atol=1e-5 * K**0.5, msg=f"{name} N={N} K={K}"
            )
            have = cpu_matmul.isa()
            if (name == "float32" and "avx512" in have) or (
                name == "int8" and T < 128 and "avx512_bf16" in have
            ):
                assert torch.equal(got, cpu_matmul.packed_gemm(x, packed, N, s, bias)), name


@pytest.mark.skipif(not HAVE_AVX2, reason="needs AVX2 and FMA")
@pytest.mark.parametrize("settings_", [{}, {"dtype": "bfloat16"}, {"quantization": "int8"}])
def test_avx2_fast_path_packs_the_weights_and_makes_the_readable_paths_tokens(
    settings_, monkeypatch
):
    """On a CPU with AVX2 but no AVX-512 (the cap, set before the engine packs its weights) the
    fused layer's GEMVs (one sequence) and the batch matmuls (prompts, two sequences) run the
    AVX2 tiles on packed copies; the greedy tokens are the readable path's at that precision."""
    monkeypatch.setattr(cpu_matmul_choice, "choice", lambda dtype, save=True: "llmlab")
    model = tiny_model(seed=11)
    prompts = [[5, 6, 7, 8, 9, 10, 11], list(range(3, 30))]
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)

    def tokens(llm, batch):
        outs = llm.generate(batch, params, use_tqdm=False)
        return [o.outputs[0].token_ids for o in outs]

    want = tokens(LLM(model, attention_backend="torch", **settings_), prompts)
    cpu_matmul.set_isa_cap(["avx2"])
    llm = LLM(model, attention_backend="cpu", **settings_)
    dtype = {"dtype": torch.bfloat16, "quantization": torch.int8}
    wdtype = next((dtype[k] for k in settings_), torch.float32)
    for layer in llm.llm_engine.model_runner.model.layers:
        assert layer.plan.wtype == cpu_decode.PACKED_TYPES[wdtype]
    assert tokens(llm, prompts) == want
    assert [tokens(llm, [p])[0] for p in prompts] == want


@needs_c
@pytest.mark.parametrize("K", [1, 9, 576])
@pytest.mark.parametrize("N", [1, 17, 64, 65, 200])
@pytest.mark.parametrize("T", [1, 6, 7, 33, 64, 70])
def test_packed_float32_matmul_equals_its_math_on_a_grid_of_shapes(T, N, K):
    """The float32 batch matmul on packed weights (`kernels/cpu_gemm.c`, one k per vector):
    float32 products and sums, the bias per output column (every other shape). Shapes cross
    every edge of its tiles and units: rows not a multiple of 6 or of a unit's 32, columns not
    a multiple of 16 or of a panel's 64 (several panels, so the next panel is asked for), any
    K. x is a strided view, fresh random per shape. Without AVX-512 nothing is packed, and
    saying so is checked."""
    g = torch.Generator().manual_seed(10_000 * T + 100 * N + K)
    with_bias = (T + N) % 2 == 0
    x = torch.randn(T, K + 5, generator=g)[:, :K]  # [T, K], row stride K + 5
    weight = torch.randn(N, K, generator=g)
    bias = torch.randn(N, generator=g) if with_bias else None
    packed = _packed_here(weight, "avx512", "AVX-512")
    if packed is None:
        return
    got = cpu_matmul.packed_gemm(x, packed, N, None, bias)
    want = x.double() @ weight.double().T + (0 if bias is None else bias.double())
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5 * K**0.5)


@pytest.mark.skipif(not HAVE_C or "avx512" not in cpu_matmul.isa(), reason="needs AVX-512")
def test_packed_float32_matmul_refuses_a_cpu_without_avx512():
    """A float32 weight packed here, multiplied where the run-time check finds no AVX-512
    (capped): a RuntimeError that says what is missing, not a wrong product."""
    weight = torch.randn(40, 24)
    packed = cpu_matmul.pack_weight(weight)
    cpu_matmul.set_isa_cap([])
    assert not cpu_matmul.packed_weight_applies(weight)
    with pytest.raises(RuntimeError, match="AVX-512"):
        cpu_matmul.packed_gemm(torch.randn(3, 24), packed, 40)


def test_pack_weight_refuses_what_the_packed_matmul_cannot_take():
    with pytest.raises(ValueError, match="pack_weight: weight is torch.float64"):
        cpu_matmul.pack_weight(torch.randn(16, 32).double())
    with pytest.raises(ValueError, match=r"\(16, 48\)"):
        cpu_matmul.pack_weight(torch.randn(16, 48).bfloat16())  # K not a multiple of 32


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int8])
@pytest.mark.parametrize("N, K", [(1, 32), (15, 64), (16, 32), (17, 96), (65, 576), (90, 1536)])
def test_pack_weight_lays_out_16_row_blocks_of_k_groups(dtype, N, K):
    """The blocked layout `kernels/cpu_gemm.c` reads, built here with torch on fresh values:
    P[nb][kp][j][e] = W[16 nb + j][g kp + e] (g = 1 for float32, 2 for bf16 and int8), the rows
    past N zero. Any packing order the kernels do not expect fails here before a matmul does."""
    if not cpu_matmul.packed_weight_applies(torch.zeros(16, 32, dtype=dtype)):
        pytest.skip(f"this CPU ({cpu_matmul.isa()}) packs no {dtype} weights")
    gen = torch.Generator().manual_seed(N * 1000 + K)
    if dtype == torch.int8:
        weight = torch.randint(-127, 128, (N, K), generator=gen, dtype=torch.int8)
    else:
        weight = torch.randn(N, K, generator=gen).to(dtype)
    g = 1 if dtype == torch.float32 else 2
    padded = torch.zeros(-(-N // 16) * 16, K, dtype=dtype)
    padded[:N] = weight
    want = padded.view(-1, 16, K // g, g).permute(0, 2, 1, 3).reshape(-1)
    got = cpu_matmul.pack_weight(weight)
    assert got.dtype == dtype and torch.equal(got.view(torch.uint8), want.view(torch.uint8))


@pytest.mark.skipif(not HAVE_C or "avx512" not in cpu_matmul.isa(), reason="needs AVX-512")
def test_pack_weight_into_a_given_place_writes_there_what_it_returns_itself():
    """`out` (a place in a huge-page buffer): the same packing, written there and returned;
    one of the wrong size or dtype is refused before anything is written."""
    weight = torch.randn(37, 40, generator=torch.Generator().manual_seed(11))
    room = torch.full((cpu_matmul.packed_numel(37, 40) + 8,), float("nan"))
    place = room[4:-4]
    got = cpu_matmul.pack_weight(weight, out=place)
    assert got.data_ptr() == place.data_ptr()
    assert torch.equal(got, cpu_matmul.pack_weight(weight))
    assert room[:4].isnan().all() and room[-4:].isnan().all()  # nothing written outside
    for bad in (room, place.double(), room[::2][: place.numel()]):
        with pytest.raises(ValueError, match="pack_weight: out"):
            cpu_matmul.pack_weight(weight, out=bad)


@needs_c
def test_c_path_without_bf16_instructions_falls_back():
    """A CPU without AVX-512 BF16 (simulated by capping the run-time choice) runs the portable
    kernels: the same engine tokens, and a product where x was not rounded to bf16."""
    model = tiny_model(seed=5)
    ids = [[3, 14, 15, 92, 65, 35, 89, 79, 32, 38]]
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    fast = LLM(model, dtype="bfloat16", attention_backend="cpu").generate(
        ids, params, use_tqdm=False
    )
    cpu_matmul.set_isa_cap([])
    assert cpu_matmul.isa() == []
    assert "no AVX-512 BF16" in cpu_matmul_choice.matmul_kernel(torch.bfloat16)
    slow = LLM(model, dtype="bfloat16", attention_backend="cpu").generate(
        ids, params, use_tqdm=False
    )
    assert fast[0].outputs[0].token_ids == slow[0].outputs[0].token_ids
    x = torch.full((1, 32), 1.0 + 2**-12)  # not a bf16 value: rounding would show
    w = torch.ones(4, 32, dtype=torch.bfloat16)
    assert torch.equal(cpu_matmul.qgemm(x, w), torch.full((1, 4), 32 * (1.0 + 2**-12)))
    with pytest.raises(ValueError, match="names"):
        cpu_matmul.set_isa_cap(["sse9"])


@needs_c
def test_isa_cap_from_the_environment_starts_a_processs_kernels_capped():
    """`LLMLAB_ISA_CAP` caps the kernels of a process from its start (how this CPU measures the
    paths of a CPU with fewer instruction sets, such as a laptop's AVX2); empty means none; an
    unknown name leaves the kernels unavailable, saying the variable and the allowed names."""
    code = (
        "from llmlab.ops import cpu_library, cpu_matmul\n"
        "ok, why = cpu_library.available()\n"
        "print(cpu_matmul.isa() if ok else why)"
    )

    def run(value: str) -> str:
        env = {**os.environ, "LLMLAB_ISA_CAP": value}
        done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()

    have = cpu_matmul.isa()
    assert run("avx2") == str([n for n in ("avx2",) if n in have])
    assert run(" avx512 , avx2") == str([n for n in have if n in ("avx512", "avx2")])
    assert run("") == "[]"
    refused = run("avx2,sse9")
    assert "LLMLAB_ISA_CAP" in refused and "'sse9'" in refused and "avx512_bf16" in refused


# ---- the fp8 KV cache --------------------------------------------------------------------------


def test_fp8_round_trip_keeps_three_mantissa_bits_and_saturates():
    x = torch.randn(4096) * 3
    scale = float(x.abs().max()) * 2 / FP8_MAX
    back = dequantize_fp8(quantize_fp8(x, scale), scale)
    normal = x.abs() >= scale * 2**-6  # e4m3's smallest normal, scaled
    rel = ((back - x).abs() / x.abs())[normal]
    assert float(rel.max()) <= 2**-4  # half a step of 3 mantissa bits
    huge = quantize_fp8(torch.tensor([1e6, -1e6]), 1.0).float()
    assert torch.equal(huge, torch.tensor([FP8_MAX, -FP8_MAX]))  # saturated, not NaN


@pytest.mark.parametrize("backend", ["torch", "cpu", "triton", "cuda"])
def test_fp8_cache_write_and_read_back(backend):
    """reshape_and_cache stores value / scale in e4m3 at the slots; attention over that cache
    equals float attention over the dequantized values, NaN in unused slots notwithstanding."""
    from llmlab import ops
    from llmlab.ops import triton_backend

    ok, why = ops.backend_available(backend)
    if not ok:
        pytest.skip(f"backend {backend!r} cannot run here: {why}")
    device = (
        "cuda"
        if backend == "cuda"
        or (backend == "triton" and torch.cuda.is_available() and not triton_backend.interpreting())
        else "cpu"
    )
    g = torch.Generator().manual_seed(0)
    blocks, bs, kvh, d, heads = 6, 4, 2, 32, 4
    kc = torch.full((blocks, bs, kvh, d), float("nan")).to(torch.float8_e4m3fn)
    vc = kc.clone()
    k, v = torch.randn(7, kvh, d, generator=g), torch.randn(7, kvh, d, generator=g)
    slots = torch.tensor([20, 21, 22, 23, 8, 9, 10], dtype=torch.int64)  # blocks 5, then 2
    q = torch.randn(1, heads, d, generator=g)
    bt = torch.tensor([[5, 2]], dtype=torch.int32)
    sl = torch.tensor([7], dtype=torch.int32)
    cu = torch.tensor([0, 1], dtype=torch.int32)
    kc_, vc_, k_, v_, slots_, q_, bt_, sl_, cu_ = (
        t.to(device) for t in (kc, vc, k, v, slots, q, bt, sl, cu)
    )
    ops.reshape_and_cache(k_, v_, kc_, vc_, slots_, backend=backend, k_scale=0.01, v_scale=0.02)
    flat_k = kc_.cpu().view(-1, kvh, d)[slots]
    assert torch.equal(flat_k.view(torch.uint8), quantize_fp8(k, 0.01).view(torch.uint8))
    out = ops.paged_attention_decode(
        q_, kc_, vc_, bt_, sl_, d**-0.5, backend=backend, k_scale=0.01, v_scale=0.02
    ).cpu()
    out_prefill = ops.paged_attention_prefill(
        q_, kc_, vc_, bt_, cu_, sl_, d**-0.5, backend=backend, k_scale=0.01, v_scale=0.02
    ).cpu()
    kf = torch.zeros(blocks, bs, kvh, d)
    vf = torch.zeros(blocks, bs, kvh, d)
    kf.view(-1, kvh, d)[slots] = dequantize_fp8(quantize_fp8(k, 0.01), 0.01)
    vf.view(-1, kvh, d)[slots] = dequantize_fp8(quantize_fp8(v, 0.02), 0.02)
    want = ops.paged_attention_decode(q, kf, vf, bt, sl, d**-0.5, backend="torch")
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out_prefill, want, rtol=1e-5, atol=1e-5)


def test_fp8_cache_needs_its_scales():
    from llmlab.ops import AttentionMetadata

    kv = [(torch.zeros(1, 4, 2, 16, dtype=torch.float8_e4m3fn),) * 2]
    with pytest.raises(ValueError, match="kv_scales"):
        single_sequence_metadata(kv, 0, 4, 4)
    with pytest.raises(ValueError, match="kv_scales"):
        AttentionMetadata(
            torch.tensor([0, 4], dtype=torch.int32),
            torch.tensor([4], dtype=torch.int32),
            torch.arange(4),
            torch.zeros(1, 1, dtype=torch.int32),
            kv,
            4,
            kv_scales=[(1.0, -1.0)],
        )


def test_fp8_cache_halves_the_kv_bytes_so_the_pool_holds_twice_the_blocks():
    model = tiny_model(seed=0)
    budget = 1 << 20
    f32 = LLM(model, attention_backend="torch", kv_cache_memory_bytes=budget, max_num_seqs=512)
    fp8 = LLM(
        model,
        attention_backend="torch",
        kv_cache_memory_bytes=budget,
        max_num_seqs=512,
        kv_cache_dtype="fp8",
    )
    assert fp8.llm_engine.num_kv_blocks == 4 * f32.llm_engine.num_kv_blocks  # 1 byte vs 4
    assert fp8.llm_engine.model_runner.kv_caches[0][0].dtype == torch.float8_e4m3fn


# ---- greedy tokens -------------------------------------------------------------------------------


def test_engine_greedy_tokens_in_bf16_equal_the_readable_models():
    """The engine (paged cache, batching, chunked prefill) in bf16 makes the tokens the readable
    model makes in bf16 with its own contiguous cache, prompt by prompt."""
    model = tiny_model(seed=7)
    prompts = [[5, 6, 7, 8, 9, 10, 11], [40, 41, 2, 3], list(range(3, 40))]
    llm = LLM(model, dtype="bfloat16", attention_backend="torch", max_num_batched_tokens=16)
    outs = llm.generate(
        prompts, SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True), use_tqdm=False
    )
    bf16 = copy.deepcopy(model).to(torch.bfloat16)
    for prompt, out in zip(prompts, outs):
        assert out.outputs[0].token_ids == generate_with_cache(bf16, prompt, 10).token_ids


@needs_c
def test_fast_path_bf16_and_int8_tokens_equal_the_readable_paths():
    """The C path computes bf16 / int8 weights with float32 activations; on these prompts its
    greedy tokens are those of the readable path at the same precision."""
    model = tiny_model(seed=11)
    prompts = [[5, 6, 7, 8, 9, 10, 11], list(range(3, 30))]
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    for settings_ in ({"dtype": "bfloat16"}, {"quantization": "int8"}):
        runs = [
            [
                o.outputs[0].token_ids
                for o in LLM(model, attention_backend=b, **settings_).generate(
                    prompts, params, use_tqdm=False
                )
            ]
            for b in ("torch", "cpu")
        ]
        assert runs[0] == runs[1], settings_
