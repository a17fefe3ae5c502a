"""A model's weight matrices moved onto 2 MB pages, in the order the CPU fast path reads them.

A batch-1 decode step streams every weight once, so its speed is the speed the cores read
memory at. Linux hands out memory in 4 KB pages: 270 MB of bf16 weights are 66,000 pages, far
more than the CPU's TLB holds, and the hardware prefetchers stop at each 4 KB page's end. A
transparent huge page ("THP") maps 2 MB at once. Where the kernel's THP setting is `madvise`
(a common default), only memory that asks for it (`madvise(MADV_HUGEPAGE)`) gets such pages.
Measured on a 2-core Zen 4: the GEMVs of 30 bf16 [3072, 576] matrices read 20.6-21.0 GB/s from
4 KB pages and 23.2-23.5 GB/s from 2 MB pages (see `bench decode_profile` for the whole step).

`rehome_weights(model)` copies the matrices of `model`'s linear layers and embedding into one
anonymous mapping that asked for huge pages, and points each parameter (or int8 buffer) at its
place there: every holder of a parameter, a tied LM head too, sees the new memory, and the old
memory is freed. q, k, v lie next to each other, as do gate and up, so `model.cpu`'s
`stack_linears` uses them in place instead of copying them again. `rehome_tensors` does the
same for any list of tensors. An `Arena` reserves a second buffer for copies not made yet:
`model.cpu.cpu_model` packs its copies (which its steps stream from one row on) straight
into it, in the order a step reads them. Where the platform has no `MADV_HUGEPAGE` or the
kernel's THP setting is `never`, nothing moves and the copies go to ordinary memory.
"""

from __future__ import annotations

import mmap
from pathlib import Path

import torch
from torch import nn

HUGE_PAGE = 2 * 2**20  # bytes: x86-64's and most arm64 kernels' THP size
ALIGN = 64  # bytes between two matrices' starts: a cache line
THP_SETTING = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def huge_pages_available() -> bool:
    """Whether asking for huge pages can give any: Linux with THP not set to `never`."""
    if not hasattr(mmap, "MADV_HUGEPAGE"):
        return False
    try:
        return "[never]" not in THP_SETTING.read_text()
    except OSError:
        return False


def huge_page_buffer(nbytes: int) -> torch.Tensor:
    """`nbytes` of zeroed memory [nbytes] uint8 that starts on a 2 MB boundary and asked for
    huge pages before any page of it was touched. The tensor keeps the mapping alive."""
    if nbytes <= 0:
        raise ValueError(f"nbytes: got {nbytes}, expected a positive number of bytes")
    # private and anonymous (a shared one would be shmem, which this setting does not cover);
    # page-aligned, not 2 MB-aligned: the buffer starts at the first 2 MB boundary inside
    pages = -(-nbytes // HUGE_PAGE) * HUGE_PAGE  # the last page whole: it can be huge too
    region = mmap.mmap(-1, pages + HUGE_PAGE, flags=mmap.MAP_PRIVATE)
    address = torch.frombuffer(region, dtype=torch.uint8, count=1).data_ptr()
    start = -address % HUGE_PAGE
    region.madvise(mmap.MADV_HUGEPAGE, start, pages)
    return torch.frombuffer(region, dtype=torch.uint8, count=nbytes, offset=start)


def huge_page_tensors(specs: list[tuple[tuple[int, ...], torch.dtype]]) -> list[torch.Tensor]:
    """Zeroed tensors of the (shape, dtype) `specs`, one after another in one huge-page buffer,
    each starting on a cache line."""
    sizes = [torch.Size(shape).numel() * dtype.itemsize for shape, dtype in specs]
    starts = [0]
    for size in sizes:
        starts.append(starts[-1] + -(-size // ALIGN) * ALIGN)
    buffer = huge_page_buffer(starts[-1])
    return [
        buffer[start : start + size].view(dtype).view(shape)
        for (shape, dtype), start, size in zip(specs, starts, sizes)
    ]


def weight_matrices(model: nn.Module) -> list[torch.Tensor]:
    """The model's 2-D weights in the order the fast path reads them, each distinct storage
    once (a tied LM head is its embedding): per layer q, k, v, o, gate, up, down, then the LM
    head and the embedding."""
    order = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
    found = []
    for layer in model.layers:
        parts = {**dict(layer.self_attn.named_children()), **dict(layer.mlp.named_children())}
        found += [getattr(parts.get(name), "weight", None) for name in order]
    found += [getattr(model.lm_head, "weight", None), getattr(model.embed_tokens, "weight", None)]
    matrices, seen = [], set()
    for t in found:
        if t is not None and t.dim() == 2 and t.device.type == "cpu" and t.data_ptr() not in seen:
            seen.add(t.data_ptr())  # the same matrix twice (tied weights) moves once
            matrices.append(t)
    return matrices


def _one_buffer(tensors: list[torch.Tensor]) -> bool:
    """Whether the tensors already share one storage that starts on a huge page boundary."""
    storages = {t.untyped_storage().data_ptr() for t in tensors}
    return len(storages) == 1 and storages.pop() % HUGE_PAGE == 0


def rehome_weights(model: nn.Module) -> int:
    """Move `model`'s weight matrices (a `LlamaModel`'s layers, embedding and LM head) into one
    huge-page buffer, in place; returns the bytes moved (0 where huge pages are unavailable).
    Values, dtypes and shapes are unchanged; a matrix shared by two modules stays shared."""
    return rehome_tensors(weight_matrices(model))


def rehome_tensors(tensors: list[torch.Tensor]) -> int:
    """Move `tensors` (distinct CPU tensors) into one huge-page buffer, one after another in
    this order, in place (each tensor object keeps its values and now reads the new memory);
    returns the bytes moved, 0 where huge pages are unavailable or they are there already.
    Raw pointers taken from them before (a C plan's) must be taken again."""
    if not huge_pages_available() or not tensors or _one_buffer(tensors):
        return 0
    places = huge_page_tensors([(tuple(t.shape), t.dtype) for t in tensors])
    with torch.no_grad():
        for t, place in zip(tensors, places):
            place.copy_(t)
            t.data = place  # every module holding `t` now reads `place`
    return sum(t.numel() * t.element_size() for t in tensors)


class Arena:
    """Tensors laid one after another, each on a cache line, in one huge-page buffer of
    `nbytes`: room reserved for copies not made yet (the fast path packs its weights straight
    into it, in the order a step reads them). The bytes are an upper bound: pages never written
    cost no memory. Where huge pages are unavailable there is no buffer and `take` gives None."""

    def __init__(self, nbytes: int):
        self.buffer = huge_page_buffer(nbytes) if huge_pages_available() else None
        self.used = 0

    def take(self, numel: int, dtype: torch.dtype) -> torch.Tensor | None:
        """The next `numel` elements of `dtype` (zeros), or None where they do not fit (the
        caller then allocates ordinary memory)."""
        start = -(-self.used // ALIGN) * ALIGN
        end = start + numel * dtype.itemsize
        if self.buffer is None or end > self.buffer.numel():
            return None
        self.used = end
        return self.buffer[start:end].view(dtype)
