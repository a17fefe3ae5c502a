"""The client side of `python -m llmlab bench serve`: what one request sends and records, the
stream read off the socket and stamped as it arrives, and a run of requests at their arrival
times (`run_requests`); the workload (`build_requests`, the goodput SLOs) and a run's figures
under vLLM's result keys (`summary_dict`). `llmlab.bench.serve` drives it and reports.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import time
from dataclasses import dataclass, field
from typing import Any, Iterable

from llmlab.analysis import metrics
from llmlab.analysis.metrics import BenchmarkSummary, Timeline

# ---- one request: what the client records ----------------------------------------------------


@dataclass(frozen=True)
class BenchRequest:
    """What to send: a prompt (text, or token ids for /v1/completions) and the output length."""

    prompt: str | list[int]
    max_tokens: int
    prompt_len: int = 0  # when known (token-id prompts); else from usage


@dataclass
class RequestRecord:
    """What came back for one request (times from `time.perf_counter()`)."""

    sent_at: float
    chunk_times: list[float] = field(default_factory=list)
    text: str = ""
    prompt_tokens: int | None = None
    completion_tokens: int | None = None  # from usage
    finish_reason: str | None = None
    done: bool = False  # saw `data: [DONE]`
    error: str | None = None
    status: int | None = None

    @property
    def success(self) -> bool:
        return self.error is None and self.done and bool(self.chunk_times)

    @property
    def output_tokens(self) -> int:
        return (
            self.completion_tokens if self.completion_tokens is not None else len(self.chunk_times)
        )

    def timeline(self, prompt_len: int = 0) -> Timeline:
        """This request as `llmlab.analysis.metrics` sees it: sent → each chunk; tokens from usage."""
        return Timeline(
            arrival_time=self.sent_at,
            token_times=tuple(self.chunk_times),
            num_prompt_tokens=self.prompt_tokens or prompt_len,
            num_tokens=max(self.output_tokens, len(self.chunk_times)),
        )


def record_line(record: RequestRecord, t: float, line: str, chat: bool) -> None:
    """Feed one line of a server-sent-event stream that arrived at time `t`.

    A `data:` line with a non-empty `choices` is an output chunk (stamped, as vLLM's client
    does, whether or not its text is empty); one with `usage` gives the token counts;
    `data: [DONE]` ends the stream. Other lines (blank, comments, `event:`) are ignored.
    """
    if not line.startswith("data:"):
        return
    payload = line[5:].strip()
    if payload == "[DONE]":
        record.done = True
        return
    data = json.loads(payload)
    if "error" in data:
        record.error = str(data["error"].get("message", data["error"]))
        return
    choices = data.get("choices")
    if choices:
        record.chunk_times.append(t)
        c = choices[0]
        piece = (c.get("delta") or {}).get("content") if chat else c.get("text")
        record.text += piece or ""
        if c.get("finish_reason"):
            record.finish_reason = c["finish_reason"]
    usage = data.get("usage")
    if usage:
        record.prompt_tokens = usage.get("prompt_tokens")
        record.completion_tokens = usage.get("completion_tokens")


def record_stream(
    sent_at: float, timed_lines: Iterable[tuple[float, str]], chat: bool = False
) -> RequestRecord:
    """A `RequestRecord` from a recorded stream: (arrival time, line) pairs."""
    record = RequestRecord(sent_at=sent_at)
    for t, line in timed_lines:
        record_line(record, t, line, chat)
    return record


def summarize_records(
    records: list[RequestRecord],
    duration: float,
    slo: dict[str, float] | None = None,
    prompt_lens: list[int] | None = None,
) -> BenchmarkSummary:
    """`llmlab.analysis.metrics.summarize` over the successful requests (vLLM leaves failed ones out)."""
    lens = prompt_lens or [0] * len(records)
    good = [r.timeline(n) for r, n in zip(records, lens) if r.success]
    if not good:
        errors = sorted({r.error or "no [DONE]" for r in records})
        raise RuntimeError(f"no request succeeded; errors: {errors[:5]}")
    return metrics.summarize(good, duration=duration, slo=slo)


# ---- sending ----------------------------------------------------------------------------------


def request_payload(req: BenchRequest, model: str, chat: bool, ignore_eos: bool) -> dict[str, Any]:
    """The JSON body vLLM's client sends: greedy, streamed, usage in the last chunk."""
    body: dict[str, Any] = {
        "model": model,
        "max_tokens": req.max_tokens,
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True},
        "ignore_eos": ignore_eos,
    }
    if chat:
        if not isinstance(req.prompt, str):
            raise ValueError("the chat endpoint takes text prompts, not token ids")
        body["messages"] = [{"role": "user", "content": req.prompt}]
    else:
        body["prompt"] = req.prompt
    return body


def timed_lines(timed_pieces: Iterable[tuple[float, bytes]]) -> Iterable[tuple[float, str]]:
    """Split received bytes into lines, each stamped with the arrival time of its last byte.

    A last line without its newline (a stream cut off) is incomplete and left out.
    """
    buffer = b""
    for t, piece in timed_pieces:
        buffer += piece
        *lines, buffer = buffer.split(b"\n")
        for line in lines:
            yield t, line.rstrip(b"\r").decode()


def dechunk(timed_pieces: Iterable[tuple[float, bytes]]) -> list[tuple[float, bytes]]:
    """HTTP/1.1 chunked transfer encoding removed, piece by piece: each piece's payload bytes
    keep the piece's arrival time. Stops at the last (zero-size) chunk."""
    out: list[tuple[float, bytes]] = []
    buffer, state, remaining = b"", "size", 0
    for t, piece in timed_pieces:
        buffer += piece
        payload = bytearray()
        while state != "end":
            if state == "size":
                eol = buffer.find(b"\r\n")
                if eol < 0:
                    break
                remaining = int(buffer[:eol].split(b";")[0], 16)
                buffer = buffer[eol + 2 :]
                state = "data" if remaining else "end"
            elif state == "data":
                take = buffer[:remaining]
                payload += take
                buffer, remaining = buffer[len(take) :], remaining - len(take)
                if remaining:
                    break
                state = "crlf"
            else:  # the CRLF that closes a chunk's data
                if len(buffer) < 2:
                    break
                buffer, state = buffer[2:], "size"
        if payload:
            out.append((t, bytes(payload)))
    return out


async def stream_post(url: str, body: dict[str, Any]) -> tuple[int, list[tuple[float, bytes]]]:
    """POST `body` as JSON over HTTP/1.1 (one connection, closed after); (status, the response
    body as (arrival time, bytes) pieces, chunked encoding removed).

    A lean client on purpose: on the server's own machine every microsecond the client spends
    per chunk is taken from the server's cores (httpx spent ~100 µs per chunk here). It reads
    whatever has arrived, stamps it and keeps it; parsing waits until the stream has ended.
    """
    from urllib.parse import urlsplit

    u = urlsplit(url)
    if u.scheme not in ("http", "https") or not u.hostname:
        raise ValueError(f"url: expected http(s)://host[:port]/path, got {url!r}")
    port = u.port or (443 if u.scheme == "https" else 80)
    data = json.dumps(body).encode()
    reader, writer = await asyncio.open_connection(
        u.hostname, port, ssl=True if u.scheme == "https" else None
    )
    try:
        path = (u.path or "/") + (f"?{u.query}" if u.query else "")
        writer.write(
            f"POST {path} HTTP/1.1\r\nHost: {u.hostname}:{port}\r\n"
            "Content-Type: application/json\r\nAccept: text/event-stream\r\n"
            f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n".encode()
            + data
        )
        await writer.drain()
        head = await reader.readuntil(b"\r\n\r\n")
        status = int(head.split(b" ", 2)[1])
        chunked = b"transfer-encoding: chunked" in head.lower()
        pieces = []
        while piece := await reader.read(1 << 16):
            pieces.append((time.perf_counter(), piece))
    finally:
        writer.close()
    return status, (dechunk(pieces) if chunked else pieces)


async def send_one(url: str, body: dict[str, Any], chat: bool, timeout: float) -> RequestRecord:
    """POST one streamed request; stamp every piece of the stream as it arrives.

    The pieces are parsed after the stream ends, not as they come: the times are the same,
    and a client on the server's own machine then takes less CPU from it during the run.
    """
    record = RequestRecord(sent_at=time.perf_counter())
    try:
        record.status, pieces = await asyncio.wait_for(stream_post(url, body), timeout)
    except Exception as e:  # noqa: BLE001 (a failed request is data, not a crash)
        record.error = f"{type(e).__name__}: {e}"
        return record
    if record.status != 200:
        text = b"".join(p for _, p in pieces).decode(errors="replace")
        record.error = f"HTTP {record.status}: {text[:300]}"
        return record
    for t, line in timed_lines(pieces):
        record_line(record, t, line, chat)
    return record


async def run_requests(
    base_url: str,
    requests: list[BenchRequest],
    model: str,
    *,
    endpoint: str = "/v1/completions",
    request_rate: float = math.inf,
    burstiness: float = 1.0,
    max_concurrency: int | None = None,
    ignore_eos: bool = True,
    seed: int = 0,
    timeout: float = 300.0,
    max_seconds: float = 900.0,
    progress: bool = True,
) -> tuple[list[RequestRecord], float]:
    """Send `requests` at their arrival times; (records in request order, duration in s).

    Arrivals: `metrics.arrival_times(n, request_rate, burstiness, seed)`. A request waits for
    a free slot when `max_concurrency` are in flight (its clock starts when it is sent). The
    whole run is bounded by `max_seconds`: requests still out then are cancelled and failed.
    """
    chat = "chat" in endpoint
    url = base_url.rstrip("/") + endpoint
    offsets = metrics.arrival_times(len(requests), request_rate, burstiness, seed)
    limit = max_concurrency or len(requests)
    slots = asyncio.Semaphore(limit)
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(
            total=len(requests), desc=f"rate {request_rate:g} req/s", unit="req", dynamic_ncols=True
        )
    start = time.perf_counter()

    async def one(i: int) -> RequestRecord:
        await asyncio.sleep(max(0.0, start + float(offsets[i]) - time.perf_counter()))
        async with slots:
            rec = await send_one(
                url, request_payload(requests[i], model, chat, ignore_eos), chat, timeout
            )
        if bar is not None:
            bar.update(1)
        return rec

    tasks = [asyncio.ensure_future(one(i)) for i in range(len(requests))]
    done, pending = await asyncio.wait(tasks, timeout=max_seconds)
    for t in pending:
        t.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
    duration = time.perf_counter() - start
    if bar is not None:
        bar.close()
    records = []
    for t in tasks:
        if t in done and not t.cancelled() and t.exception() is None:
            records.append(t.result())
        else:
            records.append(
                RequestRecord(sent_at=start, error=f"not finished within max_seconds={max_seconds}")
            )
    return records, duration


def fetch_json(base_url: str, path: str, timeout: float = 10.0) -> Any:
    """GET `path` of the server as JSON (`/v1/models`: which model it serves)."""
    import httpx

    r = httpx.get(base_url.rstrip("/") + path, timeout=timeout)
    r.raise_for_status()
    return r.json()


# ---- the workload ----------------------------------------------------------------------------


def build_requests(
    num_prompts: int,
    output_len: int,
    min_output_len: int | None = None,
    dataset: str = "prompts",
    random_input_len: int = 64,
    seed: int = 0,
) -> list[BenchRequest]:
    """`prompts`: the course's chat prompts (data/prompts.json, cycled), text; `random`:
    random token ids in [10, 500) of `random_input_len` tokens (any model's vocabulary has
    them). Output lengths: `output_len`, or uniform in [min_output_len, output_len]."""
    if (
        num_prompts < 1
        or output_len < 1
        or (min_output_len is not None and not 1 <= min_output_len <= output_len)
    ):
        raise ValueError(
            f"need num_prompts >= 1 and 1 <= min_output_len <= output_len, got "
            f"{num_prompts}, {min_output_len}, {output_len}"
        )
    rng = random.Random(seed)
    lens = [
        output_len if min_output_len is None else rng.randint(min_output_len, output_len)
        for _ in range(num_prompts)
    ]
    if dataset == "random":
        return [
            BenchRequest(
                [rng.randrange(10, 500) for _ in range(random_input_len)], n, random_input_len
            )
            for n in lens
        ]
    if dataset != "prompts":
        raise ValueError(f"dataset must be 'prompts' or 'random', got {dataset!r}")
    from llmlab.paths import DATA_DIR

    texts = [p["text"] for p in json.loads((DATA_DIR / "prompts.json").read_text())["prompts"]]
    rng.shuffle(texts)
    return [BenchRequest(texts[i % len(texts)], n) for i, n in enumerate(lens)]


def parse_goodput(items: list[str] | None) -> dict[str, float] | None:
    """["ttft:500", "tpot:50"] (milliseconds, vLLM's syntax) → {"ttft": 0.5, "tpot": 0.05}."""
    if not items:
        return None
    slo = {}
    for item in items:
        key, sep, value = item.partition(":")
        if not sep or key not in metrics.SLO_KEYS:
            raise ValueError(
                f"--goodput takes KEY:MILLISECONDS with KEY in {metrics.SLO_KEYS}, got {item!r}"
            )
        try:
            slo[key] = float(value) / 1e3
        except ValueError:
            raise ValueError(f"--goodput {item!r}: {value!r} is not a number of ms") from None
    return slo


def summary_dict(s: BenchmarkSummary, records: list[RequestRecord]) -> dict[str, Any]:
    """vLLM's result keys (`mean_ttft_ms`, `p99_itl_ms`, ...) plus p90 and the raw lists."""
    out: dict[str, Any] = {
        "completed": s.num_requests,
        "failed": sum(not r.success for r in records),
        "errors": sorted({r.error for r in records if r.error})[:10],
        "duration": s.duration,
        "total_input_tokens": s.total_input_tokens,
        "total_output_tokens": s.total_output_tokens,
        "request_throughput": s.request_throughput,
        "output_throughput": s.output_throughput,
        "total_token_throughput": s.total_token_throughput,
        "request_goodput": s.goodput,
        "slo_seconds": s.slo,
    }
    for name in ("ttft", "tpot", "itl", "e2el"):
        st = getattr(s, name)
        for key, value in (
            ("mean", st.mean),
            ("median", st.median),
            ("std", st.std),
            ("p90", st.p90),
            ("p99", st.p99),
        ):
            out[f"{key}_{name}_ms"] = None if value is None else value * 1e3
    ok = [r for r in records if r.success]
    out["output_lens"] = [r.output_tokens for r in ok]
    out["ttfts"] = [r.chunk_times[0] - r.sent_at for r in ok]
    return out
