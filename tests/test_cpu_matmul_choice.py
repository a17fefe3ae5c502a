"""The bf16 batch matmul chosen per machine (`llmlab.ops.cpu_matmul_choice`): measured once,
saved per machine key, read back without measuring; and `CpuLinear` running whichever was chosen
with the same result (to the rounding that kernel states)."""

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


def test_measure_times_what_runs_here_and_applies_its_rule():
    result = cpu_matmul_choice.measure(rounds=2)
    runs_here = []
    if "avx512_bf16" in cpu_matmul.isa():
        runs_here.append("llmlab")
    if cpu_matmul_choice.onednn_bf16()[0] is not None:
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
        cpu_matmul_choice.measure(rounds=0)


def test_the_choice_is_measured_once_saved_and_read_back(cache, monkeypatch):
    measured = []

    def fake_measure():
        measured.append(1)
        return {"choice": "onednn", "ms": {}, "shape": list(cpu_matmul_choice.SHAPE)}

    monkeypatch.setattr(cpu_matmul_choice, "measure", fake_measure)
    other = "another CPU; 64 CPUs, 64 usable; torch 0; 64 threads; kernels x"
    stale = cpu_matmul_choice.machine_key().rsplit("; kernels ", 1)[0] + "; kernels old"
    # another machine's entry is ignored and kept; this machine's for another kernel build is
    # measured again and replaced
    cache.write_text(json.dumps({other: {"choice": "llmlab"}, stale: {"choice": "llmlab"}}))
    assert cpu_matmul_choice.choice() == "onednn" and len(measured) == 1
    saved = json.loads(cache.read_text())
    assert saved[cpu_matmul_choice.machine_key()]["choice"] == "onednn"
    assert saved[other] == {"choice": "llmlab"}, "other machines' entries are kept"
    assert stale not in saved
    monkeypatch.setattr(cpu_matmul_choice, "_chosen", {})  # a new process: reads the file
    assert cpu_matmul_choice.choice() == "onednn" and len(measured) == 1
    assert str(torch.get_num_threads() + 1) + " threads" in cpu_matmul_choice.machine_key(
        torch.get_num_threads() + 1
    )


@pytest.mark.parametrize("kernel", ["llmlab", "onednn"])
def test_cpu_linear_runs_the_chosen_kernel_with_its_rounding(kernel, cache, monkeypatch):
    """Whichever kernel is chosen, a batch through a bf16 `CpuLinear` is x (rounded to bf16)
    times the bf16 weight: float32 sums from llmlab's kernel, bf16 outputs from oneDNN's."""
    if kernel == "llmlab" and "avx512_bf16" not in cpu_matmul.isa():
        pytest.skip("llmlab's packed matmul needs AVX-512 BF16")
    if kernel == "onednn" and cpu_matmul_choice.onednn_bf16()[0] is None:
        pytest.skip("this PyTorch has no oneDNN bf16 matmul")
    monkeypatch.setattr(cpu_matmul_choice, "choice", lambda save=True: kernel)
    g = torch.Generator().manual_seed(3)
    weight = torch.randn(40, 64, generator=g).bfloat16()
    bias = torch.randn(40, generator=g)
    linear = model_cpu.CpuLinear(weight, bias)
    assert linear.batch_kernel == kernel and linear.extra_bytes() > 0
    x = torch.randn(9, 64, generator=g)
    want = x.bfloat16().double() @ weight.double().T + bias.double()
    rtol = 1e-5 if kernel == "llmlab" else 2**-8  # oneDNN rounds its output to bf16
    torch.testing.assert_close(linear(x).double(), want, rtol=rtol, atol=rtol * 8)
    one = x[:1]  # one row: llmlab's packed blocks, or with oneDNN chosen the dense weight
    torch.testing.assert_close(linear(one).double(), want[:1], rtol=1e-5, atol=1e-4)
