"""The GPU fast path (`llmlab.model.gpu`): the readable model's layers run as nine fused launches.

It must give what the readable model gives on the steps an engine runs (a prefill, a step that
mixes a decode with a prompt's next chunk, a decode), on a paged pool whose blocks are shuffled
and whose unused slots hold NaN; with float32, bfloat16 and int8 weights and an fp8 KV cache;
its merged weights must cost no second copy and leave the readable model's output as it was;
and its forward must never wait for the device (what a CUDA graph needs).

Without a GPU its Triton kernels run through the interpreter on CPU tensors (tiny shapes: the
interpreter runs each program in NumPy); with one, the same tests run compiled on CUDA, and the
`gpu` tests capture a decode step in a CUDA graph.
"""

from __future__ import annotations

import os

import pytest
import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from llmlab.model import tiny_model
from llmlab.model.cpu import weight_bytes
from llmlab.model.gpu import GpuDecoderLayer, gpu_model, gpu_model_applies
from llmlab.model.quantization import quantize_model_int8
from llmlab.ops.metadata import AttentionMetadata

HAS_CUDA = torch.cuda.is_available()
TRITON_COMPILED = HAS_CUDA and os.environ.get("TRITON_INTERPRET", "0") in ("", "0")
DEVICE = "cuda" if TRITON_COMPILED else "cpu"
INTERPRET = DEVICE == "cpu"

pytestmark = pytest.mark.triton

BLOCK_SIZE = 4
# new tokens of two sequences per step: both prompts (crossing block boundaries), then one
# decoding while the other brings its next chunk, then both decoding
SCHEDULE = [(6, 3), (1, 4), (1, 1)]


class PagedSteps:
    """Two sequences on a NaN-filled pool with shuffled blocks, stepped by `SCHEDULE`; one pool
    per model, the same metadata tensors for both."""

    def __init__(self, cfg, cache_dtype, seed: int, kv_scales=None):
        gen = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(3, cfg.vocab_size, (2, 16), generator=gen)
        num_blocks = 10
        self.tables = torch.randperm(num_blocks, generator=gen).to(torch.int32).view(2, 5)
        self.shape = (num_blocks, BLOCK_SIZE, cfg.num_key_value_heads, cfg.head_dim)
        self.cache_dtype, self.kv_scales = cache_dtype, kv_scales
        self.num_layers = cfg.num_hidden_layers

    def new_pool(self):
        nan = torch.full(self.shape, float("nan")).to(self.cache_dtype)  # NaN in fp8 too
        return [(nan.clone().to(DEVICE), nan.clone().to(DEVICE)) for _ in range(self.num_layers)]

    def inputs(self, done: list[int], new: tuple[int, int], pool, backend: str):
        """(input_ids, positions, metadata) of one step after `done` tokens per sequence."""
        pos = [torch.arange(d, d + n) for d, n in zip(done, new)]
        ids = torch.cat([self.ids[s, p] for s, p in enumerate(pos)])
        slots = torch.cat(
            [
                self.tables[s, p // BLOCK_SIZE].long() * BLOCK_SIZE + p % BLOCK_SIZE
                for s, p in enumerate(pos)
            ]
        )
        md = AttentionMetadata(
            cu_seqlens_q=torch.tensor([0, new[0], sum(new)], dtype=torch.int32).to(DEVICE),
            seq_lens=torch.tensor([d + n for d, n in zip(done, new)], dtype=torch.int32).to(DEVICE),
            slot_mapping=slots.to(DEVICE),
            block_tables=self.tables.to(DEVICE),
            kv_caches=pool,
            max_query_len=max(new),
            backend=backend,
            kv_scales=self.kv_scales,
        )
        return ids.to(DEVICE), torch.cat(pos).to(DEVICE), md

    def run(self, model, backend: str):
        """Logits of every token of every step [sum of SCHEDULE, vocab], and the pool."""
        pool, done, logits = self.new_pool(), [0, 0], []
        for new in SCHEDULE:
            ids, positions, md = self.inputs(done, new, pool, backend)
            logits.append(model.compute_logits(model(ids, positions, md)))
            done = [d + n for d, n in zip(done, new)]
        return torch.cat(logits).cpu(), pool


def _model(dtype=torch.float32, seed=0, **cfg):
    return tiny_model(seed=seed, **cfg).to(device=DEVICE, dtype=dtype)


def _fast(model):
    return gpu_model(model, interpret=INTERPRET)


@pytest.mark.parametrize(
    "heads,head_dim", [((4, 2), 16), ((6, 2), 64)], ids=["gqa2-d16", "gqa3-d64"]
)
def test_fused_model_equals_the_readable_model_on_prefill_mixed_and_decode_steps(heads, head_dim):
    """float32: the same logits after every step, to float rounding (logits of magnitude ~4 differ
    by 2-3e-6 here, where the fused norm's sum and the merged GEMMs add in another order), and
    the same keys and values in exactly the slots the steps own (NaN elsewhere)."""
    model = _model(num_attention_heads=heads[0], num_key_value_heads=heads[1], head_dim=head_dim)
    steps = PagedSteps(model.config, torch.float32, seed=1)
    want, want_pool = steps.run(model, "torch")
    got, got_pool = steps.run(_fast(model), "triton")
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    for (kg, vg), (kw, vw) in zip(got_pool, want_pool):
        torch.testing.assert_close(kg.cpu(), kw.cpu(), atol=1e-5, rtol=1e-5, equal_nan=True)
        torch.testing.assert_close(vg.cpu(), vw.cpu(), atol=1e-5, rtol=1e-5, equal_nan=True)


def test_fused_model_in_bfloat16_is_as_close_to_float32_as_the_readable_one():
    """bfloat16: the two implementations round differently (the fused RoPE rounds once where the
    readable one rounds cos, sin and each product), so neither is the other's reference; both
    are held against the float32 readable model, and the fused one may be at most 1.5x as far
    from it as the readable one is."""
    model = _model(seed=3)
    exact, _ = PagedSteps(model.config, torch.float32, seed=2).run(model, "torch")
    steps = PagedSteps(model.config, torch.bfloat16, seed=2)
    bf16 = _model(torch.bfloat16, seed=3)
    readable, _ = steps.run(bf16, "torch")
    fused, _ = steps.run(_fast(bf16), "triton")
    readable_err = (readable - exact).abs().max()
    fused_err = (fused - exact).abs().max()
    assert torch.isfinite(fused).all()
    assert 0 < fused_err <= 1.5 * readable_err, (float(fused_err), float(readable_err))


def test_fused_model_runs_int8_weights_as_the_readable_model_does():
    """int8 weights (`quantize_model_int8`): q/k/v and gate/up merge their int8 rows and their
    scales; the logits are the readable int8 model's (float32 activations: float rounding)."""
    model = quantize_model_int8(_model(seed=4))
    steps = PagedSteps(model.config, torch.float32, seed=3)
    want, _ = steps.run(model, "torch")
    fast = _fast(model)
    assert fast.layers[0].qkv_proj.weight.dtype == torch.int8
    got, _ = steps.run(fast, "triton")
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_fused_model_writes_and_reads_an_fp8_cache():
    """An fp8 (e4m3) cache with per-layer scales: the rotary kernel rounds k / k_scale and
    v / v_scale itself. Against the readable model on the same cache: the codes are the same,
    but for a key or value computed in another order that lands one code away (at most 1 % of
    them, each one code: here none), and the logits agree to what that moves (a dozen codes
    moved by one shift these logits by up to 0.1, measured; here they differ by 3e-6)."""
    model = _model(seed=5)
    scales = [(0.01, 0.01)] * model.config.num_hidden_layers
    steps = PagedSteps(model.config, torch.float8_e4m3fn, seed=4, kv_scales=scales)
    want, want_pool = steps.run(model, "torch")
    got, got_pool = steps.run(_fast(model), "triton")
    for pair_got, pair_want in zip(got_pool, want_pool):
        for g, w in zip(pair_got, pair_want):
            codes_got = g.cpu().view(torch.uint8).int()
            codes_want = w.cpu().view(torch.uint8).int()
            apart = (codes_got != codes_want).float().mean()
            assert apart <= 0.01 and (codes_got - codes_want).abs().max() <= 1, float(apart)
    torch.testing.assert_close(got, want, atol=0.1, rtol=0)


def test_merged_weights_are_shared_and_leave_the_readable_model_unchanged():
    """q/k/v and gate/up are merged once into matrices the readable modules now point into: the
    fast model costs only its cos/sin table, and the readable model's logits are unchanged."""
    model = _model(seed=6)
    ids = torch.tensor([5, 9, 200, 7], device=DEVICE)
    before = model.logits_for(ids)
    bytes_before = weight_bytes(model)
    fast = _fast(model)
    layer, attn = fast.layers[0], model.layers[0].self_attn
    assert isinstance(layer, GpuDecoderLayer)
    shared = layer.qkv_proj.weight.untyped_storage().data_ptr()
    assert attn.q_proj.weight.untyped_storage().data_ptr() == shared
    assert attn.v_proj.weight.untyped_storage().data_ptr() == shared
    table = layer.rotary.cos_sin_cache
    cfg = model.config
    assert table.shape == (cfg.max_position_embeddings, cfg.head_dim)
    assert weight_bytes(fast) == bytes_before + table.numel() * table.element_size()
    assert torch.equal(model.logits_for(ids), before)


def test_both_implementations_run_only_the_first_layers_for_an_early_exit_draft():
    """forward(..., num_layers=n): the first n layers and the final norm, the same in both
    implementations (the early-exit draft runs whichever the engine holds)."""
    model = _model(seed=11)
    fast = _fast(model)
    steps = PagedSteps(model.config, torch.float32, seed=10)
    pools = steps.new_pool(), steps.new_pool()
    want = model(*steps.inputs([0, 0], (3, 2), pools[0], "torch"), num_layers=1)
    got = fast(*steps.inputs([0, 0], (3, 2), pools[1], "triton"), num_layers=1)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    full = model(*steps.inputs([0, 0], (3, 2), steps.new_pool(), "torch"))
    assert not torch.allclose(full, want), "num_layers=1 ran every layer"
    for bad in (0, 3, 1.0):
        with pytest.raises(ValueError, match="^num_layers: got"):
            fast(*steps.inputs([0, 0], (3, 2), pools[1], "triton"), num_layers=bad)


def test_gpu_model_says_why_it_does_not_apply():
    model = tiny_model()
    ok, why = gpu_model_applies(model)
    assert not ok and "CUDA" in why and "interpret=True" in why
    with pytest.raises(ValueError, match="cannot run this model: .*CUDA"):
        gpu_model(model)
    if INTERPRET:
        assert gpu_model_applies(model, interpret=True) == (True, "")
    ok, why = gpu_model_applies(tiny_model(head_dim=15, num_attention_heads=4), interpret=True)
    assert not ok and "head_dim" in why


def test_fused_model_rejects_a_step_it_was_not_built_for():
    model = _model(seed=7)
    fast = _fast(model)
    steps = PagedSteps(model.config, torch.float32, seed=5)
    pool = steps.new_pool()
    ids, positions, md = steps.inputs([0, 0], (2, 1), pool, "triton")
    with pytest.raises(ValueError, match="^input_ids and positions"):
        fast(ids, positions.int(), md)
    with pytest.raises(ValueError, match="^metadata: got 3 tokens"):
        fast(ids[:2], positions[:2], md)
    half = steps.new_pool()
    _, _, md_bf16 = steps.inputs(
        [0, 0], (2, 1), [(k.bfloat16(), v.bfloat16()) for k, v in half], "triton"
    )
    with pytest.raises(ValueError, match="^metadata.kv_caches"):
        fast(ids, positions, md_bf16)
    assert all(torch.isnan(k).all() for k, _ in pool), "a rejected step wrote the cache"


# ---------------------------------------------------------------- launches per layer

# operators that launch no kernel (views, allocations, a `to` of the same dtype is not seen)
_NO_KERNEL = {
    "empty", "empty_like", "empty_strided", "new_empty", "view", "_unsafe_view", "t",
    "transpose", "permute", "expand", "slice", "select", "split", "split_with_sizes",
    "unsqueeze", "squeeze", "as_strided", "alias", "detach", "reshape", "unbind",
}  # fmt: skip
_GEMMS = {"linear", "mm", "addmm", "matmul"}


class _Launches(TorchDispatchMode):
    """Records every operator that launches a kernel ("gemm" for a matmul, however the device
    spells it), and every Triton launch as "triton:<kernel>"."""

    def __init__(self):
        super().__init__()
        self.names: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func._schema.name.split("::")[1]
        if name not in _NO_KERNEL:
            self.names.append("gemm" if name in _GEMMS else name)
        return func(*args, **(kwargs or {}))


def _launches(run) -> list[str]:
    """The kernels `run()` launches, in order."""
    from torch.utils._python_dispatch import _disable_current_modes

    from llmlab.ops import triton_backend

    modules = [triton_backend._load(m) for m in ("_triton_kernels", "_triton_layer_kernels")]
    seen = _Launches()
    saved = {
        (mod, n): getattr(mod, n) for mod in modules for n in dir(mod) if n.endswith("_kernel")
    }

    class Counted:
        def __init__(self, kernel, name):
            self.kernel, self.name = kernel, name

        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                seen.names.append(f"triton:{self.name}")
                with _disable_current_modes():  # the interpreter's own tensor work is not ours
                    return self.kernel[grid](*args, **kwargs)

            return launch

    try:
        for (mod, name), kernel in saved.items():
            setattr(mod, name, Counted(kernel, name))
        with seen:
            run()
    finally:
        for (mod, name), kernel in saved.items():
            setattr(mod, name, kernel)
    return seen.names


def test_a_fused_decode_layer_launches_nine_kernels():
    """Per layer of a decode step: add + norm, qkv GEMM, rotary + cache write, attention, o_proj,
    add + norm, gate/up GEMM, SiLU x up, down; the step adds the embedding and the final norm.
    (The readable layer dispatches about 46 operators, counted the same way.)"""
    model = _model(seed=10)
    fast = _fast(model)
    steps = PagedSteps(model.config, torch.float32, seed=9)
    pool = steps.new_pool()
    fast(*steps.inputs([0, 0], (6, 3), pool, "triton"))
    ids, positions, md = steps.inputs([6, 3], (1, 1), pool, "triton")
    layer = [
        "triton:rms_norm_kernel",
        "gemm",
        "triton:rotary_cache_kernel",
        "triton:paged_decode_kernel",
        "gemm",
        "triton:rms_norm_kernel",
        "gemm",
        "triton:silu_and_mul_kernel",
        "gemm",
    ]
    want = ["embedding", *layer * model.config.num_hidden_layers, "triton:rms_norm_kernel"]
    assert _launches(lambda: fast(ids, positions, md)) == want
    readable = _launches(lambda: model(ids, positions, md))
    assert len(readable) > 4 * len(want)


# ---------------------------------------------------------------- nothing waits for the device


class _HostReads(TorchDispatchMode):
    """Fails on every operator that copies a device value to the host or sizes a tensor by
    values (a sync on a GPU, and impossible inside a CUDA graph)."""

    FORBIDDEN = {
        "aten::_local_scalar_dense",  # .item(), int(t), float(t), bool(t)
        "aten::nonzero",
        "aten::masked_select",
        "aten::_unique2",
        "aten::unique_consecutive",
        "aten::repeat_interleave",
        "aten::lift_fresh",  # torch.tensor(python values)
    }

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func._schema.name in self.FORBIDDEN:
            raise AssertionError(f"the forward read the device: {func._schema.name}")
        return func(*args, **(kwargs or {}))


class _HostConversions(TorchFunctionMode):
    """Fails on the Python-level ways to bring a tensor's values to the host."""

    FORBIDDEN = {
        torch.Tensor.item,
        torch.Tensor.tolist,
        torch.Tensor.numpy,
        torch.Tensor.__int__,
        torch.Tensor.__float__,
        torch.Tensor.__bool__,
        torch.Tensor.__index__,
        torch.tensor,
    }

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in self.FORBIDDEN:
            raise AssertionError(f"the forward read the device: {func.__name__}")
        return func(*args, **(kwargs or {}))


class no_host_reads:
    """Context: any read of a tensor's values by the host raises AssertionError."""

    def __enter__(self):
        self.modes = [_HostConversions(), _HostReads()]
        for m in self.modes:
            m.__enter__()

    def __exit__(self, *exc):
        for m in reversed(self.modes):
            m.__exit__(*exc)


def test_the_host_read_detector_catches_a_planted_sync():
    """The detector below is sound only if it fails on what it looks for: the Triton prefill
    sized from `cu_seqlens_q` (the host read the fused layer avoids), `.tolist()`, a tensor
    built from a list."""
    from llmlab.ops import triton_backend

    steps = PagedSteps(tiny_model().config, torch.float32, seed=6)
    pool = steps.new_pool()
    _, _, md = steps.inputs([0, 0], (2, 1), pool, "triton")
    q = torch.zeros(3, 4, 16, device=DEVICE)
    kv = md.paged_kv(0)
    cu = md.cu_seqlens_q
    for planted in (
        lambda: int(md.seq_lens.max()),
        lambda: md.slot_mapping.tolist(),
        lambda: torch.tensor([1, 2]),
        # the prefill grid sized from the device, as the Triton launcher once did per layer
        lambda: triton_backend.paged_attention(
            q, kv, 0.25, max_query_len=int((cu[1:] - cu[:-1]).max())
        ),
    ):
        with pytest.raises(AssertionError, match="read the device"), no_host_reads():
            planted()
    with no_host_reads():  # the host's max_query_len: nothing read
        triton_backend.paged_attention(q, kv, 0.25, max_query_len=2)


@pytest.mark.parametrize("new", [(1, 1), (1, 4)], ids=["decode", "mixed"])
def test_fused_forward_never_reads_the_device(new):
    """A decode step and a mixed step of the whole fused model (embedding, every layer, final
    norm) run with no host read: capturable in a CUDA graph, no sync per layer."""
    model = _model(seed=8)
    fast = _fast(model)
    steps = PagedSteps(model.config, torch.float32, seed=7)
    pool = steps.new_pool()
    fast(*steps.inputs([0, 0], (6, 3), pool, "triton"))  # the context, built normally
    ids, positions, md = steps.inputs([6, 3], new, pool, "triton")
    with no_host_reads():
        hidden = fast(ids, positions, md)
    assert hidden.shape == (sum(new), model.config.hidden_size) and torch.isfinite(hidden).all()


# ---------------------------------------------------------------- on a GPU: a CUDA graph


@pytest.mark.gpu
@pytest.mark.skipif(not TRITON_COMPILED, reason="needs a CUDA GPU with Triton compiling")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_gpu_decode_step_replays_in_a_cuda_graph(dtype):
    """A decode step captured once in a CUDA graph, replayed for two steps with new inputs
    copied into its buffers, gives what the eager forward gives on a copy of the cache; the
    eager forward runs under `torch.cuda.set_sync_debug_mode("error")`."""
    fast = _fast(_model(dtype, seed=9))
    steps = PagedSteps(fast.config, dtype, seed=8)
    graph_pool = steps.new_pool()
    fast(*steps.inputs([0, 0], (6, 3), graph_pool, "triton"))
    eager_pool = [(k.clone(), v.clone()) for k, v in graph_pool]
    ids, positions, md = steps.inputs([6, 3], (1, 1), graph_pool, "triton")  # static buffers
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fast(ids, positions, md)  # compiles the kernels before capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fast(ids, positions, md)
    for done in ([6, 3], [7, 4]):
        new_ids, new_pos, new_md = steps.inputs(done, (1, 1), graph_pool, "triton")
        for buf, src in (
            (ids, new_ids),
            (positions, new_pos),
            (md.slot_mapping, new_md.slot_mapping),
            (md.seq_lens, new_md.seq_lens),
        ):
            buf.copy_(src)
        graph.replay()
        _, _, eager_md = steps.inputs(done, (1, 1), eager_pool, "triton")
        torch.cuda.set_sync_debug_mode("error")
        try:
            want = fast(new_ids, new_pos, eager_md)
        finally:
            torch.cuda.set_sync_debug_mode("default")
        torch.cuda.synchronize()
        torch.testing.assert_close(out, want)
