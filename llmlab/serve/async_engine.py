"""`AsyncLLM`: the engine behind an asyncio server (vLLM's `v1/engine/async_llm.py` with
`EngineCore`'s busy loop folded into one task).

One task owns the `LLMEngine` and loops: apply the requests that arrived and the aborts, run
one `step()` on a worker thread (the event loop keeps serving HTTP meanwhile), hand each
request its new token through its own queue, repeat; sleep when there is nothing to do.
Requests arriving over HTTP therefore join the running batch at the next step: continuous
batching over the network. The engine is only ever touched by that task, between steps, so it
needs no lock. vLLM runs `EngineCore` in another process and talks to it over ZeroMQ; one
process and a thread is the same loop with the transport left out.

A client that goes away aborts its request: at once when no step is running, else right after
the step in flight, so its KV blocks go back to the pool before the next step is scheduled.
The waiting queue is bounded: beyond `max_waiting` requests not yet scheduled, `add_request`
raises `QueueFullError` (the server answers 503) and nothing already admitted is touched.

One request's failure inside a step ends that request alone: a request the engine finished
with an error (its sampling failed: finish reason "error") ends with `RequestFailedError`, and
one whose grammar overran its mask-fill budget in the step (`grammar_failures`) is aborted and
ends with `GrammarFailedError`, its token of that step dropped. Its batch-mates go on.

A step that raises is contained: its traceback is logged, the requests of that step end with
`StepFailedError` (their streams send an error event, then close) and are aborted, and the
loop goes on serving the others. Requests are checked at the door so that no known input can
make a step fail. If steps keep failing (`max_consecutive_failures` in a row) or the scheduler
itself raises, the engine cannot continue: every stream ends with `EngineDeadError`, and
`on_fatal` is called (the `serve` command exits non-zero, so a supervisor restarts it) — never
a live process that answers 500 forever.

A burst (a benchmark at rate inf, a batch job's clients starting together) arrives over a few
milliseconds while the event loop parses one request after another. Stepping at the first one
would prefill a part of the burst, and the rest would wait a whole prefill for the next step and
finish one step behind. So when the loop wakes from idle it first lets the arrivals settle: it
keeps yielding to the event loop until `settle_quiet_s` passes with no new request (at most
`settle_max_s`). A lone request pays the quiet spell once (1 ms by default); a running batch
never waits.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import traceback
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Callable

from llmlab.engine import LLMEngine, RequestOutput
from llmlab.sampling import SamplingParams
from llmlab.sampling.grammar import grammar_failures
from llmlab.serve.prometheus import ServerMetrics


class QueueFullError(Exception):
    """The waiting queue holds `max_waiting` requests already."""


class EngineDeadError(Exception):
    """The engine cannot continue: the server stops taking requests (and exits)."""


class StepFailedError(Exception):
    """The step this request was in raised; the request was aborted, the engine serves on."""


class RequestFailedError(Exception):
    """The engine finished this request alone with an error (its sampling failed)."""


class GrammarFailedError(Exception):
    """This request's grammar took longer than its budget to compute a mask; it was stopped
    (the grammar is the client's to fix)."""


logger = logging.getLogger("llmlab.serve")


_DONE = object()


@dataclass
class RequestStream:
    """One request's deltas, in order; iterate with `async for`. Ends after the finished one."""

    request_id: str
    num_prompt_tokens: int
    queue: asyncio.Queue = field(default_factory=asyncio.Queue)
    finished: bool = False
    num_output_tokens: int = 0
    request: Any = None  # the engine's Request, kept for a request with a grammar

    def __aiter__(self) -> AsyncIterator[RequestOutput]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[RequestOutput]:
        while True:
            item = await self.queue.get()
            if item is _DONE:
                return
            if isinstance(item, BaseException):
                raise item
            yield item


class AsyncLLM:
    """Serve an `LLMEngine` to many coroutines at once.

    engine: the engine (its settings are the batch's). max_waiting: most requests admitted but
    not yet scheduled before `add_request` refuses more. model_name: the label of `/metrics`.
    Call `start()` inside the running event loop, `await stop()` at the end.
    """

    def __init__(
        self,
        engine: LLMEngine,
        max_waiting: int = 256,
        model_name: str = "llmlab",
        settle_quiet_s: float = 0.001,
        settle_max_s: float = 0.05,
        max_consecutive_failures: int = 3,
        on_fatal: Callable[[BaseException], None] | None = None,
    ) -> None:
        if not isinstance(engine, LLMEngine):
            raise ValueError(f"engine must be an LLMEngine, got {type(engine).__name__}")
        if not isinstance(max_waiting, int) or max_waiting < 1:
            raise ValueError(f"max_waiting must be an int >= 1, got {max_waiting!r}")
        if not 0 <= settle_quiet_s <= settle_max_s <= 1:
            raise ValueError(
                "need 0 <= settle_quiet_s <= settle_max_s <= 1 (seconds), got "
                f"settle_quiet_s={settle_quiet_s!r}, settle_max_s={settle_max_s!r}"
            )
        if not isinstance(max_consecutive_failures, int) or max_consecutive_failures < 1:
            raise ValueError(
                f"max_consecutive_failures must be an int >= 1, got {max_consecutive_failures!r}"
            )
        self.engine = engine
        engine.detokenize_incrementally = True  # each delta carries its new text
        self.max_waiting = max_waiting
        self.max_consecutive_failures = max_consecutive_failures
        self.on_fatal = on_fatal
        self.consecutive_failures = 0
        self.failed_steps = 0  # steps that raised and were contained
        self.settle_quiet_s = settle_quiet_s
        self.settle_max_s = settle_max_s
        self.num_admitted = 0  # requests ever admitted (the settle loop counts)
        self.metrics = ServerMetrics(model_name)
        self.streams: dict[str, RequestStream] = {}
        self._grammar_ids: set[str] = set()  # requests with a grammar, checked after each step
        self._pending: list[tuple[str, list[int], SamplingParams, float | None]] = []
        self._pending_aborts: set[str] = set()
        self._stepping = False
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task | None = None
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self.dead: BaseException | None = None
        self.stats = engine.stats()  # a snapshot taken between steps

    # ---- life cycle -----------------------------------------------------------------------

    def start(self) -> None:
        """Start the engine loop on the running event loop."""
        if self._task is not None:
            return
        self._wake = asyncio.Event()
        self._executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="llmlab-step")
        self._task = asyncio.get_running_loop().create_task(self._run(), name="llmlab-engine")

    async def stop(self) -> None:
        """Abort everything still running and stop the loop."""
        for rid in list(self.streams):
            self.abort(rid)
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except (asyncio.CancelledError, Exception):
                pass
            self._task = None
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None
        self._apply_pending()

    # ---- requests -------------------------------------------------------------------------

    @property
    def num_pending(self) -> int:
        """Admitted during the step in flight; they join the engine right after it."""
        return len(self._pending)

    @property
    def num_waiting(self) -> int:
        """Admitted and not yet scheduled: in the engine's waiting queue or about to join it.

        From the snapshot taken between steps: a request the step in flight has just
        scheduled still counts as waiting until that step ends (at most one step's worth).
        """
        return self.stats["waiting"] + len(self._pending)

    def add_request(
        self, request_id: str, prompt_token_ids: list[int], params: SamplingParams
    ) -> RequestStream:
        """Admit a request; its tokens arrive on the returned stream.

        Raises QueueFullError when `max_waiting` requests are waiting, EngineDeadError after a
        failed step, ValueError for what the engine refuses (nothing admitted then).
        """
        if self.dead is not None:
            raise EngineDeadError(f"the engine stopped after an error: {self.dead!r}")
        if request_id in self.streams:
            raise ValueError(f"request_id {request_id!r} is already in use")
        if self.num_waiting >= self.max_waiting:
            self.metrics.rejected_queue_full += 1
            raise QueueFullError(
                f"the waiting queue is full ({self.max_waiting} requests); try again later"
            )
        stream = RequestStream(request_id, len(prompt_token_ids))
        if self._stepping:  # joins the batch right after the step in flight
            self._pending.append((request_id, prompt_token_ids, params, None))
        else:
            self._join(stream, self.engine.add_request(request_id, prompt_token_ids, params))
            self.stats = self.engine.stats()
        self.streams[request_id] = stream
        self.num_admitted += 1
        if self._wake is not None:
            self._wake.set()
        return stream

    def _join(self, stream: RequestStream, request: Any) -> None:
        """The engine took `request`: keep it with its stream when it has a grammar."""
        if request.grammar is not None:
            stream.request = request
            self._grammar_ids.add(stream.request_id)

    def _end(self, request_id: str, error: BaseException, reason: str) -> None:
        """End a request's stream with `error` (its client gets an error event)."""
        stream = self.streams.pop(request_id, None)
        self._grammar_ids.discard(request_id)
        if stream is not None:
            stream.finished = True
            self.metrics.on_finished(reason, None)
            stream.queue.put_nowait(error)

    def abort(self, request_id: str) -> None:
        """Stop a request (its client left); its blocks are freed before the next step."""
        stream = self.streams.pop(request_id, None)
        self._grammar_ids.discard(request_id)
        if stream is None:
            return
        if not stream.finished:
            stream.finished = True
            self.metrics.on_finished("abort", None)
        stream.queue.put_nowait(_DONE)
        self._pending_aborts.add(request_id)
        if not self._stepping:
            self._apply_pending()

    # ---- the loop -------------------------------------------------------------------------

    def _apply_pending(self) -> None:
        """Between steps: admit the requests that came during the last one, apply aborts."""
        pending, self._pending = self._pending, []
        for request_id, ids, params, arrival in pending:
            if request_id in self._pending_aborts:
                continue
            stream = self.streams.get(request_id)
            try:
                request = self.engine.add_request(request_id, ids, params, arrival_time=arrival)
            except ValueError as e:  # checked at the door already; kept for safety
                if stream is not None:
                    self.streams.pop(request_id, None)
                    stream.finished = True
                    stream.queue.put_nowait(e)
                continue
            if stream is not None:
                self._join(stream, request)
        for request_id in self._pending_aborts:
            self.engine.abort_request(request_id)
        self._pending_aborts.clear()
        self.stats = self.engine.stats()

    def _fail_grammars(self) -> None:
        """After a step: abort, alone, each request whose grammar failed in it (its mask fill
        overran the budget); its token of that step is dropped with it."""
        if not self._grammar_ids:
            return
        live = [self.streams[rid].request for rid in self._grammar_ids if rid in self.streams]
        self._grammar_ids = {r.request_id for r in live}
        for request_id, why in grammar_failures(live).items():
            self.engine.abort_request(request_id)
            self._end(request_id, GrammarFailedError(why), "error")
            refused = self.metrics.grammars_refused
            refused["fill_budget"] = refused.get("fill_budget", 0) + 1

    def _dispatch(self, outputs: list[RequestOutput]) -> None:
        self._fail_grammars()
        for out in outputs:
            stream = self.streams.get(out.request_id)
            if stream is None:  # aborted while the step ran
                continue
            if out.finished and out.outputs[0].finish_reason == "error":
                why = out.outputs[0].stop_reason or "its sampling failed"
                self._end(out.request_id, RequestFailedError(f"the request failed: {why}"), "error")
                continue
            n = len(out.outputs[0].token_ids)
            self.metrics.on_tokens(
                n, stream.num_output_tokens == 0, stream.num_prompt_tokens, out.metrics
            )
            stream.num_output_tokens += n
            stream.queue.put_nowait(out)
            if out.finished:
                stream.finished = True
                self.metrics.on_finished(out.outputs[0].finish_reason or "stop", out.metrics)
                stream.queue.put_nowait(_DONE)
                del self.streams[out.request_id]
                self._grammar_ids.discard(out.request_id)

    async def _settle(self) -> None:
        """Yield to the event loop until arrivals pause for `settle_quiet_s` (see the top)."""
        loop = asyncio.get_running_loop()
        start = last = loop.time()
        seen = self.num_admitted
        while True:
            await asyncio.sleep(0)  # one turn of the loop: sockets read, handlers run
            now = loop.time()
            if self.num_admitted != seen:
                seen, last = self.num_admitted, now
            if now - last >= self.settle_quiet_s or now - start >= self.settle_max_s:
                return

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            self._apply_pending()
            if not self.engine.has_unfinished_requests():
                self._wake.clear()
                await self._wake.wait()
                await self._settle()
                continue
            self._stepping = True
            self.engine.last_scheduler_output = None
            try:
                outputs = await loop.run_in_executor(self._executor, self.engine.step)
            except asyncio.CancelledError:
                self._stepping = False
                raise
            except Exception as e:  # noqa: BLE001 (contained below, or fatal)
                self._stepping = False
                if not self._contain(e):
                    return
                continue
            self._stepping = False
            self.consecutive_failures = 0
            self._dispatch(outputs)

    def _contain(self, error: Exception) -> bool:
        """After a step raised: fail and abort that step's requests, keep serving. False (and
        the engine is dead) when the scheduler itself failed or steps keep failing."""
        self.failed_steps += 1
        self.consecutive_failures += 1
        sched_out = self.engine.last_scheduler_output
        if sched_out is None or self.consecutive_failures >= self.max_consecutive_failures:
            why = (
                "the scheduler raised"
                if sched_out is None
                else f"{self.consecutive_failures} steps in a row raised"
            )
            logger.critical(
                "engine step failed and the engine cannot continue (%s):\n%s",
                why,
                "".join(traceback.format_exception(error)),
            )
            self._fail_all(error)
            return False
        ids = [r.request_id for r in sched_out.requests]
        logger.error(
            "engine step failed; aborting the %d request(s) of that step (%s) and serving on:\n%s",
            len(ids),
            ", ".join(ids[:8]),
            "".join(traceback.format_exception(error)),
        )
        failure = StepFailedError(
            f"the engine step that ran this request failed: {error!r}; the request was aborted"
        )
        for request_id in ids:
            self.engine.abort_request(request_id)
            self._end(request_id, failure, "abort")
        self.stats = self.engine.stats()
        return True

    def _fail_all(self, error: BaseException) -> None:
        self.dead = error
        for stream in self.streams.values():
            stream.finished = True
            stream.queue.put_nowait(EngineDeadError(f"the engine step failed: {error!r}"))
        self.streams.clear()
        if self.on_fatal is not None:
            self.on_fatal(error)
