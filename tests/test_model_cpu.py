"""The CPU fast path (`llmlab.model.cpu`): the readable model's layers swapped for C kernels on
weights prepared once. It must give what the readable model gives (float rounding apart), on
paged caches whose unused slots hold NaN, for every head size and GQA group the C attention
takes; its fused one-token layer must give exactly what its kernel-by-kernel path gives; and
its prepared weights must cost no second dense copy."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from llmlab.config import PRECISIONS, EngineConfig
from llmlab.engine.builder import prepare_model
from llmlab.model import tiny_model
from llmlab.model.cpu import CpuDecoderLayer, CpuLinear, cpu_model, weight_bytes
from llmlab.model.quantization import quantize_model_int8
from llmlab.ops import cpu_backend, cpu_decode, cpu_matmul
from llmlab.ops.metadata import AttentionMetadata

pytestmark = pytest.mark.skipif(
    not cpu_backend.available()[0], reason=f"no C compiler: {cpu_backend.available()[1]}"
)

# (heads, kv_heads, head_dim, attention_bias): GQA 2:1, MHA, 4:1, one KV head, 16:1 (the C
# attention's largest group), Qwen2-style bias; every head size the C attention has a variant for
SHAPES = [
    (4, 2, 16, False),
    (4, 4, 32, False),
    (8, 2, 64, False),
    (2, 1, 128, False),
    (2, 2, 256, False),
    (16, 1, 16, False),
    (6, 2, 16, True),
]


def _model(heads, kv_heads, head_dim, bias, seed):
    return tiny_model(
        seed=seed,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
        attention_bias=bias,
    )


class PagedRun:
    """One sequence on a paged, NaN-filled pool with a shuffled block table: a prompt, then
    decode steps of one token. Records logits after each step."""

    def __init__(self, model, block_size, num_blocks, seed, backend):
        cfg = model.config
        gen = torch.Generator().manual_seed(seed)
        self.model, self.block_size, self.backend = model, block_size, backend
        self.kv = model.allocate_kv_caches(num_blocks, block_size, zeroed=False)
        for k, v in self.kv:
            k.fill_(float("nan"))
            v.fill_(float("nan"))
        self.table = torch.randperm(num_blocks, generator=gen).to(torch.int32)[None, :]
        self.ids = torch.randint(3, cfg.vocab_size, (64,), generator=gen)
        self.length = 0

    def metadata(self, new: int, **override) -> AttentionMetadata:
        pos = torch.arange(self.length, self.length + new)
        blocks = self.table[0, pos // self.block_size].long()
        fields = dict(
            cu_seqlens_q=torch.tensor([0, new], dtype=torch.int32),
            seq_lens=torch.tensor([self.length + new], dtype=torch.int32),
            slot_mapping=blocks * self.block_size + pos % self.block_size,
            block_tables=self.table.clone(),
            kv_caches=self.kv,
            max_query_len=new,
            backend=self.backend,
        )
        return AttentionMetadata(**{**fields, **override})

    def step(self, new: int) -> torch.Tensor:
        md = self.metadata(new)
        pos = torch.arange(self.length, self.length + new)
        hidden = self.model(self.ids[self.length : self.length + new], pos, md)
        self.length += new
        return self.model.compute_logits(hidden[-1:])


def _decode(model, block_size, prompt, steps, seed, backend):
    run = PagedRun(model, block_size, num_blocks=8, seed=seed, backend=backend)
    run.step(prompt)
    return torch.cat([run.step(1) for _ in range(steps)]), run.kv


def _count_fused_calls(monkeypatch) -> list:
    """A list that gets, per call of the fused C layers from now on, how many layers it ran."""
    calls = []
    real = cpu_decode.DecodeStack.__call__

    def counted(stack, *args):
        calls.append(len(stack.plans))
        return real(stack, *args)

    monkeypatch.setattr(cpu_decode.DecodeStack, "__call__", counted)
    return calls


def _fused_equals_kernel_path(model, block_size, prompt, steps, seed, monkeypatch):
    """Decode with the fused C layers (one call of all the layers per decode step), then with
    the plans dropped, kernel by kernel (no fused call): the same logits and the same cache
    contents (NaN where nothing was written). Returns the fused run's (logits, caches)."""
    calls = _count_fused_calls(monkeypatch)
    fused, kv_fused = _decode(model, block_size, prompt, steps, seed=seed, backend="cpu")
    assert calls == [model.config.num_hidden_layers] * steps
    calls.clear()
    for layer in model.layers:
        layer.plan = None  # kernel by kernel
    plain, kv_plain = _decode(model, block_size, prompt, steps, seed=seed, backend="cpu")
    assert not calls
    assert torch.isfinite(fused).all()
    torch.testing.assert_close(fused, plain, atol=1e-6, rtol=1e-6)
    for (kf, vf), (kp, vp) in zip(kv_fused, kv_plain):
        torch.testing.assert_close(kf, kp, atol=1e-6, rtol=1e-6, equal_nan=True)
        torch.testing.assert_close(vf, vp, atol=1e-6, rtol=1e-6, equal_nan=True)
    return fused, kv_fused


@pytest.mark.parametrize("heads,kv_heads,head_dim,bias", SHAPES)
@pytest.mark.parametrize("block_size", [8, 16])
def test_fused_layer_equals_the_layer_by_kernel_path(
    heads, kv_heads, head_dim, bias, block_size, monkeypatch
):
    """Same logits and the same cache contents (NaN where nothing was written) as the fast
    layer's kernel-by-kernel path, whose kernels the fused layer runs in the same order; and the
    fused path is the one that ran: one C call for all the layers per decode step."""
    model = cpu_model(_model(heads, kv_heads, head_dim, bias, seed=heads + head_dim))
    prompt, steps = 2 * block_size - 3, block_size + 5  # decode crosses block boundaries
    _, kv_fused = _fused_equals_kernel_path(model, block_size, prompt, steps, 1, monkeypatch)
    written = prompt + steps  # the rest still NaN
    assert int(torch.isnan(kv_fused[0][0]).any(dim=(2, 3)).sum()) == 8 * block_size - written


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int8])
@pytest.mark.parametrize("heads,kv_heads,head_dim,bias", SHAPES)
def test_packed_fused_layer_reads_the_packed_copies_and_equals_the_kernel_path(
    dtype, heads, kv_heads, head_dim, bias, monkeypatch
):
    """A float32, bf16 or int8 model whose matrices have the packed copies (llmlab's batch
    kernel chosen): the fused layer's GEMVs read those copies (the plan's weight type says so,
    and its pointers are the copies'), and give what the kernel-by-kernel path gives, whose
    one-row `CpuLinear`s run the packed matmul: the same operations, so the same logits and
    caches."""
    from llmlab.ops import cpu_matmul_choice

    need = "avx512" if dtype == torch.float32 else "avx512_bf16"
    if need not in cpu_matmul.isa() and "avx2" not in cpu_matmul.isa():
        pytest.skip(f"packed {dtype} weights need {need} or avx2")
    monkeypatch.setattr(cpu_matmul_choice, "choice", lambda dtype, save=True: "llmlab")
    base = _model(heads, kv_heads, head_dim, bias, seed=heads + 3)
    readable = {
        torch.float32: lambda: base,
        torch.bfloat16: lambda: base.to(torch.bfloat16),
        torch.int8: lambda: quantize_model_int8(base),
    }[dtype]()
    model = cpu_model(readable)
    for layer in model.layers:
        assert layer.plan.wtype == cpu_decode.PACKED_TYPES[dtype]
        assert layer.plan.weights[2] == layer.qkv.packed.data_ptr()
        assert layer.plan.weights[6] == layer.down_proj.packed.data_ptr()
    fused, _ = _fused_equals_kernel_path(model, 8, 13, 9, 5, monkeypatch)
    # and the readable model's on the same weights in float32, but for the rounding of the
    # matmuls' inputs: to bf16 (2^-9 relative each) for the prompt's rows and bf16's one row,
    # to int16 for int8's one row
    ref, _ = _decode(readable.float(), 8, 13, 9, seed=5, backend="torch")
    err = (fused - ref).abs().max() / ref.abs().max()
    assert err < 2e-2, err


def test_a_batch_decode_step_runs_attention_in_one_call(monkeypatch):
    """Decode steps of several sequences on the fast path call `decode_attention` once per
    layer (prompts do not), and the logits stay the readable model's."""
    model = _model(4, 2, 16, False, seed=11)
    fast = cpu_model(model)
    calls = []
    real = cpu_backend.decode_attention
    monkeypatch.setattr(
        cpu_backend, "decode_attention", lambda *a, **k: calls.append(1) or real(*a, **k)
    )
    logits = {}
    for name, m, backend in (("fast", fast, "cpu"), ("readable", model, "torch")):
        kv = m.allocate_kv_caches(8, 8)
        md = dict(
            kv_caches=kv,
            backend=backend,
            block_tables=torch.tensor([[0, 1, 2, 3], [4, 5, 6, 7]], dtype=torch.int32),
        )
        ids = torch.tensor([5, 9, 11, 3, 7, 2, 8])  # prompts of 4 and 3 tokens
        m(
            ids,
            torch.tensor([0, 1, 2, 3, 0, 1, 2]),
            AttentionMetadata(
                cu_seqlens_q=torch.tensor([0, 4, 7], dtype=torch.int32),
                seq_lens=torch.tensor([4, 3], dtype=torch.int32),
                slot_mapping=torch.tensor([0, 1, 2, 3, 32, 33, 34]),
                max_query_len=4,
                **md,
            ),
        )
        if name == "fast":
            assert not calls  # the prompts ran kernel by kernel
        hidden = m(
            torch.tensor([6, 4]),
            torch.tensor([4, 3]),
            AttentionMetadata(
                cu_seqlens_q=torch.tensor([0, 1, 2], dtype=torch.int32),
                seq_lens=torch.tensor([5, 4], dtype=torch.int32),
                slot_mapping=torch.tensor([4, 35]),
                max_query_len=1,
                **md,
            ),
        )
        logits[name] = m.compute_logits(hidden)
    assert len(calls) == model.config.num_hidden_layers
    torch.testing.assert_close(logits["fast"], logits["readable"], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("heads,kv_heads,head_dim,bias", SHAPES)
def test_fast_path_matches_the_readable_model(heads, kv_heads, head_dim, bias):
    """Against the readable forward (nn.Linear on aten, PyTorch attention): only float rounding
    apart, prompt and decode steps alike."""
    model = _model(heads, kv_heads, head_dim, bias, seed=7)
    ref, _ = _decode(model, 16, 21, 6, seed=2, backend="torch")
    fast, _ = _decode(cpu_model(model), 16, 21, 6, seed=2, backend="cpu")
    torch.testing.assert_close(fast, ref, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("rows", [1, 2, 33])
@pytest.mark.parametrize("dims", [(48, 64), (96, 32), (40, 24)])
def test_cpu_linear_matches_f_linear(rows, dims):
    """GEMV for one row (in-features a multiple of 16), the chosen batch kernel's packed weight
    for more, aten otherwise: the same product within float rounding, with and without a
    bias."""
    gen = torch.Generator().manual_seed(rows)
    out_f, in_f = dims
    w, b = torch.randn(out_f, in_f, generator=gen), torch.randn(out_f, generator=gen)
    x = torch.randn(rows, in_f, generator=gen)
    for bias in (None, b):
        got = CpuLinear(w, bias)(x)
        torch.testing.assert_close(got, F.linear(x, w, bias), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("kernel", ["llmlab", "onednn"])
def test_one_float32_row_runs_our_gemv_on_the_packed_blocks_or_the_dense_rows(kernel, monkeypatch):
    """One row of a float32 weight: on llmlab's packed copy where that is the batch kernel
    (from one row, `PACKED_MIN_ROWS`), else our dense GEMV; more rows never the dense GEMV."""
    from llmlab.ops import cpu_matmul_choice

    if kernel == "llmlab" and not {"avx512", "avx2"} & set(cpu_matmul.isa()):
        pytest.skip("llmlab's packed float32 matmul needs AVX-512 or AVX2")
    monkeypatch.setattr(cpu_matmul_choice, "choice", lambda dtype, save=True: kernel)
    calls = []
    for name in ("gemv", "packed_gemm"):
        real = getattr(cpu_matmul, name)
        spy = lambda *a, _n=name, _f=real: calls.append((_n, a[0].shape[0])) or _f(*a)  # noqa: E731
        monkeypatch.setattr(cpu_matmul, name, spy)
    w = torch.randn(40, 32)
    lin = CpuLinear(w)
    for rows in (1, 3):
        x = torch.randn(rows, 32)
        torch.testing.assert_close(lin(x), F.linear(x, w), atol=1e-5, rtol=1e-5)
    one = ("packed_gemm", 1) if kernel == "llmlab" else ("gemv", 1)
    assert calls[0] == one and ("gemv", 3) not in calls, calls


def test_rope_rows_come_from_the_tables_as_computed():
    """The fast model's cos and sin come from tables made at load: bit for bit what computing
    the angles gives, at random positions over the table and past its end (computed then)."""
    model = _model(4, 2, 16, False, seed=3)
    fast = cpu_model(model)
    last = model.config.max_position_embeddings
    gen = torch.Generator().manual_seed(0)
    for positions in (
        torch.randint(0, last, (33,), generator=gen),
        torch.tensor([0]),
        torch.tensor([last - 1]),
        torch.tensor([last, last + 7]),
    ):
        cos, sin = fast.rope_cos_sin(positions)
        angles = positions.float().unsqueeze(1) * model.inv_freq.unsqueeze(0)
        assert torch.equal(cos, angles.cos()) and torch.equal(sin, angles.sin())
        assert cos.is_contiguous() and sin.shape == (len(positions), model.config.head_dim // 2)


def test_prepared_weights_share_one_dense_copy():
    """q/k/v and gate/up are stacked once; the readable layer's parameters become views of the
    stacked matrices, so the fast path adds only the packed copies for batches (and its RoPE
    tables) to the parameters."""
    model = _model(4, 2, 16, False, seed=11)
    params = weight_bytes(model)
    fast = cpu_model(model)
    layer, attn = fast.layers[0], model.layers[0].self_attn
    assert (
        attn.k_proj.weight.untyped_storage().data_ptr()
        == layer.qkv.weight.untyped_storage().data_ptr()
    )
    assert (
        model.layers[0].mlp.up_proj.weight.untyped_storage().data_ptr()
        == layer.gate_up.weight.untyped_storage().data_ptr()
    )
    packed = sum(m.extra_bytes() for m in fast.modules() if isinstance(m, CpuLinear))
    rope = fast.rope_cos.nbytes + fast.rope_sin.nbytes  # the RoPE tables, computed at load
    assert rope == 2 * model.config.max_position_embeddings * (model.config.head_dim // 2) * 4
    assert weight_bytes(fast) == params + packed + rope
    # and the readable model still computes what it did
    ids = [5, 6, 7, 8]
    torch.testing.assert_close(
        model.logits_for(ids), fast.logits_for(ids, backend="cpu"), atol=1e-4, rtol=1e-4
    )


def test_a_second_engine_reuses_the_stacked_weights():
    """Preparing a model again (a second engine) finds q/k/v and gate/up already stacked and
    adds no second dense copy; only its own packed copies."""
    model = _model(4, 2, 16, False, seed=12)
    first, second = cpu_model(model), cpu_model(model)
    for a, b in zip(first.layers, second.layers):
        for x, y in ((a.qkv, b.qkv), (a.gate_up, b.gate_up)):
            assert x.weight.untyped_storage().data_ptr() == y.weight.untyped_storage().data_ptr()
            assert x.weight.shape == y.weight.shape
    torch.testing.assert_close(
        second.logits_for([1, 2, 3], backend="cpu"),
        model.logits_for([1, 2, 3]),
        atol=1e-4,
        rtol=1e-4,
    )


def test_prepare_again_after_changing_weights():
    """Packed copies do not follow the parameters: after a change, `cpu_model` again gives the
    new model's results (what the module's docstring asks of its caller)."""
    model = _model(4, 2, 16, False, seed=3)
    before = cpu_model(model).logits_for([3, 4, 5], backend="cpu")
    with torch.no_grad():
        model.layers[1].mlp.down_proj.weight.mul_(0.5)
        model.layers[0].self_attn.k_proj.weight.add_(0.1)
    after = cpu_model(model).logits_for([3, 4, 5], backend="cpu")
    assert not torch.allclose(after, before, atol=1e-3)
    torch.testing.assert_close(after, model.logits_for([3, 4, 5]), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize(
    "field,value,match",
    [
        ("slot_mapping", torch.tensor([10_000]), "slot_mapping"),
        (
            "block_tables",
            torch.tensor([[0, 99, 2, 3, 4, 5, 6, 7]], dtype=torch.int32),
            "block_tables",
        ),
        ("seq_lens", torch.tensor([65], dtype=torch.int32), "seq_lens"),
        ("max_query_len", 2, "max_query_len"),
    ],
)
def test_bad_metadata_is_refused_when_built(field, value, match):
    """No C kernel sees unchecked metadata: the step's metadata is checked when it is built, so a
    bad slot, block id or length is a ValueError naming it before any layer runs."""
    run = PagedRun(
        cpu_model(_model(4, 2, 16, False, seed=5)), 8, num_blocks=8, seed=6, backend="cpu"
    )
    run.step(9)
    with pytest.raises(ValueError, match=match):
        run.metadata(1, **{field: value})


def test_a_cache_of_the_wrong_shape_is_refused_by_the_fast_layer():
    model = cpu_model(_model(4, 2, 16, False, seed=5))
    other = _model(4, 2, 32, False, seed=5)  # head_dim 32: same model, wrong caches
    kv = other.allocate_kv_caches(2, 8)
    md = AttentionMetadata(
        torch.tensor([0, 1], dtype=torch.int32),
        torch.tensor([1], dtype=torch.int32),
        torch.tensor([0]),
        torch.tensor([[0]], dtype=torch.int32),
        kv,
        1,
        "cpu",
    )
    with pytest.raises(ValueError, match="kv_caches"):
        model(torch.tensor([3]), torch.tensor([0]), md)


def test_decode_layer_rejects_bad_arguments():
    """The C entry point's own checks: the hidden row, cos/sin, and the plan's weight shapes."""
    model = _model(4, 2, 16, False, seed=8)
    layer = CpuDecoderLayer(model.layers[0])
    plan = layer.plan
    assert plan is not None
    k, v = model.allocate_kv_caches(2, 8)[0]
    meta = (
        torch.tensor([0]),
        torch.tensor([[0, 1]], dtype=torch.int32),
        torch.tensor([1], dtype=torch.int32),
    )
    cos, sin = torch.ones(1, 8), torch.zeros(1, 8)
    stack = cpu_decode.DecodeStack([plan])
    with pytest.raises(ValueError, match="x must be contiguous float32"):
        stack(torch.zeros(2, 64), cos, sin, [(k, v)], *meta)
    with pytest.raises(ValueError, match="cos, sin"):
        stack(torch.zeros(1, 64), torch.ones(1, 16), sin, [(k, v)], *meta)
    with pytest.raises(ValueError, match="2 .key, value. cache pairs for 1 layers"):
        stack(torch.zeros(1, 64), cos, sin, [(k, v)] * 2, *meta)
    with pytest.raises(ValueError, match="value_cache"):
        stack(torch.zeros(1, 64), cos, sin, [(k, v[:1])], *meta)
    with pytest.raises(ValueError, match="same sizes"):
        cpu_decode.DecodeStack(
            [plan, CpuDecoderLayer(_model(4, 2, 32, False, seed=8).layers[0]).plan]
        )
    out = stack(torch.zeros(1, 64), cos, sin, [(k, v)], *meta)
    assert out.shape == (1, 64) and torch.isfinite(out).all()
    attn, mlp = model.layers[0].self_attn, model.layers[0].mlp
    with pytest.raises(ValueError, match="w_o"):
        cpu_decode.DecodeLayerPlan(
            layer.ln1.weight,
            layer.ln2.weight,
            1e-5,
            torch.zeros(64 + 2 * 32, 64),
            None,
            attn.o_proj.weight.t().contiguous()[:, :32],
            torch.zeros(256, 64),
            mlp.down_proj.weight,
            4,
            2,
            16,
            0.25,
        )
    assert not cpu_decode.decode_layer_applies(4, 2, 80, 64, 128)  # no 80-wide kernel
    assert not cpu_decode.decode_layer_applies(4, 3, 16, 64, 128)  # heads % kv_heads


def test_a_layer_the_fused_call_cannot_take_runs_kernel_by_kernel(monkeypatch):
    """An o_proj with a bias (which the fused C layer has no slot for): that layer runs kernel
    by kernel, the other stays fused, and the logits still equal the readable model's."""
    model = _model(4, 2, 16, False, seed=9)
    attn = model.layers[1].self_attn
    attn.o_proj.bias = torch.nn.Parameter(torch.randn(attn.o_proj.out_features) * 0.01)
    want, _ = _decode(model, 8, 5, 3, seed=5, backend="torch")
    fast = cpu_model(model)
    assert fast.layers[0].plan is not None and fast.layers[1].plan is None
    calls = _count_fused_calls(monkeypatch)
    got, _ = _decode(fast, 8, 5, 3, seed=5, backend="cpu")
    assert calls == [1, 1, 1]  # layer 0 only, one call per step
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


def test_cpu_linear_refuses_weights_the_c_code_cannot_read():
    with pytest.raises(ValueError, match="weight is torch.float64"):
        CpuLinear(torch.zeros(4, 16, dtype=torch.float64))
    with pytest.raises(ValueError, match="bias is torch.bfloat16"):
        CpuLinear(torch.zeros(4, 16), torch.zeros(4, dtype=torch.bfloat16))


def _packed_copies(fast):
    """Every CpuLinear of a fast model with a packed copy, in reading order."""
    return [m for m in fast.modules() if isinstance(m, CpuLinear) and m.packed is not None]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "int8"])
def test_a_second_fast_model_of_the_same_weights_reuses_their_packed_copies(dtype):
    """A second engine on the same model packs nothing again: every packed copy is the first
    one's, and the logits are the same."""
    model = tiny_model(seed=11)
    model = prepare_model(model, EngineConfig(**PRECISIONS[dtype]))
    first = cpu_model(model)
    second = cpu_model(model)
    a, b = _packed_copies(first), _packed_copies(second)
    if not a:
        pytest.skip("no packed matmul runs here (every matrix is read dense)")
    assert len(a) == len(b)
    assert all(x.packed is y.packed for x, y in zip(a, b))
    ids = [4, 5, 6]
    torch.testing.assert_close(
        second.logits_for(ids, backend="cpu"), first.logits_for(ids, backend="cpu"), atol=0, rtol=0
    )


def test_a_weight_changed_in_place_or_replaced_is_packed_again():
    """After one matrix changes in place and another is replaced, the next fast model packs
    those two again (and only those), and its logits follow the readable model's, changes
    included; the fast model built before keeps what it had."""
    from torch import nn

    model = tiny_model(seed=12)
    first = cpu_model(model)
    if not _packed_copies(first):
        pytest.skip("no packed matmul runs here (every matrix is read dense)")
    before = first.logits_for([4, 5, 6], backend="cpu")
    down = model.layers[1].mlp.down_proj
    o_proj = model.layers[0].self_attn.o_proj
    with torch.no_grad():
        down.weight.mul_(-2.0)  # in place: its version counts up
    o_proj.weight = nn.Parameter(torch.randn_like(o_proj.weight) * 0.05, requires_grad=False)
    second = cpu_model(model)
    changed = {id(second.layers[1].down_proj), id(second.layers[0].o_proj)}
    for old, new in zip(_packed_copies(first), _packed_copies(second)):
        assert (old.packed is new.packed) == (id(new) not in changed)
    for m in (second.layers[1].down_proj, second.layers[0].o_proj):
        if m.batch_kernel == "llmlab":
            assert torch.equal(m.packed, cpu_matmul.pack_weight(m.weight))
    torch.testing.assert_close(
        second.logits_for([4, 5, 6], backend="cpu"),
        model.logits_for([4, 5, 6]),
        atol=1e-4,
        rtol=1e-4,
    )
    assert not torch.allclose(second.logits_for([4, 5, 6], backend="cpu"), before, atol=1e-3)
    torch.testing.assert_close(first.logits_for([4, 5, 6], backend="cpu"), before, atol=0, rtol=0)
