"""Grammar compiles for the server: in worker processes, each within a time limit, with a probe
of what following the grammar costs, so that no client's grammar can stall the others.

xgrammar compiles a grammar in one C++ call, and a thread running it cannot be stopped: a JSON
schema whose `pattern` is `(.{1,50}){1,50}` kept a thread at 100 % CPU for minutes after its
client left, and no signal reached it. A process can be killed. vLLM compiles regexes the same
way (`compile_regex_with_timeout` in `vllm/v1/structured_output/utils.py`: reusable worker
processes, SIGKILL past the timeout); here every kind of grammar goes through the workers.

- `GrammarCompilePool.compile(spec)`: a free worker (503 when none frees up within the time
  limit), the compile, the probe; the compiled grammar comes back serialized (xgrammar's
  `serialize_json`) and is rebuilt here. A compile past `compile_timeout_s`, or whose client
  left (the awaiting task is cancelled), kills its worker at once; a fresh one starts.
- The probe: the worker follows the grammar `probe_tokens` tokens, each step taking the
  longest token the grammar allows (an ambiguous grammar gets slower as its text grows, so the
  text grows fastest), and times every mask fill. One slower than `probe_fill_s` refuses the
  grammar (400): `(.{1,50}){1,50}` takes 1.2 s for its first mask here, `(.{1,1000}){1,1000}`
  is fast for 11 tokens and then takes 0.14, 0.7, 1.3, 2.6 s. What the probe cannot see (a
  grammar that turns slow only later) the engine's per-step fill budget stops
  (`StructuredOutputManager.fill_budget_s`).
- A worker runs at a lower CPU priority (nice 10: on a machine with few cores the engine's
  steps come first), compiles with its address space bounded (`worker_memory_mb` more than
  it starts with), and is replaced when its resident memory passes `worker_rss_mb`. It dies
  with the server, even one killed by SIGKILL.

The server makes one pool on its first grammar (a worker imports xgrammar and torch, a few
seconds and about 400 MB each) and closes it when it stops.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

from llmlab.sampling.grammar import compile_spec
from llmlab.sampling.structured_output import (
    StructuredOutputsParams,
    make_freed_memory_returnable,
    release_freed_memory,
    resident_bytes,
    resident_cost,
)

WORKER_STARTUP_TIMEOUT_S = 120.0  # importing xgrammar and torch, on a busy machine


@dataclass
class GrammarLimits:
    """What a client's grammar may cost the server.

    compile_timeout_s: seconds a compile (and its probe) may take, and a request may wait for
    a free worker. workers: compile processes. probe_tokens, probe_fill_s: the probe's length
    and the slowest mask fill it accepts. fill_budget_s: the engine's per-step budget for one
    request's mask. cache_mb: compiled grammars kept for reuse (vLLM's VLLM_XGRAMMAR_CACHE_MB,
    512). worker_memory_mb: address space a compile may add. worker_rss_mb: a worker above it
    is replaced after its compile.
    """

    compile_timeout_s: float = 10.0
    workers: int = 2
    probe_tokens: int = 32
    probe_fill_s: float = 0.05
    fill_budget_s: float = 0.1
    cache_mb: int = 512
    worker_memory_mb: int = 4096
    worker_rss_mb: int = 1536

    def __post_init__(self) -> None:
        for name in ("compile_timeout_s", "probe_fill_s", "fill_budget_s"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not value > 0:
                raise ValueError(f"GrammarLimits.{name} must be a number > 0, got {value!r}")
        for name in ("workers", "probe_tokens", "cache_mb", "worker_memory_mb", "worker_rss_mb"):
            value = getattr(self, name)
            low = 0 if name in ("probe_tokens", "cache_mb") else 1
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise ValueError(f"GrammarLimits.{name} must be an int >= {low}, got {value!r}")


class GrammarRefused(Exception):
    """The grammar cannot be served (the client's to fix: a 400). why: "invalid" (it does not
    compile), "compile_timeout", "compile_memory" (its compile died), "too_slow" (the probe)."""

    def __init__(self, message: str, why: str) -> None:
        super().__init__(message)
        self.why = why


class GrammarBusy(Exception):
    """No compile worker could take the grammar in time (try again: a 503)."""


class _Cancelled(Exception):
    """The request that waited for this compile went away."""


# ---- the worker process ------------------------------------------------------------------------


def worker_main(read_fd: int, write_fd: int, parent_pid: int) -> None:
    """A compile worker's loop: the tokenizer first, then (spec, probe_tokens, probe_fill_s)
    jobs, each answered ("ok", serialized grammar, rss MB) or ("refused", message, why)."""
    _die_with(parent_pid)
    os.nice(10)  # the engine's steps first: a compile waits for a free core, a token does not
    inbox, outbox = Connection(read_fd, writable=False), Connection(write_fd, readable=False)
    info_json, memory_mb = inbox.recv()
    import torch
    import xgrammar as xgr

    torch.set_num_threads(1)
    info = xgr.TokenizerInfo.deserialize_json(info_json)
    compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)
    lengths = torch.zeros(info.vocab_size, dtype=torch.long)  # [V] bytes per token
    lengths[: len(info.decoded_vocab)] = torch.tensor([len(b) for b in info.decoded_vocab])
    _bound_address_space(memory_mb)
    outbox.send(("ready",))
    while True:
        try:
            spec, probe_tokens, probe_fill_s = inbox.recv()
        except (EOFError, OSError):
            return
        try:
            compiled = compile_spec(compiler, spec)
        except ValueError as e:
            outbox.send(("refused", str(e), "invalid"))
            continue
        slow = probe_cost(compiled, lengths, info.stop_token_ids, probe_tokens, probe_fill_s)
        if slow is not None:
            step, took = slow
            outbox.send(("refused", _too_slow(spec, step, took, probe_fill_s), "too_slow"))
            continue
        outbox.send(("ok", compiled.serialize_json(), resident_bytes() / 2**20))


def probe_cost(
    compiled: Any, lengths: Any, stop_ids: list[int], steps: int, limit_s: float
) -> tuple[int, float] | None:
    """Follow `compiled` for `steps` tokens, each the longest one it allows (`lengths` [V]:
    bytes per token); the first (tokens so far, CPU seconds) whose mask fill took longer than
    `limit_s`, or None when every fill was quick."""
    import torch
    import xgrammar as xgr

    vocab = lengths.shape[0]
    matcher = xgr.GrammarMatcher(compiled)
    bitmask = xgr.allocate_token_bitmask(1, vocab)  # [1, ceil(V / 32)] int32
    shifts = torch.arange(32, dtype=torch.int32)
    for step in range(steps):
        if matcher.is_terminated():
            return None
        t0 = time.thread_time()  # CPU seconds: what the grammar costs, however busy the machine
        matcher.fill_next_token_bitmask(bitmask, 0)
        took = time.thread_time() - t0
        if took > limit_s:
            return step, took
        allowed = ((bitmask[0].unsqueeze(1) >> shifts) & 1).flatten()[:vocab].bool()  # [V]
        allowed[stop_ids] = False
        if not allowed.any():  # complete: only the end may come
            return None
        if not matcher.accept_token(int(torch.where(allowed, lengths, -1).argmax())):
            return None
    return None


def _too_slow(spec: StructuredOutputsParams, step: int, took: float, limit_s: float) -> str:
    return (
        f"StructuredOutputsParams.{spec.kind}: this grammar is too slow to follow: computing the "
        f"tokens allowed after {step} tokens took {took:.2f} s, and this server allows "
        f"{limit_s:g} s (a grammar with nested repetition such as (.{{1,50}}){{1,50}} is "
        "ambiguous, and slower at every token)"
    )


def _die_with(parent_pid: int) -> None:
    """SIGKILL this process when the server dies, even by SIGKILL (Linux). Set here rather
    than before exec: a preexec_fn makes Popen fork the whole server, holding the GIL."""
    if sys.platform == "linux":
        import ctypes

        PR_SET_PDEATHSIG = 1
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent_pid:  # the server died before that
        os._exit(1)


def _bound_address_space(extra_mb: int) -> None:
    """Let this process map at most `extra_mb` more than now (a compile that would take all
    the memory fails instead); Linux only."""
    try:
        import resource

        with open("/proc/self/status") as f:
            vm_kb = next(int(line.split()[1]) for line in f if line.startswith("VmSize:"))
        limit = (vm_kb << 10) + (extra_mb << 20)
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    except (OSError, ValueError, StopIteration, ImportError):
        pass


# ---- the server's side -----------------------------------------------------------------------


class GrammarWorker:
    """One compile process and its two pipes; started at once, ready when it says so."""

    def __init__(self, info_json: str, memory_mb: int) -> None:
        self.info_json, self.memory_mb = info_json, memory_mb
        self.proc: subprocess.Popen | None = None
        self.ready = False
        self.start()

    def start(self) -> None:
        job_r, job_w = os.pipe()
        out_r, out_w = os.pipe()
        code = (
            "import sys; from llmlab.serve.grammar_compiler import worker_main; "
            "worker_main(*map(int, sys.argv[1:]))"
        )
        self.proc = subprocess.Popen(
            [sys.executable, "-c", code, str(job_r), str(out_w), str(os.getpid())],
            pass_fds=(job_r, out_w),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            env={**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"},
        )
        os.close(job_r)
        os.close(out_w)
        self.jobs = Connection(job_w, readable=False)
        self.results = Connection(out_r, writable=False)
        self.ready = False

    @property
    def pid(self) -> int | None:
        return None if self.proc is None else self.proc.pid

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def ask(self, job: tuple, timeout_s: float, cancel: threading.Event) -> tuple:
        """Send `job`, wait for the answer; kills the worker past `timeout_s` (GrammarRefused)
        or when `cancel` is set (_Cancelled)."""
        if not self.alive():
            self.start()
        if not self.ready:  # its tokenizer (1.6 MB: a pipe takes it once the child reads)
            self.jobs.send((self.info_json, self.memory_mb))
            if self._wait(WORKER_STARTUP_TIMEOUT_S, cancel, starting=True) != ("ready",):
                raise GrammarBusy("the grammar compiler did not start")
            self.ready = True
        self.jobs.send(job)
        return self._wait(timeout_s, cancel)

    def _wait(self, timeout_s: float, cancel: threading.Event, starting: bool = False) -> tuple:
        deadline = time.monotonic() + timeout_s
        while True:
            if cancel.is_set():
                self.kill()
                raise _Cancelled()
            left = deadline - time.monotonic()
            if left <= 0:
                self.kill()
                if starting:
                    raise GrammarBusy("the grammar compiler did not start in time")
                raise GrammarRefused(
                    f"compiling it took longer than {timeout_s:g} s", "compile_timeout"
                )
            try:
                if self.results.poll(min(left, 0.05)):
                    return self.results.recv()
            except (EOFError, OSError):
                pass
            if self.proc is None:  # killed from another thread: the server is stopping
                raise GrammarBusy("the grammar compiler was stopped")
            if not self.alive():
                code = self.proc.returncode
                self.kill()
                raise GrammarRefused(
                    f"the grammar compiler stopped on it (exit code {code}): it needs more "
                    "memory than this server gives a compile",
                    "compile_memory",
                )

    def kill(self) -> None:
        """SIGKILL the process (now, whatever it is doing) and close the pipes."""
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
        if proc is not None:
            proc.wait(5)
            for conn in (self.jobs, self.results):
                conn.close()
        self.ready = False


class GrammarCompilePool:
    """Compile workers for one tokenizer (`info`: xgrammar's TokenizerInfo), used from the
    server's event loop. Call `close()` when the server stops."""

    def __init__(self, info: Any, limits: GrammarLimits) -> None:
        import xgrammar as xgr

        self.xgr, self.info, self.limits = xgr, info, limits
        make_freed_memory_returnable()  # so that an evicted grammar's memory goes back
        info_json = info.serialize_json()
        self.workers = [
            GrammarWorker(info_json, limits.worker_memory_mb) for _ in range(limits.workers)
        ]
        self._idle: asyncio.Queue[GrammarWorker] = asyncio.Queue()
        for w in self.workers:
            self._idle.put_nowait(w)
        self._threads = concurrent.futures.ThreadPoolExecutor(
            limits.workers, thread_name_prefix="llmlab-grammar"
        )
        self.closed = False

    async def compile(self, spec: StructuredOutputsParams) -> tuple[Any, int]:
        """`spec` compiled and probed in a worker: xgrammar's CompiledGrammar, and the bytes
        of resident memory it took here once rebuilt (`resident_cost`). Raises
        GrammarRefused (its message names the field) or GrammarBusy. Cancelling the awaiting
        task kills the worker's compile at once."""
        limits = self.limits
        try:
            worker = await asyncio.wait_for(self._idle.get(), limits.compile_timeout_s)
        except asyncio.TimeoutError:
            raise GrammarBusy(
                f"every grammar compiler stayed busy for {limits.compile_timeout_s:g} s"
            ) from None
        loop = asyncio.get_running_loop()
        cancel = threading.Event()
        job = (spec, limits.probe_tokens, limits.probe_fill_s)
        try:
            return await loop.run_in_executor(self._threads, self._run, loop, worker, job, cancel)
        except asyncio.CancelledError:
            cancel.set()  # the thread kills the worker within 50 ms
            raise

    def _run(
        self, loop: Any, worker: GrammarWorker, job: tuple, cancel: threading.Event
    ) -> tuple[Any, int]:
        """On a pool thread: one job on `worker`, then the worker back to the idle queue."""
        try:
            answer = worker.ask(job, self.limits.compile_timeout_s, cancel)
            if answer[0] != "ok":
                raise GrammarRefused(answer[1], answer[2])
            if answer[2] > self.limits.worker_rss_mb:
                worker.kill()  # started again on its next job
            serialized = [answer[1]]
            del answer
            return self._rebuild(serialized)
        finally:
            try:
                loop.call_soon_threadsafe(self._idle.put_nowait, worker)
            except RuntimeError:  # the event loop has closed: the server is gone
                self.closed = True
            if self.closed:
                worker.kill()

    def _rebuild(self, serialized: list[str]) -> tuple[Any, int]:
        """The grammar a worker sent (`serialized`'s one item, which is dropped here: 12 MB of
        JSON for a large regex, back to the system too) and its resident cost."""
        made = resident_cost(
            lambda: self.xgr.CompiledGrammar.deserialize_json(serialized[0], self.info)
        )
        serialized.clear()
        release_freed_memory()
        return made

    def worker_pids(self) -> list[int]:
        return [w.pid for w in self.workers if w.alive()]

    def close(self) -> None:
        """Kill every worker (a compile in flight too) and stop the pool's threads."""
        self.closed = True
        for w in self.workers:
            w.kill()
        self._threads.shutdown(wait=False, cancel_futures=True)
