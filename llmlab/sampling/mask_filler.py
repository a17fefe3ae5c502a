"""Mask fills with a time budget, on a helper thread (see `llmlab.sampling.structured_output`).

An ambiguous grammar can take seconds to fill one mask, and a fill cannot be interrupted (one
C++ call). `MaskFiller` runs a step's fills one after another on its own thread and waits for
each at most its budget: a fill that overruns is left to finish there, the step goes on, and
its request's grammar is failed.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable


@dataclass
class _FillJob:
    calls: list[Callable[[], None]]
    next: int = 0  # the first call not yet started
    current: int | None = None  # the call running now
    clock: Any = None  # the CPU clock of the thread running it (None: wall time only)
    started: float = 0.0  # that clock's reading when it started
    started_wall: float = 0.0  # time.perf_counter() then
    late: list[int] = field(default_factory=list)
    error: BaseException | None = None

    def over(self, budget_s: float) -> float:
        """How far (0: not yet, else > 0) the current call is past its budget: `budget_s` CPU
        seconds of its thread where the system tells them (a fill waiting for a core on a busy
        machine is not charged for the wait), or WALL_FACTOR times that in wall time (whatever
        the load, a step waits no longer); wall time alone elsewhere."""
        wall = time.perf_counter() - self.started_wall
        cpu = wall if self.clock is None else _clock_now(self.clock) - self.started
        return max(cpu - budget_s, wall - WALL_FACTOR * budget_s, 0.0)


WALL_FACTOR = 5  # a fill's budget in wall time, in multiples of its CPU budget


def _thread_clock() -> Any:
    """The calling thread's CPU clock id (Linux), or None."""
    try:
        return time.pthread_getcpuclockid(threading.get_ident())
    except (AttributeError, OSError):
        return None


def _clock_now(clock: Any) -> float:
    if clock is not None:
        try:
            return time.clock_gettime(clock)
        except OSError:  # the thread has ended
            pass
    return time.perf_counter()


class MaskFiller:
    """Runs mask fills in order on a helper thread, each within a time budget.

    A fill is one C++ call that cannot be interrupted. The caller waits; when a fill passes
    its budget, the caller records it as late and hands the rest of the batch to a fresh
    thread; the stuck one finishes its fill alone (xgrammar releases the GIL meanwhile) and
    exits. The budget is in CPU seconds of the filling thread (on Linux): what the grammar
    costs, not how busy the machine is; and, so that a step never waits long, five times that
    in wall time. `overrunning`: fills still running past their budget."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._job: _FillJob | None = None
        self._thread: threading.Thread | None = None
        self.overrunning = 0

    def run(self, calls: list[Callable[[], None]], budget_s: float) -> list[int]:
        """Run `calls` in order; returns the indices of those that passed `budget_s` (left
        running). An exception raised by a call is raised here, after the batch."""
        job = _FillJob(calls)
        with self._cond:
            self._job = job
            self._start_thread()
            self._cond.notify_all()
            while job.next < len(calls):
                if job.current is not None and job.over(budget_s):
                    self._leave_behind(job)
                    continue
                self._cond.wait(budget_s / 4)
            self._job = None
        if job.error is not None:
            raise job.error
        return job.late

    def _leave_behind(self, job: _FillJob) -> None:
        """The running call passed its budget: skip it, and let a fresh thread go on."""
        job.late.append(job.current)
        job.next, job.current = job.current + 1, None
        self.overrunning += 1
        self._thread = None  # the stuck thread sees this and exits after its call
        if job.next < len(job.calls):
            self._start_thread()
            self._cond.notify_all()

    def _start_thread(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._work, name="llmlab-mask", daemon=True)
            self._thread.start()

    def _work(self) -> None:
        me, clock = threading.current_thread(), _thread_clock()
        while True:
            with self._cond:
                while self._thread is me and not self._has_work():
                    self._cond.wait()
                if self._thread is not me:
                    return
                job = self._job
                i = job.current = job.next
                job.clock, job.started = clock, _clock_now(clock)
                job.started_wall = time.perf_counter()
            error = None
            try:
                job.calls[i]()
            except BaseException as e:  # noqa: BLE001 (raised in the caller's thread)
                error = e
            with self._cond:
                if job.current != i:  # left behind: it passed its budget
                    self.overrunning -= 1
                    return
                job.current, job.next = None, i + 1
                job.error = job.error or error
                if job.next == len(job.calls):
                    self._cond.notify_all()

    def _has_work(self) -> bool:
        job = self._job
        return job is not None and job.current is None and job.next < len(job.calls)
