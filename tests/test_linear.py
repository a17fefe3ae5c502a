"""`llmlab.ops.linear` (module `llmlab.ops.matmul`): both matmul libraries against `F.linear`,
the switch, and who uses which."""
from __future__ import annotations

import itertools

import pytest
import torch
import torch.nn.functional as F

from llmlab import LLM, SamplingParams, ops
from llmlab.model import tiny_model
from llmlab.ops import matmul as linear_mod

ONEDNN = linear_mod._ONEDNN is not None
SHAPES = list(itertools.product((0, 1, 3, 32, 257), ((96, 40), (576, 960), (1536, 576))))


@pytest.mark.parametrize("backend", ops.MATMUL_BACKENDS)
@pytest.mark.parametrize("rows,dims", SHAPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_linear_matches_f_linear(backend, rows, dims, dtype):
    k, n = dims
    gen = torch.Generator().manual_seed(rows * 7919 + k + n)
    x = torch.randn(rows, k, generator=gen).to(dtype)
    w = (torch.randn(n, k, generator=gen) / k ** 0.5).to(dtype)
    b = torch.randn(n, generator=gen).to(dtype)
    with ops.use_matmul(backend):
        for bias in (None, b):
            got = ops.linear(x, w, bias)
            want = F.linear(x.double(), w.double(), None if bias is None else bias.double())
            assert got.shape == (rows, n) and got.dtype == dtype
            tol = 1e-5 if dtype == torch.float32 else 3e-2
            torch.testing.assert_close(got.double(), want, atol=tol, rtol=tol)


def test_aten_backend_is_exactly_f_linear():
    x, w = torch.randn(5, 64), torch.randn(32, 64)
    with ops.use_matmul("aten"):
        assert torch.equal(ops.linear(x, w), F.linear(x, w))


def test_three_dim_input_and_non_contiguous_input():
    w = torch.randn(24, 48)
    x3 = torch.randn(2, 5, 48)
    xs = torch.randn(6, 100)[:, 10:58]                  # a column slice: rows are strided
    with ops.use_matmul("onednn"):
        torch.testing.assert_close(ops.linear(x3, w), F.linear(x3, w), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(ops.linear(xs, w), F.linear(xs, w), atol=1e-5, rtol=1e-5)


@pytest.mark.skipif(not ONEDNN, reason="this PyTorch build has no oneDNN linear op")
def test_onednn_is_used_only_where_it_applies():
    x, w = torch.randn(4, 16), torch.randn(8, 16)
    with ops.use_matmul("onednn"):
        assert linear_mod.onednn_applies(x, w)
        assert not linear_mod.onednn_applies(x.half(), w.half())          # fp16: not offered
        assert not linear_mod.onednn_applies(x, torch.randn(16, 8).t())   # strided weight
        wg = w.clone().requires_grad_(True)
        assert not linear_mod.onednn_applies(x, wg)                        # autograd wants aten
        y = ops.linear(x, wg)
        y.sum().backward()                                                 # ... and gets it
        torch.testing.assert_close(wg.grad, x.sum(0).expand(8, 16))
        with torch.no_grad():
            assert linear_mod.onednn_applies(x, wg)
    with ops.use_matmul("aten"):
        assert not linear_mod.onednn_applies(x, w)


def test_unknown_library_is_rejected_and_the_switch_restores():
    before = ops.matmul_backend()
    with pytest.raises(ValueError, match="name.*'onednn'"):
        ops.set_matmul_backend("blas")
    with pytest.raises(RuntimeError):
        with ops.use_matmul("aten" if before == "onednn" else "onednn"):
            assert ops.matmul_backend() != before
            raise RuntimeError("boom")
    assert ops.matmul_backend() == before


@pytest.mark.skipif(not ONEDNN, reason="this PyTorch build has no oneDNN linear op")
def test_engine_runs_onednn_and_the_model_alone_runs_aten(monkeypatch):
    calls = []
    real = linear_mod._ONEDNN

    def counting(*args):
        calls.append(args[1].shape)
        return real(*args)

    monkeypatch.setattr(linear_mod, "_ONEDNN", counting)
    model = tiny_model(seed=3)
    ids = [5, 9, 2, 7]
    model.logits_for(ids)
    assert calls == [], "the model on its own must use the aten matmul (transformers' numerics)"
    params = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
    fast = LLM(model, max_model_len=64).generate([ids], params, use_tqdm=False)
    assert len(calls) > 0, "the engine's default matmul should be oneDNN"
    n = len(calls)
    slow = LLM(model, max_model_len=64, matmul="aten").generate([ids], params, use_tqdm=False)
    assert len(calls) == n, "matmul='aten' must not call oneDNN"
    assert fast[0].outputs[0].token_ids == slow[0].outputs[0].token_ids
    assert ops.matmul_backend() == "aten", "the engine must restore the global default"
    with pytest.raises(ValueError, match="matmul"):
        LLM(model, max_model_len=64, matmul="blas")


@pytest.mark.skipif(linear_mod._REORDER is None, reason="this PyTorch build cannot prepack")
def test_prepacked_weight_follows_in_place_changes_and_replacement():
    """The layer's packed copy must never serve a weight that has since changed."""
    gen = torch.Generator().manual_seed(11)
    layer = torch.nn.Linear(64, 48, bias=False)
    w0 = layer.weight
    cache: dict = {}
    x = torch.randn(7, 64, generator=gen)
    with ops.use_matmul("onednn"), torch.no_grad():
        first = ops.linear(x, w0, cache=cache)
        assert cache["packed"].is_mkldnn and cache["weight"] is w0
        torch.testing.assert_close(first, F.linear(x, w0), atol=1e-5, rtol=1e-5)
        w0.mul_(-2.0)                                     # in place: the version counter moves
        torch.testing.assert_close(ops.linear(x, w0, cache=cache), F.linear(x, w0),
                                   atol=1e-5, rtol=1e-5)
        w1 = torch.nn.Parameter(torch.randn(48, 64, generator=gen))
        torch.testing.assert_close(ops.linear(x, w1, cache=cache), F.linear(x, w1),
                                   atol=1e-5, rtol=1e-5)
        assert cache["weight"] is w1
        w1.data = torch.randn(48, 64, generator=gen)      # new data, same object, same version
        torch.testing.assert_close(ops.linear(x, w1, cache=cache), F.linear(x, w1),
                                   atol=1e-5, rtol=1e-5)
        for rows in (1, 3, 100):                          # one packing serves every batch size
            xr = torch.randn(rows, 64, generator=gen)
            torch.testing.assert_close(ops.linear(xr, w1, cache=cache), F.linear(xr, w1),
                                       atol=1e-5, rtol=1e-5)


def test_model_layers_after_load_state_dict_use_the_new_weights():
    """An engine's forward, then new weights copied in: the next forward must see them."""
    a, b = tiny_model(seed=1), tiny_model(seed=2)
    ids = [4, 8, 15, 16, 23]
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    LLM(a, max_model_len=64).generate([ids], params, use_tqdm=False)   # packs a's weights
    with torch.no_grad():
        a.load_state_dict(b.state_dict())                               # copies in place
    got = LLM(a, max_model_len=64).generate([ids], params, use_tqdm=False)
    want = LLM(b, max_model_len=64).generate([ids], params, use_tqdm=False)
    assert got[0].outputs[0].token_ids == want[0].outputs[0].token_ids


@pytest.mark.parametrize("backend", ops.MATMUL_BACKENDS)
@pytest.mark.parametrize("rows", (1, 5, 64))
def test_linear_split_equals_one_linear_per_weight(backend, rows):
    """q, k, v (with a bias missing on one) as one stacked matmul: the same as three."""
    gen = torch.Generator().manual_seed(rows)
    weights = [torch.nn.Parameter(torch.randn(n, 96, generator=gen) / 10) for n in (96, 32, 32)]
    biases = [torch.randn(96, generator=gen), None, torch.randn(32, generator=gen)]
    x = torch.randn(rows, 96, generator=gen)
    cache: dict = {}
    with ops.use_matmul(backend), torch.no_grad():
        for _ in range(2):                                  # the second call reuses the packing
            got = ops.linear_split(x, weights, biases, cache=cache)
            assert [tuple(g.shape) for g in got] == [(rows, 96), (rows, 32), (rows, 32)]
            for g, w, b in zip(got, weights, biases):
                torch.testing.assert_close(g, F.linear(x, w, b), atol=1e-5, rtol=1e-5)
        gemv = backend == "cpu" and rows == 1             # one dense stacked copy for the GEMV
        stacked = not gemv and backend in ("onednn", "cpu") and ONEDNN and (
            linear_mod._REORDER is not None)
        assert set(cache) == ({"dense"} if gemv else {"onednn"} if stacked else set())
        for slot in cache:
            before = cache[slot][1][0]
            assert before.shape == (160, 96) or before.is_mkldnn
            weights[1].mul_(3.0)                            # in place: must be re-stacked
            biases[2] = torch.randn(32, generator=gen)      # a new bias: also
            got = ops.linear_split(x, weights, biases, cache=cache)
            assert cache[slot][1][0] is not before
            for g, w, b in zip(got, weights, biases):
                torch.testing.assert_close(g, F.linear(x, w, b), atol=1e-5, rtol=1e-5)
            # module.to(...) swaps a parameter's data: no version bump, but a new address
            weights[0].data = torch.randn(96, 96, generator=gen) / 10
            got = ops.linear_split(x, weights, biases, cache=cache)
            for g, w, b in zip(got, weights, biases):
                torch.testing.assert_close(g, F.linear(x, w, b), atol=1e-5, rtol=1e-5)


def test_cpu_library_runs_one_row_inputs_as_our_gemv(monkeypatch):
    """"cpu": one-row inputs go to the C GEMV (a row count of 4 to N % 4, any bias), the rest to
    oneDNN; in-features that are not a multiple of 16 stay on oneDNN."""
    from llmlab.ops import cpu_backend

    assert cpu_backend.available()[0], cpu_backend.available()[1]
    calls = []
    real = cpu_backend.gemv
    monkeypatch.setattr(cpu_backend, "gemv", lambda *a: calls.append(a[1].shape) or real(*a))
    gen = torch.Generator().manual_seed(3)
    with ops.use_matmul("cpu"), torch.no_grad():
        for n, k in ((1, 16), (7, 64), (960, 576), (49152 // 64, 1536)):
            x, w = torch.randn(1, k, generator=gen), torch.randn(n, k, generator=gen)
            b = torch.randn(n, generator=gen)
            for bias in (None, b):
                torch.testing.assert_close(ops.linear(x, w, bias), F.linear(x, w, bias),
                                           atol=1e-4, rtol=1e-5)
        assert len(calls) == 8
        ops.linear(torch.randn(2, 64), torch.randn(8, 64))           # two rows: oneDNN
        ops.linear(torch.randn(1, 40), torch.randn(8, 40))           # 40 % 16 != 0: oneDNN
        assert len(calls) == 8
