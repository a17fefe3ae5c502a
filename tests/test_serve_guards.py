"""The server against what one client could do to everyone else: grammars that take minutes to
compile or seconds per token to follow, temperatures at float32's edges, a batch of 280,000
prompts, a flood of clients that leave mid-body. In each, an unrelated greedy stream runs
before, during and after: its tokens equal a quiet run's and its largest gap between tokens
stays under a second."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time

import httpx
import pytest

from llmlab.bench import default_attention_backend
from llmlab.engine import LLMEngine
from llmlab.serve.api_server import build_app
from llmlab.serve.grammar_compiler import GrammarLimits
from llmlab.serve.launch import ServerThread
from llmlab.serve.prometheus import parse_prometheus

pytestmark = pytest.mark.model

MODEL = "smollm2-135m"
ENGINE = dict(max_model_len=384, max_num_seqs=16, num_kv_blocks=200)
# three compile workers, so that the grammars of one test do not wait for each other; a short
# probe, so that a grammar which turns slow only after 12 tokens gets past it
LIMITS = GrammarLimits(compile_timeout_s=5, workers=3, probe_tokens=8)
PROMPT = "Count from one to twenty: one, two, three,"
MAX_GAP_S = 1.0  # the bound on an unrelated stream's largest gap
WATCHED = 32  # tokens of each unrelated stream


def make_engine(real_model, **extra) -> LLMEngine:
    model, tokenizer = real_model
    return LLMEngine(
        model, tokenizer, attention_backend=default_attention_backend(model), **ENGINE, **extra
    )


def serve(engine: LLMEngine) -> ServerThread:
    app = build_app(engine, MODEL, max_waiting=64, max_body_bytes=2 << 20, grammar_limits=LIMITS)
    srv = ServerThread(app)
    srv.engine, srv.serving = engine, app.state.serving
    return srv


@pytest.fixture(scope="module")
def server(real_model):
    with serve(make_engine(real_model)) as srv:
        srv.quiet = asyncio.run(watch(srv.url, WATCHED))[0]  # the reference: the stream alone
        yield srv


async def watch(url: str, max_tokens: int, started: asyncio.Event | None = None):
    """An unrelated greedy stream of `max_tokens`: (its tokens, the time each arrived)."""
    tokens, times = [], []
    body = {
        "prompt": PROMPT,
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "return_token_ids": True,
    }
    async with httpx.AsyncClient(timeout=300) as c:
        async with c.stream("POST", url + "/v1/completions", json=body) as r:
            assert r.status_code == 200
            async for line in r.aiter_lines():
                if line.startswith("data: {"):
                    tokens += json.loads(line[6:])["choices"][0]["token_ids"]
                    times.append(time.perf_counter())
                    if started is not None:
                        started.set()
    return tokens, times


async def beside_streams(url: str, *storm):
    """Run the coroutines `storm` beside unrelated streams of WATCHED tokens, one after the
    other: the first starts before the storm, the last after it has ended (however long it
    takes on a busy machine). Returns (the storm's results, each stream's tokens, the largest
    gap between two tokens of one stream)."""
    started, ended = asyncio.Event(), asyncio.Event()

    async def streams():
        runs = []
        while True:
            after = ended.is_set()
            runs.append(await watch(url, WATCHED, started))
            if after:
                return runs

    watcher = asyncio.ensure_future(streams())
    await started.wait()
    results = await asyncio.gather(*storm)
    ended.set()
    runs = await watcher
    gap = max(b - a for _, times in runs for a, b in zip(times, times[1:]))
    return results, [tokens for tokens, _ in runs], gap


async def post(url: str, body: dict, timeout: float = 300) -> httpx.Response:
    async with httpx.AsyncClient(timeout=timeout) as c:
        return await c.post(url + "/v1/completions", json=body)


async def stream_events(url: str, body: dict) -> tuple[int, list[dict]]:
    """(status, the JSON events) of a streamed request."""
    async with httpx.AsyncClient(timeout=300) as c:
        async with c.stream("POST", url + "/v1/completions", json=dict(body, stream=True)) as r:
            lines = [line async for line in r.aiter_lines()]
    if r.status_code != 200:
        return r.status_code, [json.loads("".join(lines))]
    return 200, [json.loads(x[6:]) for x in lines if x.startswith("data: {")]


def compile_workers(parent: int | None = None) -> list[int]:
    """Pids of the grammar compile workers of `parent` (default: this process)."""
    parent = os.getpid() if parent is None else parent
    pids = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read()
            with open(f"/proc/{pid}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except OSError:
            continue
        if b"grammar_compiler import worker_main" in cmd and ppid == parent:
            pids.append(int(pid))
    return pids


def warm_up(url: str) -> None:
    """Every compile worker started and ready (one grammar each, at once): the tests time
    grammars, not the workers' start."""

    async def each():
        bodies = [
            {"prompt": "Yes?", "max_tokens": 1, "structured_outputs": {"choice": [f"y{i}"]}}
            for i in range(LIMITS.workers)
        ]
        return await asyncio.gather(*(post(url, b) for b in bodies))

    assert all(r.status_code == 200 for r in asyncio.run(each()))


def metric(url: str, name: str) -> float:
    return parse_prometheus(httpx.get(url + "/metrics", timeout=10).text).get(name, 0.0)


# ---- grammars ---------------------------------------------------------------------------------

NESTED = "(.{1,50}){1,50}"  # ambiguous: 1.2 s for its first mask here, then 5 s, 20 s ...
# quick to compile and to follow for 12 tokens (past the probe's 8), then 0.2 s, 0.8 s, 1.6 s
LATE = "(a ){12}(.{1,10}){1,10}"


@pytest.mark.slow
def test_no_grammar_stalls_or_changes_an_unrelated_stream(server):
    """A regex whose every mask takes seconds (refused up front by the probe, or by the compile
    limit), a schema whose pattern takes minutes to compile (killed at the limit), a regex
    that turns slow only after 12 tokens (stopped by the per-step fill budget, alone, with a
    400 event), a keyword xgrammar ignores (refused at once): the stream beside them keeps its
    pace and its tokens."""
    url = server.url
    warm_up(url)
    late = {"prompt": "Say a a a:", "max_tokens": 60, "temperature": 0}
    storm = (
        post(url, {"prompt": "x", "structured_outputs": {"regex": NESTED}}),
        post(
            url,
            {
                "prompt": "x",
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "s", "schema": {"type": "string", "pattern": NESTED}},
                },
            },
        ),
        stream_events(url, dict(late, structured_outputs={"regex": LATE})),
        post(
            url,
            {
                "prompt": "x",
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "s", "schema": {"type": "array", "uniqueItems": True}},
                },
            },
        ),
    )
    (nested, pattern, (status, events), unique), runs, gap = asyncio.run(
        beside_streams(url, *storm)
    )
    assert nested.status_code == 400 and nested.json()["error"]["param"] == "structured_outputs"
    assert "too slow to follow" in nested.text or "took longer than" in nested.text
    assert pattern.status_code == 400 and "took longer than 5 s" in pattern.text
    assert status == 200 and events[-1]["error"]["code"] == 400, events[-1]
    assert "structured output stopped" in events[-1]["error"]["message"]
    text = "".join(e["choices"][0]["text"] for e in events[:-1])
    assert text.startswith("a a a"), text
    assert unique.status_code == 400 and "uniqueItems" in unique.text
    assert all(tokens == server.quiet for tokens in runs), "the unrelated stream's tokens changed"
    assert gap < MAX_GAP_S, f"the unrelated stream stalled {gap:.2f} s"
    assert len(compile_workers()) <= LIMITS.workers  # the killed compile left nothing behind
    refused = f'llmlab:grammars_refused_total{{model_name="{MODEL}",why='
    assert metric(url, refused + '"compile_timeout"}') >= 1
    assert metric(url, refused + '"fill_budget"}') == 1
    eng = server.engine
    deadline = time.monotonic() + 30
    while eng.has_unfinished_requests() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert eng.stats()["free_blocks"] == eng.num_kv_blocks


@pytest.mark.slow
def test_a_compile_is_killed_when_its_client_leaves(server):
    """A client that stops waiting for a schema which takes minutes to compile: its worker is
    gone within 1.5 s, well before the compile limit, and the leaving is counted."""
    warm_up(server.url)
    before = set(compile_workers())
    schema = {"type": "string", "pattern": "(.{1,40}){1,40}"}  # takes minutes to compile
    body = {
        "prompt": "x",
        "response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": schema}},
    }
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(server.url + "/v1/completions", json=body, timeout=2.0)
    left = time.monotonic()
    while before <= set(compile_workers()) and time.monotonic() - left < 8:
        time.sleep(0.05)
    assert not before <= set(compile_workers()), "the compile outlived its client"
    assert time.monotonic() - left < 1.5  # the limit (5 s from the start) is 3 s away
    name = f'llmlab:client_disconnects_total{{model_name="{MODEL}",kind="admission"}}'
    assert metric(server.url, name) >= 1


# ---- temperatures -----------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("speculative", [False, True], ids=["plain", "speculative"])
def test_temperatures_at_float32s_edges_are_greedy_or_refused(server, real_model, speculative):
    """1e-40 is 0 in float32 (every logit / T was inf, the softmax NaN, and on the speculative
    engine the rejection sampler raised and aborted the whole batch): below vLLM's epsilon it
    is greedy. 1e308 is inf in float32: refused, naming temperature. The stream beside them
    keeps its tokens, on both engines."""
    if speculative:
        spec = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3}
        srv = serve(make_engine(real_model, speculative_config=spec))
    else:
        srv = server
    try:
        body = {"prompt": "The capital of France is", "max_tokens": 8, "return_token_ids": True}
        greedy = asyncio.run(post(srv.url, dict(body, temperature=0))).json()
        storm = [stream_events(srv.url, dict(body, temperature=t)) for t in (1e-40, 1e-38)]
        storm += [post(srv.url, dict(body, temperature=t)) for t in (1e308, 2.5)]
        (tiny, small, huge, above), runs, gap = asyncio.run(beside_streams(srv.url, *storm))
        want = greedy["choices"][0]["token_ids"]
        for status, events in (tiny, small):
            assert status == 200 and "error" not in events[-1], events[-1]
            assert [t for e in events for t in e["choices"][0]["token_ids"]] == want
        for r in (huge, above):
            assert r.status_code == 400 and r.json()["error"]["param"] == "temperature", r.text
            assert "[0, 2]" in r.json()["error"]["message"]
        assert all(tokens == server.quiet for tokens in runs) and gap < MAX_GAP_S
    finally:
        if speculative:
            srv.stop()


# ---- batches that can never fit, on a free event loop -------------------------------------


async def health_latencies(url: str, stop: asyncio.Event) -> list[float]:
    """`/health`'s response time, asked every 10 ms until `stop`."""
    out = []
    async with httpx.AsyncClient(timeout=30) as c:
        await c.get(url + "/health")  # the connection is open before the clock starts
        while not stop.is_set():
            t0 = time.perf_counter()
            assert (await c.get(url + "/health")).status_code == 200
            out.append(time.perf_counter() - t0)
            await asyncio.sleep(0.01)
    return out


async def with_health(url: str, path: str, body: bytes) -> tuple[httpx.Response, list[float]]:
    stop = asyncio.Event()
    probe = asyncio.ensure_future(health_latencies(url, stop))
    await asyncio.sleep(0.1)
    async with httpx.AsyncClient(timeout=120) as c:
        r = await c.post(url + path, content=body, headers={"Content-Type": "application/json"})
    stop.set()
    return r, await probe


@pytest.mark.parametrize(
    "kind", ["280,000 prompts", pytest.param("60,000 chat messages", marks=pytest.mark.slow)]
)
def test_a_body_that_can_never_fit_is_a_400_and_health_never_waits(server, kind):
    """280,000 one-letter prompts (1.1 MB, under the body cap) are more than the queue ever
    holds: a 400 naming prompt (a 503 would have the SDK retry in vain), before any is
    tokenized; `/health` answers within 100 ms throughout. 60,000 empty chat messages render
    to a prompt past the context: a 400, the template rendered on a worker thread (it takes
    seconds); what stays on the event loop is the collector's passes over the request's
    120,000 new objects (50-80 ms each here), so `/health` within 250 ms."""
    if kind.startswith("280"):
        path, body, param, bound = "/v1/completions", {"prompt": ["a"] * 280_000}, "prompt", 0.1
    else:
        messages = [{"role": "user", "content": ""}] * 60_000
        path, body, param = "/v1/chat/completions", {"messages": messages}, "messages"
        bound = 0.25
    r, latencies = asyncio.run(with_health(server.url, path, json.dumps(body).encode()))
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text[:300]
    assert len(r.text) < 1000
    assert latencies and max(latencies) < bound, f"/health took {max(latencies):.3f} s"


# ---- clients that leave, error bodies ---------------------------------------------------------


def test_clients_that_leave_mid_body_are_counted_not_logged_each(server, caplog):
    host, port = server.url[len("http://") :].split(":")
    name = f'llmlab:client_disconnects_total{{model_name="{MODEL}",kind="body"}}'
    before = metric(server.url, name)
    with caplog.at_level(logging.INFO, logger="llmlab.serve"):
        for _ in range(150):
            s = socket.create_connection((host, int(port)), timeout=5)
            s.sendall(
                b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b"Content-Length: 1000\r\n\r\n" + b'{"prompt": "' + b"a" * 100
            )
            s.close()
        deadline = time.monotonic() + 20
        while metric(server.url, name) < before + 150 and time.monotonic() < deadline:
            time.sleep(0.05)
    assert metric(server.url, name) == before + 150
    records = [r for r in caplog.records if r.name == "llmlab.serve"]
    assert len(records) <= 3 and not any(r.exc_info for r in records), records
    ok = httpx.post(server.url + "/v1/completions", json={"prompt": "Hi", "max_tokens": 2})
    assert ok.status_code == 200


@pytest.mark.parametrize(
    "body,param",
    [
        ({"model": "m" * 100_000, "prompt": "Hi"}, "model"),
        ({"prompt": "Hi", "max_tokens": 10**4000}, "max_tokens"),
        ({"prompt": "Hi", "stop_token_ids": [10**4000]}, "stop_token_ids"),
        ({"prompt": [10**4000]}, "prompt"),
        ({"prompt": "Hi", "n": 10**4000}, "n"),
    ],
    ids=["model", "max_tokens", "stop_token_ids", "prompt", "n"],
)
def test_an_error_quotes_only_a_short_prefix_of_oversized_input(server, body, param):
    r = httpx.post(server.url + "/v1/completions", json=body, timeout=30)
    assert r.status_code in (400, 404) and r.json()["error"]["param"] == param, r.text[:300]
    assert len(r.json()["error"]["message"]) < 400, r.json()["error"]["message"][:200]


def test_prediction_is_accepted_and_unknown_fields_are_named_in_the_log(server, caplog):
    """`prediction` only speeds an answer up (the answer is the same): accepted. A field this
    server does not know is ignored, and the log says which (as vLLM's does)."""
    body = {"prompt": PROMPT, "max_tokens": 6, "temperature": 0, "return_token_ids": True}
    plain = httpx.post(server.url + "/v1/completions", json=body, timeout=60).json()
    with caplog.at_level(logging.WARNING, logger="llmlab.serve"):
        hinted = httpx.post(
            server.url + "/v1/completions",
            json=dict(body, prediction={"type": "content", "content": " four"}, frobnicate=1),
            timeout=60,
        )
    assert hinted.status_code == 200
    assert hinted.json()["choices"][0]["token_ids"] == plain["choices"][0]["token_ids"]
    assert any("frobnicate" in r.getMessage() for r in caplog.records)
    assert not any("prediction" in r.getMessage() for r in caplog.records)


# ---- stopping -----------------------------------------------------------------------------------


@pytest.mark.slow
def test_sigterm_stops_the_server_within_5_s_while_a_grammar_compiles():
    """The serve command, a schema compiling in a worker (it would take minutes): SIGTERM, and
    the process, its compile worker with it, is gone within 5 s."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "llmlab", "serve", MODEL, "--port", "0", "--max-model-len", "64"]
        + ["--grammar-workers", "1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        url = None
        for line in proc.stdout:
            if "listening on" in line:
                url = line.split("listening on ")[1].split()[0]
                break
        assert url, "the server did not start"
        warm = {"prompt": "Yes?", "max_tokens": 2, "structured_outputs": {"choice": ["y", "n"]}}
        assert httpx.post(url + "/v1/completions", json=warm, timeout=300).status_code == 200
        schema = {"type": "string", "pattern": "(.{1,40}){1,40}"}
        body = {
            "prompt": "x",
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "s", "schema": schema},
            },
        }
        client = subprocess.Popen(
            [
                sys.executable,
                "-c",
                f"import httpx; httpx.post({url!r} + '/v1/completions', "
                f"json={body!r}, timeout=120)",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        workers = []
        deadline = time.monotonic() + 60
        while not workers and time.monotonic() < deadline:  # the compile is under way
            time.sleep(0.5)
            workers = [p for p in compile_workers(proc.pid) if _busy(p)]
        assert workers, "no compile worker got busy"
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
        took = time.monotonic() - t0
        client.kill()
        assert took < 5.0, f"SIGTERM took {took:.1f} s"
        time.sleep(0.2)
        assert not any(os.path.exists(f"/proc/{p}") for p in workers), "a compile outlived it"
    finally:
        if proc.poll() is None:
            proc.kill()


def _busy(pid: int) -> bool:
    """A process using CPU now (state R)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "R"
    except OSError:
        return False
