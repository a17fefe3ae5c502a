"""CUDA graphs for decode steps: a step's hundreds of kernel launches replayed by one call.

A decode step of a small model is bound by the host on a GPU: launching 300-1,300 kernels from
Python takes longer than running them. A CUDA graph records the launches of one forward once
(`torch.cuda.graph`), and `replay()` submits them all in one call. What a graph cannot do is
change shapes or addresses, so (as vLLM's `CUDAGraphWrapper` and nano-vllm's `capture_cudagraph`
do):

- the inputs live in persistent buffers (`StagingBuffers`: every step writes its arrays there,
  at the offsets the graph was captured on);
- a graph is captured per batch size *bucket* (1, 2, 4, 8, 16, 24, ...); a step of 5 requests
  replays the graph of 8, its last 3 rows dummy sequences that write nothing (slot -1);
- only decode-only steps replay (one token per request; their shapes depend on the batch size
  alone). Prefill and mixed steps run eagerly, as does everything with `enforce_eager=True`.

The logits and the sampler run after the replay, eagerly, on the rows that are real.

`capture` takes the function that records a graph as an argument: on a GPU it is
`torch.cuda.graph`; the tests pass one that records nothing and replays eagerly, so the
buffers, buckets and padding are checked on a CPU too (`EagerGraph`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch


def capture_sizes(max_num_seqs: int) -> list[int]:
    """The batch sizes that get a graph: 1, 2, 4, then every multiple of 8 up to max_num_seqs
    (vLLM's default list, cut at the engine's cap), and max_num_seqs itself."""
    sizes = [s for s in (1, 2, 4) if s <= max_num_seqs]
    sizes += list(range(8, max_num_seqs + 1, 8))
    if sizes[-1] != max_num_seqs:
        sizes.append(max_num_seqs)
    return sizes


@dataclass
class _Captured:
    graph: Any  # torch.cuda.CUDAGraph, or an EagerGraph in the CPU tests
    hidden: torch.Tensor  # [size, hidden]: the graph's output buffer, rewritten by each replay


class EagerGraph:
    """Stands in for `torch.cuda.CUDAGraph` on a CPU: `replay()` runs the captured function
    again on the same buffers. Lets the tests check everything a graph depends on (the
    persistent buffers, the buckets, the padding rows) without a GPU."""

    def __init__(self) -> None:
        self.fn: Callable[[], torch.Tensor] | None = None
        self.out: torch.Tensor | None = None

    def replay(self) -> None:
        self.out.copy_(self.fn())


class DecodeGraphs:
    """One captured forward per batch-size bucket.

    forward(arrays_views) -> hidden runs the model on the device views of a step's arrays
    (`StagingBuffers.send`); `sizes` are the buckets (`capture_sizes`).
    """

    def __init__(self, sizes: list[int]) -> None:
        self.sizes = sorted(sizes)
        self.captured: dict[int, _Captured] = {}
        self.generation = -1  # the staging buffers' generation the graphs were captured on

    def bucket(self, num_seqs: int) -> int | None:
        """The smallest captured size that holds `num_seqs` rows (None: too many)."""
        for s in self.sizes:
            if s >= num_seqs:
                return s
        return None

    def capture(
        self,
        dummy_views: Callable[[int], dict[str, torch.Tensor]],
        forward: Callable[[dict[str, torch.Tensor]], torch.Tensor],
        generation: int,
        use_cuda_graphs: bool = True,
    ) -> None:
        """Record `forward(views)` once per size, largest first so the smaller graphs reuse its
        memory pool. `dummy_views(size)` writes a decode step of `size` dummy rows into the
        staging buffers and returns their device views: the addresses every later step of that
        size writes to."""
        self.captured.clear()
        pool = None
        for size in reversed(self.sizes):
            views = dummy_views(size)
            forward(views)  # warm-up: compiles kernels, allocates their workspaces
            if use_cuda_graphs:
                torch.cuda.synchronize()
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool):
                    hidden = forward(views)
                pool = graph.pool()
            else:
                graph = EagerGraph()
                graph.fn = lambda views=views: forward(views)
                hidden = graph.out = forward(views).clone()
            self.captured[size] = _Captured(graph, hidden)
        if use_cuda_graphs:
            torch.cuda.synchronize()
        self.generation = generation

    def replay(self, size: int) -> torch.Tensor:
        """Replay the graph of `size` on whatever the staging buffers now hold; its output
        buffer [size, hidden] (valid until the next replay)."""
        captured = self.captured[size]
        captured.graph.replay()
        return captured.hidden
