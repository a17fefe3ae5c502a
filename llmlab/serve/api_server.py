"""An OpenAI-compatible HTTP server over `AsyncLLM` (vLLM's `entrypoints/openai/api_server.py`).

Routes: `POST /v1/completions`, `POST /v1/chat/completions` (the tokenizer's chat template),
`GET /v1/models`, `GET /health`, `GET /metrics` (Prometheus text).

Streaming (`"stream": true`) is server-sent events in OpenAI's format: one `data: {chunk}`
per new token, nothing with a non-empty `choices` before the first token (a client stamps its
TTFT on the first such chunk), the last token's chunk with its `finish_reason`, then a chunk
with `"choices": []` and `usage` when `stream_options.include_usage` is set, then
`data: [DONE]`. Without streaming the answer comes whole, with `usage`.

A bad request is a 4xx with `{"error": {"message", "type", "param", "code"}}`, `param` naming
the field; a full waiting queue is a 503. Neither disturbs anything already admitted.
"""
from __future__ import annotations

import asyncio
import json
import time
import uuid
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse

from llmlab.engine import LLMEngine
from llmlab.serve.async_engine import AsyncLLM, EngineDeadError, QueueFullError, RequestStream
from llmlab.serve.detokenizer import IncrementalDetokenizer
from llmlab.serve.protocol import (ChatCompletionRequest, CompletionRequest, OpenAIError,
                                   check_token_ids, parse_body, prompt_of, to_sampling_params)

DEFAULT_COMPLETION_MAX_TOKENS = 16           # OpenAI's default for /v1/completions


def _json(obj: Any) -> str:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


class OpenAIServing:
    """The endpoints' logic, apart from the web framework (so it reads top to bottom)."""

    def __init__(self, async_llm: AsyncLLM, served_model_names: list[str]) -> None:
        self.llm = async_llm
        self.engine: LLMEngine = async_llm.engine
        self.tokenizer = self.engine.tokenizer
        self.names = list(served_model_names)
        self.created = int(time.time())

    # ---- checks at the door ---------------------------------------------------------------

    def _check_model(self, model: str | None) -> str:
        if model is None:
            return self.names[0]
        if model not in self.names:
            raise OpenAIError(404, f"model {model!r} does not exist; this server serves "
                              f"{self.names}", "model", "NotFoundError")
        return model

    def _prompt_ids(self, body: CompletionRequest | ChatCompletionRequest) -> list[int]:
        if isinstance(body, ChatCompletionRequest):
            if self.tokenizer is None or not getattr(self.tokenizer, "chat_template", None):
                raise OpenAIError(400, "messages: this model has no chat template; use "
                                  "/v1/completions", "messages")
            rendered = self.tokenizer.apply_chat_template(
                [{"role": m.role, "content": m.text()} for m in body.messages],
                add_generation_prompt=True, tokenize=False)
            return list(self.tokenizer.encode(rendered))
        prompt = prompt_of(body)
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise OpenAIError(400, "prompt: this model has no tokenizer; send token ids",
                                  "prompt")
            ids = list(self.tokenizer.encode(prompt))
        else:
            ids = prompt
        check_token_ids(ids, self.engine.vocab_size, "prompt")
        return ids

    # ---- one request ----------------------------------------------------------------------

    def admit(self, body: CompletionRequest | ChatCompletionRequest) -> tuple[str, RequestStream, Any]:
        """Check a parsed request and hand it to the engine: (model name, stream, params)."""
        model = self._check_model(body.model)
        ids = self._prompt_ids(body)
        default = (DEFAULT_COMPLETION_MAX_TOKENS if isinstance(body, CompletionRequest)
                   else None)
        params = to_sampling_params(body, len(ids), self.engine.max_model_len,
                                    self.engine.vocab_size, default)
        prefix = "chatcmpl" if isinstance(body, ChatCompletionRequest) else "cmpl"
        request_id = f"{prefix}-{uuid.uuid4().hex}"
        try:
            stream = self.llm.add_request(request_id, ids, params)
        except QueueFullError as e:
            raise OpenAIError(503, str(e), None, "ServiceUnavailableError") from None
        except EngineDeadError as e:
            raise OpenAIError(500, str(e), None, "InternalServerError") from None
        except ValueError as e:
            raise OpenAIError(400, str(e), "prompt") from None
        return model, stream, ids

    def _choice(self, chat: bool, text: str, token_ids: list[int] | None,
                finish_reason: str | None, delta: bool, first: bool = True) -> dict[str, Any]:
        choice: dict[str, Any] = {"index": 0}
        if chat and delta:       # the role comes once, with the first token (as OpenAI's)
            choice["delta"] = {"role": "assistant", "content": text} if first else {"content": text}
        elif chat:
            choice["message"] = {"role": "assistant", "content": text}
        else:
            choice["text"] = text
        choice["logprobs"] = None
        choice["finish_reason"] = finish_reason
        if token_ids is not None:
            choice["token_ids"] = token_ids
        return choice

    @staticmethod
    def _usage(prompt: int, completion: int) -> dict[str, int]:
        return {"prompt_tokens": prompt, "completion_tokens": completion,
                "total_tokens": prompt + completion}

    async def full_response(self, body, model: str, stream: RequestStream,
                            prompt_ids: list[int]) -> dict[str, Any]:
        """Wait for every token; the whole answer with `usage`."""
        chat = isinstance(body, ChatCompletionRequest)
        token_ids: list[int] = []
        finish_reason = None
        async for delta in stream:
            token_ids.extend(delta.outputs[0].token_ids)
            finish_reason = delta.outputs[0].finish_reason
        text = ("" if self.tokenizer is None
                else self.tokenizer.decode(token_ids, skip_special_tokens=True))
        out = {"id": stream.request_id, "object": "chat.completion" if chat else "text_completion",
               "created": int(time.time()), "model": model,
               "choices": [self._choice(chat, text, token_ids if body.return_token_ids else None,
                                        finish_reason, delta=False)],
               "usage": self._usage(len(prompt_ids), len(token_ids))}
        if body.return_token_ids:
            out["prompt_token_ids"] = prompt_ids
        return out

    async def sse_events(self, body, model: str, stream: RequestStream,
                         prompt_ids: list[int]) -> AsyncIterator[str]:
        """Server-sent events; a client that goes away cancels this, which aborts the request."""
        chat = isinstance(body, ChatCompletionRequest)
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        head = {"id": stream.request_id,
                "object": "chat.completion.chunk" if chat else "text_completion",
                "created": int(time.time()), "model": model}
        detok = IncrementalDetokenizer(self.tokenizer)
        n = 0
        try:
            async for delta in stream:
                new = delta.outputs[0].token_ids
                n += len(new)
                finish_reason = delta.outputs[0].finish_reason
                text = detok.push(new)
                if finish_reason is not None:
                    text += detok.flush()
                first = n == len(new)
                chunk = dict(head, choices=[self._choice(
                    chat, text, new if body.return_token_ids else None, finish_reason,
                    delta=True, first=first)])
                if include_usage:
                    chunk["usage"] = None
                if first and body.return_token_ids:
                    chunk["prompt_token_ids"] = prompt_ids
                yield f"data: {_json(chunk)}\n\n"
            if include_usage:
                yield f"data: {_json(dict(head, choices=[], usage=self._usage(len(prompt_ids), n)))}\n\n"
            yield "data: [DONE]\n\n"
        except EngineDeadError as e:
            yield f"data: {_json(OpenAIError(500, str(e), None, 'InternalServerError').body())}\n\n"
        except ValueError as e:              # the engine refused it when it joined
            yield f"data: {_json(OpenAIError(400, str(e), 'prompt').body())}\n\n"
        finally:
            if not stream.finished:
                self.llm.abort(stream.request_id)

    def models(self) -> dict[str, Any]:
        return {"object": "list", "data": [
            {"id": name, "object": "model", "created": self.created, "owned_by": "llmlab",
             "max_model_len": self.engine.max_model_len} for name in self.names]}


async def _until_disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


def build_app(engine: LLMEngine, served_model_names: list[str] | str = "llmlab",
              max_waiting: int = 256) -> Any:
    """The FastAPI application serving `engine` under the given model name(s)."""
    names = [served_model_names] if isinstance(served_model_names, str) else list(served_model_names)
    if not names or not all(isinstance(n, str) and n for n in names):
        raise ValueError(f"served_model_names must be one or more non-empty names, got {names!r}")
    async_llm = AsyncLLM(engine, max_waiting=max_waiting, model_name=names[0])
    serving = OpenAIServing(async_llm, names)

    @asynccontextmanager
    async def lifespan(app):
        async_llm.start()
        yield
        await async_llm.stop()

    app = FastAPI(title="llmlab", lifespan=lifespan)
    app.state.async_llm = async_llm
    app.state.serving = serving

    @app.exception_handler(OpenAIError)
    async def openai_error(_request, exc: OpenAIError):
        return JSONResponse(exc.body(), status_code=exc.status)

    async def generate(request: Request, model_cls) -> Any:
        body = parse_body(await request.body(), model_cls)
        model, stream, prompt_ids = serving.admit(body)
        if body.stream:
            return StreamingResponse(serving.sse_events(body, model, stream, prompt_ids),
                                     media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache"})
        # no stream to cancel: watch the connection ourselves, abort when the client leaves
        answer = asyncio.ensure_future(serving.full_response(body, model, stream, prompt_ids))
        gone = asyncio.ensure_future(_until_disconnected(request))
        try:
            await asyncio.wait({answer, gone}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
        if not answer.done():
            answer.cancel()
            async_llm.abort(stream.request_id)
            return PlainTextResponse("client disconnected", status_code=499)
        try:
            return JSONResponse(answer.result())
        except EngineDeadError as e:
            raise OpenAIError(500, str(e), None, "InternalServerError") from None
        except ValueError as e:              # the engine refused it when it joined
            raise OpenAIError(400, str(e), "prompt") from None

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await generate(request, CompletionRequest)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await generate(request, ChatCompletionRequest)

    @app.get("/v1/models")
    async def models():
        return serving.models()

    @app.get("/health")
    async def health():
        if async_llm.dead is not None:
            return JSONResponse({"status": "dead", "error": repr(async_llm.dead)}, status_code=500)
        return {"status": "ok"}

    @app.get("/metrics")
    async def metrics():
        return PlainTextResponse(async_llm.metrics.render(async_llm.stats, async_llm.num_pending),
                                 media_type="text/plain; version=0.0.4")

    return app
