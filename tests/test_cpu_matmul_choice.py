"""The float32 and bf16 batch matmuls chosen per machine (`llmlab.ops.cpu_matmul_choice`):
measured once per weight dtype, saved per dtype and machine key, read back without measuring;
and `CpuLinear` running whichever was chosen with the same result (to the rounding that kernel
states)."""

from __future__ import annotations

import json

import pytest
import torch

from llmlab.model import cpu as model_cpu
from llmlab.ops import cpu_backend, cpu_matmul, cpu_matmul_choice

HAVE_C = cpu_backend.available()[0]
pytestmark = pytest.mark.skipif(not HAVE_C, reason="no C compiler for the cpu kernels")


@pytest.fixture
def cache(monkeypatch, tmp_path):
    monkeypatch.setenv("LLMLAB_CACHE", str(tmp_path))
    monkeypatch.setattr(cpu_matmul_choice, "_chosen", {})
    return tmp_path / cpu_matmul_choice.FILE


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_measure_times_what_runs_here_and_applies_its_rule(dtype):
    result = cpu_matmul_choice.measure(dtype, rounds=2)
    runs_here = []
    have = cpu_matmul.isa()
    if ("avx512" if dtype == torch.float32 else "avx512_bf16") in have or "avx2" in have:
        runs_here.append("llmlab")
    if (
        cpu_matmul.onednn_available()
        if dtype == torch.float32
        else cpu_matmul_choice.onednn_bf16()[0] is not None
    ):
        runs_here.append("onednn")
    assert sorted(result["ms"]) == sorted(runs_here)
    assert all(len(v) == 2 and min(v) > 0 for v in result["ms"].values())
    if len(runs_here) == 2:  # oneDNN only when it won every round by the margin
        ms = result["ms"]
        won = all(
            o < (1 - cpu_matmul_choice.MARGIN) * d for o, d in zip(ms["onednn"], ms["llmlab"])
        )
        assert result["choice"] == ("onednn" if won else "llmlab")
    else:
        assert result["choice"] == (runs_here[0] if runs_here else "none")
    with pytest.raises(ValueError, match="rounds must be >= 1, got 0"):
        cpu_matmul_choice.measure(dtype, rounds=0)
    with pytest.raises(ValueError, match="dtype: got torch.int8"):
        cpu_matmul_choice.measure(torch.int8)


def test_the_choice_is_measured_once_saved_and_read_back(cache, monkeypatch):
    measured = []

    def fake_measure(dtype):
        measured.append(dtype)
        return {"choice": "onednn", "ms": {}, "shapes": []}

    monkeypatch.setattr(cpu_matmul_choice, "measure", fake_measure)
    key = cpu_matmul_choice.entry_key(torch.bfloat16)
    f32_key = cpu_matmul_choice.entry_key(torch.float32)
    other = "bfloat16 weights; another CPU; 64 CPUs, 64 usable; torch 0; 64 threads; kernels x"
    stale = key.rsplit("; kernels ", 1)[0] + "; kernels old"
    # another machine's entry and this machine's float32 entry are ignored and kept; this
    # machine's bf16 entry for another kernel build is measured again and replaced
    cache.write_text(
        json.dumps(
            {
                other: {"choice": "llmlab"},
                stale: {"choice": "llmlab"},
                f32_key: {"choice": "llmlab"},
            }
        )
    )
    assert cpu_matmul_choice.choice(torch.bfloat16) == "onednn"
    assert measured == [torch.bfloat16]
    saved = json.loads(cache.read_text())
    assert saved[key]["choice"] == "onednn"
    assert saved[other] == {"choice": "llmlab"}, "other machines' entries are kept"
    assert saved[f32_key] == {"choice": "llmlab"}, "the other dtype's entry is kept"
    assert stale not in saved
    monkeypatch.setattr(cpu_matmul_choice, "_chosen", {})  # a new process: reads the file
    assert cpu_matmul_choice.choice(torch.bfloat16) == "onednn"
    assert cpu_matmul_choice.choice(torch.float32) == "llmlab"
    assert measured == [torch.bfloat16], "both read back, nothing measured again"
    assert str(torch.get_num_threads() + 1) + " threads" in cpu_matmul_choice.machine_key(
        torch.get_num_threads() + 1
    )


@pytest.mark.parametrize("kernel", ["llmlab", "onednn"])
def test_cpu_linear_runs_the_chosen_kernel_with_its_rounding(kernel, cache, monkeypatch):
    """Whichever kernel is chosen, a batch through a bf16 `CpuLinear` is x (rounded to bf16;
    llmlab's on AVX2 without AVX-512 BF16: as it is) times the bf16 weight: float32 sums from
    llmlab's kernel, bf16 outputs from oneDNN's."""
    have = cpu_matmul.isa()
    if kernel == "llmlab" and "avx512_bf16" not in have and "avx2" not in have:
        pytest.skip("llmlab's packed matmul needs AVX-512 BF16 or AVX2")
    if kernel == "onednn" and cpu_matmul_choice.onednn_bf16()[0] is None:
        pytest.skip("this PyTorch has no oneDNN bf16 matmul")
    monkeypatch.setattr(cpu_matmul_choice, "choice", lambda dtype, save=True: kernel)
    g = torch.Generator().manual_seed(3)
    weight = torch.randn(40, 64, generator=g).bfloat16()
    bias = torch.randn(40, generator=g)
    linear = model_cpu.CpuLinear(weight, bias)
    assert linear.batch_kernel == kernel and linear.extra_bytes() > 0
    x = torch.randn(9, 64, generator=g)
    rounded = kernel == "onednn" or "avx512_bf16" in have
    want = (x.bfloat16() if rounded else x).double() @ weight.double().T + bias.double()
    rtol = 1e-5 if kernel == "llmlab" else 2**-8  # oneDNN rounds its output to bf16
    torch.testing.assert_close(linear(x).double(), want, rtol=rtol, atol=rtol * 8)
    one = x[:1]  # one row: llmlab's packed blocks, or with oneDNN chosen the dense weight
    torch.testing.assert_close(linear(one).double(), want[:1], rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("kernel", ["llmlab", "onednn"])
def test_float32_cpu_linear_runs_the_chosen_kernel(kernel, cache, monkeypatch):
    """A float32 `CpuLinear` packs its weight for the chosen batch kernel (llmlab's blocks or
    oneDNN's layout, as its extra bytes say) and gives x Wᵀ + b for a batch, strided rows and
    strided elements included; one row still runs the GEMV on the dense weight."""
    if kernel == "llmlab" and not {"avx512", "avx2"} & set(cpu_matmul.isa()):
        pytest.skip("llmlab's float32 packed matmul needs AVX-512 or AVX2")
    if kernel == "onednn" and not cpu_matmul.onednn_available():
        pytest.skip("this PyTorch has no oneDNN matmul")
    monkeypatch.setattr(cpu_matmul_choice, "choice", lambda dtype, save=True: kernel)
    g = torch.Generator().manual_seed(4)
    weight, bias = torch.randn(70, 48, generator=g), torch.randn(70, generator=g)
    linear = model_cpu.CpuLinear(weight, bias)
    assert linear.batch_kernel == kernel
    padded = -(-70 // 16) * 16 * 48 * 4  # llmlab's blocks: out padded to whole blocks of 16
    assert (linear.extra_bytes() == padded) == (kernel == "llmlab")
    x = torch.randn(13, 64, generator=g)[:, :48]  # rows 64 floats apart
    want = x.double() @ weight.double().T + bias.double()
    torch.testing.assert_close(linear(x).double(), want, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(linear(x[:1].contiguous()).double(), want[:1], rtol=1e-5, atol=1e-4)
    columns = x.T.contiguous().T  # the same values, elements 13 floats apart within a row
    torch.testing.assert_close(linear(columns).double(), want, rtol=1e-5, atol=1e-4)
