"""`python -m llmlab bench serve`: a benchmark client for any OpenAI-compatible server.

It plays many users at once, as vLLM's `vllm bench serve` does: requests leave at arrival
times drawn from a Poisson process (or gamma gaps, `--burstiness`) at `--request-rate`, at most
`--max-concurrency` in flight, each streamed. For every request it stamps the time it was sent
and the time each chunk with a non-empty `choices` came back; `llmlab.analysis.metrics` turns those into
TTFT, TPOT, ITL, E2EL (mean, median, p90, p99), request and token throughput, and goodput under
SLOs (`--goodput ttft:500 tpot:50`, milliseconds, vLLM's syntax). Output lengths come from the
server's `usage` (requested with `stream_options.include_usage`), else one token per chunk.

Against llmlab's own server (`--launch` starts one) `--compare-offline` also runs the same
requests in this process: `LLM.generate` at saturation (the throughput ratio) and the engine
driven at the same arrivals (`metrics.run_with_arrivals`) for each finite rate, which gives the
HTTP cost per token: median ITL over HTTP minus median ITL in process.

Results go to JSON (default `build/bench-serve.json`) with the machine, the settings and the date.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import math
import os
import random
import time
from dataclasses import dataclass, field
from typing import Any, Iterable

from llmlab.analysis import metrics
from llmlab.analysis.metrics import BenchmarkSummary, Timeline
from llmlab.bench import write_report

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


def benchmark(
    base_url: str,
    requests: list[BenchRequest],
    model: str,
    slo: dict[str, float] | None = None,
    **kwargs: Any,
) -> tuple[BenchmarkSummary, list[RequestRecord]]:
    """Run `run_requests` to the end (from sync code, e.g. a notebook) and summarize it."""
    records, duration = _run_async(run_requests(base_url, requests, model, **kwargs))
    return summarize_records(records, duration, slo, [r.prompt_len for r in requests]), records


def _run_async(coro: Any) -> Any:
    """asyncio.run, also where a loop already runs (a Jupyter kernel): then on a thread."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    import concurrent.futures

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro).result()


def warm_up(
    base_url: str,
    model: str,
    prompt: str | list[int],
    endpoint: str = "/v1/completions",
    timeout: float = 300.0,
) -> None:
    """One two-token request before measuring (as vLLM's client does): a server's first steps
    pay one-time costs that are not serving."""
    (rec,) = _run_async(
        run_requests(
            base_url,
            [BenchRequest(prompt, 2)],
            model,
            endpoint=endpoint,
            timeout=timeout,
            max_seconds=timeout,
            progress=False,
        )
    )[0]
    if not rec.success:
        raise RuntimeError(f"the warm-up request failed: {rec.error}")


def scrape_metrics(base_url: str) -> dict[str, float]:
    """The server's `/metrics`, `{name: value}` (labels dropped; buckets left out)."""
    import httpx

    from llmlab.serve.prometheus import parse_prometheus

    text = httpx.get(base_url.rstrip("/") + "/metrics", timeout=10).text
    return {
        k.split("{")[0]: v
        for k, v in parse_prometheus(text).items()
        if "_bucket{" not in k and "finished_reason" not in k
    }


def fetch_json(base_url: str, path: str, timeout: float = 10.0) -> Any:
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


# ---- against offline llmlab -------------------------------------------------------------------


def offline_llm(serve_args: list[str]) -> Any:
    """An `LLM` with the engine settings `python -m llmlab serve SERVE_ARGS` uses."""
    from llmlab import LLM
    from llmlab.serve.launch import engine_kwargs, load, parser

    args = parser().parse_args(serve_args)
    model, tokenizer = load(args.model)
    return LLM(model, tokenizer=tokenizer, **engine_kwargs(args))


def engine_prompt_ids(tokenizer: Any, req: BenchRequest, chat: bool) -> list[int]:
    """The token ids the server makes of this request's prompt."""
    if isinstance(req.prompt, list):
        return list(req.prompt)
    if chat:
        rendered = tokenizer.apply_chat_template(
            [{"role": "user", "content": req.prompt}], add_generation_prompt=True, tokenize=False
        )
        return list(tokenizer.encode(rendered))
    return list(tokenizer.encode(req.prompt))


def run_offline(
    llm: Any, prompts: list[list[int]], requests: list[BenchRequest], ignore_eos: bool
) -> dict[str, float]:
    """`LLM.generate` on the same requests at once: output tokens, seconds, tok/s."""
    from llmlab import SamplingParams

    params = [
        SamplingParams(temperature=0.0, max_tokens=r.max_tokens, ignore_eos=ignore_eos)
        for r in requests
    ]
    t0 = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=False)
    seconds = time.perf_counter() - t0
    tokens = sum(len(o.outputs[0].token_ids) for o in outs)
    return {"output_tokens": tokens, "seconds": seconds, "output_throughput": tokens / seconds}


def run_in_process(
    llm: Any,
    prompts: list[list[int]],
    requests: list[BenchRequest],
    rate: float,
    burstiness: float,
    seed: int,
    ignore_eos: bool,
    slo: dict[str, float] | None,
) -> BenchmarkSummary:
    """The engine driven at the same arrivals as the HTTP run (`metrics.run_with_arrivals`)."""
    from llmlab import SamplingParams

    params = [
        SamplingParams(temperature=0.0, max_tokens=r.max_tokens, ignore_eos=ignore_eos)
        for r in requests
    ]
    arrivals = metrics.arrival_times(len(requests), rate, burstiness, seed)
    outs, duration = metrics.run_with_arrivals(llm.llm_engine, prompts, params, arrivals)
    return metrics.summarize(outs, duration=duration, slo=slo)


def http_cost_per_token(http: BenchmarkSummary, in_process: BenchmarkSummary) -> float | None:
    """Median ITL over HTTP minus median ITL in process (seconds per token), same workload."""
    if http.itl.median is None or in_process.itl.median is None:
        return None
    return http.itl.median - in_process.itl.median


# ---- the command ------------------------------------------------------------------------------


def machine_and_date() -> dict[str, Any]:
    from llmlab.bench.throughput import machine_info

    return {
        "machine": machine_info(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }


def _rates(text: str) -> list[float]:
    try:
        rates = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--request-rate: numbers or inf, comma-separated; got {text!r}"
        ) from None
    if not rates or any(not r > 0 for r in rates):
        raise argparse.ArgumentTypeError(f"--request-rate values must be > 0, got {text!r}")
    return rates


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m llmlab bench serve",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--base-url", default=None, help="server (default http://127.0.0.1:8000)")
    ap.add_argument(
        "--endpoint", default="/v1/completions", help="/v1/completions or /v1/chat/completions"
    )
    ap.add_argument("--model", default=None, help="model name (default: the server's first)")
    ap.add_argument(
        "--launch",
        nargs="?",
        const="",
        default=None,
        metavar="SERVE_ARGS",
        help="start `python -m llmlab serve SERVE_ARGS` for the run, e.g. "
        "--launch='--max-model-len 1024'",
    )
    ap.add_argument("--dataset", default="prompts", choices=("prompts", "random"))
    ap.add_argument("--random-input-len", type=int, default=64)
    ap.add_argument("--num-prompts", type=int, default=None, help="requests (default 64; --fast 8)")
    ap.add_argument(
        "--output-len", type=int, default=None, help="output tokens (default 64; --fast 8)"
    )
    ap.add_argument(
        "--min-output-len",
        type=int,
        default=None,
        help="draw output lengths uniformly from [this, --output-len]",
    )
    ap.add_argument(
        "--no-ignore-eos",
        dest="ignore_eos",
        action="store_false",
        help="let requests stop at EOS (default: exactly --output-len tokens)",
    )
    ap.add_argument(
        "--request-rate",
        type=_rates,
        default=[math.inf],
        help="requests/s, comma-separated for several runs; inf: all at once",
    )
    ap.add_argument("--burstiness", type=float, default=1.0, help="gamma shape; 1 = Poisson")
    ap.add_argument("--max-concurrency", type=int, default=None)
    ap.add_argument(
        "--goodput",
        nargs="+",
        default=None,
        metavar="KEY:MS",
        help="SLOs in ms, e.g. ttft:500 tpot:50 (keys ttft, tpot, e2el)",
    )
    ap.add_argument(
        "--compare-offline",
        action="store_true",
        help="also run the requests in this process (llmlab servers), with the "
        "engine settings of --launch (else serve's defaults): offline "
        "LLM.generate throughput at rate inf, and the engine at the same "
        "arrivals for finite rates (the HTTP cost per token)",
    )
    ap.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="with --compare-offline at rate inf: alternate offline and HTTP this "
        "many times, report the best of each",
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--client-nice",
        type=int,
        default=None,
        help="lower this client's CPU priority by N once the server runs (default: "
        "10 with --launch, where client and server share this machine's cores "
        "and the client would otherwise take CPU a remote client would not; 0 "
        "with --base-url)",
    )
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds per request")
    ap.add_argument("--max-seconds", type=float, default=900.0, help="seconds per run, at most")
    ap.add_argument("--disable-tqdm", action="store_true")
    ap.add_argument("--fast", action="store_true", help="a small workload")
    ap.add_argument("--json", default="build/bench-serve.json", help="result file")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    slo = parse_goodput(args.goodput)
    num = args.num_prompts or (8 if args.fast else 64)
    out_len = args.output_len or (8 if args.fast else 64)
    requests = build_requests(
        num, out_len, args.min_output_len, args.dataset, args.random_input_len, args.seed
    )
    chat = "chat" in args.endpoint
    if args.client_nice is not None and not 0 <= args.client_nice <= 19:
        raise ValueError(f"--client-nice must be in [0, 19], got {args.client_nice}")
    server = None
    serve_args = None
    if args.launch is not None:
        from llmlab.serve.launch import ServerProcess

        serve_args = args.launch.split()
        server = ServerProcess(None, serve_args)
        base_url = server.url
    else:
        base_url = args.base_url or "http://127.0.0.1:8000"
    nice = args.client_nice if args.client_nice is not None else (10 if server else 0)
    if nice and hasattr(os, "nice"):
        os.nice(nice)  # after the server started: it keeps its priority
        print(f"client priority lowered by {nice} (the server's is unchanged)", flush=True)
    from llmlab import openmp

    print(
        f"OpenMP: {openmp.describe()} (this client's offline runs and a launched server alike)",
        flush=True,
    )
    report: dict[str, Any] = {}
    try:
        model = args.model or fetch_json(base_url, "/v1/models")["data"][0]["id"]
        llm = prompts = None
        if args.compare_offline:
            llm = offline_llm(serve_args or [])
            prompts = [engine_prompt_ids(llm.get_tokenizer(), r, chat) for r in requests]
        # one short request first (as vLLM's client does): the server's first step pays
        # one-time costs that are not serving
        warm_up(base_url, model, requests[0].prompt, args.endpoint, args.timeout)
        if llm is not None:
            run_offline(llm, prompts[:1], [BenchRequest(requests[0].prompt, 2)], True)
        runs = []
        for rate in args.request_rate:
            rounds = args.rounds if (llm is not None and math.isinf(rate)) else 1
            best_http, best_offline = None, None
            for k in range(rounds):
                if llm is not None and math.isinf(rate):
                    off = run_offline(llm, prompts, requests, args.ignore_eos)
                    if (
                        best_offline is None
                        or off["output_throughput"] > best_offline["output_throughput"]
                    ):
                        best_offline = off
                records, duration = _run_async(
                    run_requests(
                        base_url,
                        requests,
                        model,
                        endpoint=args.endpoint,
                        request_rate=rate,
                        burstiness=args.burstiness,
                        max_concurrency=args.max_concurrency,
                        ignore_eos=args.ignore_eos,
                        seed=args.seed,
                        timeout=args.timeout,
                        max_seconds=args.max_seconds,
                        progress=not args.disable_tqdm,
                    )
                )
                summary = summarize_records(
                    records, duration, slo, [r.prompt_len for r in requests]
                )
                if rounds > 1:
                    print(
                        f"round {k + 1}: offline {off['output_throughput']:.1f} tok/s, "
                        f"HTTP {summary.output_throughput:.1f} tok/s",
                        flush=True,
                    )
                if best_http is None or summary.output_throughput > best_http[0].output_throughput:
                    best_http = (summary, records)
            summary, records = best_http
            run: dict[str, Any] = {
                "request_rate": _rate(rate),
                "http": summary_dict(summary, records),
            }
            print(f"\n--- {base_url}{args.endpoint}, rate {rate:g} req/s ---\n{summary.table()}")
            if best_offline is not None:
                ratio = summary.output_throughput / best_offline["output_throughput"]
                run["offline"] = dict(best_offline, http_over_offline=ratio)
                print(
                    f"offline LLM.generate: {best_offline['output_throughput']:.1f} tok/s; "
                    f"HTTP / offline = {ratio:.3f} (best of {rounds})"
                )
            if llm is not None and not math.isinf(rate):
                inproc = run_in_process(
                    llm, prompts, requests, rate, args.burstiness, args.seed, args.ignore_eos, slo
                )
                cost = http_cost_per_token(summary, inproc)
                run["in_process"] = summary_dict(inproc, [])
                run["http_cost_per_token_p50_ms"] = None if cost is None else cost * 1e3
                print(
                    f"in process at the same arrivals:\n{inproc.table()}\nHTTP cost per "
                    f"token (median ITL, HTTP − in process): "
                    f"{'—' if cost is None else f'{cost * 1e3:.2f} ms'}"
                )
            runs.append(run)
        report = {
            **machine_and_date(),
            "settings": {
                "base_url": base_url,
                "endpoint": args.endpoint,
                "model": model,
                "dataset": args.dataset,
                "num_prompts": num,
                "output_len": out_len,
                "min_output_len": args.min_output_len,
                "ignore_eos": args.ignore_eos,
                "request_rates": [_rate(r) for r in args.request_rate],
                "burstiness": args.burstiness,
                "max_concurrency": args.max_concurrency,
                "seed": args.seed,
                "goodput_slo_ms": None if slo is None else {k: v * 1e3 for k, v in slo.items()},
                "launched_server_args": serve_args,
                "rounds": args.rounds,
                "openmp": openmp.describe(),
            },
            "runs": runs,
        }
    finally:
        if server is not None:
            server.stop()
    write_report(report, args.json, default=_jsonable)
    return 0


def _rate(rate: float) -> float | str:
    return "inf" if math.isinf(rate) else rate


def _jsonable(x: Any) -> Any:
    return str(x)
