"""Argument checks shared by every attention backend.

Every backend receives exactly the same arguments (see `llmlab.ops`), so the checks live here,
once, and run at the public boundary before any backend is called. Shapes, dtypes, devices and
contiguity are always checked. Checks that must read tensor *values* (slot ranges, sequence
lengths against the block table) run only for CPU tensors, because on a GPU they would force a
device-to-host copy.

The engine's layers do not come through these per-call checks: the step's metadata is checked
once when it is built (`check_metadata`, called by `llmlab.ops.metadata.AttentionMetadata`) and
each layer's call (`llmlab.ops.attention`) checks only its own q, k and v (`check_layer_qkv`).
"""

from __future__ import annotations

import itertools
import weakref

import numpy as np
import torch

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
# a cache may also hold fp8 e4m3 (values / a per-layer scale); q, k, v are then any float dtype
CACHE_DTYPES = FLOAT_DTYPES + (torch.float8_e4m3fn,)
BACKENDS = ("torch", "triton", "cuda", "cpu")


def _fail(name: str, value: object, expected: str) -> None:
    raise ValueError(f"{name}: got {value}, expected {expected}")


def check_backend_name(backend: object) -> str:
    if backend not in BACKENDS:
        _fail("backend", repr(backend), f"one of {', '.join(map(repr, BACKENDS))}")
    return backend


def _check_tensor(name: str, t: object, ndim: int, dtypes: tuple, layout: str) -> None:
    if not isinstance(t, torch.Tensor):
        _fail(name, type(t).__name__, f"a torch.Tensor of shape {layout}")
    if t.dim() != ndim:
        _fail(name, f"shape {tuple(t.shape)}", f"a {ndim}-D tensor {layout}")
    if t.dtype not in dtypes:
        allowed = ", ".join(str(d).replace("torch.", "") for d in dtypes)
        _fail(f"{name}.dtype", str(t.dtype).replace("torch.", ""), f"one of ({allowed})")
    if not t.is_contiguous():
        _fail(
            name,
            f"a non-contiguous tensor with strides {t.stride()}",
            "a contiguous tensor (call .contiguous() first)",
        )


def _check_same_device(names_and_tensors: list[tuple[str, torch.Tensor]]) -> None:
    first_name, first = names_and_tensors[0]
    for name, t in names_and_tensors[1:]:
        if t.device != first.device:
            _fail(f"{name}.device", t.device, f"the device of {first_name} ({first.device})")


def check_cache(key_cache: torch.Tensor, value_cache: torch.Tensor) -> tuple[int, int, int, int]:
    """Check the NHD cache pair; return (num_blocks, block_size, num_kv_heads, head_dim)."""
    layout = "[num_blocks, block_size, num_kv_heads, head_dim]"
    _check_tensor("key_cache", key_cache, 4, CACHE_DTYPES, layout)
    _check_tensor("value_cache", value_cache, 4, CACHE_DTYPES, layout)
    if value_cache.shape != key_cache.shape:
        _fail(
            "value_cache",
            f"shape {tuple(value_cache.shape)}",
            f"the shape of key_cache {tuple(key_cache.shape)}",
        )
    if value_cache.dtype != key_cache.dtype:
        _fail("value_cache.dtype", value_cache.dtype, f"the dtype of key_cache ({key_cache.dtype})")
    num_blocks, block_size, num_kv_heads, head_dim = key_cache.shape
    if num_blocks < 1 or block_size < 1 or num_kv_heads < 1 or head_dim < 1:
        _fail("key_cache", f"shape {tuple(key_cache.shape)}", "every dimension >= 1")
    return num_blocks, block_size, num_kv_heads, head_dim


def check_reshape_and_cache(key, value, key_cache, value_cache, slot_mapping) -> None:
    """Validate the arguments of `reshape_and_cache`."""
    num_blocks, block_size, num_kv_heads, head_dim = check_cache(key_cache, value_cache)
    layout = "[num_tokens, num_kv_heads, head_dim]"
    _check_tensor("key", key, 3, FLOAT_DTYPES, layout)
    _check_tensor("value", value, 3, FLOAT_DTYPES, layout)
    _check_tensor("slot_mapping", slot_mapping, 1, (torch.int64,), "[num_tokens] of int64 slots")
    expected = (key.shape[0], num_kv_heads, head_dim)
    if tuple(key.shape) != expected:
        _fail(
            "key",
            f"shape {tuple(key.shape)}",
            f"[num_tokens, num_kv_heads={num_kv_heads}, head_dim={head_dim}] to match key_cache",
        )
    if value.shape != key.shape:
        _fail("value", f"shape {tuple(value.shape)}", f"the shape of key {tuple(key.shape)}")
    if slot_mapping.shape[0] != key.shape[0]:
        _fail(
            "slot_mapping",
            f"shape {tuple(slot_mapping.shape)}",
            f"[num_tokens={key.shape[0]}] (one slot per token of key)",
        )
    for name, t in (("key", key), ("value", value)):
        _check_new_dtype(name, t, key_cache)
    _check_same_device(
        [
            ("key_cache", key_cache),
            ("value_cache", value_cache),
            ("key", key),
            ("value", value),
            ("slot_mapping", slot_mapping),
        ]
    )
    _check_slot_values(slot_mapping, num_blocks * block_size)


def _check_slot_values(slot_mapping: torch.Tensor, num_slots: int) -> None:
    if slot_mapping.device.type == "cpu" and slot_mapping.numel() > 0:
        slots = slot_mapping.numpy()  # a view: numpy's reductions of a few values are cheaper
        lo, hi = int(slots.min()), int(slots.max())
        if lo < -1 or hi >= num_slots:
            bad = lo if lo < -1 else hi
            _fail(
                "slot_mapping",
                f"a slot {bad}",
                f"-1 (skip) or a slot in [0, {num_slots}) = num_blocks * block_size",
            )


def _check_metadata_tensors(block_tables, seq_lens) -> int:
    _check_tensor(
        "block_tables", block_tables, 2, (torch.int32,), "[num_seqs, max_blocks_per_seq] of int32"
    )
    _check_tensor("seq_lens", seq_lens, 1, (torch.int32,), "[num_seqs] of int32")
    num_seqs = seq_lens.shape[0]
    if block_tables.shape[0] != num_seqs:
        _fail(
            "block_tables",
            f"shape {tuple(block_tables.shape)}",
            f"num_seqs={num_seqs} rows (one per entry of seq_lens)",
        )
    return num_seqs


def _check_table_values(block_tables, seq_lens, num_blocks: int, block_size: int) -> None:
    """Lengths fit the block table, and every block a sequence uses is a real block."""
    num_seqs = seq_lens.shape[0]
    if seq_lens.device.type == "cpu" and num_seqs > 0:
        lens, table = seq_lens.numpy(), block_tables.numpy()  # views, as in _check_slot_values
        capacity = table.shape[1] * block_size
        lo, hi = int(lens.min()), int(lens.max())
        if lo < 0 or hi > capacity:
            _fail(
                "seq_lens",
                f"a length {lo if lo < 0 else hi}",
                f"lengths in [0, {capacity}] = max_blocks_per_seq * block_size",
            )
        # Only the blocks a sequence actually uses must be valid block ids.
        needed = (lens.astype(np.int64) + block_size - 1) // block_size  # [num_seqs]
        used = np.arange(table.shape[1]) < needed[:, None]  # [num_seqs, max_blocks]
        if used.any():
            ids = table[used]
            lo_id, hi_id = int(ids.min()), int(ids.max())
            if lo_id < 0 or hi_id >= num_blocks:
                bad = lo_id if lo_id < 0 else hi_id
                _fail("block_tables", f"a used block id {bad}", f"ids in [0, {num_blocks})")


def check_attention(
    query,
    key_cache,
    value_cache,
    block_tables,
    seq_lens,
    scale,
    cu_seqlens_q=None,
    max_query_len=None,
) -> int:
    """Validate the arguments of `paged_attention_decode` (no `cu_seqlens_q`: one query row per
    sequence) or of `paged_attention_prefill`; return `max_query_len`, the most new tokens of any
    sequence, which sizes a launcher's grid (1 for decode)."""
    num_blocks, block_size, num_kv_heads, head_dim = check_cache(key_cache, value_cache)
    rows = "num_seqs" if cu_seqlens_q is None else "num_tokens"
    _check_tensor("query", query, 3, FLOAT_DTYPES, f"[{rows}, num_heads, head_dim]")
    if query.shape[2] != head_dim:
        _fail("query", f"shape {tuple(query.shape)}", f"head_dim={head_dim} to match key_cache")
    num_heads = query.shape[1]
    if num_heads < 1 or num_heads % num_kv_heads != 0:
        _fail(
            "query",
            f"num_heads={num_heads}",
            f"a positive multiple of num_kv_heads={num_kv_heads} (GQA)",
        )
    _check_new_dtype("query", query, key_cache)
    num_seqs = _check_metadata_tensors(block_tables, seq_lens)
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not scale > 0:
        _fail("scale", scale, "a positive float (usually head_dim ** -0.5)")
    _check_same_device(
        [
            ("query", query),
            ("key_cache", key_cache),
            ("value_cache", value_cache),
            ("block_tables", block_tables),
            ("seq_lens", seq_lens),
        ]
    )
    _check_table_values(block_tables, seq_lens, num_blocks, block_size)
    if cu_seqlens_q is None:
        _check_decode_rows(query, seq_lens, num_seqs)
        return 1
    return _check_prefill_rows(query, cu_seqlens_q, seq_lens, max_query_len)


def _check_decode_rows(query, seq_lens, num_seqs: int) -> None:
    if query.shape[0] != num_seqs:
        _fail(
            "query",
            f"shape {tuple(query.shape)}",
            f"num_seqs={num_seqs} rows (one query token per sequence in decode)",
        )
    if seq_lens.device.type == "cpu" and num_seqs > 0 and int(seq_lens.min()) < 1:
        _fail(
            "seq_lens",
            f"a length {int(seq_lens.min())}",
            ">= 1 (a decode query attends at least to its own key)",
        )


def _check_prefill_rows(query, cu_seqlens_q, seq_lens, max_query_len) -> int:
    """The query offsets; `max_query_len` as given, else read from `cu_seqlens_q` on the CPU,
    else bounded by the number of tokens (tiles past a sequence's end do no work), so nothing
    waits for the GPU."""
    _check_same_device([("query", query), ("cu_seqlens_q", cu_seqlens_q)])
    longest = _check_query_offsets(cu_seqlens_q, seq_lens, query.shape[0])
    num_tokens = query.shape[0]
    if max_query_len is None:
        return longest if cu_seqlens_q.device.type == "cpu" else num_tokens
    if (
        isinstance(max_query_len, bool)
        or not isinstance(max_query_len, int)
        or not (0 <= max_query_len <= num_tokens)
    ):
        _fail(
            "max_query_len",
            repr(max_query_len),
            f"an int in [0, {num_tokens}] (the most new tokens of any sequence)",
        )
    return max_query_len


def check_partition_size(partition_size: object) -> None:
    """A split-context launch's `partition_size`: None (the launcher chooses), 0 (one pass) or a
    positive multiple of 32 context positions per partition."""
    if partition_size is not None and (
        isinstance(partition_size, bool)
        or not isinstance(partition_size, int)
        or partition_size < 0
        or partition_size % 32
    ):
        _fail(
            "partition_size",
            repr(partition_size),
            "None (choose), 0 (one pass) or a positive multiple of 32",
        )


def _check_query_offsets(cu_seqlens_q, seq_lens, num_tokens: int) -> int:
    """cu_seqlens_q: [num_seqs + 1] int32 from 0 to num_tokens, no sequence with more new tokens
    than its length. Returns the longest query (CPU tensors; 0 otherwise)."""
    num_seqs = seq_lens.shape[0]
    _check_tensor("cu_seqlens_q", cu_seqlens_q, 1, (torch.int32,), "[num_seqs + 1] of int32")
    if cu_seqlens_q.shape[0] != num_seqs + 1:
        _fail(
            "cu_seqlens_q", f"shape {tuple(cu_seqlens_q.shape)}", f"[num_seqs + 1 = {num_seqs + 1}]"
        )
    if cu_seqlens_q.device.type == "cpu":
        cu = cu_seqlens_q.numpy().astype(np.int64)  # as in _check_slot_values
        q_lens = cu[1:] - cu[:-1]  # [num_seqs]
        if int(cu[0]) != 0 or int(cu[-1]) != num_tokens:
            _fail(
                "cu_seqlens_q",
                cu_seqlens_q.tolist() if num_seqs < 9 else "...",
                f"to start at 0 and end at num_tokens={num_tokens}",
            )
        if num_seqs > 0 and int(q_lens.min()) < 0:
            _fail("cu_seqlens_q", "a decreasing pair", "non-decreasing offsets")
        too_long = q_lens > seq_lens.numpy()  # [num_seqs]
        if num_seqs > 0 and too_long.any():
            s = int(np.flatnonzero(too_long)[0])
            _fail(
                "seq_lens",
                f"seq_lens[{s}]={int(seq_lens[s])}",
                f">= the query length of that sequence ({int(q_lens[s])}): "
                "seq_len = cached context + new tokens",
            )
        return int(q_lens.max()) if num_seqs > 0 else 0
    return 0


# the ids of the tensors of the last `kv_caches` found alike (an engine passes the same caches
# every step: looking at each of SmolLM2's 60 again took 50 us of a 5-10 ms batch-1 step, and
# comparing them one by one in Python 15-80 us), forgotten as soon as one of those tensors is
# freed, before its id can be reused; weak references, so the check keeps no cache alive
_CHECKED_CACHES: dict = {"ids": None, "refs": []}


def _forget_checked_caches(_ref: weakref.ref) -> None:
    _CHECKED_CACHES["ids"] = None


def _check_every_layer_cache(kv_caches, key0: torch.Tensor) -> None:
    """Every layer's two caches are contiguous tensors like layer 0's key cache; the same
    tensors as last time (by identity) pass without being looked at again."""
    tensors = tuple(itertools.chain.from_iterable(kv_caches))
    ids = tuple(map(id, tensors))
    if ids == _CHECKED_CACHES["ids"]:
        return
    for i, pair in enumerate(kv_caches):
        for t in pair:
            if (
                not isinstance(t, torch.Tensor)
                or t.shape != key0.shape
                or t.dtype != key0.dtype
                or t.device != key0.device
                or not t.is_contiguous()
            ):
                got = (
                    f"{tuple(t.shape)} {t.dtype} on {t.device}"
                    if isinstance(t, torch.Tensor)
                    else type(t).__name__
                )
                _fail(
                    f"kv_caches[{i}]",
                    got,
                    f"contiguous {tuple(key0.shape)} {key0.dtype} on {key0.device}, like layer 0's",
                )
    _CHECKED_CACHES["refs"] = [weakref.ref(t, _forget_checked_caches) for t in tensors]
    _CHECKED_CACHES["ids"] = ids


def check_metadata(
    cu_seqlens_q, seq_lens, slot_mapping, block_tables, kv_caches, max_query_len
) -> None:
    """Validate one step's attention metadata against its caches, once (values included, on
    CPU tensors): what every layer of the step may then rely on without checking again."""
    if not isinstance(kv_caches, (list, tuple)) or not kv_caches:
        _fail("kv_caches", type(kv_caches).__name__, "a non-empty list of (key_cache, value_cache)")
    first = kv_caches[0]
    if not isinstance(first, (list, tuple)) or len(first) != 2:
        _fail("kv_caches[0]", type(first).__name__, "a (key_cache, value_cache) pair")
    num_blocks, block_size, _, _ = check_cache(*first)
    key0 = first[0]
    _check_every_layer_cache(kv_caches, key0)
    num_seqs = _check_metadata_tensors(block_tables, seq_lens)
    _check_tensor("slot_mapping", slot_mapping, 1, (torch.int64,), "[num_tokens] of int64 slots")
    _check_same_device(
        [
            ("key_cache", key0),
            ("block_tables", block_tables),
            ("seq_lens", seq_lens),
            ("slot_mapping", slot_mapping),
            ("cu_seqlens_q", cu_seqlens_q),
        ]
    )
    longest = _check_query_offsets(cu_seqlens_q, seq_lens, slot_mapping.shape[0])
    if (
        isinstance(max_query_len, bool)
        or not isinstance(max_query_len, int)
        or max_query_len < (1 if num_seqs else 0)
        or (cu_seqlens_q.device.type == "cpu" and max_query_len != longest)
    ):
        _fail("max_query_len", max_query_len, f"the longest query of cu_seqlens_q ({longest})")
    _check_slot_values(slot_mapping, num_blocks * block_size)
    _check_table_values(block_tables, seq_lens, num_blocks, block_size)


def check_kv_scales(kv_scales, kv_caches) -> None:
    """An fp8 cache needs one positive (k_scale, v_scale) per layer; a float cache none."""
    fp8 = kv_caches[0][0].dtype == torch.float8_e4m3fn
    if kv_scales is None:
        if fp8:
            _fail("kv_scales", None, "one (k_scale, v_scale) per layer for an fp8 cache")
        return
    if (
        not isinstance(kv_scales, (list, tuple))
        or len(kv_scales) != len(kv_caches)
        or not all(
            isinstance(p, (list, tuple))
            and len(p) == 2
            and all(isinstance(x, float) and x > 0 for x in p)
            for p in kv_scales
        )
    ):
        _fail(
            "kv_scales",
            repr(kv_scales)[:80],
            f"{len(kv_caches)} pairs (k_scale, v_scale) of positive floats, one per layer",
        )


def _check_new_dtype(name: str, t: torch.Tensor, key_cache: torch.Tensor) -> None:
    """New q, k, v have the cache's dtype; a fp8 cache takes them in any float dtype."""
    if key_cache.dtype in FLOAT_DTYPES and t.dtype != key_cache.dtype:
        _fail(f"{name}.dtype", t.dtype, f"the cache dtype ({key_cache.dtype})")


def check_layer_qkv(query, key, value, key_cache, num_tokens: int) -> None:
    """One layer's new q, k, v against its (already checked) cache: shapes, dtypes, devices."""
    _, _, num_kv_heads, head_dim = key_cache.shape
    dtypes = (key_cache.dtype,) if key_cache.dtype in FLOAT_DTYPES else (query.dtype,)
    if dtypes[0] not in FLOAT_DTYPES:
        _fail("query.dtype", query.dtype, f"one of {FLOAT_DTYPES}")
    for name, t, layout in (
        ("query", query, "[num_tokens, num_heads, head_dim]"),
        ("key", key, "[num_tokens, num_kv_heads, head_dim]"),
        ("value", value, "[num_tokens, num_kv_heads, head_dim]"),
    ):
        _check_tensor(name, t, 3, dtypes, layout)
        if t.device != key_cache.device:
            _fail(f"{name}.device", t.device, f"the cache's device ({key_cache.device})")
        if t.shape[0] != num_tokens or t.shape[2] != head_dim:
            _fail(
                name,
                f"shape {tuple(t.shape)}",
                f"[num_tokens={num_tokens}, heads, head_dim={head_dim}] to match the metadata",
            )
    for name, t in (("key", key), ("value", value)):
        if t.shape[1] != num_kv_heads:
            _fail(name, f"shape {tuple(t.shape)}", f"num_kv_heads={num_kv_heads} of the cache")
    if query.shape[1] < 1 or query.shape[1] % num_kv_heads:
        _fail(
            "query",
            f"num_heads={query.shape[1]}",
            f"a positive multiple of num_kv_heads={num_kv_heads} (GQA)",
        )
