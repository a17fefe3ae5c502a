"""A step's flat batch as arrays: built on the host with NumPy, sent to the device in one copy.

vLLM's model runner keeps its per-step inputs (token ids, positions, slot mapping, block tables,
sequence lengths) in persistent buffers: a pinned host copy that the scheduler's output is
written into, and a device copy that one asynchronous transfer per step fills
(`vllm/v1/worker/gpu_input_batch.py`, `CpuGpuBuffer`). Two reasons, both about a GPU:

- each `torch.tensor(list).to("cuda")` is a separate transfer from pageable memory, which the
  driver copies twice and the host waits for; seven of them per step cost more than the step's
  kernels at batch 1;
- a CUDA graph replays kernels on fixed addresses, so its inputs must be written in place, into
  the very buffers it was captured on.

`StepArrays` is the host side (NumPy, no Python loop over tokens); `StagingBuffers` lays the
arrays end to end in one byte buffer and copies them to the device in one transfer. On a CPU no
copy is needed, and the arrays are used where they are.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

_ALIGN = 16  # bytes: every array starts on a boundary any dtype may be viewed at


@dataclass
class StepArrays:
    """One step's integer inputs on the host, in the layout the attention kernels read.

    input_ids [T] int64, positions [T] int64, slot_mapping [T] int64 (-1: not cached),
    cu_seqlens_q [S + 1] int32, seq_lens [S] int32, block_tables [S, W] int32,
    sample_rows [R] int64 (flat index of each row whose logits are computed).
    """

    input_ids: np.ndarray
    positions: np.ndarray
    slot_mapping: np.ndarray
    cu_seqlens_q: np.ndarray
    seq_lens: np.ndarray
    block_tables: np.ndarray
    sample_rows: np.ndarray

    FIELDS = (
        "input_ids",
        "positions",
        "slot_mapping",
        "cu_seqlens_q",
        "seq_lens",
        "block_tables",
        "sample_rows",
    )

    @property
    def max_query_len(self) -> int:
        return int(np.diff(self.cu_seqlens_q).max()) if len(self.seq_lens) else 0


def build_step_arrays(
    token_ids: list[int],
    block_ids: list[list[int]],
    starts: list[int],
    q_lens: list[int],
    sample_idx: list[int],
    block_size: int,
    pad_to: int | None = None,
    table_width: int | None = None,
) -> StepArrays:
    """The step's arrays from its flat token list: sequence s brings `q_lens[s]` tokens from
    position `starts[s]` on, its blocks `block_ids[s]`; `sample_idx` are the flat rows whose
    logits are computed.

    pad_to: for a decode-only step replayed by a CUDA graph, the batch size of the graph: the
    rows after the real ones are dummy sequences of one token (token 0 at position 0, slot -1 so
    nothing is written, length 1 over block 0), which no real row ever reads.
    table_width: block-table columns (default: the longest sequence's blocks).
    """
    num_seqs = len(starts)
    starts_a = np.asarray(starts, dtype=np.int64)  # [S]
    q_lens_a = np.asarray(q_lens, dtype=np.int64)  # [S]
    num_tokens = len(token_ids)
    if num_tokens == num_seqs:  # decode only: one token per sequence
        cu = np.arange(num_seqs + 1, dtype=np.int32)  # [S + 1]
        seq_idx = np.arange(num_seqs)
        positions = starts_a
    else:
        cu = np.zeros(num_seqs + 1, dtype=np.int32)  # [S + 1]
        np.cumsum(q_lens_a, out=cu[1:])
        seq_idx = np.repeat(np.arange(num_seqs), q_lens_a)  # [T]
        positions = starts_a[seq_idx] + np.arange(num_tokens) - cu[:-1][seq_idx]  # [T]
    table = _block_table(block_ids, table_width)  # [S, W]
    # slot of token t = block_tables[its sequence, pos // bs] * bs + pos % bs
    slots = table[seq_idx, positions // block_size].astype(np.int64) * block_size
    slots += positions % block_size  # [T]
    arrays = StepArrays(
        input_ids=np.asarray(token_ids, dtype=np.int64),
        positions=np.ascontiguousarray(positions, dtype=np.int64),
        slot_mapping=slots,
        cu_seqlens_q=cu,
        seq_lens=(starts_a + q_lens_a).astype(np.int32),
        block_tables=table,
        sample_rows=np.asarray(sample_idx, dtype=np.int64),
    )
    if pad_to is not None and pad_to > num_seqs:
        arrays = _pad_decode(arrays, pad_to)
    return arrays


def _block_table(block_ids: list[list[int]], width: int | None) -> np.ndarray:
    """[S, width] int32, row s holding `block_ids[s]` then zeros (never read: past its length)."""
    if len(block_ids) == 1 and width is None:  # one sequence: its blocks as they are
        return np.array(block_ids, dtype=np.int32)
    lens = np.fromiter(map(len, block_ids), dtype=np.int64, count=len(block_ids))  # [S]
    width = int(lens.max()) if width is None else width
    table = np.zeros((len(block_ids), width), dtype=np.int32)
    filled = np.arange(width) < lens[:, None]  # [S, W]: row-major order matches the flat list
    table[filled] = np.fromiter(
        (b for ids in block_ids for b in ids), dtype=np.int32, count=int(lens.sum())
    )
    return table


def _pad_decode(a: StepArrays, size: int) -> StepArrays:
    """A decode-only step's arrays grown to `size` sequences of one token each (see
    `build_step_arrays`'s pad_to)."""
    n = len(a.seq_lens)
    extra = size - n
    table = np.zeros((size, a.block_tables.shape[1]), dtype=np.int32)
    table[:n] = a.block_tables
    return StepArrays(
        input_ids=np.concatenate([a.input_ids, np.zeros(extra, np.int64)]),
        positions=np.concatenate([a.positions, np.zeros(extra, np.int64)]),
        slot_mapping=np.concatenate([a.slot_mapping, np.full(extra, -1, np.int64)]),
        cu_seqlens_q=np.arange(size + 1, dtype=np.int32),
        seq_lens=np.concatenate([a.seq_lens, np.ones(extra, np.int32)]),
        block_tables=table,
        sample_rows=a.sample_rows,
    )


class StagingBuffers:
    """One host byte buffer (pinned where the device is a GPU) and its device twin: a step's
    arrays are laid end to end in the host buffer and reach the device in one transfer.

    Arrays of the same sizes always land at the same offsets, so the device views a CUDA graph
    was captured on are the ones the next step of that size writes into.
    """

    def __init__(self, device: torch.device, capacity: int = 1 << 16) -> None:
        self.device = device
        self.generation = 0  # bumped when the buffers are reallocated (graphs must recapture)
        self._allocate(capacity)

    def _allocate(self, capacity: int) -> None:
        pin = self.device.type == "cuda"
        self.host = torch.empty(capacity, dtype=torch.uint8, pin_memory=pin)
        self.host_np = self.host.numpy()
        self.dev = torch.empty(capacity, dtype=torch.uint8, device=self.device)
        self.generation += 1

    def send(self, arrays: StepArrays) -> dict[str, torch.Tensor]:
        """Copy `arrays` to the device (one transfer); their device views by field name."""
        spans = []
        end = 0
        for name in StepArrays.FIELDS:
            a = getattr(arrays, name)
            start = -(-end // _ALIGN) * _ALIGN
            spans.append((name, start, a))
            end = start + a.nbytes
        if end > self.host.numel():
            self._allocate(max(end, 2 * self.host.numel()))
        for _, start, a in spans:
            self.host_np[start : start + a.nbytes] = np.ascontiguousarray(a).view(np.uint8).ravel()
        self.dev[:end].copy_(self.host[:end], non_blocking=True)
        views = {}
        for name, start, a in spans:
            dtype = _TORCH_DTYPES[a.dtype.type]
            views[name] = self.dev[start : start + a.nbytes].view(dtype).view(a.shape)
        return views


_TORCH_DTYPES = {np.int32: torch.int32, np.int64: torch.int64}


def host_tensors(arrays: StepArrays) -> dict[str, torch.Tensor]:
    """The arrays as CPU tensors sharing their memory (a CPU step needs no copy)."""
    return {name: torch.from_numpy(getattr(arrays, name)) for name in StepArrays.FIELDS}
