"""Argument checks shared by every attention backend.

Every backend receives exactly the same arguments (see `llmlab.ops`), so the checks live here,
once, and run at the public boundary before any backend is called. Shapes, dtypes, devices and
contiguity are always checked. Checks that must read tensor *values* (slot ranges, sequence
lengths against the block table) run only for CPU tensors, because on a GPU they would force a
device-to-host copy on every layer of every step.
"""

from __future__ import annotations

import torch

from llmlab.ops._memo import LastValues

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)

# The value checks read metadata every layer of a step shares: a set of values that passed is
# not checked again (see `llmlab.ops._memo`).
_ATTENTION_PASSED = LastValues()
_PREFILL_PASSED = LastValues()
_SLOTS_PASSED = LastValues()


def _fail(name: str, value: object, expected: str) -> None:
    raise ValueError(f"{name}: got {value}, expected {expected}")


def _check_tensor(name: str, t: object, ndim: int, dtypes: tuple, layout: str) -> None:
    if not isinstance(t, torch.Tensor):
        _fail(name, type(t).__name__, f"a torch.Tensor of shape {layout}")
    if t.dim() != ndim:
        _fail(name, f"shape {tuple(t.shape)}", f"a {ndim}-D tensor {layout}")
    if t.dtype not in dtypes:
        allowed = ", ".join(str(d).replace("torch.", "") for d in dtypes)
        _fail(f"{name}.dtype", str(t.dtype).replace("torch.", ""), f"one of ({allowed})")
    if not t.is_contiguous():
        _fail(name, f"a non-contiguous tensor with strides {t.stride()}",
              "a contiguous tensor (call .contiguous() first)")


def _check_same_device(names_and_tensors: list[tuple[str, torch.Tensor]]) -> None:
    first_name, first = names_and_tensors[0]
    for name, t in names_and_tensors[1:]:
        if t.device != first.device:
            _fail(f"{name}.device", t.device, f"the device of {first_name} ({first.device})")


def check_cache(key_cache: torch.Tensor, value_cache: torch.Tensor) -> tuple[int, int, int, int]:
    """Check the NHD cache pair; return (num_blocks, block_size, num_kv_heads, head_dim)."""
    layout = "[num_blocks, block_size, num_kv_heads, head_dim]"
    _check_tensor("key_cache", key_cache, 4, FLOAT_DTYPES, layout)
    _check_tensor("value_cache", value_cache, 4, FLOAT_DTYPES, layout)
    if value_cache.shape != key_cache.shape:
        _fail("value_cache", f"shape {tuple(value_cache.shape)}",
              f"the shape of key_cache {tuple(key_cache.shape)}")
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
        _fail("key", f"shape {tuple(key.shape)}",
              f"[num_tokens, num_kv_heads={num_kv_heads}, head_dim={head_dim}] to match key_cache")
    if value.shape != key.shape:
        _fail("value", f"shape {tuple(value.shape)}", f"the shape of key {tuple(key.shape)}")
    if slot_mapping.shape[0] != key.shape[0]:
        _fail("slot_mapping", f"shape {tuple(slot_mapping.shape)}",
              f"[num_tokens={key.shape[0]}] (one slot per token of key)")
    for name, t in (("key", key), ("value", value)):
        if t.dtype != key_cache.dtype:
            _fail(f"{name}.dtype", t.dtype, f"the cache dtype ({key_cache.dtype})")
    _check_same_device([("key_cache", key_cache), ("value_cache", value_cache), ("key", key),
                        ("value", value), ("slot_mapping", slot_mapping)])
    num_slots = num_blocks * block_size
    if (slot_mapping.device.type == "cpu" and slot_mapping.numel() > 0
            and not _SLOTS_PASSED.get((num_slots,), slot_mapping)):
        lo, hi = int(slot_mapping.min()), int(slot_mapping.max())
        if lo < -1 or hi >= num_slots:
            bad = lo if lo < -1 else hi
            _fail("slot_mapping", f"a slot {bad}",
                  f"-1 (skip) or a slot in [0, {num_slots}) = num_blocks * block_size")
        _SLOTS_PASSED.put((num_slots,), (slot_mapping,), True)


def _check_attention_common(query, key_cache, value_cache, block_tables, seq_lens,
                            scale, query_layout: str) -> tuple[int, int, int, int, int]:
    num_blocks, block_size, num_kv_heads, head_dim = check_cache(key_cache, value_cache)
    _check_tensor("query", query, 3, FLOAT_DTYPES, query_layout)
    if query.shape[2] != head_dim:
        _fail("query", f"shape {tuple(query.shape)}", f"head_dim={head_dim} to match key_cache")
    num_heads = query.shape[1]
    if num_heads < 1 or num_heads % num_kv_heads != 0:
        _fail("query", f"num_heads={num_heads}",
              f"a positive multiple of num_kv_heads={num_kv_heads} (GQA)")
    if query.dtype != key_cache.dtype:
        _fail("query.dtype", query.dtype, f"the cache dtype ({key_cache.dtype})")
    _check_tensor("block_tables", block_tables, 2, (torch.int32,),
                  "[num_seqs, max_blocks_per_seq] of int32")
    _check_tensor("seq_lens", seq_lens, 1, (torch.int32,), "[num_seqs] of int32")
    num_seqs = seq_lens.shape[0]
    if block_tables.shape[0] != num_seqs:
        _fail("block_tables", f"shape {tuple(block_tables.shape)}",
              f"num_seqs={num_seqs} rows (one per entry of seq_lens)")
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not scale > 0:
        _fail("scale", scale, "a positive float (usually head_dim ** -0.5)")
    _check_same_device([("query", query), ("key_cache", key_cache), ("value_cache", value_cache),
                        ("block_tables", block_tables), ("seq_lens", seq_lens)])
    if (seq_lens.device.type == "cpu" and num_seqs > 0
            and not _ATTENTION_PASSED.get((num_blocks, block_size), block_tables, seq_lens)):
        capacity = block_tables.shape[1] * block_size
        lo, hi = int(seq_lens.min()), int(seq_lens.max())
        if lo < 0 or hi > capacity:
            _fail("seq_lens", f"a length {lo if lo < 0 else hi}",
                  f"lengths in [0, {capacity}] = max_blocks_per_seq * block_size")
        # Only the blocks a sequence actually uses must be valid block ids.
        needed = (seq_lens.long() + block_size - 1) // block_size  # [num_seqs]
        used = torch.arange(block_tables.shape[1]) < needed[:, None]  # [num_seqs, max_blocks]
        if bool(used.any()):
            ids = block_tables[used]
            if int(ids.min()) < 0 or int(ids.max()) >= num_blocks:
                bad = int(ids.min()) if int(ids.min()) < 0 else int(ids.max())
                _fail("block_tables", f"a used block id {bad}", f"ids in [0, {num_blocks})")
        _ATTENTION_PASSED.put((num_blocks, block_size), (block_tables, seq_lens), True)
    return num_seqs, num_heads, num_kv_heads, head_dim, block_size


def check_decode(query, key_cache, value_cache, block_tables, seq_lens, scale) -> None:
    """Validate the arguments of `paged_attention_decode`."""
    num_seqs, *_ = _check_attention_common(query, key_cache, value_cache, block_tables, seq_lens,
                                           scale, "[num_seqs, num_heads, head_dim]")
    if query.shape[0] != num_seqs:
        _fail("query", f"shape {tuple(query.shape)}",
              f"num_seqs={num_seqs} rows (one query token per sequence in decode)")
    if seq_lens.device.type == "cpu" and num_seqs > 0 and int(seq_lens.min()) < 1:
        _fail("seq_lens", f"a length {int(seq_lens.min())}",
              ">= 1 (a decode query attends at least to its own key)")


def check_prefill(query, key_cache, value_cache, block_tables, cu_seqlens_q, seq_lens,
                  scale) -> None:
    """Validate the arguments of `paged_attention_prefill`."""
    num_seqs, *_ = _check_attention_common(query, key_cache, value_cache, block_tables, seq_lens,
                                           scale, "[num_tokens, num_heads, head_dim]")
    _check_tensor("cu_seqlens_q", cu_seqlens_q, 1, (torch.int32,), "[num_seqs + 1] of int32")
    if cu_seqlens_q.shape[0] != num_seqs + 1:
        _fail("cu_seqlens_q", f"shape {tuple(cu_seqlens_q.shape)}",
              f"[num_seqs + 1 = {num_seqs + 1}]")
    _check_same_device([("query", query), ("cu_seqlens_q", cu_seqlens_q)])
    if cu_seqlens_q.device.type == "cpu" and not _PREFILL_PASSED.get(
            (query.shape[0],), cu_seqlens_q, seq_lens):
        cu = cu_seqlens_q.long()
        q_lens = cu[1:] - cu[:-1]  # [num_seqs]
        if int(cu[0]) != 0 or int(cu[-1]) != query.shape[0]:
            _fail("cu_seqlens_q", cu_seqlens_q.tolist() if num_seqs < 9 else "...",
                  f"to start at 0 and end at num_tokens={query.shape[0]}")
        if num_seqs > 0 and int(q_lens.min()) < 0:
            _fail("cu_seqlens_q", "a decreasing pair", "non-decreasing offsets")
        if num_seqs > 0 and bool((q_lens > seq_lens.long()).any()):
            s = int(torch.nonzero(q_lens > seq_lens.long())[0, 0])
            _fail("seq_lens", f"seq_lens[{s}]={int(seq_lens[s])}",
                  f">= the query length of that sequence ({int(q_lens[s])}): "
                  "seq_len = cached context + new tokens")
        _PREFILL_PASSED.put((query.shape[0],), (cu_seqlens_q, seq_lens), True)
