"""The OpenAI-compatible server on a real loopback port: greedy answers equal `LLM.generate`
token for token, streamed and not; 64 streaming clients with 4 hanging up leave the engine
empty; every bad input gets its status and names its field; a full queue answers 503."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import pytest

from llmlab import LLM, SamplingParams
from llmlab.bench import default_attention_backend
from llmlab.engine import LLMEngine
from llmlab.serve.api_server import build_app
from llmlab.serve.grammar_compiler import GrammarLimits
from llmlab.serve.launch import ServerProcess, ServerThread
from llmlab.serve.prometheus import Histogram, parse_prometheus
from llmlab.serve.protocol import MAX_JSON_DEPTH, CompletionRequest, OpenAIError, parse_body

MODEL = "smollm2-135m"
MAX_MODEL_LEN = 256
ENGINE = dict(max_model_len=MAX_MODEL_LEN, max_num_seqs=64, num_kv_blocks=320)
PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a small village,",
    "The three primary colours are",
    "To make a cup of tea, first",
    "北京是中国的",
    "The quick brown fox",
    "In 1969, Neil Armstrong",
]
SETTLE_S = 15.0  # most seconds to wait for the engine to empty after a load


def engine_kwargs(model):
    return dict(ENGINE, attention_backend=default_attention_backend(model))


@pytest.fixture(scope="module")
def server(real_model):
    model, tokenizer = real_model
    engine = LLMEngine(model, tokenizer, **engine_kwargs(model))
    # one grammar compile process (the default two cost 400 MB and a few seconds each)
    with ServerThread(build_app(engine, MODEL, grammar_limits=GrammarLimits(workers=1))) as srv:
        srv.engine = engine
        yield srv


def post(srv, path, body, **kw):
    return httpx.post(srv.url + path, json=body, timeout=60, **kw)


def read_sse(resp) -> list[dict]:
    """The JSON chunks of a streamed response; asserts it ends with [DONE]."""
    events = [line[6:] for line in resp.iter_lines() if line.startswith("data: ")]
    assert events and events[-1] == "[DONE]", f"stream did not end with [DONE]: {events[-3:]}"
    return [json.loads(e) for e in events[:-1]]


def metric(srv, name: str) -> float:
    return parse_prometheus(httpx.get(srv.url + "/metrics", timeout=10).text)[
        f'{name}{{model_name="{MODEL}"}}'
    ]


def wait_until_idle(srv) -> dict:
    deadline = time.monotonic() + SETTLE_S
    while time.monotonic() < deadline:
        m = parse_prometheus(httpx.get(srv.url + "/metrics", timeout=10).text)
        key = f'{{model_name="{MODEL}"}}'
        if m["vllm:num_requests_running" + key] == 0 and m["vllm:num_requests_waiting" + key] == 0:
            return m
        time.sleep(0.05)
    raise AssertionError(f"requests still running or waiting {SETTLE_S} s after the load ended")


# ---- correctness ------------------------------------------------------------------------------


@pytest.mark.model
def test_greedy_over_http_equals_llm_generate_streamed_and_not(server, real_model):
    model, tokenizer = real_model
    params = SamplingParams(temperature=0.0, max_tokens=12)
    ref = LLM(model, tokenizer=tokenizer, **engine_kwargs(model)).generate(
        PROMPTS, params, use_tqdm=False
    )

    async def ask(prompt, stream):
        body = {
            "model": MODEL,
            "prompt": prompt,
            "max_tokens": 12,
            "temperature": 0,
            "return_token_ids": True,
            "stream": stream,
        }
        if stream:
            body["stream_options"] = {"include_usage": True}
        async with httpx.AsyncClient(timeout=60) as c:
            if not stream:
                r = await c.post(server.url + "/v1/completions", json=body)
                assert r.status_code == 200, r.text
                return r.json()
            async with c.stream("POST", server.url + "/v1/completions", json=body) as r:
                assert r.status_code == 200
                lines = [line async for line in r.aiter_lines() if line.startswith("data: ")]
            assert lines[-1] == "data: [DONE]"
            return [json.loads(line[6:]) for line in lines[:-1]]

    async def all_of(stream):
        return await asyncio.gather(*(ask(p, stream) for p in PROMPTS))

    whole = asyncio.run(all_of(False))
    streamed = asyncio.run(all_of(True))
    for i, (r, w, chunks) in enumerate(zip(ref, whole, streamed)):
        want = r.outputs[0]
        got = w["choices"][0]
        assert got["token_ids"] == want.token_ids, f"prompt {i}: non-streamed tokens differ"
        assert got["text"] == want.text and got["finish_reason"] == want.finish_reason
        assert w["usage"] == {
            "prompt_tokens": len(r.prompt_token_ids),
            "completion_tokens": len(want.token_ids),
            "total_tokens": len(r.prompt_token_ids) + len(want.token_ids),
        }
        token_chunks = [c for c in chunks if c["choices"]]
        assert [t for c in token_chunks for t in c["choices"][0]["token_ids"]] == want.token_ids, (
            f"prompt {i}: streamed tokens differ"
        )
        assert all(len(c["choices"][0]["token_ids"]) == 1 for c in token_chunks), (
            "one chunk per token"
        )
        assert "".join(c["choices"][0]["text"] for c in token_chunks) == want.text
        assert token_chunks[-1]["choices"][0]["finish_reason"] == want.finish_reason
        assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == len(
            want.token_ids
        ), "the last chunk carries usage"


@pytest.mark.model
def test_chat_uses_the_chat_template_and_streams_the_role_once(server, real_model):
    model, tokenizer = real_model
    messages = [{"role": "user", "content": "Name a colour."}]
    ids = tokenizer.encode(
        tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    )
    ref = LLM(model, tokenizer=tokenizer, **engine_kwargs(model)).generate(
        [ids], SamplingParams(temperature=0.0, max_tokens=6), use_tqdm=False
    )[0]
    r = post(
        server, "/v1/chat/completions", {"messages": messages, "max_tokens": 6, "temperature": 0}
    )
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"] == {
        "role": "assistant",
        "content": ref.outputs[0].text,
    }
    assert r.json()["usage"]["prompt_tokens"] == len(ids)
    with httpx.stream(
        "POST",
        server.url + "/v1/chat/completions",
        timeout=60,
        json={"messages": messages, "max_tokens": 6, "temperature": 0, "stream": True},
    ) as s:
        chunks = read_sse(s)
    assert all(c["choices"] for c in chunks), "no chunk without a token before [DONE]"
    deltas = [c["choices"][0]["delta"] for c in chunks]
    assert deltas[0]["role"] == "assistant" and all("role" not in d for d in deltas[1:])
    assert "".join(d["content"] for d in deltas) == ref.outputs[0].text


@pytest.mark.model
def test_sampling_fields_are_honoured(server):
    def tokens(**fields):
        r = post(
            server, "/v1/completions", {"prompt": PROMPTS[0], "return_token_ids": True, **fields}
        )
        assert r.status_code == 200, r.text
        return r.json()["choices"][0]

    greedy = tokens(max_tokens=6, temperature=0)["token_ids"]
    stop = tokens(max_tokens=6, temperature=0, stop_token_ids=[greedy[2]])
    assert stop["token_ids"] == greedy[:3] and stop["finish_reason"] == "stop"
    assert tokens(max_tokens=6, temperature=1.0, top_k=1)["token_ids"] == greedy
    a = tokens(max_tokens=8, temperature=1.0, seed=7)["token_ids"]
    assert a == tokens(max_tokens=8, temperature=1.0, seed=7)["token_ids"]
    long = tokens(
        max_tokens=40,
        temperature=0,
        ignore_eos=True,
        repetition_penalty=1.0,
        some_unknown_field={"x": 1},
    )
    assert len(long["token_ids"]) == 40 and long["finish_reason"] == "length"
    # EOS (id 2) as a stop token is only honoured once min_tokens exist
    early = tokens(max_tokens=5, temperature=0, stop_token_ids=[greedy[0]], min_tokens=3)
    assert len(early["token_ids"]) >= 3


# ---- load: many clients, some hang up -----------------------------------------------------------


@pytest.mark.model
@pytest.mark.slow
def test_64_streaming_clients_with_4_hanging_up_leave_the_engine_empty(server):
    n_clients, n_leave, n_tokens, read_before_leaving = 64, 4, 8, 2
    before = parse_prometheus(httpx.get(server.url + "/metrics", timeout=10).text)
    key = f'{{model_name="{MODEL}"}}'

    async def client(i: int, c: httpx.AsyncClient):
        leave = i % (n_clients // n_leave) == 0
        body = {
            "model": MODEL,
            "prompt": f"Request {i}: {PROMPTS[i % len(PROMPTS)]}",
            "max_tokens": 200 if leave else n_tokens,
            "temperature": 0,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        chunks = []
        async with c.stream("POST", server.url + "/v1/completions", json=body) as r:
            assert r.status_code == 200
            async for line in r.aiter_lines():
                if not line.startswith("data: "):
                    continue
                if line == "data: [DONE]":
                    return leave, chunks, True
                chunks.append(json.loads(line[6:]))
                if leave and len(chunks) == read_before_leaving:
                    return leave, chunks, False  # closes the connection mid-stream
        return leave, chunks, False

    async def load():
        limits = httpx.Limits(max_connections=n_clients)
        async with httpx.AsyncClient(timeout=120, limits=limits) as c:
            return await asyncio.wait_for(
                asyncio.gather(*(client(i, c) for i in range(n_clients))), 180
            )

    results = asyncio.run(load())
    assert sum(leave for leave, _, _ in results) == n_leave
    for leave, chunks, done in results:
        if leave:
            assert not done and len(chunks) == read_before_leaving
            continue
        assert done
        token_chunks = [c for c in chunks if c["choices"]]
        assert (
            len(token_chunks) == n_tokens and chunks[-1]["usage"]["completion_tokens"] == n_tokens
        )
    after = wait_until_idle(server)
    assert after["vllm:kv_cache_usage_perc" + key] == 0.0
    assert after["llmlab:kv_cache_free_blocks" + key] == after["llmlab:kv_cache_num_blocks" + key]
    st = server.engine.stats()
    assert (st["running"], st["waiting"], st["kv_usage"]) == (0, 0, 0.0)
    assert st["free_blocks"] == server.engine.num_kv_blocks
    assert not server.engine.has_unfinished_requests()
    aborted = 'vllm:request_success_total{model_name="%s",finished_reason="abort"}' % MODEL
    assert after[aborted] - before[aborted] == n_leave
    # the hung-up requests stopped within a few steps of leaving, not at their 200 tokens
    generated = (
        after["vllm:generation_tokens_total" + key] - before["vllm:generation_tokens_total" + key]
    )
    assert generated <= (n_clients - n_leave) * n_tokens + n_leave * (read_before_leaving + 10)


@pytest.mark.model
def test_a_non_streaming_client_that_leaves_aborts_its_request(server):
    async def leave_early():
        async with httpx.AsyncClient() as c:
            with pytest.raises(httpx.TimeoutException):
                await c.post(
                    server.url + "/v1/completions",
                    timeout=0.5,
                    json={"prompt": PROMPTS[1], "max_tokens": 200, "ignore_eos": True},
                )

    asyncio.run(leave_early())
    wait_until_idle(server)
    assert server.engine.stats()["free_blocks"] == server.engine.num_kv_blocks


# ---- bad input ------------------------------------------------------------------------------------

BAD = [  # (endpoint, body, status, the field the error must name)
    ("/v1/completions", b"{not json", 400, "body"),
    ("/v1/completions", [1, 2], 400, "body"),
    ("/v1/completions", {"max_tokens": 4}, 400, "prompt"),
    ("/v1/chat/completions", {"max_tokens": 4}, 400, "messages"),
    ("/v1/chat/completions", {"messages": "hi"}, 400, "messages"),
    (
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": 5}]},
        400,
        "messages[0].content",
    ),
    ("/v1/completions", {"prompt": 5}, 400, "prompt"),
    ("/v1/completions", {"prompt": "hi", "max_tokens": "4"}, 400, "max_tokens"),
    ("/v1/completions", {"prompt": "hi", "temperature": "hot"}, 400, "temperature"),
    ("/v1/completions", {"prompt": "hi", "stream": "yes"}, 400, "stream"),
    ("/v1/completions", {"prompt": "hi", "max_tokens": 0}, 400, "max_tokens"),
    ("/v1/completions", {"prompt": "hi", "max_tokens": -3}, 400, "max_tokens"),
    ("/v1/completions", {"prompt": "hi", "max_tokens": MAX_MODEL_LEN}, 400, "max_tokens"),
    (
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 10**6},
        400,
        "max_completion_tokens",
    ),
    ("/v1/completions", {"prompt": "hi", "temperature": -0.5}, 400, "temperature"),
    ("/v1/completions", {"prompt": "hi", "top_p": 0}, 400, "top_p"),
    ("/v1/completions", {"prompt": "hi", "top_p": 1.5}, 400, "top_p"),
    ("/v1/completions", {"prompt": "hi", "top_k": -2}, 400, "top_k"),
    ("/v1/completions", {"prompt": "hi", "min_tokens": 9, "max_tokens": 4}, 400, "min_tokens"),
    ("/v1/completions", {"prompt": [7] * (MAX_MODEL_LEN + 5)}, 400, "prompt"),
    ("/v1/completions", {"prompt": "word " * (MAX_MODEL_LEN + 5)}, 400, "prompt"),
    ("/v1/completions", {"prompt": [1, 2, 10**6]}, 400, "prompt"),
    ("/v1/completions", {"prompt": [-1, 5]}, 400, "prompt"),
    ("/v1/completions", {"prompt": "hi", "stop_token_ids": [10**6]}, 400, "stop_token_ids"),
    ("/v1/completions", {"prompt": ["a", 5]}, 400, "prompt"),
    ("/v1/completions", {"prompt": ["a", ""]}, 400, "prompt[1]"),
    ("/v1/completions", {"prompt": "hi", "n": 0}, 400, "n"),
    ("/v1/completions", {"prompt": "hi", "n": 65}, 400, "n"),
    ("/v1/completions", {"prompt": "hi", "best_of": 3}, 400, "best_of"),
    ("/v1/completions", {"prompt": "hi", "logprobs": 21}, 400, "logprobs"),
    ("/v1/completions", {"prompt": "hi", "logprobs": -1}, 400, "logprobs"),
    ("/v1/completions", {"prompt": "hi", "model": "gpt-4"}, 404, "model"),
    # values that once passed the door and broke a step, or answered 500
    ("/v1/completions", {"prompt": "hi", "top_k": 2**63}, 400, "top_k"),
    ("/v1/completions", {"prompt": "hi", "top_k": 49153}, 400, "top_k"),
    ("/v1/completions", {"prompt": "hi", "seed": 2**64}, 400, "seed"),
    ("/v1/completions", {"prompt": "hi", "seed": -(2**63) - 1}, 400, "seed"),
    ("/v1/completions", b'{"prompt": "hi", "seed": ' + b"9" * 5000 + b"}", 400, "body"),
    ("/v1/completions", b'{"prompt": "hi", "temperature": NaN}', 400, "body"),
    ("/v1/completions", b'{"prompt": "hi", "temperature": 1e999}', 400, "temperature"),
    (
        "/v1/completions",
        b'{"prompt": "hi", "x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
        400,
        "body",
    ),
    ("/v1/completions", b'{"prompt": "hi", "x": ' + b"[" * 40 + b"]" * 40 + b"}", 400, "x"),
    ("/v1/completions", b'{"prompt": "a \\ud800 b"}', 400, "prompt"),
    ("/v1/completions", b'{"prompt": "a \xed\xa0\x80 b"}', 400, "prompt"),  # its UTF-8 bytes
    ("/v1/completions", '{"prompt": "\udfff"}'.encode("utf-16-le", "surrogatepass"), 400, "prompt"),
    ("/v1/completions", b'{"prompt": ["a", "b", "\\uDBFF"]}', 400, "prompt[2]"),
    ("/v1/completions", b'{"prompt": "hi", "logit_bias": {"\\udc00": 1}}', 400, "logit_bias"),
    ("/v1/completions", b'{"prompt": ["a", ' + b"[" * 40 + b"]" * 40 + b"]}", 400, "prompt"),
    (
        "/v1/chat/completions",
        b'{"messages": [{"role": "user", "content": "\\ud800"}]}',
        400,
        "messages[0].content",
    ),
    ("/v1/completions", {"prompt": "hi", "presence_penalty": 3}, 400, "presence_penalty"),
    ("/v1/completions", {"prompt": "hi", "frequency_penalty": -2.5}, 400, "frequency_penalty"),
    ("/v1/completions", {"prompt": "hi", "repetition_penalty": 0}, 400, "repetition_penalty"),
    ("/v1/completions", {"prompt": "hi", "logit_bias": {"x": 1}}, 400, "logit_bias"),
    ("/v1/completions", {"prompt": "hi", "logit_bias": {"10000000": 1}}, 400, "logit_bias"),
    ("/v1/completions", {"prompt": "hi", "logit_bias": {"5": 101}}, 400, "logit_bias"),
    ("/v1/completions", {"prompt": "hi", "stop": [""]}, 400, "stop"),
    ("/v1/completions", {"prompt": "hi", "stop": ["x"] * 17}, 400, "stop"),
    # accepted and silently ignored once: now refused until served
    (
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": "hi"}], "response_format": {"type": "xml"}},
        400,
        "response_format.type",
    ),
    (
        "/v1/chat/completions",
        {
            "messages": [{"role": "user", "content": "hi"}],
            "response_format": {"type": "json_schema", "json_schema": {"name": "x"}},
        },
        400,
        "response_format.json_schema.schema",
    ),
    (
        "/v1/chat/completions",
        {
            "messages": [{"role": "user", "content": "hi"}],
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "x", "schema": {"type": "strin"}},
            },
        },
        400,
        "response_format",
    ),
    (
        "/v1/completions",
        {"prompt": "hi", "structured_outputs": {"regex": "a", "choice": ["b"]}},
        400,
        "structured_outputs",
    ),
    (
        "/v1/completions",
        {"prompt": "hi", "structured_outputs": {"regex": "(unclosed"}},
        400,
        "structured_outputs",
    ),
    (
        "/v1/completions",
        {"prompt": "hi", "structured_outputs": {"choice": []}},
        400,
        "structured_outputs",
    ),
    (
        "/v1/chat/completions",
        {
            "messages": [{"role": "user", "content": "hi"}],
            "tools": [{"type": "function", "function": {"name": "f"}}],
        },
        400,
        "tools",
    ),
    (
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": "hi"}], "tool_choice": "auto"},
        400,
        "tool_choice",
    ),
    (
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": "hi"}], "top_logprobs": 3},
        400,
        "top_logprobs",
    ),
    (
        "/v1/completions",
        {"prompt": "hi", "stream_options": {"include_usage": True}},
        400,
        "stream_options",
    ),
    # temperatures past float32 (1e308 is inf there) or OpenAI's and vLLM's bound
    ("/v1/completions", {"prompt": "hi", "temperature": 1e308}, 400, "temperature"),
    ("/v1/completions", {"prompt": "hi", "temperature": 2.5}, 400, "temperature"),
    # more sequences than the waiting queue (256) ever holds: can never fit, so not a 503
    ("/v1/completions", {"prompt": ["a"] * 257}, 400, "prompt"),
    ("/v1/completions", {"prompt": ["a"] * 65, "n": 4}, 400, "prompt"),
    # OpenAI fields this server does not serve: refused, not ignored
    (
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": "hi"}], "reasoning_effort": "low"},
        400,
        "reasoning_effort",
    ),
    (
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": "hi"}], "modalities": ["text", "audio"]},
        400,
        "modalities",
    ),
    (
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": "hi"}], "audio": {"voice": "alloy"}},
        400,
        "audio",
    ),
    (
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": "hi"}], "echo": True},
        400,
        "echo",
    ),
    # schema keywords xgrammar would not enforce
    (
        "/v1/chat/completions",
        {
            "messages": [{"role": "user", "content": "hi"}],
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "x", "schema": {"type": "array", "uniqueItems": True}},
            },
        },
        400,
        "response_format.json_schema.schema",
    ),
    (
        "/v1/completions",
        {"prompt": "hi", "structured_outputs": {"json": {"not": {}}}},
        400,
        "structured_outputs",
    ),
]


@pytest.mark.parametrize("inner", ["", "1"], ids=["empty", "a number inside"])
def test_a_body_nested_to_the_limit_passes_and_one_level_more_is_refused(inner):
    """MAX_JSON_DEPTH counts the levels of values below the body: "x" is level 1, so 32
    lists around nothing pass and 33 do not; a number inside is one level more."""

    def body(lists: int) -> bytes:
        return b'{"prompt": "hi", "x": ' + b"[" * lists + inner.encode() + b"]" * lists + b"}"

    deepest = MAX_JSON_DEPTH - len(inner)  # the most lists that pass
    assert parse_body(body(deepest), CompletionRequest).prompt == "hi"
    with pytest.raises(OpenAIError) as e:
        parse_body(body(deepest + 1), CompletionRequest)
    assert e.value.status == 400 and e.value.param == "x"


def test_a_surrogate_pair_is_text_and_a_long_list_of_prompts_passes_the_door():
    """The surrogate check reads the body's bytes first: an escaped pair, and the same
    character as UTF-8, are text; and 280,000 prompts, some not ASCII, pass the door."""
    for raw in (b'{"prompt": "\\ud83d\\ude00"}', '{"prompt": "\U0001f600"}'.encode()):
        assert parse_body(raw, CompletionRequest).prompt == "\U0001f600"
    many = json.dumps({"prompt": ["a", "b\u00e9"] * 140_000}, ensure_ascii=False).encode()
    assert parse_body(many, CompletionRequest).prompt[-1] == "b\u00e9"


@pytest.mark.model
@pytest.mark.parametrize(
    "endpoint,body,status,field", BAD, ids=[f"{i}-{b[3]}" for i, b in enumerate(BAD)]
)
def test_bad_input_is_a_4xx_naming_the_field_and_the_server_keeps_serving(
    server, endpoint, body, status, field
):
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    r = httpx.post(
        server.url + endpoint, content=raw, timeout=30, headers={"Content-Type": "application/json"}
    )
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["param"] == field and field.split("[")[0] in err["message"], err
    assert err["code"] == status
    ok = post(server, "/v1/completions", {"model": MODEL, "prompt": "Hello", "max_tokens": 2})
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 2


@pytest.mark.model
def test_models_health_and_metrics(server):
    models = httpx.get(server.url + "/v1/models", timeout=10).json()
    assert [m["id"] for m in models["data"]] == [MODEL]
    assert httpx.get(server.url + "/health", timeout=10).json() == {"status": "ok"}
    text = httpx.get(server.url + "/metrics", timeout=10).text
    for name in (
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:prompt_tokens_total",
        "vllm:generation_tokens_total",
        "vllm:num_preemptions_total",
        "vllm:prefix_cache_queries_total",
        "vllm:prefix_cache_hits_total",
        "vllm:time_to_first_token_seconds",
        "vllm:inter_token_latency_seconds",
        "vllm:e2e_request_latency_seconds",
    ):
        assert f"# TYPE {name} " in text, name
    prompt_before = metric(server, "vllm:prompt_tokens_total")
    ttft_before = parse_prometheus(text)[
        f'vllm:time_to_first_token_seconds_count{{model_name="{MODEL}"}}'
    ]
    r = post(server, "/v1/completions", {"prompt": [5, 6, 7], "max_tokens": 3, "ignore_eos": True})
    assert r.status_code == 200
    assert metric(server, "vllm:prompt_tokens_total") == prompt_before + 3
    after = parse_prometheus(httpx.get(server.url + "/metrics", timeout=10).text)
    assert (
        after[f'vllm:time_to_first_token_seconds_count{{model_name="{MODEL}"}}'] == ttft_before + 1
    )


@pytest.mark.model
def test_a_full_waiting_queue_answers_503_and_loses_nothing_admitted(real_model):
    model, tokenizer = real_model
    engine = LLMEngine(
        model,
        tokenizer,
        max_model_len=128,
        max_num_seqs=1,
        num_kv_blocks=32,
        attention_backend=default_attention_backend(model),
    )
    n_tokens = 30
    body = {
        "prompt": "Count to ten:",
        "max_tokens": n_tokens,
        "ignore_eos": True,
        "stream": True,
        "temperature": 0,
    }

    async def run(url):
        async with httpx.AsyncClient(timeout=60) as c:
            streams = []
            for i in range(3):  # one runs (max_num_seqs=1), two wait: the queue is full
                cm = c.stream("POST", url + "/v1/completions", json=body)
                r = await cm.__aenter__()
                assert r.status_code == 200
                lines = r.aiter_lines()
                first = []
                if i == 0:  # running for sure once its first token is out
                    first = [await anext(lines)]
                    while not first[-1].startswith("data: {"):
                        first.append(await anext(lines))
                streams.append((cm, lines, len([x for x in first if x.startswith("data: {")])))
            full = await c.post(url + "/v1/completions", json=dict(body, stream=False))
            counts = []
            for cm, lines, seen in streams:
                counts.append(seen + sum([1 async for line in lines if line.startswith("data: {")]))
                await cm.__aexit__(None, None, None)
            return full, counts

    with ServerThread(build_app(engine, "m", max_waiting=2)) as srv:
        full, counts = asyncio.run(asyncio.wait_for(run(srv.url), 120))
        assert full.status_code == 503, full.text
        assert "queue" in full.json()["error"]["message"]
        assert counts == [n_tokens] * 3, "every admitted request completes with all its tokens"
        ok = httpx.post(
            srv.url + "/v1/completions", timeout=60, json={"prompt": "Hi", "max_tokens": 2}
        )
        assert ok.status_code == 200
        assert engine.stats()["free_blocks"] == engine.num_kv_blocks


# ---- parts ------------------------------------------------------------------------------------


@pytest.mark.model
@pytest.mark.parametrize("quiet_s", [0.05, 0.0])
def test_a_burst_arriving_while_idle_joins_one_first_step(real_model, quiet_s):
    """Eight requests 2 ms apart: with the settle spell they share the first step (one prefill
    for all, as offline); without it (quiet 0) the first step starts with the first alone."""
    from llmlab.serve.async_engine import AsyncLLM

    model, tokenizer = real_model
    engine = LLMEngine(model, tokenizer, **engine_kwargs(model))
    first_batch = []
    step = engine.step

    def recording_step():
        if not first_batch:
            first_batch.append(len(engine.scheduler.waiting) + len(engine.scheduler.running))
        return step()

    engine.step = recording_step
    ids = tokenizer.encode(PROMPTS[0])

    async def run():
        llm = AsyncLLM(engine, settle_quiet_s=quiet_s, settle_max_s=1.0)
        llm.start()

        async def one(i):
            await asyncio.sleep(0.002 * i)
            stream = llm.add_request(f"r{i}", ids, SamplingParams(max_tokens=2, temperature=0))
            return [out async for out in stream]

        outs = await asyncio.wait_for(asyncio.gather(*(one(i) for i in range(8))), 60)
        await llm.stop()
        return outs

    outs = asyncio.run(run())
    assert all(sum(len(o.outputs[0].token_ids) for o in out) == 2 for out in outs)
    if quiet_s:
        assert first_batch == [8]
    else:
        assert first_batch[0] < 8
    assert engine.stats()["free_blocks"] == engine.num_kv_blocks


def test_the_settle_spell_is_checked():
    from llmlab.serve.async_engine import AsyncLLM

    engine = LLMEngine.__new__(LLMEngine)
    for quiet, most in [(-0.001, 0.05), (0.1, 0.05), (0.001, 2.0)]:
        with pytest.raises(ValueError, match="settle_quiet_s"):
            AsyncLLM(engine, settle_quiet_s=quiet, settle_max_s=most)


def test_histogram_buckets_are_cumulative():
    h = Histogram((0.1, 1.0))
    for v in (0.05, 0.1, 0.5, 3.0):
        h.observe(v)
    lines = parse_prometheus("\n".join(h.lines("x", 'a="b"')))
    assert lines['x_bucket{a="b",le="0.1"}'] == 2  # le: less than or equal
    assert lines['x_bucket{a="b",le="1.0"}'] == 3
    assert lines['x_bucket{a="b",le="+Inf"}'] == 4
    assert lines['x_count{a="b"}'] == 4 and lines['x_sum{a="b"}'] == pytest.approx(3.65)


@pytest.mark.slow
def test_the_serve_command_listens_answers_and_stops():
    with ServerProcess(
        "tiny", ["--max-model-len", "64", "--num-kv-blocks", "16"], start_timeout=120
    ) as srv:
        assert srv.url.startswith("http://127.0.0.1:")
        assert httpx.get(srv.url + "/health", timeout=10).status_code == 200
        r = httpx.post(
            srv.url + "/v1/completions",
            timeout=30,
            json={
                "model": "tiny",
                "prompt": [3, 4, 5],
                "max_tokens": 4,
                "ignore_eos": True,
                "return_token_ids": True,
            },
        )
        assert r.status_code == 200 and len(r.json()["choices"][0]["token_ids"]) == 4
        chat = httpx.post(
            srv.url + "/v1/chat/completions",
            timeout=30,
            json={"messages": [{"role": "user", "content": "hi"}]},
        )
        assert chat.status_code == 400 and chat.json()["error"]["param"] == "messages"
    assert srv.proc.returncode is not None


def test_serve_takes_a_device_and_refuses_a_gpu_this_machine_lacks():
    """`--device` and `--enforce-eager` reach the engine; where there is no CUDA GPU, asking for
    one is an error that names `device`."""
    import torch

    from llmlab.serve.launch import build_engine, engine_kwargs, parser

    args = parser().parse_args(["--device", "cpu", "--enforce-eager"])
    engine = build_engine("tiny", **engine_kwargs(args))
    assert engine.device.type == "cpu" and engine.config.enforce_eager
    assert build_engine("tiny").device.type == ("cuda" if torch.cuda.is_available() else "cpu")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="device='cuda'"):
            build_engine("tiny", **engine_kwargs(parser().parse_args(["--device", "cuda"])))


def test_the_connection_options_reach_uvicorn():
    """`serve`'s connection options become `uvicorn_config`'s keywords, each by its name."""
    from llmlab.serve.connections import connection_limits, uvicorn_config
    from llmlab.serve.launch import parser

    args = parser().parse_args(
        [
            "--limit-concurrency",
            "7",
            "--timeout-keep-alive",
            "2",
            "--timeout-graceful-shutdown",
            "4",
        ]
    )
    cfg = uvicorn_config(object(), "127.0.0.1", 0, **connection_limits(args))
    assert (cfg.limit_concurrency, cfg.timeout_keep_alive, cfg.timeout_graceful_shutdown) == (
        7,
        2,
        4,
    )
