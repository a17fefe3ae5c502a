"""An OpenAI-compatible HTTP server over `AsyncLLM` (vLLM's `entrypoints/openai/api_server.py`).

Routes: `POST /v1/completions`, `POST /v1/chat/completions` (the tokenizer's chat template),
`GET /v1/models`, `GET /v1/models/{id}`, `GET /health`, `GET /metrics` (Prometheus text). This
module is the web framework's side (the app, its routes, the body read, errors as JSON); what a
route does is `llmlab.serve.serving`'s (admission) and `llmlab.serve.responses`' (the answer).

Streaming (`"stream": true`) is server-sent events in OpenAI's format: one `data: {chunk}`
per new token and choice, nothing with a non-empty `choices` before the first token (a client
stamps its TTFT on the first such chunk), the last token's chunk with its `finish_reason`,
then a chunk with `"choices": []` and `usage` when `stream_options.include_usage` is set, then
`data: [DONE]`. Without streaming the answer comes whole, with `usage`.

What clients rely on, as vLLM serves it: `stop` strings (matched on the text; a stream never
sends text that a later match removes), `n` choices per prompt (parallel sampling: the
children share the prompt's KV blocks through the prefix cache; with a `seed`, child i uses
seed + i), a list of prompts, `logprobs` / `top_logprobs`, `echo` (with the prompt's logprobs),
presence / frequency / repetition penalties, `logit_bias`, and structured output
(`response_format` json_object / json_schema, or vLLM's `structured_outputs`).

What the door keeps out: a body that is not `Content-Type: application/json` (415) or larger
than `max_body_bytes` (413), a wrong or missing API key when one is set (401, the scheme
`Bearer` in any case, as vLLM reads it), and every bad field (400, naming it and quoting at
most a short prefix of it). A request that can never fit (more sequences than the waiting
queue holds, a prompt past the context) is a 400; a full waiting queue, which frees up, a
503. Every error, 404 and 405 included, is a JSON body in OpenAI's shape
`{"error": {"message", "type", "param", "code"}}`. None of them disturbs anything admitted.

Nothing a body holds runs long on the event loop: a large body is parsed, every batch of
prompts and every chat is tokenized or rendered, on a worker thread; a grammar is compiled
in a worker process with a time limit and probed for its cost first
(`llmlab.serve.grammar_compiler`), its compile killed when its client leaves; in the engine,
one request's mask fill gets `fill_budget_s` per step (`GrammarLimits`). A client that leaves
before its answer is counted in `/metrics` and logged at its 1st, 10th, 100th, ... of a kind,
never with a traceback.
"""

from __future__ import annotations

import asyncio
import gc
import hashlib
import hmac
import logging
from contextlib import asynccontextmanager
from typing import Any, Callable

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from llmlab.engine import LLMEngine
from llmlab.serve.async_engine import AsyncLLM
from llmlab.serve.grammar_compiler import GrammarLimits
from llmlab.serve.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    OpenAIError,
    parse_body,
    short,
)
from llmlab.serve.responses import FAILURES, failure
from llmlab.serve.serving import PARSE_INLINE_BYTES, OpenAIServing, default_max_body_bytes

logger = logging.getLogger("llmlab.serve")


class ClientGone(Exception):
    """The client closed its connection before its answer. kind: "body" (while sending it),
    "admission" (while its prompt was tokenized or its grammar compiled), "answer" (while
    waiting for a whole answer; a stream that is left is cancelled by the framework)."""

    def __init__(self, kind: str) -> None:
        super().__init__(kind)
        self.kind = kind


async def _until_disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def unless_client_leaves(request: Request, work: Any, kind: str) -> Any:
    """Await `work` (a coroutine) unless the client disconnects first: then `work` is
    cancelled (a grammar compile in flight is killed) and ClientGone(kind) raised."""
    task = asyncio.ensure_future(work)
    gone = asyncio.ensure_future(_until_disconnected(request))
    try:
        await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
        if not task.done():
            task.cancel()
    if not task.done() or task.cancelled():
        raise ClientGone(kind)
    return task.result()


BODY_TIMEOUT_S = 30.0  # a body that takes longer to arrive is refused (408)


async def read_body(request: Request, max_bytes: int, timeout_s: float = BODY_TIMEOUT_S) -> bytes:
    """The body, refused with 413 as soon as it is known to pass `max_bytes`, and with 408 if
    it has not all arrived within `timeout_s` (a client trickling its body holds no slot)."""
    try:
        return await asyncio.wait_for(_read_body(request, max_bytes), timeout_s)
    except asyncio.TimeoutError:
        raise OpenAIError(
            408, f"the request body did not arrive within {timeout_s:.0f} s", "body"
        ) from None


async def _read_body(request: Request, max_bytes: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > max_bytes:
        raise OpenAIError(
            413,
            f"the request body has {int(declared)} bytes, more than this "
            f"server's limit of {max_bytes} (--max-body-bytes)",
            "body",
        )
    chunks, size = [], 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > max_bytes:
                raise OpenAIError(
                    413,
                    f"the request body is larger than this server's limit of "
                    f"{max_bytes} bytes (--max-body-bytes)",
                    "body",
                )
            chunks.append(chunk)
    except ClientDisconnect:
        raise ClientGone("body") from None
    return b"".join(chunks)


def check_content_type(request: Request) -> None:
    """JSON only: a browser's form or text/plain POST (sent cross-site with no preflight) is
    refused before its body is read."""
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if kind != "application/json":
        raise OpenAIError(
            415,
            f"Content-Type must be application/json, got {short(kind or 'none')}",
            "Content-Type",
        )


def build_app(
    engine: LLMEngine,
    served_model_names: list[str] | str = "llmlab",
    max_waiting: int = 256,
    api_key: str | None = None,
    max_body_bytes: int | None = None,
    enable_docs: bool = True,
    on_fatal: Callable[[BaseException], None] | None = None,
    grammar_limits: GrammarLimits | None = None,
) -> Any:
    """The FastAPI application serving `engine` under the given model name(s).

    api_key: when set, every `/v1/*` request needs `Authorization: Bearer <api_key>` (401
    otherwise). max_body_bytes: the largest request body (None: `default_max_body_bytes` of the
    engine's max_model_len). enable_docs: FastAPI's /docs, /redoc and /openapi.json.
    on_fatal: called when the engine cannot continue (the `serve` command exits then).
    grammar_limits: what a client's grammar may cost (None: `GrammarLimits()`'s defaults).
    """
    names = (
        [served_model_names] if isinstance(served_model_names, str) else list(served_model_names)
    )
    if not names or not all(isinstance(n, str) and n for n in names):
        raise ValueError(f"served_model_names must be one or more non-empty names, got {names!r}")
    if api_key is not None and (not isinstance(api_key, str) or not api_key):
        raise ValueError("api_key must be None or a non-empty str")
    if max_body_bytes is None:
        max_body_bytes = default_max_body_bytes(engine.max_model_len)
    if not isinstance(max_body_bytes, int) or max_body_bytes < 1024:
        raise ValueError(f"max_body_bytes must be an int >= 1024, got {max_body_bytes!r}")
    if grammar_limits is not None and not isinstance(grammar_limits, GrammarLimits):
        raise ValueError(f"grammar_limits must be None or a GrammarLimits, got {grammar_limits!r}")
    async_llm = AsyncLLM(engine, max_waiting=max_waiting, model_name=names[0], on_fatal=on_fatal)
    serving = OpenAIServing(async_llm, names, grammar_limits)

    @asynccontextmanager
    async def lifespan(app):
        _freeze_heap(True)
        async_llm.start()
        yield
        serving.close()
        await async_llm.stop()
        _freeze_heap(False)

    docs = {} if enable_docs else dict(docs_url=None, redoc_url=None, openapi_url=None)
    app = FastAPI(title="llmlab", lifespan=lifespan, **docs)
    app.state.async_llm = async_llm
    app.state.serving = serving
    app.state.max_body_bytes = max_body_bytes
    _error_handlers(app, serving)
    if api_key is not None:
        _api_key_guard(app, api_key)
    _generation_routes(app, serving, max_body_bytes)
    _info_routes(app, serving)
    return app


_serving = [0]  # servers running in this process (tests run several)


def _freeze_heap(starting: bool) -> None:
    """What exists when a server starts (the model, the libraries) is left out of the garbage
    collector's full passes, as vLLM's server does: over that heap one pass took 0.9 s, every
    thread stopped. Unfrozen when the last server of the process stops."""
    _serving[0] += 1 if starting else -1
    if starting:
        gc.freeze()
    elif _serving[0] == 0:
        gc.unfreeze()


def _error_handlers(app: Any, serving: OpenAIServing) -> None:
    """Every error as OpenAI's JSON body; a client that left counted, not logged each time."""

    @app.exception_handler(OpenAIError)
    async def openai_error(_request, exc: OpenAIError):
        return JSONResponse(exc.body(), status_code=exc.status)

    @app.exception_handler(ClientGone)
    async def client_gone(_request, exc: ClientGone):
        serving.client_gone(exc.kind)
        return PlainTextResponse("client disconnected", status_code=499)  # nobody reads it

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request, exc: StarletteHTTPException):
        path = short(request.url.path)
        if exc.status_code == 404:
            message = f"no route {request.method} {path} on this server"
        elif exc.status_code == 405:
            message = f"{request.method} is not allowed on {path}"
        else:
            message = str(exc.detail)
        return JSONResponse(
            OpenAIError(exc.status_code, message).body(),
            status_code=exc.status_code,
            headers=getattr(exc, "headers", None),
        )

    @app.exception_handler(Exception)
    async def server_error(_request, exc: Exception):
        logger.error("unexpected error while answering a request", exc_info=exc)
        return JSONResponse(
            OpenAIError(
                500, f"internal server error: {type(exc).__name__}", None, "InternalServerError"
            ).body(),
            status_code=500,
        )


def api_key_matches(header: str, key_digest: bytes) -> bool:
    """`Authorization: Bearer <key>`, the scheme in any case (RFC 9110; vLLM reads it so),
    compared in constant time (digests of equal length, whatever was sent)."""
    scheme, _, token = header.strip().partition(" ")
    given = hashlib.sha256(token.strip().encode()).digest()
    return hmac.compare_digest(given, key_digest) and scheme.lower() == "bearer"


def _api_key_guard(app: Any, api_key: str) -> None:
    key_digest = hashlib.sha256(api_key.encode()).digest()

    @app.middleware("http")
    async def check_api_key(request: Request, call_next):
        if request.url.path.startswith("/v1/") or request.url.path == "/v1":
            if not api_key_matches(request.headers.get("authorization", ""), key_digest):
                return JSONResponse(
                    OpenAIError(
                        401,
                        "missing or wrong API key: send 'Authorization: Bearer <key>'",
                        None,
                        "AuthenticationError",
                    ).body(),
                    status_code=401,
                )
        return await call_next(request)


def _generation_routes(app: Any, serving: OpenAIServing, max_body_bytes: int) -> None:
    async def generate(request: Request, model_cls) -> Any:
        check_content_type(request)
        raw = await read_body(request, max_body_bytes)
        if len(raw) <= PARSE_INLINE_BYTES:
            body = parse_body(raw, model_cls)
        else:  # a 1 MB body of 280,000 prompts takes a while to parse and check
            body = await asyncio.to_thread(parse_body, raw, model_cls)
        ignored = body.ignored_fields()
        if ignored:
            logger.warning("request fields ignored (not served here): %s", short(ignored))
        gen = await unless_client_leaves(request, serving.admit(body), "admission")
        if body.stream:
            return StreamingResponse(
                serving.answers.sse_events(body, gen),
                media_type="text/event-stream",
                headers={"Cache-Control": "no-cache"},
            )
        # no stream to cancel: watch the connection ourselves, abort when the client leaves
        try:
            answer = await unless_client_leaves(
                request, serving.answers.full_response(body, gen), "answer"
            )
        except FAILURES as e:
            raise failure(e, body) from None
        finally:
            serving.abort(gen)
        return JSONResponse(answer)

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await generate(request, CompletionRequest)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await generate(request, ChatCompletionRequest)


def _info_routes(app: Any, serving: OpenAIServing) -> None:
    async_llm = serving.llm

    @app.get("/v1/models")
    async def models():
        return serving.models()

    @app.get("/v1/models/{model_id:path}")
    async def model(model_id: str):
        if model_id not in serving.names:
            raise OpenAIError(
                404,
                f"model {short(model_id)} does not exist; this server serves {serving.names}",
                "model",
                "NotFoundError",
            )
        return serving.model_card(model_id)

    @app.get("/health")
    async def health():
        if async_llm.dead is not None:
            return JSONResponse({"status": "dead", "error": repr(async_llm.dead)}, status_code=503)
        return {"status": "ok"}

    @app.get("/metrics")
    async def metrics():
        return PlainTextResponse(
            async_llm.metrics.render(async_llm.stats, async_llm.num_pending),
            media_type="text/plain; version=0.0.4",
        )
