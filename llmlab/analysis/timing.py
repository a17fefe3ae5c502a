"""How `llmlab.analysis.hardware` times a measurement of this machine: the device asked for, the
thread counts to try, the matmul libraries to try, and the fastest of a few timed calls. The roof
a measurement reports is the best this machine reaches, whichever threads or library get there.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from llmlab.utils import best_of


def resolve_device(device: str | torch.device | None) -> torch.device:
    """`device` as a torch.device (None: the GPU where there is one), one this machine has."""
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device={str(device)!r} but no CUDA device is available; use 'cpu'")
    if dev.type not in ("cpu", "cuda"):
        raise ValueError(f"device={str(device)!r} is not supported; use 'cpu' or 'cuda'")
    return dev


def best_time(
    fn: Callable[[], Any], device: torch.device, repeats: int, budget_s: float | None = None
) -> float:
    """Fastest of `repeats` timed calls (after one warm-up), in seconds, synchronising a GPU
    after each (`llmlab.utils.best_of`, which says why the fastest)."""
    sync = torch.cuda.synchronize if device.type == "cuda" else None
    return best_of(fn, repeats, budget_s=budget_s, warmup=1, sync=sync)


def thread_counts(dev: torch.device, threads: int | None) -> list[int | None]:
    """Thread counts to try: the given one; else all threads and, on a multi-core CPU, one thread.

    On a busy machine (or a laptop with other work) one thread sometimes streams faster than all
    of them fighting over cores; the roof is the best either achieves.
    """
    if threads is not None or dev.type != "cpu" or torch.get_num_threads() == 1:
        return [threads]
    return [None, 1]


# "aten": torch's F.linear (MKL's sgemm on x86); "onednn": oneDNN's matmul (inside PyTorch);
# "cpu": the engine's CPU fast path (`llmlab.model.cpu.CpuLinear`: our C GEMV for one row,
# oneDNN on a packed weight for more)
MATMUL_LIBRARIES = ("aten", "onednn", "cpu")


def matmul_libraries(dev: torch.device, library: str | None) -> list[str]:
    if library is not None:
        if library not in MATMUL_LIBRARIES:
            raise ValueError(
                f"library={library!r}; allowed: {list(MATMUL_LIBRARIES)} or None (best)"
            )
        return [library]
    if dev.type != "cpu":
        return ["aten"]
    from llmlab.ops import backend_available
    from llmlab.ops.cpu_matmul import onednn_available

    return (
        ["aten"]
        + (["onednn"] if onednn_available() else [])
        + (["cpu"] if backend_available("cpu")[0] else [])
    )


def linear_fn(library: str, w: torch.Tensor):
    """x -> x @ wᵀ on `library` (weights prepared as that library wants them, once)."""
    if library == "aten":
        return lambda x: torch.nn.functional.linear(x, w)
    from llmlab.model.cpu import CpuLinear
    from llmlab.ops.cpu_matmul import onednn_linear

    if library == "onednn" or w.dtype != torch.float32:  # the fast path is float32 only
        return lambda x: onednn_linear(x, w)
    return CpuLinear(w)


def best_linear_time(
    x: torch.Tensor,
    w: torch.Tensor,
    dev: torch.device,
    libraries: list[str],
    threads: int | None,
    repeats: int,
) -> float:
    """Fastest `x @ wᵀ` over the matmul libraries and thread counts to try (s)."""
    best = float("inf")
    for lib in libraries:
        fn = linear_fn(lib, w)
        for count in thread_counts(dev, threads):
            with using_threads(count), torch.inference_mode():
                best = min(best, best_time(lambda: fn(x), dev, repeats))
    return best


class using_threads:
    """Temporarily set torch's intra-op thread count (None: leave it)."""

    def __init__(self, n: int | None) -> None:
        if n is not None and n < 1:
            raise ValueError(f"threads={n} must be >= 1 or None")
        self.n = n
        self.old = torch.get_num_threads()

    def __enter__(self) -> None:
        if self.n is not None:
            torch.set_num_threads(self.n)

    def __exit__(self, *exc: Any) -> None:
        torch.set_num_threads(self.old)
