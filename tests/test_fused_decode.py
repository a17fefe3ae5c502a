"""The fused batch-1 decode layer (`llmlab_decode_layer` in kernels/cpu_layer.c): a whole decoder
layer for one token in one C call. It must give what the layer-by-kernel path
(`DecoderLayer.forward_cpu`) and the readable PyTorch forward give, on paged caches whose unused
slots hold NaN, for every head size and GQA group the C attention takes; follow weight changes;
and check the step's metadata although it calls no `llmlab.ops` function."""
from __future__ import annotations

import pytest
import torch

from llmlab import ops
from llmlab.model import AttentionContext, DecoderLayer, tiny_model
from llmlab.ops import cpu_backend

pytestmark = pytest.mark.skipif(not cpu_backend.available()[0],
                                reason=f"no C compiler: {cpu_backend.available()[1]}")

# (heads, kv_heads, head_dim, attention_bias): GQA 2:1, MHA, 4:1, one KV head, 16:1 (the C
# attention's largest group), Qwen2-style bias; every head size the C attention has a variant for
SHAPES = [(4, 2, 16, False), (4, 4, 32, False), (8, 2, 64, False), (2, 1, 128, False),
          (2, 2, 256, False), (16, 1, 16, False), (6, 2, 16, True)]


def _model(heads, kv_heads, head_dim, bias, seed):
    return tiny_model(seed=seed, num_attention_heads=heads, num_key_value_heads=kv_heads,
                      head_dim=head_dim, attention_bias=bias)


class PagedRun:
    """One sequence on a paged, NaN-filled pool with a shuffled block table: a prompt, then
    decode steps of one token. Records logits and the cache after each step."""

    def __init__(self, model, block_size, num_blocks, seed):
        cfg = model.config
        gen = torch.Generator().manual_seed(seed)
        self.model, self.block_size = model, block_size
        self.kv = model.allocate_kv_caches(num_blocks, block_size, zeroed=False)
        for k, v in self.kv:
            k.fill_(float("nan"))
            v.fill_(float("nan"))
        self.table = torch.randperm(num_blocks, generator=gen).to(torch.int32)[None, :]
        self.ids = torch.randint(3, cfg.vocab_size, (64,), generator=gen)
        self.length = 0

    def context(self, new: int) -> AttentionContext:
        pos = torch.arange(self.length, self.length + new)
        blocks = self.table[0, pos // self.block_size].long()
        return AttentionContext(
            cu_seqlens_q=torch.tensor([0, new], dtype=torch.int32),
            seq_lens=torch.tensor([self.length + new], dtype=torch.int32),
            slot_mapping=blocks * self.block_size + pos % self.block_size,
            block_tables=self.table.clone(), kv_caches=self.kv, max_query_len=new,
            backend="cpu")

    def step(self, new: int, backend: str = "cpu") -> torch.Tensor:
        ctx = self.context(new)
        ctx.backend = backend
        pos = torch.arange(self.length, self.length + new)
        hidden = self.model(self.ids[self.length:self.length + new], pos, ctx)
        self.length += new
        return self.model.compute_logits(hidden[-1:])


def _decode(model, block_size, prompt, steps, seed, fused, monkeypatch, backend="cpu"):
    """Logits of `steps` decode steps after a prompt, and the caches; the fused layer on or off."""
    with monkeypatch.context() as m:
        if not fused:
            m.setattr(DecoderLayer, "decode_plan", lambda self: None)
        run = PagedRun(model, block_size, num_blocks=8, seed=seed)
        with ops.use_matmul("cpu"):
            run.step(prompt, backend)
            logits = torch.cat([run.step(1, backend) for _ in range(steps)])
    return logits, run.kv


def _count_fused_layers(monkeypatch) -> list:
    """A list that gets one entry per call of the fused C layer from now on."""
    calls = []
    real = cpu_backend.decode_layer
    monkeypatch.setattr(cpu_backend, "decode_layer", lambda *a: calls.append(1) or real(*a))
    return calls


@pytest.mark.parametrize("heads,kv_heads,head_dim,bias", SHAPES)
@pytest.mark.parametrize("block_size", [8, 16])
def test_fused_layer_equals_the_layer_by_kernel_path(heads, kv_heads, head_dim, bias,
                                                     block_size, monkeypatch):
    """Same logits and the same cache contents (NaN where nothing was written) as
    forward_cpu, whose kernels the fused layer runs in the same order; and the fused path is
    the one that ran: one C call per layer per decode step."""
    model = _model(heads, kv_heads, head_dim, bias, seed=heads + head_dim)
    calls = _count_fused_layers(monkeypatch)
    prompt, steps = 2 * block_size - 3, block_size + 5          # decode crosses block boundaries
    fused, kv_fused = _decode(model, block_size, prompt, steps, seed=1, fused=True,
                              monkeypatch=monkeypatch)
    assert len(calls) == steps * model.config.num_hidden_layers
    calls.clear()
    plain, kv_plain = _decode(model, block_size, prompt, steps, seed=1, fused=False,
                              monkeypatch=monkeypatch)
    assert not calls
    assert torch.isfinite(fused).all()
    torch.testing.assert_close(fused, plain, atol=1e-6, rtol=1e-6)
    for (kf, vf), (kp, vp) in zip(kv_fused, kv_plain):
        torch.testing.assert_close(kf, kp, atol=1e-6, rtol=1e-6, equal_nan=True)
        torch.testing.assert_close(vf, vp, atol=1e-6, rtol=1e-6, equal_nan=True)
    written = prompt + steps                                     # the rest still NaN
    assert int(torch.isnan(kv_fused[0][0]).any(dim=(2, 3)).sum()) == 8 * block_size - written


@pytest.mark.parametrize("heads,kv_heads,head_dim,bias", SHAPES[:3])
def test_fused_layer_matches_the_pytorch_forward(heads, kv_heads, head_dim, bias, monkeypatch):
    """Against the readable forward (torch attention, aten matmul): only float rounding apart."""
    model = _model(heads, kv_heads, head_dim, bias, seed=7)
    fused, _ = _decode(model, 16, 21, 6, seed=2, fused=True, monkeypatch=monkeypatch)
    with ops.use_matmul("aten"):
        run = PagedRun(model, 16, num_blocks=8, seed=2)
        run.step(21, "torch")
        ref = torch.cat([run.step(1, "torch") for _ in range(6)])
    torch.testing.assert_close(fused, ref, atol=1e-4, rtol=1e-4)


def test_fused_layer_follows_weight_changes(monkeypatch):
    """The plan holds pointers to the weights and their stacked copies: after an in-place change,
    a swapped `.data` (what module.to() does) and a replaced parameter, the fused layer must
    compute with the new weights, like the unfused path does."""
    model = _model(4, 2, 16, False, seed=3)
    layer = model.layers[1]
    gen = torch.Generator().manual_seed(0)
    changes = [
        lambda: layer.mlp.down_proj.weight.mul_(0.5),
        lambda: setattr(layer.self_attn.k_proj.weight, "data",
                        torch.randn(layer.self_attn.k_proj.weight.shape, generator=gen) / 4),
        lambda: setattr(layer.post_attention_layernorm, "weight",
                        torch.nn.Parameter(torch.rand(model.config.hidden_size, generator=gen))),
        lambda: layer.mlp.up_proj.weight.add_(0.1),
    ]
    before, _ = _decode(model, 8, 5, 3, seed=4, fused=True, monkeypatch=monkeypatch)
    for change in changes:
        with torch.no_grad():
            change()
        fused, _ = _decode(model, 8, 5, 3, seed=4, fused=True, monkeypatch=monkeypatch)
        plain, _ = _decode(model, 8, 5, 3, seed=4, fused=False, monkeypatch=monkeypatch)
        assert not torch.allclose(fused, before, atol=1e-3)      # the change matters
        torch.testing.assert_close(fused, plain, atol=1e-6, rtol=1e-6)
        before = fused


@pytest.mark.parametrize("field,value,match", [
    ("slot_mapping", torch.tensor([10_000]), "slot_mapping"),
    ("block_tables", torch.tensor([[0, 99, 2, 3, 4, 5, 6, 7]], dtype=torch.int32), "block_tables"),
    ("seq_lens", torch.tensor([65], dtype=torch.int32), "seq_lens"),
])
def test_fused_step_checks_its_metadata_and_leaves_the_cache(field, value, match):
    """The fused path calls no llmlab.ops function, so the model checks layer 0's cache and the
    step's metadata itself: a bad slot, block id or length is a ValueError naming it, raised
    before any cache is written."""
    model = _model(4, 2, 16, False, seed=5)
    run = PagedRun(model, 8, num_blocks=8, seed=6)
    with ops.use_matmul("cpu"):
        run.step(9)
        ctx = run.context(1)
        if field == "block_tables":          # block 1 of the table is the one position 9 uses
            ctx.block_tables = value
        else:
            setattr(ctx, field, value)
        saved = [(k.clone(), v.clone()) for k, v in run.kv]
        with pytest.raises(ValueError, match=match):
            model(run.ids[9:10], torch.tensor([9]), ctx)
    for (k, v), (k0, v0) in zip(run.kv, saved):
        assert torch.equal(k.nan_to_num(), k0.nan_to_num())
        assert torch.equal(v.nan_to_num(), v0.nan_to_num())


def test_decode_layer_rejects_bad_arguments():
    """The C entry point's own checks: the hidden row, cos/sin, and the plan's weight shapes."""
    model = _model(4, 2, 16, False, seed=8)
    layer = model.layers[0]
    with ops.use_matmul("cpu"), torch.no_grad():
        plan = layer.decode_plan()
    assert plan is not None
    k, v = model.allocate_kv_caches(2, 8)[0]
    meta = (torch.tensor([0]), torch.tensor([[0, 1]], dtype=torch.int32),
            torch.tensor([1], dtype=torch.int32))
    cos, sin = torch.ones(1, 8), torch.zeros(1, 8)
    with pytest.raises(ValueError, match="x must be contiguous float32"):
        cpu_backend.decode_layer(plan, torch.zeros(2, 64), cos, sin, k, v, *meta)
    with pytest.raises(ValueError, match="cos, sin"):
        cpu_backend.decode_layer(plan, torch.zeros(1, 64), torch.ones(1, 16), sin, k, v, *meta)
    out = cpu_backend.decode_layer(plan, torch.zeros(1, 64), cos, sin, k, v, *meta)
    assert out.shape == (1, 64) and torch.isfinite(out).all()
    attn, mlp = layer.self_attn, layer.mlp
    with pytest.raises(ValueError, match="w_o"):
        cpu_backend.DecodeLayerPlan(
            layer.input_layernorm.weight, layer.post_attention_layernorm.weight, 1e-5,
            torch.zeros(64 + 2 * 32, 64), None, attn.o_proj.weight.t().contiguous()[:, :32],
            torch.zeros(256, 64), mlp.down_proj.weight, 4, 2, 16, 0.25)
    assert not cpu_backend.decode_layer_applies(4, 2, 80, 64, 128)      # no 80-wide kernel
    assert not cpu_backend.decode_layer_applies(4, 3, 16, 64, 128)      # heads % kv_heads


def test_a_weight_the_c_layer_cannot_take_runs_kernel_by_kernel(monkeypatch):
    """A column-major o_proj weight (same values): that layer falls back to forward_cpu's
    kernel-by-kernel path, the other layer stays fused, and the logits do not change."""
    model = _model(4, 2, 16, False, seed=9)
    want, _ = _decode(model, 8, 5, 3, seed=5, fused=True, monkeypatch=monkeypatch)
    attn = model.layers[1].self_attn
    attn.o_proj.weight = torch.nn.Parameter(attn.o_proj.weight.detach().t().contiguous().t())
    assert not attn.o_proj.weight.is_contiguous()
    calls = _count_fused_layers(monkeypatch)
    got, _ = _decode(model, 8, 5, 3, seed=5, fused=True, monkeypatch=monkeypatch)
    assert len(calls) == 3                                   # layer 0 only, one per step
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
