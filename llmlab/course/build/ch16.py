"""Drivers of chapter 16's build exercise, the paged decode attention kernel in Triton, and of
its merge.

The student writes two pieces. `paged_decode_partition`, a Triton kernel with one program per
(sequence, KV head, partition): an online softmax over the partition's positions, storing each
query head's running max m, sum l and accumulator acc. `merge_partitions(part_out, part_max,
part_sum)`: the attention output from those partial results. `launch_partitions` (the launcher:
grid, partial results) runs the kernel; `paged_decode(kernel, merge, ...)` is the two together,
with the arguments of `llmlab.ops.paged_attention_decode`.

The drivers build each case's tensors from a plain description (`make_case`, `make_partials`:
the checker builds the same ones in its own process), run the student's piece on them and hand
back its results, or what was wrong with a return value. The cases are small on purpose: through
Triton's interpreter on a CPU each program costs milliseconds. Where a CUDA GPU is present and
Triton compiles, the kernel's cases run on it.

`with_decode_attention(model, decode)` plugs a decode function into the real engine: a model
whose layers call it on decode steps, as choosing an attention backend in vLLM swaps the
implementation (`impl`) each attention layer calls.
"""

from __future__ import annotations

import copy
import math
from typing import Any, Callable

import torch
from torch import nn

from llmlab.ops.paged_kv import PagedKV

HEAD_DIM = 16
BLOCK_SIZE = 16  # tl.dot's smallest tile on a GPU is 16 x 16
PARTITION_SIZE = 32  # two blocks: a context of 33 positions already spans two partitions

# (name, seq_lens, num_heads, num_kv_heads, what the unused slots hold): GQA groups of 2, 3
# (SmolLM2's 9 / 3) and 4 (where h % num_kv_heads and h // group differ the most), plain MHA;
# contexts of 1 token, exactly a block or a partition, and one past each boundary; unused
# slots full of NaN (what a freed block may hold) or of finite noise (so that a read past
# seq_len shows as a wrong number, not only as NaN)
CASES = (
    ("gqa2", (1, 17, 33), 4, 2, "nan"),
    ("gqa3", (16, 32, 70), 9, 3, "nan"),
    ("gqa4", (47, 5), 8, 2, "noise"),
    ("mha", (33, 64), 2, 2, "noise"),
)


def _device() -> torch.device:
    """Where the kernels run: the GPU when Triton compiles for one, else the CPU (interpreter)."""
    from llmlab.ops.triton_backend import interpreting

    return torch.device("cuda" if torch.cuda.is_available() and not interpreting() else "cpu")


def make_case(case: tuple, seed: int, device: str | torch.device = "cpu") -> dict[str, Any]:
    """The tensors of one case (`CASES` row), drawn from `seed`: physically shuffled blocks, a
    block table one entry wider than the longest context (the engine's tables are wider than the
    context too), every entry pointing at a real block, and unused slots filled as the case says."""
    _, seq_lens, num_heads, num_kv_heads, fill = case
    g = torch.Generator().manual_seed(seed)
    num_seqs = len(seq_lens)
    width = -(-max(seq_lens) // BLOCK_SIZE) + 1
    num_blocks = num_seqs * width + 2
    tables = torch.randperm(num_blocks, generator=g)[: num_seqs * width].view(num_seqs, width)
    shape = (num_blocks, BLOCK_SIZE, num_kv_heads, HEAD_DIM)
    if fill == "nan":
        key_cache = torch.full(shape, float("nan"))
        value_cache = torch.full(shape, float("nan"))
    else:
        key_cache, value_cache = torch.randn(shape, generator=g), torch.randn(shape, generator=g)
    for s, length in enumerate(seq_lens):
        for pos in range(length):
            block, offset = int(tables[s, pos // BLOCK_SIZE]), pos % BLOCK_SIZE
            key_cache[block, offset] = torch.randn(num_kv_heads, HEAD_DIM, generator=g)
            value_cache[block, offset] = torch.randn(num_kv_heads, HEAD_DIM, generator=g)
    # scores of spread ~2: a later block often holds a larger max, which the rescaling must handle
    query = 2 * torch.randn(num_seqs, num_heads, HEAD_DIM, generator=g)
    tensors = {
        "query": query,
        "key_cache": key_cache,
        "value_cache": value_cache,
        "block_tables": tables.to(torch.int32),
        "seq_lens": torch.tensor(seq_lens, dtype=torch.int32),
    }
    out = {name: t.to(device) for name, t in tensors.items()}
    out["scale"] = HEAD_DIM**-0.5
    return out


def launch_partitions(
    kernel: Any,
    query: torch.Tensor,
    kv: PagedKV,
    scale: float,
    partition_size: int = PARTITION_SIZE,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Run `kernel` (the student's `paged_decode_partition`) on a grid of (sequences, KV heads,
    partitions) programs over the paged cache `kv` (a backend's `PagedKV`, decode: one query per
    sequence) -> its partial results (part_out [S, H, P, D], part_max [S, H, P], part_sum
    [S, H, P], float32), NaN wherever the kernel stored nothing. The number of partitions comes
    from the block table's width, which the host knows (no wait for the GPU)."""
    import triton

    num_seqs, num_heads, head_dim = query.shape
    _, block_size, num_kv_heads, _ = kv.key_cache.shape
    max_blocks = kv.block_tables.shape[1]
    if partition_size % block_size:
        raise ValueError(
            f"partition_size: got {partition_size}, expected a multiple of the block size "
            f"({block_size})"
        )
    num_parts = triton.cdiv(max_blocks * block_size, partition_size)
    part_max = query.new_full((num_seqs, num_heads, num_parts), math.nan, dtype=torch.float32)
    part_sum = torch.full_like(part_max, math.nan)
    part_out = torch.full((*part_max.shape, head_dim), math.nan, device=query.device)
    kernel[(num_seqs, num_kv_heads, num_parts)](
        query, kv.key_cache, kv.value_cache, kv.block_tables, kv.seq_lens,
        part_out, part_max, part_sum, scale, max_blocks,
        NUM_HEADS=num_heads, NUM_KV_HEADS=num_kv_heads, HEAD_DIM=head_dim,
        BLOCK_SIZE=block_size, PARTITION_BLOCKS=partition_size // block_size,
        BLOCK_G=max(16, triton.next_power_of_2(num_heads // num_kv_heads)),  # tl.dot: 16 or more
    )  # fmt: skip
    return part_out, part_max, part_sum


def paged_decode(
    kernel: Any,
    merge: Callable,
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    partition_size: int = PARTITION_SIZE,
) -> torch.Tensor:
    """Paged decode attention from the student's two pieces: `kernel`'s partial results, then
    `merge` of them -> [num_seqs, num_heads, head_dim] in the query's dtype. Bound to the two
    (`functools.partial(paged_decode, kernel, merge)`) it takes the arguments of
    `llmlab.ops.paged_attention_decode`."""
    kv = PagedKV(key_cache, value_cache, block_tables, seq_lens)
    partials = launch_partitions(kernel, query, kv, scale, partition_size)
    return merge(*partials).to(query.dtype)


def partial_results(kernel: Any, seeds: list) -> dict[str, Any]:
    """`seeds`: one per row of `CASES`. Runs the student's kernel on each case (partitions of
    `PARTITION_SIZE` positions) and returns `{"partials": [(part_out, part_max, part_sum) as
    float64 CPU tensors], "device": "cpu" or "cuda"}`."""
    device = _device()
    partials = []
    for case, seed in zip(CASES, seeds):
        t = make_case(case, int(seed), device)
        names = ("key_cache", "value_cache", "block_tables", "seq_lens")
        kv = PagedKV(*(t[n] for n in names))
        got = launch_partitions(kernel, t["query"], kv, t["scale"], PARTITION_SIZE)
        partials.append(tuple(x.detach().to("cpu", torch.float64) for x in got))
    return {"partials": partials, "device": device.type}


# The merge's cases: (name, sequences, heads, partitions, head size, spread of the maxima,
# partitions left empty per sequence). A spread of 200 puts the first partition's maxima at 100,
# past the 88 where exp(m) alone overflows float32; an empty partition has m = -inf, l = 0,
# acc = 0.
MERGE_CASES = (
    ("spread", 3, 4, 5, 8, 6.0, 1),
    ("far_apart", 2, 3, 4, 8, 200.0, 2),
)


def make_partials(case: tuple, seed: int) -> dict[str, torch.Tensor]:
    """Partial results as the kernel stores them for a merge case (`MERGE_CASES` row), drawn
    from `seed`: part_out [S, H, P, D], part_max and part_sum [S, H, P], float32; the last
    `empty` partitions of every sequence hold nothing (the contexts are shorter than the table)."""
    _, num_seqs, num_heads, num_parts, head_dim, spread, empty = case
    g = torch.Generator().manual_seed(seed)
    part_max = spread * (torch.rand(num_seqs, num_heads, num_parts, generator=g) - 0.5)
    part_max[..., 0] = spread / 2  # the first partition holds the largest scores
    part_sum = 1 + 15 * torch.rand(num_seqs, num_heads, num_parts, generator=g)
    # acc = sum of exp(s - m) * v: of the order of l times a value
    part_out = part_sum[..., None] * torch.randn(
        num_seqs, num_heads, num_parts, head_dim, generator=g
    )
    if empty:
        part_max[..., -empty:] = -math.inf
        part_sum[..., -empty:] = 0.0
        part_out[..., -empty:, :] = 0.0
    return {"part_out": part_out, "part_max": part_max, "part_sum": part_sum}


def merged(merge: Callable, seeds: list) -> dict[str, Any]:
    """`seeds`: one per row of `MERGE_CASES`. Runs the student's `merge_partitions` on each and
    returns `{"bad": None, "outputs": [[S, H, D] float64 tensors]}`, or `{"bad": kind, "case":
    name, ...}` for a return value that is not an output of the right shape."""
    outputs = []
    for case, seed in zip(MERGE_CASES, seeds):
        t = make_partials(case, int(seed))
        got = merge(t["part_out"].clone(), t["part_max"].clone(), t["part_sum"].clone())
        want = list(t["part_out"].shape[:2]) + [t["part_out"].shape[3]]
        if not isinstance(got, torch.Tensor):
            return {"bad": "not_a_tensor", "case": case[0], "got": type(got).__name__}
        if list(got.shape) != want:
            return {"bad": "shape", "case": case[0], "got": list(got.shape), "want": want}
        if not got.is_floating_point():
            return {"bad": "dtype", "case": case[0], "got": str(got.dtype)}
        outputs.append(got.detach().to("cpu", torch.float64))
    return {"bad": None, "outputs": outputs}


class DecodeAttention(nn.Module):
    """One layer's attention whose decode steps call `decode` (a function with the arguments of
    `llmlab.ops.paged_attention_decode`); every other step runs the layer as it was. The new
    token's key and value go into the cache first, as in `llmlab.ops.attention` (a float cache:
    no fp8 scales)."""

    def __init__(self, attention: nn.Module, decode: Callable) -> None:
        super().__init__()
        self.attention = attention
        self.decode = decode

    def forward(self, x, cos, sin, metadata, layer: int) -> torch.Tensor:
        if not metadata.is_decode_only:
            return self.attention(x, cos, sin, metadata, layer)
        from llmlab import ops

        a = self.attention
        q, k, v = a.qkv(x, cos, sin)  # [S, heads, d], [S, kv_heads, d] x2: one token per sequence
        key_cache, value_cache = metadata.kv_caches[layer]
        ops.reshape_and_cache(k, v, key_cache, value_cache, metadata.slot_mapping)
        out = self.decode(
            q, key_cache, value_cache, metadata.block_tables, metadata.seq_lens, a.scale
        )  # [S, heads, d]
        return a.o_proj(out.to(x.dtype).reshape(x.shape[0], -1))  # [S, hidden]


def with_decode_attention(model: nn.Module, decode: Callable) -> nn.Module:
    """A copy of the readable `model` (`llmlab.model.LlamaModel`) whose every layer runs its
    decode steps through `decode`; the weights are shared with `model`, which is left unchanged.
    Run it with `attention_backend="torch"`, which keeps the readable model (the fast paths
    swap the layers for their own), on the device and in the dtype `model` has: an engine that
    converts a model builds a plain copy, without these layers."""
    shared = {id(t): t for t in (*model.parameters(), *model.buffers())}
    new = copy.deepcopy(model, memo=dict(shared))
    for layer in new.layers:
        layer.self_attn = DecodeAttention(layer.self_attn, decode)
    return new
