"""The CPU fast path's weights on 2 MB pages (`llmlab.model.huge_pages`): the same values, one
buffer in reading order, shared matrices still shared, and pages the kernel may make huge."""

import re
from pathlib import Path

import pytest
import torch

from llmlab.config import PRECISIONS, EngineConfig
from llmlab.engine.builder import prepare_model
from llmlab.model import huge_pages, tiny_model
from llmlab.model.cpu import cpu_model

needs_thp = pytest.mark.skipif(
    not huge_pages.huge_pages_available(),
    reason="this kernel gives no transparent huge pages (THP `never`, or not Linux)",
)


def _matrices(model):
    """Every 2-D weight of the model, by name."""
    return {name: t for name, t in model.state_dict(keep_vars=True).items() if t.dim() == 2}


def _smaps_entry(address: int) -> dict[str, str]:
    """The fields of /proc/self/smaps for the mapping that holds `address`."""
    fields, inside = {}, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        span = re.match(r"([0-9a-f]+)-([0-9a-f]+) ", line)
        if span:
            if inside:
                break
            inside = int(span.group(1), 16) <= address < int(span.group(2), 16)
        elif inside and ":" in line:
            key, value = line.split(":", 1)
            fields[key] = value.strip()
    return fields


@needs_thp
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "int8"])
def test_rehomed_weights_keep_their_values_in_one_buffer(dtype):
    model = tiny_model(seed=5)
    model = prepare_model(model, EngineConfig(**PRECISIONS[dtype]))
    before = {name: t.detach().clone() for name, t in _matrices(model).items()}
    moved = huge_pages.rehome_weights(model)
    after = _matrices(model)
    distinct = {t.data_ptr(): t for t in _matrices(model).values()}  # a tied head once
    assert moved == sum(t.numel() * t.element_size() for t in distinct.values())
    for name, t in after.items():
        assert t.dtype == before[name].dtype and torch.equal(t, before[name]), name
    storages = {t.untyped_storage().data_ptr() for t in after.values()}
    assert len(storages) == 1
    assert storages.pop() % huge_pages.HUGE_PAGE == 0
    layer = model.layers[0]
    q, k, v = (getattr(layer.self_attn, n).weight for n in ("q_proj", "k_proj", "v_proj"))
    assert k.data_ptr() == q.data_ptr() + q.numel() * q.element_size()  # stacked in place
    assert v.data_ptr() == k.data_ptr() + k.numel() * k.element_size()
    if model.config.tie_word_embeddings:
        assert model.lm_head.weight.data_ptr() == model.embed_tokens.weight.data_ptr()


@needs_thp
def test_where_one_row_streams_the_dense_weights_the_fast_path_reads_them_from_the_buffer(
    monkeypatch,
):
    """oneDNN as float32's batch kernel: one row runs the dense GEMV, so the dense matrices move
    onto the huge-page buffer, and the fast path stacks them there without another copy."""
    from llmlab.ops import cpu_matmul_choice

    if not torch.backends.mkldnn.is_available():
        pytest.skip("this PyTorch build has no oneDNN")
    monkeypatch.setattr(cpu_matmul_choice, "choice", lambda dtype, save=True: "onednn")
    model = tiny_model(seed=6)
    reference = model.logits_for([4, 5, 6])
    fast = cpu_model(model)
    arena = model.layers[0].self_attn.q_proj.weight.untyped_storage().data_ptr()
    assert arena % huge_pages.HUGE_PAGE == 0
    assert _smaps_entry(arena).get("THPeligible") == "1"
    for layer in fast.layers:
        assert layer.qkv.weight.untyped_storage().data_ptr() == arena
        assert layer.gate_up.weight.untyped_storage().data_ptr() == arena
    assert huge_pages.rehome_weights(model) == 0  # a second engine: nothing moves again
    torch.testing.assert_close(
        fast.logits_for([4, 5, 6], backend="cpu"), reference, atol=1e-4, rtol=1e-4
    )


def _on_llmlab_kernel(dtype: str, seed: int, monkeypatch):
    """(a tiny model in `dtype`, its float32 readable logits for [4, 5, 6]) with llmlab's packed
    matmul chosen as the batch kernel; skips where this CPU cannot run it."""
    from llmlab.ops import cpu_matmul, cpu_matmul_choice

    have = cpu_matmul.isa()
    if "avx2" not in have and (
        "avx512" not in have or (dtype != "float32" and "avx512_bf16" not in have)
    ):
        pytest.skip("llmlab's packed matmul needs AVX-512 (AVX-512 BF16 for bf16, int8) or AVX2")
    monkeypatch.setattr(cpu_matmul_choice, "choice", lambda dtype, save=True: "llmlab")
    model = tiny_model(seed=seed)
    reference = model.logits_for([4, 5, 6])
    model = prepare_model(model, EngineConfig(**PRECISIONS[dtype]))
    return model, reference


@needs_thp
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "int8"])
def test_where_one_row_reads_packed_copies_the_dense_weights_stay_off_huge_pages(
    dtype, monkeypatch
):
    """llmlab's packed matmul as the batch kernel: one row reads every matrix's packed copy, so
    the dense matrices are not moved onto 2 MB pages (the embedding stays where it was loaded,
    q/k/v are stacked by a copy in ordinary memory), a second engine stacks nothing again, and
    the logits stay the readable model's."""
    model, reference = _on_llmlab_kernel(dtype, 9, monkeypatch)
    embedding = model.embed_tokens.weight.data_ptr()
    fast = cpu_model(model)
    assert model.embed_tokens.weight.data_ptr() == embedding
    stacked = fast.layers[0].qkv.weight
    assert model.layers[0].self_attn.q_proj.weight.data_ptr() == stacked.data_ptr()
    if "[madvise]" in huge_pages.THP_SETTING.read_text():  # else ordinary memory may be huge
        assert _smaps_entry(stacked.data_ptr()).get("THPeligible") == "0"
        assert _smaps_entry(fast.layers[0].qkv.packed.data_ptr()).get("THPeligible") == "1"
    again = cpu_model(model)
    assert again.layers[0].qkv.weight.data_ptr() == stacked.data_ptr()
    tol = 1e-4 if dtype == "float32" else 0.1  # bf16 and int8 weights: their own rounding
    got = fast.logits_for([4, 5, 6], backend="cpu")
    assert (got - reference).abs().max() <= tol * reference.abs().max()


@needs_thp
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "int8"])
def test_our_packed_copies_share_a_second_buffer_and_the_plans_read_it(dtype, monkeypatch):
    """With llmlab's batch kernel chosen, every packed copy of a `cpu_model` (four per layer,
    then the LM head's) is packed straight into one more huge-page buffer, in that order, with
    the values a packing into ordinary memory gives; each fused layer's plan points into it, and
    the logits stay the readable model's."""
    from llmlab.model.cpu import CpuLinear
    from llmlab.ops import cpu_matmul

    model, reference = _on_llmlab_kernel(dtype, 7, monkeypatch)
    fast = cpu_model(model)
    linears = [m for layer in fast.layers for m in layer.modules() if isinstance(m, CpuLinear)]
    linears.append(fast.lm_head)
    packed = [m.packed for m in linears]
    assert len({t.untyped_storage().data_ptr() for t in packed}) == 1
    assert packed[0].data_ptr() % huge_pages.HUGE_PAGE == 0
    assert all(a.data_ptr() < b.data_ptr() for a, b in zip(packed, packed[1:]))  # read order
    for m in linears:
        assert torch.equal(m.packed, cpu_matmul.pack_weight(m.weight))
    for layer in fast.layers:
        if layer.plan is not None:
            assert layer.plan.weights[2] == layer.qkv.packed.data_ptr()
            assert layer.plan.weights[6] == layer.down_proj.packed.data_ptr()
    tol = 1e-4 if dtype == "float32" else 0.1  # bf16 and int8 weights: their own rounding
    got = fast.logits_for([4, 5, 6], backend="cpu")
    assert (got - reference).abs().max() <= tol * reference.abs().max()


@needs_thp
def test_the_buffer_asks_for_huge_pages():
    buffer = huge_pages.huge_page_buffer(3 * huge_pages.HUGE_PAGE + 4096)
    assert buffer.data_ptr() % huge_pages.HUGE_PAGE == 0
    assert buffer.numel() == 3 * huge_pages.HUGE_PAGE + 4096
    assert int(buffer.sum()) == 0
    entry = _smaps_entry(buffer.data_ptr())
    assert entry.get("THPeligible") == "1", entry  # madvised, private and anonymous


@pytest.mark.parametrize("nbytes", [0, -1])
def test_the_buffer_refuses_no_bytes(nbytes):
    with pytest.raises(ValueError, match="nbytes"):
        huge_pages.huge_page_buffer(nbytes)


@needs_thp
def test_an_arena_hands_out_aligned_zeroed_places_until_it_is_full():
    arena = huge_pages.Arena(1000)
    a = arena.take(10, torch.float32)  # 40 bytes
    b = arena.take(3, torch.int8)
    c = arena.take(5, torch.bfloat16)
    assert a.data_ptr() % huge_pages.HUGE_PAGE == 0
    assert b.data_ptr() == a.data_ptr() + 64 and c.data_ptr() == b.data_ptr() + 64
    assert (a.dtype, a.shape, c.dtype, c.shape) == (torch.float32, (10,), torch.bfloat16, (5,))
    assert not a.any() and not b.any() and not c.any()
    assert arena.take(1000 - 192 + 1, torch.int8) is None  # one byte past the end
    assert arena.take(1000 - 192, torch.int8) is not None  # exactly to the end


def test_without_huge_pages_the_packed_copies_go_to_ordinary_memory(monkeypatch):
    """No huge pages (THP `never`, or not Linux): no arena buffer, every copy packed where
    `pack_weight` puts it by itself, and the fast path computes the same logits."""
    from llmlab.model.cpu import CpuLinear
    from llmlab.ops import cpu_matmul

    monkeypatch.setattr(huge_pages, "huge_pages_available", lambda: False)
    assert huge_pages.Arena(4096).take(1, torch.float32) is None
    model = tiny_model(seed=8)
    reference = model.logits_for([4, 5, 6])
    fast = cpu_model(model)
    packed = [m.packed for m in fast.modules() if isinstance(m, CpuLinear)]
    packed = [p for p in packed if p is not None and p.dtype == torch.float32]
    if len(packed) > 1:  # llmlab's own packed copies: each its own allocation
        assert len({p.untyped_storage().data_ptr() for p in packed}) == len(packed)
    for m in fast.modules():
        if isinstance(m, CpuLinear) and m.batch_kernel == "llmlab":
            assert torch.equal(m.packed, cpu_matmul.pack_weight(m.weight))
    torch.testing.assert_close(
        fast.logits_for([4, 5, 6], backend="cpu"), reference, atol=1e-4, rtol=1e-4
    )
