"""The server as real clients see it: the official `openai` SDK for every feature a client
relies on (stop strings, n, logprobs, echo, penalties, logit_bias, models.retrieve), checked
against the engine and against Hugging Face's logits; and the door: content types, the body
cap, a huge prompt that must not stall other streams, the API key, slow headers, the
connection cap, a failing step contained, a dead engine that makes `serve` exit non-zero."""

from __future__ import annotations

import asyncio
import json
import logging
import random
import socket
import threading
import time

import httpx
import openai
import pytest
import torch

from llmlab import SamplingParams
from llmlab.bench import default_attention_backend
from llmlab.engine import LLMEngine
from llmlab.parallel.launch import free_port
from llmlab.serve.api_server import build_app
from llmlab.serve.connections import RateLimitFilter
from llmlab.serve.grammar_compiler import GrammarLimits
from llmlab.serve.launch import ServerThread, build_engine
from llmlab.serve.prometheus import parse_prometheus

MODEL = "smollm2-135m"
ENGINE = dict(max_model_len=256, max_num_seqs=16, num_kv_blocks=160, block_size=16)
TINY = dict(max_model_len=64, num_kv_blocks=32)
PROMPT = "Count from one to twenty: one, two, three,"


@pytest.fixture(scope="module")
def server(real_model):
    model, tokenizer = real_model
    engine = LLMEngine(
        model, tokenizer, attention_backend=default_attention_backend(model), **ENGINE
    )
    # one grammar compile process (the default two cost 400 MB and a few seconds each)
    with ServerThread(build_app(engine, MODEL, grammar_limits=GrammarLimits(workers=1))) as srv:
        srv.engine = engine
        srv.client = openai.OpenAI(
            base_url=srv.url + "/v1", api_key="unused", max_retries=0, timeout=60
        )
        yield srv


def metrics(srv) -> dict[str, float]:
    return parse_prometheus(httpx.get(srv.url + "/metrics", timeout=10).text)


def ask(srv, content: str, **options):
    """The OpenAI SDK's chat completion of one user turn saying `content`, with `options`."""
    messages = [{"role": "user", "content": content}]
    return srv.client.chat.completions.create(model=MODEL, messages=messages, **options)


def serves_greedy(srv, model: str = MODEL, prompt=PROMPT, **headers) -> None:
    """The server still answers a greedy request correctly (equal to the engine run alone)."""
    r = httpx.post(
        srv.url + "/v1/completions",
        timeout=60,
        headers=headers,
        json={
            "model": model,
            "prompt": prompt,
            "max_tokens": 4,
            "temperature": 0,
            "return_token_ids": True,
        },
    )
    assert r.status_code == 200, r.text
    assert len(r.json()["choices"][0]["token_ids"]) == 4


def greedy_text(srv, max_tokens: int = 30) -> tuple[str, list[int], list[int]]:
    out = srv.client.completions.create(
        model=MODEL,
        prompt=PROMPT,
        max_tokens=max_tokens,
        temperature=0,
        extra_body={"return_token_ids": True, "ignore_eos": True},
    )
    choice = out.choices[0]
    return choice.text, choice.token_ids, out.prompt_token_ids


def ref_logprobs(hf_model, ids: list[int]) -> torch.Tensor:
    """log_softmax of Hugging Face's logits at every position of `ids`: [T, vocab]."""
    with torch.inference_mode():
        return hf_model(torch.tensor([ids])).logits[0].float().log_softmax(-1)


def scored(create, hf_model, **request):
    """A greedy request through the SDK's `create` with its token ids returned: the response,
    its first choice, and `ref_logprobs` over the prompt and that choice's tokens."""
    out = create(model=MODEL, temperature=0, extra_body={"return_token_ids": True}, **request)
    choice = out.choices[0]
    return out, choice, ref_logprobs(hf_model, out.prompt_token_ids + choice.token_ids)


# ---- what clients rely on, through the official SDK ----------------------------------------------


@pytest.mark.model
def test_stop_strings_stream_across_chunks_and_never_leak(server):
    text, ids, _ = greedy_text(server)
    tok = server.engine.tokenizer
    # a stop string that straddles a token boundary, from the middle of the greedy answer
    bound = len(tok.decode(ids[:6], skip_special_tokens=True))
    stop = text[bound - 2 : bound + 2]
    cut = text[: text.index(stop)]
    for include, want in ((False, cut), (True, cut + stop)):
        kw = dict(
            model=MODEL,
            prompt=PROMPT,
            max_tokens=30,
            temperature=0,
            stop=[stop, "@@@"],
            extra_body={"include_stop_str_in_output": include, "ignore_eos": True},
        )
        whole = server.client.completions.create(**kw).choices[0]
        assert whole.text == want and whole.finish_reason == "stop"
        streamed = ""
        chunks = list(server.client.completions.create(stream=True, **kw))
        for chunk in chunks:
            streamed += chunk.choices[0].text
            assert want.startswith(streamed), "a chunk sent text that the stop string removes"
        assert streamed == want and chunks[-1].choices[0].finish_reason == "stop"
        assert len(chunks) > 3
    chat = ask(server, "List three colours.", temperature=0, max_tokens=30, stop=["\n"])
    assert "\n" not in chat.choices[0].message.content


@pytest.mark.model
def test_n_choices_share_the_prompt_blocks_and_differ_with_a_seed(server):
    rng = random.Random(5)
    prompt = [rng.randrange(1000, 40000) for _ in range(40)]  # a prefix nobody cached
    before = metrics(server)
    key = f'{{model_name="{MODEL}"}}'
    kw = dict(
        model=MODEL,
        prompt=prompt,
        max_tokens=8,
        temperature=1.0,
        seed=123,
        n=4,
        extra_body={"ignore_eos": True, "return_token_ids": True},
    )
    out = server.client.completions.create(**kw)
    after = metrics(server)
    # children 1..3 each found the prompt's two full blocks (32 tokens) that child 0 holds
    hits = (
        after["vllm:prefix_cache_hits_total" + key] - before["vllm:prefix_cache_hits_total" + key]
    )
    assert hits == 3 * 32
    assert [c.index for c in out.choices] == [0, 1, 2, 3]
    assert out.usage.prompt_tokens == 40 and out.usage.completion_tokens == 32
    samples = [tuple(c.token_ids) for c in out.choices]
    assert len(set(samples)) >= 3, "n samples with one seed should differ (seed + i per child)"
    again = server.client.completions.create(**kw)
    assert [tuple(c.token_ids) for c in again.choices] == samples  # reproducible
    one = server.client.completions.create(**{**kw, "n": 1})
    assert tuple(one.choices[0].token_ids) == samples[0]  # child 0 uses the seed
    streamed: dict[int, list[int]] = {}
    for chunk in server.client.completions.create(stream=True, **kw):
        for c in chunk.choices:
            streamed.setdefault(c.index, []).extend(c.token_ids)
    assert [tuple(streamed[i]) for i in range(4)] == samples
    assert server.engine.stats()["free_blocks"] == server.engine.num_kv_blocks


@pytest.mark.model
def test_a_list_of_prompts_gets_a_choice_each_in_order(server):
    out = server.client.completions.create(
        model=MODEL, prompt=["Hello", "The sky is"], n=2, max_tokens=3, temperature=0
    )
    assert [c.index for c in out.choices] == [0, 1, 2, 3]
    assert out.choices[0].text == out.choices[1].text != out.choices[2].text == out.choices[3].text


@pytest.mark.model
def test_completion_logprobs_equal_log_softmax_of_hf_logits(server, hf_model):
    create = server.client.completions.create
    out, choice, ref = scored(create, hf_model, prompt=PROMPT, max_tokens=6, logprobs=3)
    lp = choice.logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(choice.token_ids) == 6
    tok = server.engine.tokenizer
    P = len(out.prompt_token_ids)
    for i, t in enumerate(choice.token_ids):
        assert lp.tokens[i] == tok.decode([t])
        assert lp.token_logprobs[i] == pytest.approx(float(ref[P + i - 1, t]), abs=2e-3)
        top = ref[P + i - 1].topk(3)
        assert len(lp.top_logprobs[i]) >= 3
        for v, tid in zip(top.values.tolist(), top.indices.tolist()):
            assert lp.top_logprobs[i][tok.decode([tid])] == pytest.approx(v, abs=2e-3)
    assert lp.text_offset == [len("".join(lp.tokens[:i])) for i in range(6)]


@pytest.mark.model
def test_chat_logprobs_give_the_top_k_per_token(server, hf_model):
    out, choice, ref = scored(
        server.client.chat.completions.create,
        hf_model,
        messages=[{"role": "user", "content": "Say hello."}],
        max_tokens=5,
        logprobs=True,
        top_logprobs=2,
    )
    P = len(out.prompt_token_ids)
    content = choice.logprobs.content
    assert len(content) == len(choice.token_ids)
    for i, (item, t) in enumerate(zip(content, choice.token_ids)):
        assert item.logprob == pytest.approx(float(ref[P + i - 1, t]), abs=2e-3)
        assert bytes(item.bytes).decode("utf-8", "replace") == item.token
        assert len(item.top_logprobs) == 2
        assert [x.logprob for x in item.top_logprobs] == pytest.approx(
            ref[P + i - 1].topk(2).values.tolist(), abs=2e-3
        )


@pytest.mark.model
def test_echo_with_logprobs_scores_the_prompt_as_evaluation_harnesses_do(server, hf_model):
    # lm-evaluation-harness's loglikelihood request: echo + logprobs + max_tokens 1
    create = server.client.completions.create
    request = dict(prompt=PROMPT, max_tokens=1, echo=True, logprobs=1)
    out, choice, ref = scored(create, hf_model, **request)
    prompt_ids = out.prompt_token_ids
    assert choice.text.startswith(PROMPT) and len(choice.text) > len(PROMPT)
    lp = choice.logprobs
    assert len(lp.tokens) == len(prompt_ids) + 1
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    for i in range(1, len(prompt_ids) + 1):
        t = (prompt_ids + choice.token_ids)[i]
        assert lp.token_logprobs[i] == pytest.approx(float(ref[i - 1, t]), abs=2e-3)
    # the same numbers when streamed
    chunks = list(create(model=MODEL, temperature=0, stream=True, **request))
    assert "".join(c.choices[0].text for c in chunks) == choice.text
    assert chunks[0].choices[0].logprobs.token_logprobs == pytest.approx(lp.token_logprobs)


@pytest.mark.model
def test_logit_bias_and_penalties_over_the_sdk(server):
    tok = server.engine.tokenizer
    target = tok.encode(" banana")[0]
    out = server.client.completions.create(
        model=MODEL,
        prompt=PROMPT,
        max_tokens=5,
        temperature=0,
        logit_bias={str(target): 100},
        extra_body={"return_token_ids": True},
    )
    assert out.choices[0].token_ids == [target] * 5
    kw = dict(
        model=MODEL,
        prompt=PROMPT,
        temperature=0,
        max_tokens=40,
        extra_body={"ignore_eos": True, "return_token_ids": True},
    )
    plain = server.client.completions.create(**kw).choices[0].token_ids
    penalised = (
        server.client.completions.create(**kw, presence_penalty=1.5, frequency_penalty=1.5)
        .choices[0]
        .token_ids
    )
    repeated = lambda ids: max(ids.count(t) for t in ids)  # noqa: E731
    assert penalised != plain and repeated(penalised) < repeated(plain)


@pytest.mark.model
def test_models_retrieve_and_errors_in_openai_shape(server):
    assert server.client.models.retrieve(MODEL).id == MODEL
    assert [m.id for m in server.client.models.list()] == [MODEL]
    with pytest.raises(openai.NotFoundError):
        server.client.models.retrieve("gpt-4")
    with pytest.raises(openai.BadRequestError) as e:
        server.client.completions.create(model=MODEL, prompt="hi", extra_body={"top_k": 2**63})
    assert e.value.body["param"] == "top_k"
    for method, path, status in (
        ("GET", "/v1/nothing", 404),
        ("GET", "/v1/completions", 405),
        ("DELETE", "/v1/models", 405),
    ):
        r = httpx.request(method, server.url + path, timeout=10)
        assert r.status_code == status
        err = r.json()["error"]
        assert err["code"] == status and err["message"] and "type" in err


@pytest.mark.model
def test_ttft_is_recorded_at_the_first_token_even_for_an_aborted_request(server):
    key = f'vllm:time_to_first_token_seconds_count{{model_name="{MODEL}"}}'
    before = metrics(server)[key]
    with httpx.stream(
        "POST",
        server.url + "/v1/completions",
        timeout=60,
        json={"prompt": PROMPT, "max_tokens": 200, "ignore_eos": True, "stream": True},
    ) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                break  # the first token came: hang up
    deadline = time.monotonic() + 10
    while server.engine.has_unfinished_requests() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert metrics(server)[key] == before + 1
    assert server.engine.stats()["free_blocks"] == server.engine.num_kv_blocks


# ---- the door ----------------------------------------------------------------------------------


@pytest.mark.model
@pytest.mark.parametrize(
    "content_type",
    ["text/plain", "application/x-www-form-urlencoded", None, "multipart/form-data; boundary=x"],
)
def test_only_json_bodies_are_read(server, content_type):
    headers = {} if content_type is None else {"Content-Type": content_type}
    body = json.dumps({"prompt": "hi", "top_k": 2**63}).encode()
    r = httpx.post(server.url + "/v1/completions", content=body, headers=headers, timeout=10)
    assert r.status_code == 415 and r.json()["error"]["param"] == "Content-Type"
    serves_greedy(server)


@pytest.mark.model
def test_a_body_over_the_cap_is_refused_without_reading_it(server):
    cap = server.app.state.max_body_bytes
    big = json.dumps({"prompt": "x" * (cap + 10)}).encode()
    r = httpx.post(
        server.url + "/v1/completions",
        content=big,
        timeout=30,
        headers={"Content-Type": "application/json"},
    )
    assert r.status_code == 413 and r.json()["error"]["param"] == "body"

    # chunked, with no Content-Length: refused once the cap is passed
    def chunks():
        for i in range(0, len(big), 65536):
            yield big[i : i + 65536]

    r = httpx.post(
        server.url + "/v1/completions",
        content=chunks(),
        timeout=30,
        headers={"Content-Type": "application/json"},
    )
    assert r.status_code == 413
    serves_greedy(server)


@pytest.mark.model
def test_a_huge_prompt_is_tokenized_without_stalling_other_streams(server):
    """A ~1 MB prompt takes the tokenizer about half a second; on a worker thread the other
    stream's tokens keep coming meanwhile."""
    huge = "word " * 190_000

    async def run():
        gaps, got = [], []
        async with httpx.AsyncClient(timeout=120) as c:

            async def stream():
                async with c.stream(
                    "POST",
                    server.url + "/v1/completions",
                    json={"prompt": PROMPT, "max_tokens": 60, "ignore_eos": True, "stream": True},
                ) as r:
                    last = None
                    async for line in r.aiter_lines():
                        if line.startswith("data: {"):
                            now = time.perf_counter()
                            if last is not None:
                                gaps.append((last, now))
                            last = now

            async def big():
                await asyncio.sleep(0.3)
                t0 = time.perf_counter()
                r = await c.post(
                    server.url + "/v1/completions", json={"prompt": huge, "max_tokens": 1}
                )
                got.append((r.status_code, t0, time.perf_counter()))

            await asyncio.gather(stream(), big())
        return gaps, got[0]

    gaps, (status, t0, t1) = asyncio.run(run())
    assert status == 400  # too long for max_model_len
    during = [b - a for a, b in gaps if a < t1 and b > t0]
    assert t1 - t0 > 0.3 and during, "the big prompt should take a while to refuse"
    # inline, the stream would stall for the whole tokenization (measured: 0.40 of 0.41 s)
    assert max(during) < 0.5 * (t1 - t0), (
        f"a stream stalled {max(during):.2f} s while a prompt took {t1 - t0:.2f} s to refuse"
    )


@pytest.fixture
def tiny_server(request):
    """A server on the tiny random model (token-id prompts), with the test's settings."""
    app_kw, limits = getattr(request, "param", ({}, {}))
    engine = build_engine("tiny", **TINY)
    with ServerThread(build_app(engine, "tiny", **app_kw), **limits) as srv:
        srv.engine = engine
        yield srv


def tiny_ok(srv, **headers) -> None:
    r = httpx.post(
        srv.url + "/v1/completions",
        timeout=30,
        headers=headers,
        json={"prompt": [3, 4, 5], "max_tokens": 3, "ignore_eos": True},
    )
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] == 3


@pytest.mark.parametrize("tiny_server", [({"api_key": "sekrit"}, {})], indirect=True)
def test_the_api_key_guards_v1_only(tiny_server):
    url = tiny_server.url + "/v1/completions"
    body = {"prompt": [3, 4, 5], "max_tokens": 2}
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "sekrit"}):
        r = httpx.post(url, json=body, headers=headers, timeout=10)
        assert r.status_code == 401 and r.json()["error"]["code"] == 401
    for headers in ({"Authorization": "Bearer sekrit2"}, {"Authorization": "Basic sekrit"}):
        r = httpx.post(url, json=body, headers=headers, timeout=10)
        assert r.status_code == 401
    assert httpx.get(tiny_server.url + "/v1/models", timeout=10).status_code == 401
    assert httpx.get(tiny_server.url + "/health", timeout=10).status_code == 200
    tiny_ok(tiny_server, Authorization="Bearer sekrit")
    tiny_ok(tiny_server, Authorization="bearer sekrit")  # the scheme in any case, as vLLM
    tiny_ok(tiny_server, Authorization="BEARER  sekrit")
    good = openai.OpenAI(base_url=tiny_server.url + "/v1", api_key="sekrit", max_retries=0)
    assert (
        good.completions.create(
            model="tiny", prompt=[3, 4, 5], max_tokens=2
        ).usage.completion_tokens
        == 2
    )
    bad = openai.OpenAI(base_url=tiny_server.url + "/v1", api_key="nope", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()


@pytest.mark.parametrize("tiny_server", [({}, {"timeout_header": 0.5})], indirect=True)
def test_a_slow_header_client_is_closed_and_others_are_served(tiny_server):
    host, port = tiny_server.url[len("http://") :].split(":")
    s = socket.create_connection((host, int(port)), timeout=5)
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")
    t0 = time.monotonic()
    closed = False
    while time.monotonic() - t0 < 5:
        try:
            s.sendall(b"X")  # a byte now and then: slowloris
            s.settimeout(0.1)
            if s.recv(1024) == b"":
                closed = True
                break
        except socket.timeout:
            continue
        except OSError:
            closed = True
            break
    took = time.monotonic() - t0
    s.close()
    assert closed and took < 2.5, f"the slow client was still connected after {took:.1f} s"
    tiny_ok(tiny_server)


@pytest.mark.parametrize("tiny_server", [({}, {"max_connections": 6})], indirect=True)
def test_connections_past_the_cap_are_closed_at_once(tiny_server):
    host, port = tiny_server.url[len("http://") :].split(":")
    held = [socket.create_connection((host, int(port)), timeout=5) for _ in range(6)]
    time.sleep(0.2)
    extra = socket.create_connection((host, int(port)), timeout=5)
    extra.settimeout(2)
    try:
        extra.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        data = extra.recv(1024)
    except OSError:
        data = b""
    assert data == b"", "a connection past the cap was served"
    extra.close()
    for s in held:
        s.close()
    time.sleep(0.2)
    tiny_ok(tiny_server)


def test_the_log_never_floods():
    f = RateLimitFilter(period=0.2, burst=3)
    rec = lambda: logging.LogRecord(
        "asyncio",
        logging.ERROR,
        "",
        0,  # noqa: E731
        "socket.accept() out of system resource",
        None,
        None,
    )
    assert [f.filter(rec()) for _ in range(100)].count(True) == 3
    time.sleep(0.25)
    r = rec()
    assert f.filter(r) and "97 more" in r.msg


# ---- a step that raises -----------------------------------------------------------------------

POISON = 13  # a prompt holding this token makes the test's model runner raise


def poisoned(engine, always: bool = False) -> None:
    run = engine.model_runner.execute_model

    def execute_model(out):
        if always or any(POISON in r.prompt_token_ids for r in out.requests):
            raise RuntimeError("injected failure inside the step")
        return run(out)

    engine.model_runner.execute_model = execute_model


def test_a_failing_step_fails_its_requests_and_the_server_serves_on(tiny_server, caplog):
    poisoned(tiny_server.engine)
    with caplog.at_level(logging.ERROR, logger="llmlab.serve"):
        with httpx.stream(
            "POST",
            tiny_server.url + "/v1/completions",
            timeout=30,
            json={"prompt": [3, POISON, 5], "max_tokens": 4, "stream": True},
        ) as r:
            events = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
        assert r.status_code == 200
        assert json.loads(events[-2])["error"]["code"] == 500 and events[-1] == "[DONE]"
        r = httpx.post(
            tiny_server.url + "/v1/completions",
            timeout=30,
            json={"prompt": [3, POISON, 5], "max_tokens": 4},
        )
        assert r.status_code == 500 and r.json()["error"]["type"] == "InternalServerError"
    assert "injected failure" in caplog.text  # the traceback is in the log
    for _ in range(3):  # more than the consecutive-failure limit
        tiny_ok(tiny_server)
    assert httpx.get(tiny_server.url + "/health", timeout=10).json() == {"status": "ok"}
    eng = tiny_server.engine
    assert not eng.has_unfinished_requests() and eng.stats()["free_blocks"] == eng.num_kv_blocks
    # the same greedy tokens as an engine that never failed
    fresh = build_engine("tiny", **TINY)
    fresh.add_request("r", [3, 4, 5], SamplingParams(temperature=0, max_tokens=3, ignore_eos=True))
    want = []
    while fresh.has_unfinished_requests():
        want += [t for o in fresh.step() for t in o.outputs[0].token_ids]
    r = httpx.post(
        tiny_server.url + "/v1/completions",
        timeout=30,
        json={
            "prompt": [3, 4, 5],
            "max_tokens": 3,
            "temperature": 0,
            "ignore_eos": True,
            "return_token_ids": True,
        },
    )
    assert r.json()["choices"][0]["token_ids"] == want


def test_an_engine_that_keeps_failing_is_declared_dead_and_says_so():
    fatal = []
    engine = build_engine("tiny", **TINY)
    with ServerThread(build_app(engine, "tiny", on_fatal=fatal.append)) as srv:
        poisoned(engine, always=True)
        for _ in range(3):
            r = httpx.post(
                srv.url + "/v1/completions", timeout=30, json={"prompt": [3, 4, 5], "max_tokens": 2}
            )
            assert r.status_code == 500
        assert len(fatal) == 1 and "injected" in repr(fatal[0])
        assert httpx.get(srv.url + "/health", timeout=10).status_code == 503
        r = httpx.post(
            srv.url + "/v1/completions", timeout=30, json={"prompt": [3, 4, 5], "max_tokens": 2}
        )
        assert r.status_code == 503


def test_the_serve_command_exits_non_zero_when_the_engine_dies(monkeypatch):
    from llmlab.serve import launch

    def broken_step(self):
        raise RuntimeError("injected: the engine is broken")

    monkeypatch.setattr(LLMEngine, "step", broken_step)
    port = free_port()
    result = []
    t = threading.Thread(
        target=lambda: result.append(
            launch.main(
                ["tiny", "--port", str(port), "--max-model-len", "64", "--num-kv-blocks", "16"]
            )
        ),
        daemon=True,
    )
    t.start()
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                break
        except httpx.HTTPError:
            time.sleep(0.1)
    for _ in range(3):
        try:
            httpx.post(
                url + "/v1/completions", timeout=10, json={"prompt": [3, 4, 5], "max_tokens": 2}
            )
        except httpx.HTTPError:
            break
    t.join(30)
    assert not t.is_alive() and result == [1]


@pytest.mark.model
def test_response_format_json_schema_always_parses_over_the_sdk(server):
    import jsonschema

    schema = {
        "type": "object",
        "properties": {
            "city": {"type": "string", "maxLength": 20},
            # bounded, so every answer fits in max_tokens: an unbounded integer lets a sample
            # write digits until the budget runs out, whichever engine draws it
            "population": {"type": "integer", "minimum": 0, "maximum": 10**9},
        },
        "required": ["city", "population"],
        "additionalProperties": False,
    }
    out = ask(
        server,
        "Name a big city and its population.",
        temperature=1.0,
        seed=7,
        n=6,
        max_tokens=64,
        response_format={"type": "json_schema", "json_schema": {"name": "city", "schema": schema}},
    )
    for choice in out.choices:
        assert choice.finish_reason == "stop"
        jsonschema.validate(json.loads(choice.message.content), schema)
    obj = ask(
        server,
        "A JSON object, please.",
        max_tokens=48,
        temperature=1.0,
        seed=3,
        response_format={"type": "json_object"},
    )
    if obj.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(obj.choices[0].message.content), dict)
    streamed = "".join(
        c.choices[0].text
        for c in server.client.completions.create(
            model=MODEL,
            prompt="Is water wet? Answer:",
            max_tokens=5,
            stream=True,
            extra_body={"structured_outputs": {"choice": ["yes", "no"]}},
        )
        if c.choices
    )
    assert streamed in ("yes", "no")
