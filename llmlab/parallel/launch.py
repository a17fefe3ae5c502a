"""Start real `torch.distributed` processes on this machine and collect what each rank returns.

`launch(fn, world_size, args)` starts `world_size` fresh processes (`fn` must be a module-level
function, importable by name, so that it works from a notebook kernel too), joins them into one
process group over a free localhost port, calls `fn(rank, world_size, *args)` in each and returns
the ranks' results in rank order.

A distributed job has two ways to go wrong that a single process does not: one rank raises
while the others wait for it inside a collective forever, or one rank simply never arrives.
The launcher turns both into a `RuntimeError` that names the rank, within `timeout` seconds,
and kills the remaining processes, so a test or a notebook never hangs.

On Linux the ranks come from multiprocessing's fork server, which imports torch and the model
code once (`PRELOAD`) and forks a clean process per rank: a rank then starts without the second
or two that importing torch costs. Elsewhere each rank is a new interpreter ("spawn").
"""

from __future__ import annotations

import contextlib
import os
import pickle
import queue
import socket
import sys
import time
import traceback
from datetime import timedelta
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

BACKENDS = ("gloo", "nccl")
# what the fork server imports once for every rank it starts
PRELOAD = ["torch", "torch.distributed", "llmlab.model", "llmlab.parallel.tp", "llmlab.parallel.pp"]


def _context():
    """The multiprocessing context ranks start from: the fork server on Linux, else spawn."""
    if sys.platform.startswith("linux"):
        ctx = mp.get_context("forkserver")
        ctx.set_forkserver_preload(PRELOAD)  # read when the server starts, the first time only
        return ctx
    return mp.get_context("spawn")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank_device(rank: int, backend: str) -> torch.device:
    """The device a rank computes on: its own GPU under NCCL, the CPU under gloo."""
    if backend == "nccl":
        return torch.device("cuda", rank % torch.cuda.device_count())
    return torch.device("cpu")


def _worker(
    rank: int,
    world_size: int,
    port: int,
    backend: str,
    timeout: float,
    fn: Callable[..., Any],
    args: tuple,
    results: Any,
) -> None:
    """Body of one spawned rank: join the group, run `fn`, report ("ok"|"error", rank, payload)."""
    torch.set_num_threads(1)  # one core per rank: ranks must not fight over the same cores
    try:
        if backend == "nccl":
            torch.cuda.set_device(rank_device(rank, backend))
        dist.init_process_group(
            backend,
            init_method=f"tcp://127.0.0.1:{port}",
            rank=rank,
            world_size=world_size,
            # outlive the launcher's own deadline, which names the ranks
            timeout=timedelta(seconds=timeout + 60),
        )
        out = fn(rank, world_size, *args)
        # plain pickle copies tensors by value (a torch.multiprocessing queue would hand over
        # shared-memory handles that die with this process)
        results.put(("ok", rank, pickle.dumps(out)))
    except BaseException as e:  # noqa: BLE001 - every failure must reach the parent
        results.put(("error", rank, f"{type(e).__name__}: {e}\n{traceback.format_exc()}"))
    finally:
        with contextlib.suppress(Exception):
            if dist.is_initialized():
                dist.destroy_process_group()


def launch(
    fn: Callable[..., Any],
    world_size: int,
    args: tuple = (),
    *,
    timeout: float = 120.0,
    backend: str = "gloo",
) -> list[Any]:
    """Run `fn(rank, world_size, *args)` in `world_size` fresh processes; return results by rank.

    Raises RuntimeError naming the rank when a rank raises, dies, or does not finish within
    `timeout` seconds (then every remaining process is killed).
    """
    if not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be an int >= 1, got {world_size!r}")
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if not timeout > 0:
        raise ValueError(f"timeout must be > 0 seconds, got {timeout!r}")
    if backend == "nccl" and torch.cuda.device_count() < world_size:
        raise ValueError(
            f"backend 'nccl' needs one GPU per rank: world_size={world_size}, "
            f"GPUs={torch.cuda.device_count()}; use backend='gloo'"
        )
    ctx = _context()
    results = ctx.Queue()
    procs = _start_ranks(ctx, fn, world_size, args, backend, timeout, results)
    ok = False
    try:
        done = _collect(procs, results, world_size, timeout)
        ok = True
    finally:
        for p in procs:
            if ok:
                p.join(timeout=5.0)
            if p.is_alive():
                p.kill()
            p.join(timeout=5.0)
        results.close()
    return [done[r] for r in range(world_size)]


def _start_ranks(ctx, fn, world_size: int, args: tuple, backend: str, timeout: float, results):
    """A started process per rank, each rendezvousing on one free port."""
    port = free_port()
    procs = []
    # children inherit the environment at start: one OpenMP thread each (set before torch loads;
    # the fork server, started at the first launch, keeps the environment it started with)
    saved = os.environ.get("OMP_NUM_THREADS")
    os.environ["OMP_NUM_THREADS"] = "1"
    try:
        for rank in range(world_size):
            p = ctx.Process(
                target=_worker,
                name=f"llmlab-rank{rank}",
                daemon=True,
                args=(rank, world_size, port, backend, timeout, fn, args, results),
            )
            p.start()
            procs.append(p)
    finally:
        if saved is None:
            os.environ.pop("OMP_NUM_THREADS", None)
        else:
            os.environ["OMP_NUM_THREADS"] = saved
    return procs


def _collect(procs, results, world_size: int, timeout: float) -> dict[int, Any]:
    """Every rank's result by rank, or a RuntimeError naming the rank that failed, died
    silently, or had not finished by `timeout`."""
    deadline = time.monotonic() + timeout
    done: dict[int, Any] = {}
    while len(done) < world_size:
        try:
            status, rank, payload = results.get(timeout=0.2)
        except queue.Empty:
            status = None
        if status == "ok":
            done[rank] = pickle.loads(payload)
            continue
        if status == "error":
            # a rank that died silently is the cause; the error of its peer is the symptom
            time.sleep(0.5)
            dead = _silently_dead(procs, done, results, exclude=rank)
            if dead is not None:
                raise RuntimeError(
                    f"rank {dead} of {world_size} died with exit code "
                    f"{procs[dead].exitcode} without reporting a result "
                    f"(then rank {rank} failed: {payload.splitlines()[0]})"
                )
            raise RuntimeError(f"rank {rank} of {world_size} failed: {payload}")
        dead = _silently_dead(procs, done, results)
        if dead is not None:
            time.sleep(0.5)  # a message in flight may still arrive
            if results.empty():
                raise RuntimeError(
                    f"rank {dead} of {world_size} died with exit code "
                    f"{procs[dead].exitcode} without reporting a result"
                )
        if time.monotonic() > deadline:
            missing = [r for r in range(world_size) if r not in done]
            raise RuntimeError(
                f"timed out after {timeout:g} s: rank(s) {missing} of {world_size} did "
                f"not finish (hung, or waiting in a collective for a rank that hung)"
            )
    return done


def _silently_dead(procs, done: dict, results, exclude: int | None = None) -> int | None:
    """The first rank whose process has exited without its result having been read."""
    for rank, p in enumerate(procs):
        if rank != exclude and rank not in done and p.exitcode is not None and p.exitcode != 0:
            return rank
    return None


# --- small module-level targets, used by the tests and the notebook to show the launcher -----


def all_reduce_sum_of_ranks(rank: int, world_size: int) -> float:
    """Every rank contributes rank + 1; everyone gets the sum (world_size·(world_size+1)/2)."""
    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t)
    return float(t.item())


def crash_on_rank(rank: int, world_size: int, bad_rank: int) -> float:
    """Rank `bad_rank` raises before the collective the others are waiting in (a test aid)."""
    if rank == bad_rank:
        raise ValueError(f"deliberate failure on rank {rank}")
    return all_reduce_sum_of_ranks(rank, world_size)


def exit_on_rank(rank: int, world_size: int, bad_rank: int) -> float:
    """Rank `bad_rank` dies abruptly, as a segfault or the OOM killer would (a test aid)."""
    if rank == bad_rank:
        os._exit(3)
    return all_reduce_sum_of_ranks(rank, world_size)


def hang_on_rank(rank: int, world_size: int, bad_rank: int) -> float:
    """Rank `bad_rank` never reaches the collective (a test aid for the launcher's timeout)."""
    if rank == bad_rank:
        while True:
            time.sleep(1.0)
    return all_reduce_sum_of_ranks(rank, world_size)


def split_evenly(n: int, parts: int) -> list[range]:
    """n items into `parts` contiguous ranges whose sizes differ by at most one (first ones larger).

    Shared by the tensor-parallel plan (KV heads, MLP columns) and the pipeline plan (layers).
    """
    base, extra = divmod(n, parts)
    out, start = [], 0
    for r in range(parts):
        size = base + (1 if r < extra else 0)
        out.append(range(start, start + size))
        start += size
    return out
