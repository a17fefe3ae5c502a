"""The server's connections, before a request reaches the app: uvicorn's h11 protocol with a
header timeout and a cap on open connections (`guarded_protocol`), the loggers a flood of
connections makes talk rate-limited (`RateLimitFilter`), the open-file limit raised, and the
command-line options that bound them (`connection_options`); `uvicorn_config` puts them together.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

DEFAULT_LIMIT_CONCURRENCY = 512  # connections + requests in flight before uvicorn says 503
DEFAULT_MAX_CONNECTIONS = 1024  # open connections before new ones are closed at once
DEFAULT_TIMEOUT_KEEP_ALIVE = 5.0  # seconds an idle keep-alive connection stays open
DEFAULT_TIMEOUT_HEADER = 10.0  # seconds a request's headers may take to arrive
# seconds a stopping server (SIGTERM) lets requests in flight finish before cancelling them
DEFAULT_TIMEOUT_GRACEFUL_SHUTDOWN = 3.0
# `uvicorn_config`'s keywords, each set by the command-line option of its name
CONNECTION_LIMITS = (
    "limit_concurrency",
    "max_connections",
    "timeout_keep_alive",
    "timeout_header",
    "timeout_graceful_shutdown",
)


def guarded_protocol(timeout_header: float, max_connections: int) -> type:
    """uvicorn's h11 protocol with what it lacks against slow or piling-up clients: a request's
    headers must arrive within `timeout_header` seconds of the connection opening or of the
    previous response (a slowloris client that trickles a byte now and then is closed; uvicorn's
    keep-alive timer restarts on every byte), and beyond `max_connections` open connections a
    new one is closed at once, before the process runs out of file descriptors."""
    import asyncio

    from uvicorn.protocols.http.h11_impl import H11Protocol

    class GuardedH11Protocol(H11Protocol):
        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            self._header_timer = None
            if len(self.connections) >= max_connections:
                transport.abort()
                return
            super().connection_made(transport)
            self._arm_header_timer()

        def _arm_header_timer(self) -> None:
            self._armed_cycle = self.cycle
            if self._header_timer is not None:
                self._header_timer.cancel()
            self._header_timer = self.loop.call_later(timeout_header, self._header_timed_out)

        def _header_timed_out(self) -> None:
            self._header_timer = None
            if self.cycle is self._armed_cycle and not self.transport.is_closing():
                self.transport.close()  # no request began in time

        def handle_events(self) -> None:
            super().handle_events()
            if self._header_timer is not None and self.cycle is not self._armed_cycle:
                self._header_timer.cancel()  # a request's headers are in
                self._header_timer = None

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if (
                not self.transport.is_closing()
                and self.cycle is not None
                and (self._header_timer is None)
            ):
                self._arm_header_timer()  # the next request's headers, in time too

        def connection_lost(self, exc: Exception | None) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None
            if self.transport is not None:
                super().connection_lost(exc)

    return GuardedH11Protocol


class RateLimitFilter:
    """A logging filter: at most `burst` records per message per `period` seconds, then one
    line saying how many were left out (so a storm of accept errors cannot flood the log)."""

    def __init__(self, period: float = 10.0, burst: int = 3) -> None:
        self.period, self.burst = period, burst
        self.windows: dict[str, list[float | int]] = {}

    def filter(self, record: Any) -> bool:
        key = str(record.msg)[:80]
        now = time.monotonic()
        window = self.windows.setdefault(key, [now, 0, 0])  # start, passed, dropped
        if now - window[0] > self.period:
            if window[2]:
                record.msg = f"{record.msg} (and {window[2]} more like it left out)"
            window[:] = [now, 0, 0]
        if window[1] < self.burst:
            window[1] += 1
            return True
        window[2] += 1
        return False


def quiet_storms() -> None:
    """Rate-limit the loggers that a flood of connections makes talk (asyncio's accept errors,
    uvicorn's invalid-request warnings, the server's own); once per process."""
    import logging

    for name in ("asyncio", "uvicorn.error", "llmlab.serve"):
        logger = logging.getLogger(name)
        if not any(isinstance(f, RateLimitFilter) for f in logger.filters):
            logger.addFilter(RateLimitFilter())


def uvicorn_config(
    app: Any,
    host: str,
    port: int,
    log_level: str = "warning",
    limit_concurrency: int | None = DEFAULT_LIMIT_CONCURRENCY,
    max_connections: int = DEFAULT_MAX_CONNECTIONS,
    timeout_keep_alive: float = DEFAULT_TIMEOUT_KEEP_ALIVE,
    timeout_header: float = DEFAULT_TIMEOUT_HEADER,
    timeout_graceful_shutdown: float = DEFAULT_TIMEOUT_GRACEFUL_SHUTDOWN,
) -> Any:
    """uvicorn's settings for the server: its caps and timeouts, the guarded protocol."""
    import uvicorn

    for name, value in (
        ("max_connections", max_connections),
        ("limit_concurrency", limit_concurrency or 1),
    ):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    for name, value in (
        ("timeout_keep_alive", timeout_keep_alive),
        ("timeout_header", timeout_header),
        ("timeout_graceful_shutdown", timeout_graceful_shutdown),
    ):
        if not isinstance(value, (int, float)) or not value > 0:
            raise ValueError(f"{name} must be a number of seconds > 0, got {value!r}")
    quiet_storms()
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level=log_level,
        access_log=False,
        http=guarded_protocol(timeout_header, max_connections),
        limit_concurrency=limit_concurrency,
        timeout_keep_alive=timeout_keep_alive,
        timeout_graceful_shutdown=timeout_graceful_shutdown,
    )


def raise_file_limit() -> int:
    """Raise this process's open-file limit to its hard limit; returns the soft limit now."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError):
            pass
    return soft


def connection_options(ap: argparse.ArgumentParser) -> None:
    """The options bounding connections and their timeouts (uvicorn's, `uvicorn_config`)."""
    ap.add_argument(
        "--limit-concurrency",
        type=int,
        default=DEFAULT_LIMIT_CONCURRENCY,
        help="connections and requests in flight before new requests get 503",
    )
    ap.add_argument(
        "--max-connections",
        type=int,
        default=DEFAULT_MAX_CONNECTIONS,
        help="open connections before new ones are closed at once",
    )
    ap.add_argument(
        "--timeout-keep-alive",
        type=float,
        default=DEFAULT_TIMEOUT_KEEP_ALIVE,
        help="seconds an idle keep-alive connection stays open",
    )
    ap.add_argument(
        "--timeout-header",
        type=float,
        default=DEFAULT_TIMEOUT_HEADER,
        help="seconds a request's headers may take to arrive",
    )
    ap.add_argument(
        "--timeout-graceful-shutdown",
        type=float,
        default=DEFAULT_TIMEOUT_GRACEFUL_SHUTDOWN,
        help="seconds a stopping server lets requests in flight finish before cancelling them",
    )


def connection_limits(args: argparse.Namespace) -> dict[str, Any]:
    """The values of `connection_options` in parsed `args`, as `uvicorn_config`'s keywords."""
    return {name: getattr(args, name) for name in CONNECTION_LIMITS}
