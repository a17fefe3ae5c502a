"""Every attention backend against one dense reference (`llmlab.ops.reference`).

Each case builds a paged cache whose physical blocks are a random permutation, fills every
cache slot with NaN first and writes only the slots the sequences own, so a backend that reads
an unused slot (or a masked position it should have skipped) produces NaN and fails. Sequence
lengths cross several block boundaries (1, B-1, B, B+1, 3B+2, ...).

- "torch" runs the full grid on CPU.
- "triton" (marker `triton`) runs the same grid through the interpreter on CPU tensors (every
  program executed in NumPy: keep cases small), compiled on CUDA tensors when there is a GPU.
- `gpu` tests run torch / triton / cuda on CUDA tensors and skip, saying why, without a GPU.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import re
import zlib

import pytest
import torch
import torch.nn.functional as F

from llmlab import ops
from llmlab.ops import torch_backend
from llmlab.ops.paged_kv import PagedKV
from llmlab.ops.reference import (
    reference_paged_attention_decode,
    reference_paged_attention_prefill,
    reference_reshape_and_cache,
)

HAS_CUDA = torch.cuda.is_available()
NO_GPU_REASON = "no CUDA GPU: torch.cuda.is_available() is False"
TRITON_COMPILED = HAS_CUDA and os.environ.get("TRITON_INTERPRET", "0") in ("", "0")
TRITON_DEVICE = "cuda" if TRITON_COMPILED else "cpu"

BLOCK_SIZES = (8, 16, 32)
HEAD_DIMS = (64, 128)
HEADS = ((4, 4), (8, 2), (9, 3))  # (num_heads, num_kv_heads): MHA, GQA 4:1, GQA 3:1
FULL_GRID = list(itertools.product(BLOCK_SIZES, HEAD_DIMS, HEADS))
# The interpreter is fast enough for the full grid at these sizes (about a second a case);
# head_dim 16 (the tiny test model) is added.
TRITON_GRID = FULL_GRID + [(16, 16, (9, 3))]

TOL = {torch.float32: (1e-5, 1e-5), torch.bfloat16: (2e-2, 2e-2), torch.float16: (5e-3, 5e-3)}


def _generator(*key: object) -> torch.Generator:
    """A generator seeded from the case, so each case has its own reproducible inputs."""
    return torch.Generator().manual_seed(zlib.crc32(repr(key).encode()))


def make_paged_cache(
    seq_lens: list[int],
    block_size: int,
    num_kv_heads: int,
    head_dim: int,
    dtype: torch.dtype,
    gen: torch.Generator,
    device: str = "cpu",
    spare_blocks: int = 3,
):
    """A NaN-filled cache holding random K/V for `seq_lens`, blocks physically shuffled.

    Returns key_cache, value_cache, block_tables (unused entries -1), seq_lens tensor.
    """
    blocks_per_seq = [-(-n // block_size) for n in seq_lens]
    num_blocks = sum(blocks_per_seq) + spare_blocks
    width = max(blocks_per_seq) + 1  # one spare column: tables are wider than needed
    physical = torch.randperm(num_blocks, generator=gen).tolist()
    tables = torch.full((len(seq_lens), width), -1, dtype=torch.int32)
    slots = []
    for s, (n, nb) in enumerate(zip(seq_lens, blocks_per_seq)):
        tables[s, :nb] = torch.tensor([physical.pop() for _ in range(nb)], dtype=torch.int32)
        slots += [int(tables[s, p // block_size]) * block_size + p % block_size for p in range(n)]
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    key_cache = torch.full(shape, float("nan"), dtype=dtype)
    value_cache = torch.full(shape, float("nan"), dtype=dtype)
    k = torch.randn(len(slots), num_kv_heads, head_dim, generator=gen).to(dtype)
    v = torch.randn(len(slots), num_kv_heads, head_dim, generator=gen).to(dtype)
    reference_reshape_and_cache(k, v, key_cache, value_cache, torch.tensor(slots))
    lens = torch.tensor(seq_lens, dtype=torch.int32)
    return (key_cache.to(device), value_cache.to(device), tables.to(device), lens.to(device))


def decode_lens(block_size: int) -> list[int]:
    return [1, block_size - 1, block_size, block_size + 1, 3 * block_size + 2]


def prefill_layout(block_size: int) -> tuple[list[int], list[int]]:
    """(context, new tokens) per sequence: fresh prompts, a block-aligned prefix hit, a chunk
    starting mid-block, a single new token after a long context."""
    pairs = [
        (0, 1),
        (0, block_size + 3),
        (block_size, 5),
        (5, 2 * block_size),
        (2 * block_size + 1, 1),
    ]
    return [c + q for c, q in pairs], [q for _, q in pairs]


def grouped(query, key_cache, value_cache, block_tables, seq_lens, cu_seqlens_q=None):
    """`torch_backend.grouped_attention` (the engine's planned torch path) on these tensors, and
    the plan it made: the step's metadata is built as an engine builds it (one layer)."""
    n = query.shape[0]
    if cu_seqlens_q is None:
        cu_seqlens_q = torch.arange(n + 1, dtype=torch.int32)
    q_lens = (cu_seqlens_q[1:] - cu_seqlens_q[:-1]).tolist()
    md = ops.AttentionMetadata(
        cu_seqlens_q,
        seq_lens,
        torch.full((n,), -1, dtype=torch.int64),
        block_tables,
        [(key_cache, value_cache)],
        max(q_lens, default=0),
        "torch",
    )
    scale = query.shape[-1] ** -0.5
    out = torch_backend.grouped_attention(query, md.paged_kv(0), md, scale)
    return out, md.backend_state["plan"][0]


def assert_matches(out: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype, what: str) -> None:
    out = out.detach().cpu()
    assert out.dtype == dtype, f"{what}: output dtype {out.dtype}, expected the query's {dtype}"
    assert not torch.isnan(out).any(), f"{what}: NaN in the output (an unused slot leaked in)"
    atol, rtol = TOL[dtype]
    torch.testing.assert_close(
        out.double(), ref, atol=atol, rtol=rtol, msg=lambda m: f"{what}: {m}"
    )


OPS = ("decode", "prefill")


def run_case(
    op: str,
    backend: str,
    block_size: int,
    head_dim: int,
    heads: tuple[int, int],
    dtype: torch.dtype,
    device: str,
) -> None:
    """`op` on `backend` against the float64 reference: "decode", one query per sequence of
    `decode_lens`; "prefill", the chunks of `prefill_layout` after their cached context."""
    num_heads, num_kv_heads = heads
    gen = _generator(op, backend, block_size, head_dim, heads, dtype)
    if op == "decode":
        lens = decode_lens(block_size)
        q_lens = [1] * len(lens)
    else:
        lens, q_lens = prefill_layout(block_size)
    kc, vc, bt, sl = make_paged_cache(lens, block_size, num_kv_heads, head_dim, dtype, gen, device)
    cu = torch.tensor([0] + list(itertools.accumulate(q_lens)), dtype=torch.int32)
    q = torch.randn(int(cu[-1]), num_heads, head_dim, generator=gen).to(dtype)
    scale = head_dim**-0.5
    if op == "decode":
        out = ops.paged_attention_decode(q.to(device), kc, vc, bt, sl, scale, backend=backend)
        ref = reference_paged_attention_decode(q, kc.cpu(), vc.cpu(), bt.cpu(), sl.cpu(), scale)
    else:
        out = ops.paged_attention_prefill(
            q.to(device), kc, vc, bt, cu.to(device), sl, scale, backend=backend
        )
        ref = reference_paged_attention_prefill(
            q, kc.cpu(), vc.cpu(), bt.cpu(), cu, sl.cpu(), scale
        )
    assert_matches(out, ref, dtype, f"{op}[{backend}] B={block_size} d={head_dim} {heads}")


def run_reshape_and_cache_case(backend: str, dtype: torch.dtype, device: str) -> None:
    gen = _generator("cache", backend, dtype)
    num_blocks, block_size, kv_heads, head_dim = 6, 8, 3, 16
    num_tokens = 20
    slots = torch.randperm(num_blocks * block_size, generator=gen)[:num_tokens]
    slots[[3, 11, 12]] = -1  # padding tokens that must not be cached
    key = torch.randn(num_tokens, kv_heads, head_dim, generator=gen).to(dtype)
    value = torch.randn(num_tokens, kv_heads, head_dim, generator=gen).to(dtype)
    key[3] = value[3] = 1234.0  # a sentinel: a skipped token's row may appear nowhere
    shape = (num_blocks, block_size, kv_heads, head_dim)
    kc = torch.full(shape, float("nan"), dtype=dtype, device=device)
    vc = torch.full(shape, float("nan"), dtype=dtype, device=device)
    ops.reshape_and_cache(
        key.to(device), value.to(device), kc, vc, slots.to(device), backend=backend
    )
    ref_k = torch.full(shape, float("nan"), dtype=dtype)
    ref_v = torch.full(shape, float("nan"), dtype=dtype)
    reference_reshape_and_cache(key, value, ref_k, ref_v, slots)
    for got, want, name in ((kc, ref_k, "key_cache"), (vc, ref_v, "value_cache")):
        torch.testing.assert_close(
            got.cpu(),
            want,
            atol=0,
            rtol=0,
            equal_nan=True,
            msg=lambda m, name=name: f"{name}[{backend}]: {m}",
        )
        written = ~torch.isnan(got.cpu()).all(dim=(2, 3)).flatten()  # [num_slots]
        assert int(written.sum()) == num_tokens - 3, f"{name}: slot -1 tokens were written"
        assert not (got.cpu() == 1234.0).any(), f"{name}: a slot -1 token's row was written"


# ---------------------------------------------------------------- torch: the full grid, CPU


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("block_size,head_dim,heads", FULL_GRID)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_torch_matches_reference(op, block_size, head_dim, heads, dtype):
    run_case(op, "torch", block_size, head_dim, heads, dtype, "cpu")


@pytest.mark.parametrize("op", OPS)
def test_torch_fp16_matches_reference(op):
    run_case(op, "torch", 16, 64, (8, 2), torch.float16, "cpu")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_torch_reshape_and_cache_skips_slot_minus_one(dtype):
    run_reshape_and_cache_case("torch", dtype, "cpu")


def test_torch_prefill_long_prompt_next_to_decode_tokens(monkeypatch):
    """A long prompt batched with one-token sequences: the one-token rows take the decode path
    (one call), the prompt its own padded call, and the result still matches the reference."""
    prefill_calls, decode_calls = [], []
    original_prefill = torch_backend._prefill_padded
    original_decode = torch_backend._decode_groups

    def spy_prefill(*args, **kwargs):
        prefill_calls.append(int(args[5].max()))  # longest query in that call
        return original_prefill(*args, **kwargs)

    def spy_decode(*args, **kwargs):
        decode_calls.append(args[0].shape[0])  # one-token queries in that call
        return original_decode(*args, **kwargs)

    monkeypatch.setattr(torch_backend, "_prefill_padded", spy_prefill)
    monkeypatch.setattr(torch_backend, "_decode_groups", spy_decode)
    gen = _generator("mixed")
    q_lens = [90, 1, 1, 1, 0, 1]
    lens = [90, 40, 7, 61, 12, 1]
    kc, vc, bt, sl = make_paged_cache(lens, 16, 3, 64, torch.float32, gen)
    cu = torch.tensor([0] + list(itertools.accumulate(q_lens)), dtype=torch.int32)
    q = torch.randn(int(cu[-1]), 9, 64, generator=gen)
    out, _ = grouped(q, kc, vc, bt, sl, cu)
    ref = reference_paged_attention_prefill(q, kc, vc, bt, cu, sl, 64**-0.5)
    assert_matches(out, ref, torch.float32, "mixed prefill")
    assert prefill_calls == [90], (
        f"expected one padded call for the long prompt, got {prefill_calls}"
    )
    assert decode_calls == [4], (
        f"expected the 4 one-token rows in one decode call, got {decode_calls}"
    )


def _long_and_short_lens(gen: torch.Generator) -> list[int]:
    """Many short sequences and two long ones: padding all to the longest would waste >80 %."""
    short = torch.randint(1, 40, (24,), generator=gen).tolist()
    return short[:12] + [523] + short[12:] + [601]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_torch_decode_splits_uneven_lengths_into_groups_and_matches_reference(dtype):
    gen = _generator("groups", dtype)
    lens = _long_and_short_lens(gen)
    kc, vc, bt, sl = make_paged_cache(lens, 16, 3, 64, dtype, gen)
    q = torch.randn(len(lens), 9, 64, generator=gen).to(dtype)
    out, plan = grouped(q, kc, vc, bt, sl)
    assert len(plan.decode) >= 2, "long and short sequences should not share one padded batch"
    served = sorted(i for g in plan.decode for i in g.query_rows.tolist())
    assert served == list(range(len(lens))), "every sequence must be in exactly one group"
    ref = reference_paged_attention_decode(q, kc, vc, bt, sl, 64**-0.5)
    assert_matches(out, ref, dtype, "decode, grouped by length")


@pytest.mark.parametrize(
    "block_size,head_dim,heads", [(8, 64, (9, 3)), (16, 128, (8, 2)), (32, 64, (4, 4))]
)
def test_torch_one_group_per_block_count_matches_reference(
    monkeypatch, block_size, head_dim, heads
):
    """With groups free of cost every distinct block count gets its own group: the most
    scattered plan must give the same attention as the single padded batch."""
    monkeypatch.setattr(torch_backend, "GROUP_COST_SLOTS", 0)
    gen = _generator("scattered", block_size, head_dim, heads)
    lens = decode_lens(block_size) + [7 * block_size + 3]
    kc, vc, bt, sl = make_paged_cache(lens, block_size, heads[1], head_dim, torch.float32, gen)
    q = torch.randn(len(lens), heads[0], head_dim, generator=gen)
    out, plan = grouped(q, kc, vc, bt, sl)
    assert len(plan.decode) == len({-(-n // block_size) for n in lens})
    ref = reference_paged_attention_decode(q, kc, vc, bt, sl, head_dim**-0.5)
    assert_matches(out, ref, torch.float32, "decode, one group per block count")
    run_case("prefill", "torch", block_size, head_dim, heads, torch.float32, "cpu")


def test_torch_plan_is_recomputed_when_the_lengths_change_in_place():
    """Layers share one plan per step; an in-place change of seq_lens must not reuse it."""
    gen = _generator("replan")
    lens = [5, 30, 17]
    kc, vc, bt, sl = make_paged_cache(lens, 16, 2, 64, torch.float32, gen)
    q = torch.randn(3, 8, 64, generator=gen)
    ops.paged_attention_decode(q, kc, vc, bt, sl, 0.125)
    sl -= 1  # the same tensor, now one token shorter each
    out = ops.paged_attention_decode(q, kc, vc, bt, sl, 0.125)
    ref = reference_paged_attention_decode(q, kc, vc, bt, sl, 0.125)
    assert_matches(out, ref, torch.float32, "decode after an in-place length change")


def test_checks_see_in_place_changes_of_the_same_metadata_tensors():
    """The value checks are memoised per step (ops._memo): the same tensor object changed in
    place must be checked again, and one that is unchanged is not read again."""
    gen = _generator("memo")
    kc, vc, bt, sl = make_paged_cache([5, 30], 16, 2, 64, torch.float32, gen)
    k = torch.randn(2, 2, 64, generator=gen)
    slots = torch.tensor([4, 16 * int(bt[1, 1]) + 13])
    ops.reshape_and_cache(k, k, kc, vc, slots)
    slots[0] = kc.shape[0] * 16  # in place: now out of range
    with pytest.raises(ValueError, match="slot_mapping"):
        ops.reshape_and_cache(k, k, kc, vc, slots)
    q = torch.randn(2, 8, 64, generator=gen)
    ops.paged_attention_decode(q, kc, vc, bt, sl, 0.125)
    bt[1, 0] = kc.shape[0] + 7  # a used block id past the cache
    with pytest.raises(ValueError, match="block_tables"):
        ops.paged_attention_decode(q, kc, vc, bt, sl, 0.125)


def test_split_by_length_is_a_partition_no_costlier_than_one_batch():
    gen = _generator("split")
    for _ in range(50):
        lens = torch.randint(
            1, 700, (int(torch.randint(1, 60, (1,), generator=gen)),), generator=gen
        ).tolist()
        groups = torch_backend._split_by_length(lens, 16)
        assert sorted(i for g in groups for i in g) == list(range(len(lens)))

        def cost(gs):
            return sum(
                len(g) * 16 * max(-(-lens[i] // 16) for i in g) + torch_backend.GROUP_COST_SLOTS
                for g in gs
            )

        assert cost(groups) <= cost([list(range(len(lens)))])


def test_torch_prefill_equals_decode_for_one_token_per_sequence():
    gen = _generator("prefill-is-decode")
    lens = decode_lens(16)
    kc, vc, bt, sl = make_paged_cache(lens, 16, 2, 64, torch.float32, gen)
    q = torch.randn(len(lens), 8, 64, generator=gen)
    cu = torch.arange(len(lens) + 1, dtype=torch.int32)
    dec = ops.paged_attention_decode(q, kc, vc, bt, sl, 0.125)
    pre = ops.paged_attention_prefill(q, kc, vc, bt, cu, sl, 0.125)
    torch.testing.assert_close(pre, dec, atol=1e-6, rtol=1e-6)


# ---------------------------------------------------------------- cpu: C kernels, the full grid

# head_dim 16 is the tiny test model; (16, 1) is the widest GQA group the C kernel takes
CPU_GRID = FULL_GRID + [(16, 16, (9, 3)), (16, 32, (16, 1))]


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("block_size,head_dim,heads", CPU_GRID)
def test_cpu_matches_reference(op, block_size, head_dim, heads):
    run_case(op, "cpu", block_size, head_dim, heads, torch.float32, "cpu")


def test_cpu_reshape_and_cache_skips_slot_minus_one():
    run_reshape_and_cache_case("cpu", torch.float32, "cpu")


@pytest.mark.parametrize("trial", range(4))
def test_cpu_random_mixed_batches_match_reference(trial):
    """Random steps as the engine makes them: long prompts cut in tiles of 16 queries, chunks
    after cached context, decodes, all in one call, over a shuffled NaN-filled cache."""
    gen = _generator("cpu-mixed", trial)
    num_seqs = int(torch.randint(1, 24, (1,), generator=gen))
    q_lens = [
        int(torch.randint(1, 80, (1,), generator=gen)) if torch.rand(1, generator=gen) < 0.4 else 1
        for _ in range(num_seqs)
    ]
    lens = [q + int(torch.randint(0, 300, (1,), generator=gen)) for q in q_lens]
    kc, vc, bt, sl = make_paged_cache(lens, 16, 3, 64, torch.float32, gen)
    cu = torch.tensor([0] + list(itertools.accumulate(q_lens)), dtype=torch.int32)
    q = torch.randn(int(cu[-1]), 9, 64, generator=gen)
    out = ops.paged_attention_prefill(q, kc, vc, bt, cu, sl, 0.125, backend="cpu")
    ref = reference_paged_attention_prefill(q, kc, vc, bt, cu, sl, 0.125)
    assert_matches(out, ref, torch.float32, f"cpu mixed batch {q_lens}")


def test_cpu_other_dtypes_and_shapes_run_the_torch_code():
    """bf16, and a head_dim the C kernel has no variant for, still give the right answer."""
    run_case("decode", "cpu", 16, 64, (8, 2), torch.bfloat16, "cpu")
    run_case("prefill", "cpu", 16, 64, (8, 2), torch.bfloat16, "cpu")
    run_case("decode", "cpu", 16, 48, (9, 3), torch.float32, "cpu")
    run_case("prefill", "cpu", 8, 48, (9, 3), torch.float32, "cpu")


def decode_step(block_size: int, head_dim: int, heads: tuple[int, int], gen: torch.Generator):
    """A decode step of 7 sequences of random lengths over `make_paged_cache` (the new token's
    slot, position len - 1, holds random K/V until the step writes it): their stacked q/k/v rows
    as a strided view of a wider matmul output, RoPE's cos and sin, the PagedKV and the slots;
    the third sequence's slot is -1 (nothing written)."""
    num_heads, num_kv_heads = heads
    lens = torch.randint(1, 40, (7,), generator=gen).tolist()
    kc, vc, bt, sl = make_paged_cache(lens, block_size, num_kv_heads, head_dim, torch.float32, gen)
    pos = sl.long() - 1
    slots = bt[torch.arange(len(lens)), pos // block_size].long() * block_size + pos % block_size
    slots[2] = -1
    w = (num_heads + 2 * num_kv_heads) * head_dim
    qkv = torch.randn(len(lens), w + 16, generator=gen)[:, :w]
    angles = torch.rand(len(lens), head_dim // 2, generator=gen) * 6.3
    return qkv, angles.cos(), angles.sin(), PagedKV(kc, vc, bt, sl), slots


def assert_same_cache(got: torch.Tensor, want: torch.Tensor) -> None:
    """Equal to the bit, NaN (never written) where the other is NaN."""
    torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize(
    "block_size,head_dim,heads", CPU_GRID + [(1, 32, (4, 4)), (1, 256, (2, 2)), (16, 256, (4, 1))]
)
def test_cpu_decode_attention_equals_rope_cache_write_and_attention(block_size, head_dim, heads):
    """A decode step's attention in one call (`cpu_backend.decode_attention`, what the fast
    path's layers run from 2 sequences on) against the four kernel calls it replaces (RoPE of q
    and of k, the cache write, the attention): the same outputs and the same caches, bit for
    bit; one slot written per sequence, none for slot -1."""
    from llmlab.ops import cpu_backend

    num_heads, num_kv_heads = heads
    gen = _generator("cpu-decode-attention", block_size, head_dim, heads)
    qkv, cos, sin, kv, slots = decode_step(block_size, head_dim, heads, gen)
    scale = head_dim**-0.5
    before = kv.key_cache.clone(), kv.value_cache.clone()
    got = cpu_backend.decode_attention(qkv, cos, sin, kv, slots, num_heads, scale)
    ref_kv = dataclasses.replace(kv, key_cache=before[0].clone(), value_cache=before[1].clone())
    q, k, v = qkv.split([num_heads * head_dim] + [num_kv_heads * head_dim] * 2, dim=-1)
    q = cpu_backend.rope(q, num_heads, cos, sin)
    k = cpu_backend.rope(k, num_kv_heads, cos, sin)
    v = v.reshape(-1, num_kv_heads, head_dim).contiguous()
    cpu_backend.reshape_and_cache(k, v, ref_kv, slots)
    want = cpu_backend.paged_attention(q, ref_kv, scale)
    assert got.shape == want.shape and torch.isfinite(got).all()
    assert torch.equal(got, want)
    assert_same_cache(kv.key_cache, ref_kv.key_cache)
    assert_same_cache(kv.value_cache, ref_kv.value_cache)
    changed = kv.key_cache.nan_to_num(7.0) != before[0].nan_to_num(7.0)
    assert int(changed.any(dim=(2, 3)).sum()) == len(slots) - 1


def test_cpu_decode_attention_refuses_bad_arguments_and_writes_nothing():
    from llmlab.ops import cpu_backend

    qkv, cos, sin, kv, slots = decode_step(8, 16, (4, 2), _generator("cpu-decode-refusals"))
    before = kv.key_cache.clone(), kv.value_cache.clone()
    bad = [
        (dict(cos=cos[:, :4]), "cos, sin must be contiguous float32 \\[7, 8\\]"),
        (dict(qkv=qkv[:, :-16]), "qkv .* must be float32 \\[7, 128\\]"),
        (dict(qkv=qkv[:5]), "one per sequence"),
        (dict(slot_mapping=slots[:6]), "slot_mapping must be int64 \\[7\\]"),
        (dict(slot_mapping=slots.int()), "slot_mapping must be int64"),
        (dict(heads=3), "heads 3 a multiple of kv_heads 2"),
        (
            dict(kv=dataclasses.replace(kv, cu_seqlens_q=torch.arange(8, dtype=torch.int32))),
            "a decode step",
        ),
        (
            dict(kv=dataclasses.replace(kv, key_cache=kv.key_cache.to(torch.float8_e4m3fn))),
            "float32 CPU caches",
        ),
    ]
    for change, match in bad:
        args = dict(qkv=qkv, cos=cos, sin=sin, kv=kv, slot_mapping=slots, heads=4, scale=0.25)
        with pytest.raises(ValueError, match=match):
            cpu_backend.decode_attention(**{**args, **change})
    assert_same_cache(kv.key_cache, before[0])
    assert_same_cache(kv.value_cache, before[1])


def test_cpu_backend_is_listed_and_its_library_is_built_once(monkeypatch, tmp_path):
    from llmlab.ops import cpu_backend, cpu_library

    assert "cpu" in ops.available_backends(), cpu_backend.available()[1]
    monkeypatch.setenv("LLMLAB_CACHE", str(tmp_path))
    monkeypatch.setattr(cpu_library, "_lib", None)
    lib = cpu_library.load_library()
    built = list((tmp_path / "cpu_kernels").glob("*/*.so"))
    assert len(built) == 1 and lib._name == str(built[0])
    stamp = built[0].stat().st_mtime_ns
    monkeypatch.setattr(cpu_library, "_lib", None)
    cpu_library.load_library()  # a later process: reused
    assert built[0].stat().st_mtime_ns == stamp
    assert not list(tmp_path.glob("cpu_kernels/*/*.so.tmp*")), "no partial build left behind"


def _fused_decode_matches_torch(monkeypatch) -> None:
    """A tiny model's decode step through the fused C layer equals the torch forward's."""
    from llmlab.kvcache import ContiguousKVCache
    from llmlab.model import tiny_model
    from llmlab.ops import cpu_decode

    calls = []
    real = cpu_decode.DecodeStack.__call__
    monkeypatch.setattr(
        cpu_decode.DecodeStack, "__call__", lambda *a: calls.append(len(a[0].plans)) or real(*a)
    )
    model = tiny_model(seed=4)
    ids = torch.randint(3, 500, (6,), generator=_generator("fused-fallback"))
    out = {}
    from llmlab.model.cpu import cpu_model

    for backend, runs in (("torch", model), ("cpu", cpu_model(model))):
        cache = ContiguousKVCache(model.config, batch_size=1, max_len=8, dtype=model.dtype)
        runs(ids[:5], cache.positions([5]), cache.context([5], backend=backend))
        cache.advance([5])
        out[backend] = runs(ids[5:], cache.positions([1]), cache.context([1], backend=backend))
    assert calls == [model.config.num_hidden_layers]  # the decode step: all layers, one call
    torch.testing.assert_close(out["cpu"], out["torch"], atol=1e-4, rtol=1e-4)


def test_cpu_backend_falls_back_to_flags_the_compiler_takes(monkeypatch, tmp_path):
    """A compiler that refuses a flag (Apple clang and -fopenmp) gets the next flag set."""
    from llmlab.ops import cpu_library

    monkeypatch.setenv("LLMLAB_CACHE", str(tmp_path))
    monkeypatch.setattr(cpu_library, "_lib", None)
    monkeypatch.setattr(
        cpu_library, "FALLBACK_FLAGS", (("-fno-such-flag-llmlab",), cpu_library.FALLBACK_FLAGS[1])
    )
    cpu_library.load_library()
    assert len(list((tmp_path / "cpu_kernels").glob("*/*.so"))) == 1
    run_case("decode", "cpu", 16, 64, (9, 3), torch.float32, "cpu")  # built without OpenMP
    _fused_decode_matches_torch(monkeypatch)  # its `omp for`/`single` now run on one thread
    monkeypatch.setattr(cpu_library, "_lib", None)
    monkeypatch.setattr(cpu_library, "_error", None)
    monkeypatch.setattr(cpu_library, "FALLBACK_FLAGS", (("-fno-such-flag-llmlab",),))
    monkeypatch.setenv("LLMLAB_CACHE", str(tmp_path / "other"))
    with pytest.raises(RuntimeError, match="no-such-flag"):
        cpu_library.load_library()


def test_cpu_backend_without_a_compiler_says_so(monkeypatch, tmp_path):
    from llmlab.ops import cpu_backend, cpu_library

    monkeypatch.setenv("LLMLAB_CACHE", str(tmp_path))
    monkeypatch.setattr(cpu_library, "_lib", None)
    monkeypatch.setattr(cpu_library, "_error", None)
    monkeypatch.setattr(cpu_library, "_compiler", lambda: None)
    ok, why = cpu_backend.available()
    assert not ok and "C compiler" in why
    assert "cpu" not in ops.available_backends()
    gen = _generator("no-compiler")
    kc, vc, bt, sl = make_paged_cache([5], 16, 2, 64, torch.float32, gen)
    with pytest.raises(RuntimeError, match="C compiler"):
        ops.paged_attention_decode(torch.randn(1, 4, 64), kc, vc, bt, sl, 0.125, backend="cpu")


@pytest.mark.parametrize("rows", [1, 3, 40])
def test_cpu_layer_kernels_match_the_model_code(rows):
    """rms_norm (plain and with the residual add), silu_mul and rope in C against the model's
    PyTorch code, on strided row views as the stacked matmuls produce them."""
    from llmlab.model import RMSNorm, apply_rope
    from llmlab.ops import cpu_backend as ck

    gen = _generator("layer-ops", rows)
    norm = RMSNorm(576, 1e-5)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(576, generator=gen))
    w = norm.weight.detach()
    wide = torch.randn(rows, 700, generator=gen) * 3
    x, residual = wide[:, :576], torch.randn(rows, 576, generator=gen)  # x: strided rows
    tol = dict(atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ck.rms_norm(x, w, 1e-5), norm(x), **tol)
    normed, total = ck.rms_norm(x, w, 1e-5, residual=residual)
    torch.testing.assert_close(total, x + residual, atol=0, rtol=0)
    torch.testing.assert_close(normed, norm(x + residual), **tol)
    gate_up = torch.randn(rows, 2 * 1536, generator=gen) * 6  # silu's tails on both sides
    gate, up = gate_up.split(1536, dim=-1)
    torch.testing.assert_close(ck.silu_mul(gate, up), F.silu(gate) * up, **tol)
    for heads, d in ((9, 64), (3, 64), (4, 16)):
        qkv = torch.randn(rows, heads * d + 40, generator=gen)
        q = qkv[:, : heads * d]
        angles = torch.rand(rows, d // 2, generator=gen) * 100
        cos, sin = angles.cos(), angles.sin()
        torch.testing.assert_close(
            ck.rope(q, heads, cos, sin), apply_rope(q.reshape(rows, heads, d), cos, sin), **tol
        )
    with pytest.raises(ValueError, match="rms_norm"):
        ck.rms_norm(torch.randn(2, 24), torch.ones(24), 1e-5)  # 24 is not a multiple of 16
    with pytest.raises(ValueError, match="rms_norm"):  # fewer residual rows than x
        ck.rms_norm(torch.randn(4, 32), torch.ones(32), 1e-5, residual=torch.randn(2, 32))
    with pytest.raises(ValueError, match="rms_norm"):  # a weight of the wrong size
        ck.rms_norm(torch.randn(4, 32), torch.ones(16), 1e-5)
    with pytest.raises(ValueError, match="rope"):  # float64 tables
        ck.rope(
            torch.randn(2, 64),
            4,
            torch.ones(2, 8, dtype=torch.float64),
            torch.zeros(2, 8, dtype=torch.float64),
        )


@pytest.mark.parametrize("rows", [1, 2, 5, 64])
@pytest.mark.parametrize("vocab", [1, 7, 16, 17, 33, 1000, 49152])
def test_cpu_argmax_rows_is_torchs_argmax(rows, vocab):
    """The C argmax of greedy sampling against torch.argmax on fresh random rows (strided
    views), where the answer is the first of equal maxima (few distinct values: ties), where a
    row holds NaN (the first NaN), +inf or only -inf."""
    from llmlab.ops import cpu_backend as ck

    gen = _generator("argmax", rows, vocab)
    wide = torch.randn(rows, vocab + 5, generator=gen) * 4
    cases = {"random": wide[:, :vocab], "ties": wide[:, :vocab].round().clamp(-2, 2)}
    for name, hit, value in (("nan", 0.02, float("nan")), ("inf", 0.02, float("inf"))):
        x = cases["ties"].clone()
        x[torch.rand(rows, vocab, generator=gen) < hit] = value
        x[rows // 2, torch.randint(vocab, (1,), generator=gen)] = value  # one row has one
        cases[name] = x
    cases["-inf"] = torch.full((rows, vocab), float("-inf"))
    for name, x in cases.items():
        assert torch.equal(ck.argmax_rows(x), x.argmax(dim=-1)), name
    with pytest.raises(ValueError, match="argmax_rows"):
        ck.argmax_rows(torch.randn(2, 8, dtype=torch.float64))
    with pytest.raises(ValueError, match="argmax_rows"):  # elements not contiguous
        ck.argmax_rows(torch.randn(8, 2).t())


# ---------------------------------------------------------------- triton


@pytest.mark.triton
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("block_size,head_dim,heads", TRITON_GRID)
def test_triton_matches_reference(op, block_size, head_dim, heads):
    run_case(op, "triton", block_size, head_dim, heads, torch.float32, TRITON_DEVICE)


@pytest.mark.triton
@pytest.mark.parametrize("op", OPS)
def test_triton_bf16_matches_reference(op):
    run_case(op, "triton", 16, 64, (8, 2), torch.bfloat16, TRITON_DEVICE)


@pytest.mark.triton
def test_triton_reshape_and_cache_skips_slot_minus_one():
    run_reshape_and_cache_case("triton", torch.float32, TRITON_DEVICE)


@pytest.mark.triton
def test_triton_split_k_decode_merges_partitions():
    """Partitions of 32 positions: 1 to 4 per sequence, some sequences ending before the last
    partition (empty partitions must weigh nothing in the merge)."""
    from llmlab.ops import triton_backend

    gen = _generator("split-k")
    lens = [1, 31, 33, 64, 100]
    kc, vc, bt, sl = make_paged_cache(lens, 16, 2, 64, torch.float32, gen, TRITON_DEVICE)
    q = torch.randn(len(lens), 8, 64, generator=gen)
    out = triton_backend.paged_attention(
        q.to(TRITON_DEVICE), PagedKV(kc, vc, bt, sl), 0.125, partition_size=32
    )
    assert triton_backend.num_partitions_for(bt.shape[1] * 16, 32) == 4
    ref = reference_paged_attention_decode(q, kc.cpu(), vc.cpu(), bt.cpu(), sl.cpu(), 0.125)
    assert_matches(out, ref, torch.float32, "split-K decode")


@pytest.mark.triton
def test_triton_rejects_bad_partition_size():

    gen = _generator("bad-partition")
    kc, vc, bt, sl = make_paged_cache([5], 8, 1, 16, torch.float32, gen, TRITON_DEVICE)
    q = torch.randn(1, 1, 16).to(TRITON_DEVICE)
    with pytest.raises(ValueError, match="partition_size"):
        ops.paged_attention_decode(q, kc, vc, bt, sl, 0.25, "triton", partition_size=48)
    with pytest.raises(ValueError, match="partition_size"):
        ops.paged_attention_decode(
            q.cpu(), kc.cpu(), vc.cpu(), bt.cpu(), sl.cpu(), 0.25, partition_size=32
        )


@pytest.mark.triton
@pytest.mark.skipif(TRITON_COMPILED, reason="Triton is compiling for the GPU in this process")
def test_triton_interpreter_is_switched_on_without_gpu():
    from llmlab.ops import triton_backend

    cache = PagedKV(*[torch.zeros(1, 8, 1, 16)] * 2)
    triton_backend.reshape_and_cache(*[torch.zeros(1, 1, 16)] * 2, cache, torch.tensor([0]))
    assert os.environ.get("TRITON_INTERPRET") == "1"
    assert triton_backend.interpreting()


# ---------------------------------------------------------------- the fused layer's kernels
# `llmlab.ops.fused`: each kernel against plain PyTorch (the readable model's own modules, or a
# float64 formula) on fresh random inputs; through the interpreter on CPU tensors, compiled on
# CUDA tensors where Triton compiles.

FUSED_DTYPES = pytest.mark.parametrize(
    "dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"]
)
# the fused kernels round where the readable model rounds: fp32 within float rounding, bf16
# within two units in the last place (1 ulp = 2^-8 relative)
FUSED_TOL = {torch.float32: dict(atol=1e-5, rtol=1e-5), torch.bfloat16: dict(atol=1e-6, rtol=2**-7)}


def _rope_tables(head_dim: int, max_positions: int):
    """(inv_freq, the kernel's cos/sin table) of a Llama with this head_dim."""
    from llmlab.config import tiny_config
    from llmlab.model import rope_inv_freq
    from llmlab.model.llama import rope_cos_sin_cache

    inv_freq = rope_inv_freq(tiny_config(head_dim=head_dim))
    return inv_freq, rope_cos_sin_cache(inv_freq, max_positions)


@pytest.mark.triton
@FUSED_DTYPES
@pytest.mark.parametrize("num_tokens,hidden", [(1, 64), (5, 96), (3, 576)])
def test_triton_fused_add_rms_norm_matches_the_readable_norm(num_tokens, hidden, dtype):
    """fused_add_rms_norm: the residual becomes residual + x exactly as the readable model's
    `x + a` rounds it (bit for bit), and x its RMSNorm (`llmlab.model.RMSNorm`); rms_norm alone
    gives the norm of x."""
    from llmlab.model import RMSNorm
    from llmlab.ops import fused

    gen = _generator("add-rms-norm", num_tokens, hidden, dtype)
    x = torch.randn(num_tokens, hidden, generator=gen).to(dtype)
    residual = (3 * torch.randn(num_tokens, hidden, generator=gen)).to(dtype)
    norm = RMSNorm(hidden, 1e-5)
    with torch.no_grad():
        norm.weight.copy_(1 + 0.1 * torch.randn(hidden, generator=gen))
    norm = norm.to(dtype)
    weight = norm.weight.detach().to(TRITON_DEVICE)
    with torch.no_grad():
        want_plain, want_sum = norm(x), residual + x
        want = norm(want_sum)
    got_plain = fused.rms_norm(x.to(TRITON_DEVICE), weight, 1e-5)
    torch.testing.assert_close(got_plain.cpu(), want_plain, **FUSED_TOL[dtype])
    xd, rd = x.to(TRITON_DEVICE), residual.to(TRITON_DEVICE)
    assert fused.fused_add_rms_norm(xd, rd, weight, 1e-5) is None  # in place
    assert torch.equal(rd.cpu(), want_sum), "residual: not residual + x rounded once"
    torch.testing.assert_close(xd.cpu(), want, **FUSED_TOL[dtype])


def run_rotary_case(num_tokens, head_dim, heads, dtype, device) -> None:
    """Random positions and slots in a NaN-filled pool of shuffled blocks (a token past a block
    boundary, a slot -1 when there are several tokens): q rotated out, k rotated and v copied
    into exactly their slots, compared with the float64 rotation of `llmlab.model.apply_rope`."""
    from llmlab.model import apply_rope
    from llmlab.ops import fused

    num_heads, num_kv_heads = heads
    gen = _generator("rotary-cache", num_tokens, head_dim, heads, dtype)
    num_blocks, block_size, max_positions = 5, 8, 100
    slots = torch.randperm(num_blocks * block_size, generator=gen)[:num_tokens]
    if num_tokens > 1:
        slots[num_tokens // 2] = -1
    positions = torch.randint(0, max_positions, (num_tokens,), generator=gen)
    width = (num_heads + 2 * num_kv_heads) * head_dim
    qkv = torch.randn(num_tokens, width, generator=gen).to(dtype)
    inv_freq, table = _rope_tables(head_dim, max_positions)
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    kc, vc = (torch.full(shape, float("nan"), dtype=dtype, device=device) for _ in range(2))
    q = fused.rotary_embedding_and_cache(
        qkv.to(device), positions.to(device), table.to(device), kc, vc, slots.to(device)
    )
    angles = positions.double()[:, None] * inv_freq.double()[None, :]  # [T, d/2]
    cos, sin = angles.cos(), angles.sin()
    q_ref, k_ref, v_ref = qkv.double().split(
        [num_heads * head_dim, num_kv_heads * head_dim, num_kv_heads * head_dim], dim=1
    )
    q_ref = apply_rope(q_ref.reshape(num_tokens, num_heads, head_dim), cos, sin)
    k_ref = apply_rope(k_ref.reshape(num_tokens, num_kv_heads, head_dim), cos, sin)
    what = f"rotary T={num_tokens} d={head_dim} {heads} {dtype}"
    assert q.shape == (num_tokens, num_heads, head_dim) and q.dtype == dtype, what
    torch.testing.assert_close(q.cpu().double(), q_ref.to(dtype).double(), **FUSED_TOL[dtype])
    ref_k, ref_v = (torch.full(shape, float("nan"), dtype=dtype) for _ in range(2))
    v_ref = v_ref.reshape(num_tokens, num_kv_heads, head_dim)
    reference_reshape_and_cache(k_ref.to(dtype), v_ref.to(dtype), ref_k, ref_v, slots)
    for got, want in ((kc, ref_k), (vc, ref_v)):
        torch.testing.assert_close(got.cpu(), want, equal_nan=True, **FUSED_TOL[dtype])


ROTARY_GRID = list(itertools.product([1, 7], [64, 128], [(4, 4), (6, 2), (8, 2)]))


@pytest.mark.triton
@FUSED_DTYPES
@pytest.mark.parametrize("num_tokens,head_dim,heads", ROTARY_GRID)
def test_triton_rotary_embedding_and_cache_matches_rope_and_reshape_and_cache(
    num_tokens, head_dim, heads, dtype
):
    run_rotary_case(num_tokens, head_dim, heads, dtype, TRITON_DEVICE)


def _e4m3_probe_values(gen: torch.Generator) -> torch.Tensor:
    """Every finite e4m3 value, the midpoints between neighbours (ties round to even), values
    beyond 448 (saturate), deep subnormals and random magnitudes over 2^-12 .. 2^10."""
    codes = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
    finite = codes[torch.isfinite(codes) & (codes >= 0)].sort().values  # 0 .. 448
    mids = (finite[1:] + finite[:-1]) / 2
    logs = torch.rand(512, generator=gen) * 22 - 12
    extra = torch.tensor([460.0, 500.0, 1e4, 2.0**-10, 2.0**-11, 3 * 2.0**-11, 1e-30])
    mags = torch.cat([finite, mids, 2.0**logs, extra])
    signs = torch.where(torch.rand(mags.shape, generator=gen) < 0.5, -1.0, 1.0)
    return torch.where(mags == 0, 0.0, mags * signs)  # no -0: k - 0 * sin may flip its sign


@pytest.mark.triton
def test_triton_fp8_cache_write_rounds_as_torch():
    """Position 0 (cos 1, sin 0) and scale 1 leave k as it is: the kernel's e4m3 bytes must then be
    torch's (`quantize_fp8`) bit for bit, over every e4m3 value, every tie and saturation."""
    from llmlab.ops import fused
    from llmlab.ops.fp8 import quantize_fp8

    gen = _generator("fp8-encode")
    values = _e4m3_probe_values(gen)
    kv_heads, head_dim = 2, 64
    row = kv_heads * head_dim
    num_tokens = -(-values.numel() // row)
    k = torch.zeros(num_tokens * row)
    k[: values.numel()] = values
    k = k.view(num_tokens, kv_heads, head_dim)
    v = k.flip(0).clone()
    v[0, 0, 0] = -0.0  # v is copied as it is: its sign of zero must survive
    qkv = torch.cat([torch.zeros(num_tokens, row), k.flatten(1), v.flatten(1)], dim=1)
    shape = (num_tokens, 1, kv_heads, head_dim)
    kc, vc = (torch.zeros(shape, dtype=torch.float8_e4m3fn, device=TRITON_DEVICE) for _ in "kv")
    dev = TRITON_DEVICE
    _, table = _rope_tables(head_dim, 4)
    slots = torch.arange(num_tokens)
    zeros = torch.zeros(num_tokens, dtype=torch.int64)
    fused.rotary_embedding_and_cache(
        qkv.to(dev), zeros.to(dev), table.to(dev), kc, vc, slots.to(dev), 1.0, 1.0
    )
    for got, want, name in ((kc, k, "key_cache"), (vc, v, "value_cache")):
        want_bytes = quantize_fp8(want, 1.0).view(torch.uint8)
        got_bytes = got.cpu().view(torch.uint8).view(num_tokens, kv_heads, head_dim)
        bad = (got_bytes != want_bytes).nonzero()
        assert bad.numel() == 0, (
            f"{name}: {bad.shape[0]} values rounded differently from torch, e.g. "
            f"{want[tuple(bad[0])].item()!r} -> {got_bytes[tuple(bad[0])].item():#04x}, "
            f"torch {want_bytes[tuple(bad[0])].item():#04x}"
        )


@pytest.mark.triton
def test_triton_rotary_writes_an_fp8_cache_with_its_scales():
    """An fp8 cache stores rotated k / k_scale and v / v_scale: within one e4m3 step of the
    float64 rotation (the scale is applied as a product with its inverse, so a value on a
    rounding boundary may land one code away), slot -1 untouched."""
    from llmlab.ops import fused
    from llmlab.ops.fp8 import dequantize_fp8

    gen = _generator("rotary-fp8")
    num_tokens, num_heads, kv_heads, head_dim, block_size = 9, 6, 2, 64, 4
    k_scale, v_scale = 0.011, 0.0093  # |k|, |v| < 4 map below 448
    qkv = torch.randn(num_tokens, (num_heads + 2 * kv_heads) * head_dim, generator=gen)
    positions = torch.randint(0, 50, (num_tokens,), generator=gen)
    slots = torch.randperm(4 * block_size, generator=gen)[:num_tokens]
    slots[2] = -1
    shape = (4, block_size, kv_heads, head_dim)
    nan = torch.full(shape, 0x7F, dtype=torch.uint8).view(torch.float8_e4m3fn)  # e4m3 NaN
    kc, vc = nan.clone().to(TRITON_DEVICE), nan.clone().to(TRITON_DEVICE)
    _, table = _rope_tables(head_dim, 50)
    dev = TRITON_DEVICE
    q = fused.rotary_embedding_and_cache(
        qkv.to(dev), positions.to(dev), table.to(dev), kc, vc, slots.to(dev), k_scale, v_scale
    )
    kf, vf = (torch.full(shape, float("nan")) for _ in "kv")
    # the float cache path of the same kernel is checked above: it is the reference here
    fused.rotary_embedding_and_cache(qkv, positions, table, kf, vf, slots)
    for got, want, s in ((kc, kf, k_scale), (vc, vf, v_scale)):
        got = dequantize_fp8(got.cpu(), s)
        written = ~torch.isnan(want)
        assert torch.isnan(got[~written]).all(), "an fp8 slot the step does not own was written"
        err = (got[written] - want[written]).abs()
        assert (err <= want[written].abs() * 2**-3 + s * 2**-9).all(), err.max()
    assert q.dtype == torch.float32 and q.shape == (num_tokens, num_heads, head_dim)


@pytest.mark.triton
@FUSED_DTYPES
@pytest.mark.parametrize("num_tokens,inter", [(1, 64), (5, 96), (2, 1536)])
def test_triton_silu_and_mul_matches_the_readable_mlp(num_tokens, inter, dtype):
    """silu(gate) * up of [gate | up], as the readable MLP's `F.silu(gate) * up` rounds it."""
    from llmlab.ops import fused

    gen = _generator("silu-and-mul", num_tokens, inter, dtype)
    x = (2 * torch.randn(num_tokens, 2 * inter, generator=gen)).to(dtype)
    gate, up = x.split(inter, dim=1)
    got = fused.silu_and_mul(x.to(TRITON_DEVICE))
    assert got.shape == (num_tokens, inter) and got.dtype == dtype
    torch.testing.assert_close(got.cpu(), F.silu(gate) * up, **FUSED_TOL[dtype])


_COMPILE_FUSED = """
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource, compile
from llmlab.ops import _triton_layer_kernels as K

def sig(fn, types, consts):
    types.update(dict.fromkeys(consts, "constexpr"))
    return ASTSource(fn=fn, signature=types, constexprs=consts)

bf16, fp32, i64 = "*bf16", "*fp32", "*i64"
rotary = dict(NUM_HEADS=9, NUM_KV_HEADS=3, HEAD_DIM=64, BLOCK_H=16, BLOCK_KV=4, BLOCK_HALF=32,
              BLOCK_D=64)
for src in [
    sig(K.rms_norm_kernel, dict(x_ptr=bf16, residual_ptr=bf16, weight_ptr=bf16, out_ptr=bf16,
        eps="fp32"), dict(HIDDEN=576, BLOCK=1024, ADD_RESIDUAL=True)),
    *[sig(K.rotary_cache_kernel, dict(qkv_ptr=bf16, positions_ptr=i64, cos_sin_ptr=fp32,
          q_out_ptr=bf16, key_cache_ptr=cache, value_cache_ptr=cache, slot_ptr=i64,
          k_inv_scale="fp32", v_inv_scale="fp32"), dict(rotary, FP8=cache == "*u8"))
      for cache in (bf16, "*u8")],
    sig(K.silu_and_mul_kernel, dict(x_ptr=bf16, out_ptr=bf16), dict(INTER=1536, BLOCK=1024)),
]:
    assert compile(src, target=GPUTarget("cuda", 90, 32)).asm["ptx"]
"""


@pytest.mark.triton
@pytest.mark.skipif(TRITON_COMPILED, reason="Triton compiles them for this GPU in the tests above")
def test_fused_kernels_compile_for_an_h100_without_a_gpu(tmp_path):
    """The interpreter runs what a GPU would refuse to compile (it knows no types): the fused
    kernels are compiled here for sm_90 (PTX and cubin, Triton's bundled ptxas; no GPU needed),
    in bfloat16 and with the fp8 cache, in a process where Triton is not interpreting."""
    import subprocess
    import sys

    env = dict(os.environ, TRITON_INTERPRET="0", TRITON_CACHE_DIR=str(tmp_path))
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    run = subprocess.run(
        [sys.executable, "-c", _COMPILE_FUSED], env=env, capture_output=True, text=True
    )
    assert run.returncode == 0, run.stderr[-3000:]


def _assert_refused(op, args: dict, change, name: str) -> None:
    """`op(**args)` with `args` altered by `change` is a ValueError whose message opens by naming
    the argument `name`, then what it got (the ops boundary's form)."""
    change(args)
    with pytest.raises(ValueError, match=rf"^{re.escape(name)}: got"):
        op(**args)


def _rotary_args():
    gen = _generator("rotary-args")
    kc, vc = torch.full((2, 4, 2, 16), float("nan")), torch.full((2, 4, 2, 16), float("nan"))
    return dict(
        qkv=torch.randn(3, (4 + 4) * 16, generator=gen),
        positions=torch.tensor([0, 5, 9]),
        cos_sin_cache=_rope_tables(16, 10)[1],
        key_cache=kc,
        value_cache=vc,
        slot_mapping=torch.tensor([0, -1, 7]),
    )


@pytest.mark.triton
@pytest.mark.parametrize(
    "change,name",
    [
        (lambda a: a.update(positions=a["positions"].int()), "positions.dtype"),
        (lambda a: a.update(positions=torch.tensor([0, 5, 10])), "positions"),  # past the table
        (lambda a: a.update(slot_mapping=torch.tensor([0, -1, 8])), "slot_mapping"),
        (lambda a: a.update(slot_mapping=torch.tensor([0, 1])), "slot_mapping"),
        (lambda a: a.update(qkv=a["qkv"][:, :-16].contiguous()), "qkv"),  # not H + 2 KVH heads
        (lambda a: a.update(qkv=a["qkv"].double()), "qkv.dtype"),
        (lambda a: a.update(qkv=a["qkv"].bfloat16()), "qkv.dtype"),  # not the cache's dtype
        (lambda a: a.update(cos_sin_cache=a["cos_sin_cache"][:, :8].contiguous()), "cos_sin_cache"),
        (lambda a: a.update(k_scale=0.0), "k_scale"),
    ],
)
def test_fused_rotary_rejects_bad_arguments_and_writes_nothing(change, name):
    from llmlab.ops import fused

    args = _rotary_args()
    _assert_refused(fused.rotary_embedding_and_cache, args, change, name)
    assert torch.isnan(args["key_cache"]).all() and torch.isnan(args["value_cache"]).all()


@pytest.mark.triton
def test_fused_norm_and_silu_reject_bad_arguments_and_change_nothing():
    from llmlab.ops import fused

    x, residual, weight = torch.ones(2, 8), torch.ones(2, 8), torch.ones(8)
    for call, name in [
        (lambda: fused.rms_norm(x, weight.double(), 1e-5), "weight.dtype"),
        (lambda: fused.rms_norm(x, torch.ones(4), 1e-5), "weight"),
        (lambda: fused.rms_norm(x, weight, -1.0), "eps"),
        (lambda: fused.fused_add_rms_norm(x, torch.ones(3, 8), weight, 1e-5), "residual"),
        (lambda: fused.fused_add_rms_norm(x.t(), residual, weight, 1e-5), "x"),  # strided
        (lambda: fused.silu_and_mul(torch.ones(2, 7)), "x"),
        (lambda: fused.silu_and_mul(torch.ones(2, 8, dtype=torch.int32)), "x.dtype"),
    ]:
        with pytest.raises(ValueError, match=f"^{name}: got"):
            call()
    assert (x == 1).all() and (residual == 1).all()


def _step_metadata(backend, lens, q_lens, block_size, heads, dtype, gen, device):
    """A cache holding every token of `lens` already (as after the fused layer's write) and the
    step's metadata: `q_lens` new tokens per sequence, max_query_len known on the host."""
    num_heads, num_kv_heads = heads
    kc, vc, bt, sl = make_paged_cache(lens, block_size, num_kv_heads, 64, dtype, gen, device)
    cu = torch.tensor([0, *itertools.accumulate(q_lens)], dtype=torch.int32)
    md = ops.AttentionMetadata(
        cu.to(device),
        sl,
        torch.full((int(cu[-1]),), -1, dtype=torch.int64, device=device),
        bt,
        [(kc, vc)],
        max(q_lens),
        backend,
    )
    q = torch.randn(int(cu[-1]), num_heads, 64, generator=gen).to(dtype)
    return q, md, cu


@pytest.mark.parametrize("backend", ["torch", pytest.param("triton", marks=pytest.mark.triton)])
@pytest.mark.parametrize("decode", [True, False], ids=["decode", "mixed"])
def test_paged_attention_reads_what_the_layer_wrote(backend, decode):
    """ops.paged_attention (keys already in the cache): the decode kernel for a decode-only
    step, the prefill kernel sized by the host's max_query_len for a mixed one."""
    device = TRITON_DEVICE if backend == "triton" else "cpu"
    gen = _generator("paged-attention", backend, decode)
    block_size = 8
    lens, q_lens = (decode_lens(block_size), [1] * 5) if decode else prefill_layout(block_size)
    q, md, cu = _step_metadata(
        backend, lens, q_lens, block_size, (9, 3), torch.float32, gen, device
    )
    kc, vc = md.kv_caches[0]
    out = ops.paged_attention(q.to(device), md, 0, 0.125)
    ref = reference_paged_attention_prefill(
        q, kc.cpu(), vc.cpu(), md.block_tables.cpu(), cu, md.seq_lens.cpu(), 0.125
    )
    assert_matches(out, ref, torch.float32, f"paged_attention[{backend}] decode={decode}")


@pytest.mark.triton
def test_triton_step_metadata_checks_the_device_once():
    """The layers' inner calls trust the device: a "triton" step's metadata refuses tensors
    Triton cannot run here (a `meta` cache stands for a device of the wrong kind)."""
    kv = [(torch.empty(2, 4, 1, 16, device="meta"), torch.empty(2, 4, 1, 16, device="meta"))]
    with pytest.raises(ValueError, match="^kv_caches.device: got meta"):
        ops.AttentionMetadata(
            torch.tensor([0, 1], dtype=torch.int32, device="meta"),
            torch.tensor([1], dtype=torch.int32, device="meta"),
            torch.tensor([0], device="meta"),
            torch.tensor([[0]], dtype=torch.int32, device="meta"),
            kv,
            1,
            "triton",
        )


@pytest.mark.triton
def test_triton_prefill_rejects_a_bad_max_query_len():
    gen = _generator("bad-max-query-len")
    lens, q_lens = prefill_layout(8)
    q, md, cu = _step_metadata("triton", lens, q_lens, 8, (4, 2), torch.float32, gen, "cpu")
    kc, vc = md.kv_caches[0]
    args = (q, kc, vc, md.block_tables, cu, md.seq_lens, 0.125)
    for bad in (-1, q.shape[0] + 1, 2.0, True):
        with pytest.raises(ValueError, match="^max_query_len: got"):
            ops.paged_attention_prefill(*args, backend="triton", max_query_len=bad)


# ---------------------------------------------------------------- GPU: every backend on CUDA

NOT_COMPILING = "TRITON_INTERPRET is set: Triton is not compiling in this process"
# each test below runs every GPU backend on CUDA tensors ("triton" where it compiles)
GPU_BACKENDS = pytest.mark.parametrize(
    "backend",
    [
        "torch",
        pytest.param("triton", marks=pytest.mark.skipif(not TRITON_COMPILED, reason=NOT_COMPILING)),
        "cuda",
    ],
)


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason=NO_GPU_REASON)
@GPU_BACKENDS
@pytest.mark.parametrize(
    "op,dtype",
    [
        ("decode", torch.float32),
        ("decode", torch.bfloat16),
        ("decode", torch.float16),
        ("prefill", torch.float32),
        ("prefill", torch.bfloat16),
    ],
    ids=["decode-fp32", "decode-bf16", "decode-fp16", "prefill-fp32", "prefill-bf16"],
)
def test_gpu_matches_reference(backend, op, dtype):
    for block_size, head_dim, heads in FULL_GRID:
        run_case(op, backend, block_size, head_dim, heads, dtype, "cuda")


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason=NO_GPU_REASON)
@GPU_BACKENDS
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_gpu_reshape_and_cache_skips_slot_minus_one(backend, dtype):
    run_reshape_and_cache_case(backend, dtype, "cuda")


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason=NO_GPU_REASON)
def test_gpu_triton_split_k_long_context():
    from llmlab.ops import triton_backend

    if not TRITON_COMPILED:
        pytest.skip(NOT_COMPILING)
    gen = _generator("gpu-split-k")
    lens = [1, 700, 1500, 2049]
    kc, vc, bt, sl = make_paged_cache(lens, 16, 2, 128, torch.float32, gen, "cuda")
    q = torch.randn(len(lens), 8, 128, generator=gen)
    out = triton_backend.paged_attention(
        q.cuda(), PagedKV(kc, vc, bt, sl), 128**-0.5, partition_size=512
    )
    ref = reference_paged_attention_decode(q, kc.cpu(), vc.cpu(), bt.cpu(), sl.cpu(), 128**-0.5)
    assert_matches(out, ref, torch.float32, "GPU split-K decode")


# ---------------------------------------------------------------- the CUDA kernel
# The launch plan is plain Python (tested here on any machine); the kernel runs on a GPU only.
# Its GPU cases force both paths (one pass, split context) over contexts that cross the
# 512-position tile and many partitions, every GQA group 1..8, mixed query lengths including 1,
# an fp8 cache, and the head dims of each compiled variant, against the float64 reference.

H200_SMS = 132


def test_cuda_plan_splits_few_long_rows_and_keeps_many_rows_in_one_pass():
    from llmlab.ops import cuda_backend as cb

    # 4 blocks per SM wanted: 528. Batch 1 x 4,096 with 8 KV heads has 8 (row, KV head)
    # blocks; no partition size reaches 528 (64 positions give 512), so the smallest is taken.
    batch1 = cb.plan_attention(1, 8, 4096, H200_SMS)
    assert (batch1.partition_size, batch1.num_partitions, batch1.split) == (64, 64, True)
    assert batch1.grid == (1, 8, 64)
    # the largest size that reaches the target: 16 x 8 blocks x 8 partitions of 256 = 1,024
    assert cb.plan_attention(16, 8, 2048, H200_SMS).grid == (16, 8, 8)
    batch64 = cb.plan_attention(64, 8, 2048, H200_SMS)  # 512 blocks: just under the target
    assert (batch64.partition_size, batch64.num_partitions) == (512, 4)
    for rows, context in ((256, 2048), (128, 4096), (1, 64), (4, 0)):
        one = cb.plan_attention(rows, 8, context, H200_SMS)
        assert (one.partition_size, one.num_partitions, one.split) == (0, 1, False), (rows, context)


@pytest.mark.parametrize("num_sms", [1, 16, 132])
def test_cuda_plan_partitions_always_cover_the_table(num_sms):
    from llmlab.ops import cuda_backend as cb

    for rows, kv_heads, context in itertools.product((1, 3, 64), (1, 8), (1, 65, 511, 4097)):
        plan = cb.plan_attention(rows, kv_heads, context, num_sms)
        what = f"rows={rows} kv_heads={kv_heads} context={context} sms={num_sms}"
        if plan.split:
            assert plan.partition_size in cb.PARTITION_SIZES, what
            assert plan.num_partitions == -(-context // plan.partition_size) > 1, what
        else:
            assert (plan.partition_size, plan.num_partitions) == (0, 1), what


def test_cuda_plan_takes_a_forced_partition_size_or_names_it():
    from llmlab.ops import cuda_backend as cb

    assert cb.plan_attention(1, 2, 2049, 132, partition_size=0).num_partitions == 1
    forced = cb.plan_attention(200, 2, 2049, 132, partition_size=32)
    assert (forced.partition_size, forced.num_partitions) == (32, 65)
    assert cb.plan_attention(1, 2, 20, 132, partition_size=32).num_partitions == 1
    for bad in (48, -32, 32.0, True, "32"):
        with pytest.raises(ValueError, match="^partition_size: got"):
            cb.plan_attention(1, 2, 100, 132, partition_size=bad)
    with pytest.raises(ValueError, match="^partition_size: got 32.*at most 8192"):
        cb.plan_attention(1, 2, 32 * 8193, 132, partition_size=32)


def test_cuda_kernel_shape_limits_name_the_query():
    from llmlab.ops import cuda_backend as cb

    def shapes(num_heads, num_kv_heads, head_dim, cache_dtype):
        q = torch.empty(1, num_heads, head_dim, device="meta")
        return q, torch.empty(4, 16, num_kv_heads, head_dim, dtype=cache_dtype, device="meta")

    for head_dim in (16, 32, 64, 96, 128, 256):
        cb.check_kernel_shape(*shapes(16, 2, head_dim, torch.bfloat16))  # group 8: accepted
    cb.check_kernel_shape(*shapes(4, 4, 20, torch.float32))  # 20 = 5 vectors of 4 fp32
    for args, match in (
        ((4, 4, 20, torch.bfloat16), "head_dim=20, expected a multiple of 8"),
        ((4, 4, 264, torch.float32), "head_dim=264, expected a multiple of 4 up to 256"),
        ((4, 4, 12, torch.float8_e4m3fn), "head_dim=12, expected a multiple of 8"),
        ((18, 2, 64, torch.bfloat16), "GQA group of 9, expected at most 8"),
    ):
        with pytest.raises(ValueError, match=f"^query: .*{match}"):
            cb.check_kernel_shape(*shapes(*args))


def run_cuda_case(
    lens: list[int],
    q_lens: list[int] | None,
    block_size: int,
    head_dim: int,
    heads: tuple[int, int],
    dtype: torch.dtype,
    partition_sizes: tuple[int | None, ...],
    kv_scales: tuple[float, float] | None = None,
) -> None:
    """The CUDA kernel on one step, once per partition size, against the float64 reference:
    decode when `q_lens` is None, varlen otherwise. With `kv_scales` the cache is fp8 (value /
    scale; the NaN of unused slots stays NaN) and the reference reads it dequantized."""
    from llmlab.ops import cuda_backend
    from llmlab.ops.fp8 import dequantize_fp8, quantize_fp8

    num_heads, num_kv_heads = heads
    gen = _generator("cuda", lens, q_lens, block_size, head_dim, heads, dtype, kv_scales)
    cache_dtype = dtype if kv_scales is None else torch.float32
    kc, vc, bt, sl = make_paged_cache(lens, block_size, num_kv_heads, head_dim, cache_dtype, gen)
    ref_k, ref_v, scales = kc, vc, (1.0, 1.0)
    if kv_scales is not None:
        k_scale, v_scale = kv_scales
        kc, vc = quantize_fp8(kc, k_scale), quantize_fp8(vc, v_scale)
        ref_k, ref_v = dequantize_fp8(kc, k_scale), dequantize_fp8(vc, v_scale)
        scales = (k_scale, v_scale)
    per_seq = q_lens if q_lens is not None else [1] * len(lens)
    cu = torch.tensor([0, *itertools.accumulate(per_seq)], dtype=torch.int32)
    q = torch.randn(int(cu[-1]), num_heads, head_dim, generator=gen).to(dtype)
    scale = head_dim**-0.5
    ref = reference_paged_attention_prefill(q, ref_k, ref_v, bt, cu, sl, scale)
    kv = PagedKV(kc.cuda(), vc.cuda(), bt.cuda(), sl.cuda(), None, *scales)
    if q_lens is not None:
        kv = dataclasses.replace(kv, cu_seqlens_q=cu.cuda())
    for partition_size in partition_sizes:
        out = cuda_backend.paged_attention(q.cuda(), kv, scale, partition_size=partition_size)
        what = (
            f"cuda {'decode' if q_lens is None else 'varlen'} partition_size={partition_size} "
            f"B={block_size} d={head_dim} {heads} fp8={kv_scales is not None}"
        )
        assert_matches(out, ref, dtype, what)


# (head_dim, (num_heads, num_kv_heads)) for GQA groups 1 to 8, both common head dims
CUDA_GROUPS = [(64 if g % 2 else 128, (2 * g, 2)) for g in range(1, 9)]
LONG_LENS = [1, 31, 33, 100, 513, 2049]  # past the 512-position tile, and over 4 of them


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason=NO_GPU_REASON)
@pytest.mark.parametrize(
    "dtype", [torch.float32, torch.bfloat16, torch.float16], ids=["fp32", "bf16", "fp16"]
)
def test_gpu_cuda_decode_one_pass_and_split_match_reference(dtype):
    """One pass (tiles of 512 merged inside the block) and split context (partitions of 32
    and 512 merged by the second kernel), GQA groups 1 to 8."""
    for head_dim, heads in CUDA_GROUPS:
        run_cuda_case(LONG_LENS, None, 16, head_dim, heads, dtype, (0, 32, 512))


# (context, new tokens) per sequence: decode tokens, fresh prompts, a chunk after a long
# context, a prefix-cache hit, and a sequence with no new token in the middle of the step
MIXED_STEP = [(0, 1), (40, 1), (0, 37), (16, 5), (600, 30), (8, 0), (1030, 1), (5, 40)]
MIXED_LENS = [c + n for c, n in MIXED_STEP]
MIXED_Q_LENS = [n for _, n in MIXED_STEP]


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason=NO_GPU_REASON)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_gpu_cuda_varlen_mixed_step_matches_reference(dtype):
    """Rows of prompts, chunks and decode tokens in one launch (block size 5 as well: nothing
    assumes a power of two), planned automatically, in one pass and split."""
    for block_size, head_dim, heads in ((16, 64, (9, 3)), (5, 128, (8, 1)), (32, 64, (4, 4))):
        run_cuda_case(MIXED_LENS, MIXED_Q_LENS, block_size, head_dim, heads, dtype, (None, 0, 32))


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason=NO_GPU_REASON)
@pytest.mark.parametrize(
    "dtype", [torch.float32, torch.bfloat16, torch.float16], ids=["fp32", "bf16", "fp16"]
)
def test_gpu_cuda_fp8_cache_matches_reference_on_the_dequantized_cache(dtype):
    scales = (0.03, 0.02)
    run_cuda_case(LONG_LENS, None, 16, 128, (8, 2), dtype, (0, 32), scales)
    run_cuda_case(MIXED_LENS, MIXED_Q_LENS, 16, 64, (9, 3), dtype, (0, 32), scales)


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason=NO_GPU_REASON)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_gpu_cuda_head_dims_of_every_compiled_variant(dtype):
    """16 and 32 (vectors past head_dim unused), 96 (not a power of two), 256 (fp32: two
    vectors per lane), in one pass and split."""
    for head_dim in (16, 32, 96, 256):
        run_cuda_case([1, 17, 300, 530], None, 16, head_dim, (6, 2), dtype, (0, 64))


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason=NO_GPU_REASON)
def test_gpu_cuda_launchers_equal_the_checked_calls_and_replay_in_a_graph():
    """The launchers (what the fused layer calls per layer, unchecked) give the checked calls'
    bits, and decode captured in a CUDA graph replays on new query values with no sync."""
    from llmlab.ops import cuda_backend

    gen = _generator("cuda-inner")
    kc, vc, bt, sl = make_paged_cache(MIXED_LENS, 16, 2, 64, torch.bfloat16, gen, "cuda")
    cu = torch.tensor([0, *itertools.accumulate(MIXED_Q_LENS)], dtype=torch.int32).cuda()
    q = torch.randn(sum(MIXED_Q_LENS), 8, 64, generator=gen).to(torch.bfloat16).cuda()
    want = ops.paged_attention_prefill(q, kc, vc, bt, cu, sl, 0.125, "cuda")
    got = cuda_backend.paged_attention(q, PagedKV(kc, vc, bt, sl, cu), 0.125)
    assert torch.equal(got, want), "the prefill launcher differs from ops.paged_attention_prefill"
    q_dec = torch.randn(len(MIXED_LENS), 8, 64, generator=gen).to(torch.bfloat16).cuda()
    want = ops.paged_attention_decode(q_dec, kc, vc, bt, sl, 0.125, "cuda")
    kv = PagedKV(kc, vc, bt, sl)
    assert torch.equal(cuda_backend.paged_attention(q_dec, kv, 0.125), want)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):  # fails if anything waits for the GPU or reads its values
        static_out = cuda_backend.paged_attention(q_dec, kv, 0.125)
    new_q = torch.randn(q_dec.shape, generator=gen).to(torch.bfloat16).cuda()
    q_dec.copy_(new_q)
    graph.replay()
    torch.cuda.synchronize()
    want = ops.paged_attention_decode(new_q, kc, vc, bt, sl, 0.125, "cuda")
    assert torch.equal(static_out, want), "the graph's replay differs from an eager call"


# ---------------------------------------------------------------- availability and errors


def test_available_backends_lists_what_runs_here():
    found = ops.available_backends()
    assert found[0] == "torch"
    assert ("cuda" in found) == HAS_CUDA
    assert set(found) <= set(ops.BACKENDS)


@pytest.mark.skipif(HAS_CUDA, reason="this machine has a GPU; the cuda backend runs instead")
def test_cuda_backend_without_gpu_says_so():
    gen = _generator("no-gpu")
    kc, vc, bt, sl = make_paged_cache([3], 8, 1, 16, torch.float32, gen)
    q = torch.randn(1, 1, 16)
    with pytest.raises(RuntimeError, match="needs an NVIDIA GPU"):
        ops.paged_attention_decode(q, kc, vc, bt, sl, 0.25, backend="cuda")
    with pytest.raises(RuntimeError, match="needs an NVIDIA GPU"):
        ops.reshape_and_cache(
            torch.zeros(1, 1, 16), torch.zeros(1, 1, 16), kc, vc, torch.tensor([0]), backend="cuda"
        )


def _valid_decode_args():
    gen = _generator("valid")
    kc, vc, bt, sl = make_paged_cache([3, 9], 8, 2, 16, torch.float32, gen)
    q = torch.randn(2, 4, 16)
    return dict(query=q, key_cache=kc, value_cache=vc, block_tables=bt, seq_lens=sl, scale=0.25)


@pytest.mark.parametrize(
    "change,name",
    [
        (lambda a: a.update(block_tables=a["block_tables"].long()), "block_tables.dtype"),
        (lambda a: a.update(seq_lens=a["seq_lens"].long()), "seq_lens.dtype"),
        (lambda a: a.update(query=a["query"][:, :, :8]), "query"),  # wrong head_dim
        (lambda a: a.update(query=torch.randn(2, 3, 16)), "query"),  # 3 heads over 2 KV heads
        (lambda a: a.update(query=torch.randn(16, 4, 2).transpose(0, 2)), "query"),  # strided
        (lambda a: a.update(query=a["query"].double()), "query.dtype"),
        (lambda a: a.update(query=torch.randn(3, 4, 16)), "query"),  # 3 queries for 2 sequences
        (lambda a: a.update(value_cache=a["value_cache"][:, :, :1].contiguous()), "value_cache"),
        (lambda a: a.update(seq_lens=torch.tensor([3, 30], dtype=torch.int32)), "seq_lens"),
        (lambda a: a.update(seq_lens=torch.tensor([0, 9], dtype=torch.int32)), "seq_lens"),
        (
            lambda a: a.update(block_tables=torch.full((2, 3), 99, dtype=torch.int32)),
            "block_tables",
        ),
        (lambda a: a.update(scale=0.0), "scale"),
    ],
)
def test_decode_rejects_bad_arguments_naming_them(change, name):
    _assert_refused(ops.paged_attention_decode, _valid_decode_args(), change, name)


def test_prefill_rejects_bad_offsets_and_lengths():
    args = _valid_decode_args()
    q = torch.randn(5, 4, 16)
    bad_end = torch.tensor([0, 2, 4], dtype=torch.int32)  # 4 != 5 tokens
    too_many = torch.tensor([0, 4, 5], dtype=torch.int32)  # 4 new tokens, seq_len 3
    for cu_seqlens_q, name in [(bad_end, "cu_seqlens_q"), (too_many, "seq_lens")]:
        with pytest.raises(ValueError, match=f"^{name}:"):
            ops.paged_attention_prefill(
                q,
                args["key_cache"],
                args["value_cache"],
                args["block_tables"],
                cu_seqlens_q,
                args["seq_lens"],
                0.25,
            )


def test_reshape_and_cache_rejects_bad_slots_and_dtypes():
    kc = torch.zeros(2, 8, 1, 16)
    vc = torch.zeros(2, 8, 1, 16)
    key = torch.zeros(2, 1, 16)
    with pytest.raises(ValueError, match="^slot_mapping:"):
        ops.reshape_and_cache(key, key, kc, vc, torch.tensor([0, 16]))  # 16 slots: 0..15
    with pytest.raises(ValueError, match="^slot_mapping:"):
        ops.reshape_and_cache(key, key, kc, vc, torch.tensor([0, -2]))
    with pytest.raises(ValueError, match="^slot_mapping[.]dtype:"):
        ops.reshape_and_cache(key, key, kc, vc, torch.tensor([0, 1], dtype=torch.int32))
    with pytest.raises(ValueError, match="^key[.]dtype:"):
        ops.reshape_and_cache(key.half(), key.half(), kc, vc, torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="^key:"):
        ops.reshape_and_cache(
            torch.zeros(2, 2, 16), torch.zeros(2, 2, 16), kc, vc, torch.tensor([0, 1])
        )


def test_unknown_backend_is_rejected_with_the_allowed_values():
    args = _valid_decode_args()
    with pytest.raises(ValueError, match="^backend: got 'cuda2'.*'torch', 'triton', 'cuda'"):
        ops.paged_attention_decode(**args, backend="cuda2")


def test_torch_decode_reads_a_full_contiguous_cache_in_place():
    """Sequences that fill consecutive blocks exactly (a contiguous cache, one block each) are
    attended straight from the cache; out-of-order blocks or padding still take the gather."""
    gen = _generator("in-place")
    n, length, kvh, d = 4, 24, 2, 64
    kc = torch.randn(n + 1, length, kvh, d, generator=gen)
    vc = torch.randn(n + 1, length, kvh, d, generator=gen)
    q = torch.randn(n, 8, d, generator=gen)
    full = torch.full((n,), length, dtype=torch.int32)
    for table, lens, in_place in (
        (torch.arange(1, n + 1), full, True),
        (torch.tensor([2, 1, 3, 4]), full, False),
        (torch.arange(1, n + 1), full - 1, False),
    ):
        bt = table.to(torch.int32)[:, None]
        out, plan = grouped(q, kc, vc, bt, lens)
        assert (plan.decode[0].view_start is not None) == in_place, (table, lens)
        ref = reference_paged_attention_decode(q, kc, vc, bt, lens, d**-0.5)
        assert_matches(out, ref, torch.float32, f"decode, blocks {table.tolist()}")


def test_value_checks_run_again_when_the_metadata_changes():
    """Checks that read values are skipped for values that already passed; the same tensors
    changed in place to something invalid must still be rejected."""
    gen = _generator("recheck")
    kc, vc, bt, sl = make_paged_cache([5, 20], 16, 2, 64, torch.float32, gen)
    q = torch.randn(2, 8, 64, generator=gen)
    ops.paged_attention_decode(q, kc, vc, bt, sl, 0.125)
    ops.paged_attention_decode(q, kc, vc, bt, sl, 0.125)  # the same values: fine again
    bt[1, 0] = kc.shape[0] + 5  # in place: a block that is not there
    with pytest.raises(ValueError, match="block_tables"):
        ops.paged_attention_decode(q, kc, vc, bt, sl, 0.125)
    bt[1, 0] = 0
    sl[0] = 10_000  # longer than the table holds
    with pytest.raises(ValueError, match="seq_lens"):
        ops.paged_attention_decode(q, kc, vc, bt, sl, 0.125)


def test_grouped_attention_equals_the_readable_path_on_mixed_steps():
    """The planned path is an optimisation of the readable one: on random mixed steps (prompt
    chunks beside decodes, shuffled blocks, NaN in unused slots) both give the same output."""
    for trial in range(4):
        gen = _generator("grouped-vs-readable", trial)
        lens = torch.randint(1, 90, (7,), generator=gen).tolist()
        q_lens = [min(n, int(torch.randint(1, 4, (1,), generator=gen)) ** 3) for n in lens]
        kc, vc, bt, sl = make_paged_cache(lens, 16, 2, 32, torch.float32, gen)
        cu = torch.tensor([0] + list(itertools.accumulate(q_lens)), dtype=torch.int32)
        q = torch.randn(int(cu[-1]), 6, 32, generator=gen)
        out, _ = grouped(q, kc, vc, bt, sl, cu)
        readable = torch_backend.paged_attention(q, PagedKV(kc, vc, bt, sl, cu), 32**-0.5)
        torch.testing.assert_close(out, readable, atol=1e-5, rtol=1e-5)


PLANTED_HEADER = """
/* called from Python */
int llmlab_a(const float *x, int64_t n,
             const void *w, float s);
void llmlab_b(void);
/* called from another kernel file */
void llmlab_c(int64_t n);
"""


def test_ctypes_signatures_are_read_from_the_c_header():
    """The library's argument types come from `kernels/cpu_kernels.h`'s "called from Python"
    section (a prototype over several lines, `f(void)`), not from kernels only C calls; a type
    ctypes is not told of is refused (it would pass garbage to C without any error); and every
    function the package calls is declared there."""
    import ctypes
    import re
    from pathlib import Path

    from llmlab.ops import cpu_library

    read = cpu_library.python_signatures(PLANTED_HEADER)
    assert read == {
        "llmlab_a": (
            ctypes.c_int,
            [ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p, ctypes.c_float],
        ),
        "llmlab_b": (None, []),
    }
    with pytest.raises(ValueError, match="llmlab_d"):
        cpu_library.python_signatures(
            PLANTED_HEADER.replace("void llmlab_b(void)", "void llmlab_d(double x)")
        )
    with pytest.raises(ValueError, match="called from Python"):
        cpu_library.python_signatures("void llmlab_b(void);")
    root = Path(__file__).resolve().parents[1]
    declared = cpu_library.python_signatures((root / "kernels" / "cpu_kernels.h").read_text())
    called = {  # lib.llmlab_x(...), and the matmuls called by name: _weight_matmul("qgemm", ...)
        name
        for path in (root / "llmlab").rglob("*.py")
        for name in re.findall(r"\.(llmlab_\w+)\(", path.read_text())
        + ["llmlab_" + n for n in re.findall(r'_weight_matmul\(\s*"(\w+)"', path.read_text())]
    }
    assert {"llmlab_paged_attention", "llmlab_decode_layers", "llmlab_packed_gemm"} <= called
    assert called <= set(declared), f"called but not declared for Python: {called - set(declared)}"
