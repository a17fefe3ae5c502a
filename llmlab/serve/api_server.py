"""An OpenAI-compatible HTTP server over `AsyncLLM` (vLLM's `entrypoints/openai/api_server.py`).

Routes: `POST /v1/completions`, `POST /v1/chat/completions` (the tokenizer's chat template),
`GET /v1/models`, `GET /v1/models/{id}`, `GET /health`, `GET /metrics` (Prometheus text).

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
import json
import logging
import time
import uuid
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, AsyncIterator, Callable

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from llmlab.engine import LLMEngine
from llmlab.engine.outputs import RequestOutput
from llmlab.sampling.params import INT64_MAX, Logprob, SamplingParams
from llmlab.sampling.structured_output import StructuredOutputsParams
from llmlab.serve.async_engine import (
    AsyncLLM,
    EngineDeadError,
    GrammarFailedError,
    QueueFullError,
    RequestFailedError,
    RequestStream,
    StepFailedError,
)
from llmlab.serve.grammar_compiler import (
    GrammarBusy,
    GrammarCompilePool,
    GrammarLimits,
    GrammarRefused,
)
from llmlab.serve.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    OpenAIError,
    check_token_ids,
    parse_body,
    prompt_count,
    prompts_of,
    short,
    structured_outputs_of,
    to_sampling_params,
)

DEFAULT_COMPLETION_MAX_TOKENS = 16  # OpenAI's default for /v1/completions
TOKENIZE_INLINE_CHARS = 4096  # one prompt up to this long is tokenized on the event loop
PARSE_INLINE_BYTES = 64 * 1024  # a larger body is parsed and checked on a worker thread
MAX_OVERRUNNING_FILLS = 2  # grammar fills left running past their budget before new grammars wait
logger = logging.getLogger("llmlab.serve")


class ClientGone(Exception):
    """The client closed its connection before its answer. kind: "body" (while sending it),
    "admission" (while its prompt was tokenized or its grammar compiled), "answer" (while
    waiting for a whole answer; a stream that is left is cancelled by the framework)."""

    def __init__(self, kind: str) -> None:
        super().__init__(kind)
        self.kind = kind


def default_max_body_bytes(max_model_len: int) -> int:
    """The body cap for a context of `max_model_len` tokens: room for a prompt that fills it
    even as escaped JSON (a token is rarely over 16 characters, a character at most 6 bytes
    as \\uXXXX) plus 1 MiB for the rest of the body."""
    return (1 << 20) + 96 * max_model_len


def _json(obj: Any) -> str:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


@dataclass
class Choice:
    """One sequence the client gets: prompt `prompt_index`, its stream, its place in `choices`."""

    index: int
    prompt_index: int
    stream: RequestStream


@dataclass
class Generation:
    """An admitted request: its choices (n per prompt) and what the answer needs."""

    request_id: str
    model: str
    chat: bool
    prompts: list[list[int]]
    choices: list[Choice]
    params: SamplingParams


class OpenAIServing:
    """The endpoints' logic, apart from the web framework (so it reads top to bottom)."""

    def __init__(
        self,
        async_llm: AsyncLLM,
        served_model_names: list[str],
        grammar_limits: GrammarLimits | None = None,
    ) -> None:
        self.llm = async_llm
        self.engine: LLMEngine = async_llm.engine
        self.tokenizer = self.engine.tokenizer
        self.names = list(served_model_names)
        self.created = int(time.time())
        self.grammar_limits = grammar_limits or GrammarLimits()
        self.grammar_pool: GrammarCompilePool | None = None  # made on the first grammar
        self._grammar_setup: asyncio.Lock | None = None

    def client_gone(self, kind: str) -> None:
        """Count a client that left early; log the 1st, 10th, 100th, ... of each kind."""
        counts = self.llm.metrics.client_disconnects
        n = counts[kind] = counts.get(kind, 0) + 1
        if n == 10 ** (len(str(n)) - 1):
            logger.warning(
                "a client left before its answer, during %s (%d so far of that kind; "
                "llmlab:client_disconnects_total counts them all)",
                kind,
                n,
            )

    def close(self) -> None:
        """Stop the grammar workers (a compile in flight too)."""
        if self.grammar_pool is not None:
            self.grammar_pool.close()

    # ---- checks at the door ---------------------------------------------------------------

    def _check_model(self, model: str | None) -> str:
        if model is None:
            return self.names[0]
        if model not in self.names:
            raise OpenAIError(
                404,
                f"model {short(model)} does not exist; this server serves {self.names}",
                "model",
                "NotFoundError",
            )
        return model

    async def _prompt_ids(self, body: CompletionRequest | ChatCompletionRequest) -> list[list[int]]:
        """The prompts' token ids, checked. On a worker thread (the tokenizer lets the event
        loop run meanwhile) unless it is one short text: a chat template, a batch of prompts or
        a long text never stalls the other streams."""
        if isinstance(body, ChatCompletionRequest):
            if self.tokenizer is None or not getattr(self.tokenizer, "chat_template", None):
                raise OpenAIError(
                    400,
                    "messages: this model has no chat template; use /v1/completions",
                    "messages",
                )
            return [await asyncio.to_thread(self._chat_ids, body)]
        p = body.prompt
        if isinstance(p, str) and self.tokenizer is not None and len(p) <= TOKENIZE_INLINE_CHARS:
            return self._completion_ids(body)
        return await asyncio.to_thread(self._completion_ids, body)

    def _chat_ids(self, body: ChatCompletionRequest) -> list[int]:
        messages = [{"role": m.role, "content": m.text()} for m in body.messages]
        text = self.tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=False
        )
        return list(self.tokenizer.encode(text))

    def _completion_ids(self, body: CompletionRequest) -> list[list[int]]:
        out = []
        batch = prompts_of(body)
        for i, prompt in enumerate(batch):
            param = "prompt" if len(batch) == 1 else f"prompt[{i}]"
            if isinstance(prompt, str):
                if self.tokenizer is None:
                    raise OpenAIError(
                        400, f"{param}: this model has no tokenizer; send token ids", param
                    )
                ids = list(self.tokenizer.encode(prompt))
            else:
                ids = prompt
            check_token_ids(ids, self.engine.vocab_size, param)
            out.append(ids)
        return out

    def _check_fits(self, body: CompletionRequest | ChatCompletionRequest) -> None:
        """A request of more sequences than the waiting queue ever holds can never be admitted:
        a 400 (a 503 would have the client retry in vain), before anything is tokenized."""
        count = 1 if isinstance(body, ChatCompletionRequest) else prompt_count(body)
        total = count * body.n
        if total > self.llm.max_waiting:
            raise OpenAIError(
                400,
                f"prompt: {count} prompt(s) with n={short(body.n)} make {short(total)} "
                "sequences, more than this server ever queues at once "
                f"(max_waiting={self.llm.max_waiting}); send fewer per request",
                "prompt",
            )

    async def _grammar_pool(self) -> GrammarCompilePool | None:
        """The compile workers, made on the first grammar with the engine's grammar manager
        (xgrammar reads the vocabulary then); None when the engine has its own backend."""
        if self._grammar_setup is None:
            self._grammar_setup = asyncio.Lock()
        async with self._grammar_setup:
            if self.grammar_pool is None:
                manager = await asyncio.to_thread(self.engine.structured_outputs)
                if manager.backend is not None:
                    return None
                limits = self.grammar_limits
                manager.set_limits(
                    cache_limit_bytes=limits.cache_mb << 20, fill_budget_s=limits.fill_budget_s
                )
                self.grammar_pool = GrammarCompilePool(manager.info, limits)
            return self.grammar_pool

    async def _compile_grammar(self, spec: StructuredOutputsParams, field: str) -> None:
        """Compile `spec` (or find it in the cache) before its request is admitted, and attach
        it: the engine never compiles in its step. Refusals name `field`."""
        pool = await self._grammar_pool()
        if pool is None:
            return
        manager = self.engine.structured_outputs()
        if manager.overrunning_fills >= MAX_OVERRUNNING_FILLS:
            raise OpenAIError(
                503,
                "grammar masks left running past their budget still hold this server's cores; "
                "try again later",
                field,
                "ServiceUnavailableError",
            )
        compiled = manager.cached(spec)
        if compiled is None:
            try:
                compiled = await pool.compile(spec)
            except GrammarRefused as e:
                if e.why != "invalid":  # one that costs too much
                    refused = self.llm.metrics.grammars_refused
                    refused[e.why] = refused.get(e.why, 0) + 1
                raise OpenAIError(400, f"{field}: {e}", field) from None
            except GrammarBusy as e:
                raise OpenAIError(503, f"{field}: {e}", field, "ServiceUnavailableError") from None
            manager.remember(spec, compiled)
        spec._compiled = compiled

    # ---- one request ----------------------------------------------------------------------

    async def admit(self, body: CompletionRequest | ChatCompletionRequest) -> Generation:
        """Check a parsed request and hand its n × prompts sequences to the engine."""
        model = self._check_model(body.model)
        chat = isinstance(body, ChatCompletionRequest)
        if body.n > self.engine.config.max_num_seqs:
            raise OpenAIError(
                400,
                f"n must be in [1, max_num_seqs={self.engine.config.max_num_seqs}]"
                f" (the choices of a request run in one batch), got {short(body.n)}",
                "n",
            )
        if (body.stop or body_echo(body)) and self.tokenizer is None:
            raise OpenAIError(
                400,
                "stop strings and echo need a tokenizer; this model has none (use stop_token_ids)",
                "stop",
            )
        self._check_fits(body)
        spec = structured_outputs_of(body)
        if spec is not None:
            field = "response_format" if body.response_format is not None else "structured_outputs"
            if self.tokenizer is None:
                raise OpenAIError(
                    400, "structured output needs a tokenizer; this model has none", field
                )
            await self._compile_grammar(spec, field)
        prompts = await self._prompt_ids(body)
        default = None if chat else DEFAULT_COMPLETION_MAX_TOKENS
        params = [
            to_sampling_params(
                body, len(ids), self.engine.max_model_len, self.engine.vocab_size, default, spec
            )
            for ids in prompts
        ]
        total = len(prompts) * body.n
        if self.llm.num_waiting + total > self.llm.max_waiting:
            self.llm.metrics.rejected_queue_full += 1
            raise OpenAIError(
                503,
                f"the waiting queue is full ({self.llm.max_waiting} requests); try again later",
                None,
                "ServiceUnavailableError",
            )
        request_id = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        choices: list[Choice] = []
        try:
            for p, (ids, base) in enumerate(zip(prompts, params)):
                for j in range(body.n):
                    child = base if body.n == 1 else _child_params(base, j)
                    rid = request_id if total == 1 else f"{request_id}-{len(choices)}"
                    choices.append(Choice(len(choices), p, self.llm.add_request(rid, ids, child)))
        except (QueueFullError, EngineDeadError, ValueError) as e:
            for c in choices:  # all or nothing
                self.llm.abort(c.stream.request_id)
            if isinstance(e, QueueFullError):
                raise OpenAIError(503, str(e), None, "ServiceUnavailableError") from None
            if isinstance(e, EngineDeadError):
                raise OpenAIError(503, str(e), None, "ServiceUnavailableError") from None
            raise OpenAIError(400, str(e), "prompt") from None
        return Generation(request_id, model, chat, prompts, choices, params[0])

    def abort(self, gen: Generation) -> None:
        for c in gen.choices:
            if not c.stream.finished:
                self.llm.abort(c.stream.request_id)

    # ---- answers --------------------------------------------------------------------------

    def _token_text(self, token_id: int) -> str:
        return "" if self.tokenizer is None else self.tokenizer.decode([token_id])

    def _completion_logprobs(
        self, token_ids: list[int], entries: list[dict[int, Logprob] | None], offset: int
    ) -> dict[str, Any]:
        """OpenAI's legacy completions logprobs: tokens, token_logprobs, top_logprobs and
        text_offset (characters from the start of the choice's text, `offset` first)."""
        tokens, token_lps, tops, offsets = [], [], [], []
        for tok, entry in zip(token_ids, entries):
            text = self._token_text(tok)
            tokens.append(text)
            offsets.append(offset)
            offset += len(text)
            if entry is None:  # the prompt's first token has no logprob
                token_lps.append(None)
                tops.append(None)
                continue
            token_lps.append(entry[tok].logprob)
            tops.append({self._token_text(t): lp.logprob for t, lp in entry.items()})
        return {
            "tokens": tokens,
            "token_logprobs": token_lps,
            "top_logprobs": tops,
            "text_offset": offsets,
        }

    def _chat_logprobs(
        self, token_ids: list[int], entries: list[dict[int, Logprob]], k: int
    ) -> dict[str, Any]:
        """OpenAI's chat logprobs: per token its text, logprob, UTF-8 bytes and the top k."""

        def item(t: int, lp: float) -> dict[str, Any]:
            text = self._token_text(t)
            return {"token": text, "logprob": lp, "bytes": list(text.encode("utf-8"))}

        content = []
        for tok, entry in zip(token_ids, entries):
            top = sorted((lp.rank, t, lp.logprob) for t, lp in entry.items() if lp.rank <= k)
            content.append(
                dict(
                    item(tok, entry[tok].logprob),
                    top_logprobs=[item(t, lp) for _, t, lp in top[:k]],
                )
            )
        return {"content": content}

    def _choice(
        self,
        gen: Generation,
        index: int,
        text: str,
        token_ids: list[int] | None,
        finish_reason: str | None,
        stop_reason: Any,
        logprobs: Any,
        delta: bool,
        first: bool = True,
    ) -> dict[str, Any]:
        choice: dict[str, Any] = {"index": index}
        if gen.chat and delta:  # the role comes once, with the first token (as OpenAI's)
            choice["delta"] = {"role": "assistant", "content": text} if first else {"content": text}
        elif gen.chat:
            choice["message"] = {"role": "assistant", "content": text}
        else:
            choice["text"] = text
        choice["logprobs"] = logprobs
        choice["finish_reason"] = finish_reason
        choice["stop_reason"] = stop_reason
        if token_ids is not None:
            choice["token_ids"] = token_ids
        return choice

    def _logprobs_of(
        self,
        gen: Generation,
        body: Any,
        token_ids: list[int],
        entries: list | None,
        prompt_ids: list[int] | None,
        prompt_entries: list | None,
        offset: int,
    ) -> Any:
        if entries is None and prompt_entries is None:
            return None
        if gen.chat:
            return self._chat_logprobs(token_ids, entries or [], body.top_logprobs or 0)
        ids = list(prompt_ids or []) + token_ids
        return self._completion_logprobs(
            ids, list(prompt_entries or []) + list(entries or []), offset
        )

    def _echo_text(self, gen: Generation, body: Any, prompt_index: int) -> str:
        """The prompt as `echo` returns it: the text sent, or token ids decoded."""
        if gen.chat or not body.echo:
            return ""
        prompt = prompts_of(body)[prompt_index]
        return (
            prompt if isinstance(prompt, str) else self.tokenizer.decode(gen.prompts[prompt_index])
        )

    @staticmethod
    def _usage(prompt: int, completion: int) -> dict[str, int]:
        return {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        }

    async def full_response(self, body: Any, gen: Generation) -> dict[str, Any]:
        """Wait for every token of every choice; the whole answer with `usage`."""
        n = len(gen.choices)
        token_ids: list[list[int]] = [[] for _ in range(n)]
        texts = [""] * n
        entries: list[list | None] = [None] * n
        prompt_entries: list[list | None] = [None] * n
        finish: list[tuple[Any, Any]] = [(None, None)] * n
        async for i, delta in _merged([c.stream for c in gen.choices]):
            out = delta.outputs[0]
            token_ids[i].extend(out.token_ids)
            texts[i] += out.text
            if out.logprobs is not None:
                entries[i] = (entries[i] or []) + out.logprobs
            if delta.prompt_logprobs is not None:
                prompt_entries[i] = delta.prompt_logprobs
            finish[i] = (out.finish_reason, out.stop_reason)
        choices = []
        for c in gen.choices:
            i = c.index
            echo = self._echo_text(gen, body, c.prompt_index)
            logprobs = self._logprobs_of(
                gen,
                body,
                token_ids[i],
                entries[i],
                gen.prompts[c.prompt_index] if body_echo(body) else None,
                prompt_entries[i] if body_echo(body) else None,
                0,
            )
            choices.append(
                self._choice(
                    gen,
                    i,
                    echo + texts[i],
                    token_ids[i] if body.return_token_ids else None,
                    *finish[i],
                    logprobs,
                    delta=False,
                )
            )
        out = {
            "id": gen.request_id,
            "object": "chat.completion" if gen.chat else "text_completion",
            "created": int(time.time()),
            "model": gen.model,
            "choices": choices,
            "usage": self._usage(sum(map(len, gen.prompts)), sum(map(len, token_ids))),
        }
        if body.return_token_ids:
            out["prompt_token_ids"] = gen.prompts[0] if len(gen.prompts) == 1 else gen.prompts
        return out

    async def sse_events(self, body: Any, gen: Generation) -> AsyncIterator[str]:
        """Server-sent events; a client that goes away cancels this, which aborts the request."""
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        head = {
            "id": gen.request_id,
            "object": "chat.completion.chunk" if gen.chat else "text_completion",
            "created": int(time.time()),
            "model": gen.model,
        }
        n = len(gen.choices)
        counts = [0] * n
        offsets = [0] * n
        try:
            async for i, delta in _merged([c.stream for c in gen.choices]):
                c = gen.choices[i]
                out = delta.outputs[0]
                first = counts[i] == 0
                counts[i] += len(out.token_ids)
                text = out.text
                echo = self._echo_text(gen, body, c.prompt_index) if first else ""
                logprobs = self._logprobs_of(
                    gen,
                    body,
                    out.token_ids,
                    out.logprobs,
                    gen.prompts[c.prompt_index] if first and body_echo(body) else None,
                    delta.prompt_logprobs if first and body_echo(body) else None,
                    offsets[i],
                )
                offsets[i] += len(echo) + len(text)
                chunk = dict(
                    head,
                    choices=[
                        self._choice(
                            gen,
                            i,
                            echo + text,
                            out.token_ids if body.return_token_ids else None,
                            out.finish_reason,
                            out.stop_reason,
                            logprobs,
                            delta=True,
                            first=first,
                        )
                    ],
                )
                if include_usage:
                    chunk["usage"] = None
                if first and body.return_token_ids:
                    chunk["prompt_token_ids"] = gen.prompts[c.prompt_index]
                yield f"data: {_json(chunk)}\n\n"
            if include_usage:
                usage = self._usage(sum(map(len, gen.prompts)), sum(counts))
                yield f"data: {_json(dict(head, choices=[], usage=usage))}\n\n"
        except FAILURES as e:
            yield f"data: {_json(failure(e, body).body())}\n\n"
        finally:
            self.abort(gen)
        yield "data: [DONE]\n\n"

    def model_card(self, name: str) -> dict[str, Any]:
        return {
            "id": name,
            "object": "model",
            "created": self.created,
            "owned_by": "llmlab",
            "max_model_len": self.engine.max_model_len,
        }

    def models(self) -> dict[str, Any]:
        return {"object": "list", "data": [self.model_card(name) for name in self.names]}


def body_echo(body: Any) -> bool:
    return bool(getattr(body, "echo", False))


# how an admitted request can fail (its stream raises one of these)
FAILURES = (
    EngineDeadError,
    StepFailedError,
    RequestFailedError,
    GrammarFailedError,
    ValueError,
)


def failure(error: BaseException, body: Any) -> OpenAIError:
    """The error a client gets for an admitted request that failed: the server's fault (500),
    its grammar's (400, naming the field), or a refusal when it joined the engine (400)."""
    if isinstance(error, GrammarFailedError):
        field = "response_format" if body.response_format is not None else "structured_outputs"
        return OpenAIError(400, f"{field}: {error}", field)
    if isinstance(error, ValueError):  # the engine refused it when it joined
        return OpenAIError(400, str(error), "prompt")
    return OpenAIError(500, str(error), None, "InternalServerError")


def _child_params(params: SamplingParams, index: int) -> SamplingParams:
    """Child `index` of a request with n > 1: the same parameters, seed + index when seeded
    (vLLM's parallel sampling), wrapped to stay a 64-bit int."""
    if params.seed is None:
        return params
    seed = params.seed + index
    if seed > INT64_MAX:
        seed -= 1 << 64
    return SamplingParams(**{**params.__dict__, "seed": seed})


async def _merged(streams: list[RequestStream]) -> AsyncIterator[tuple[int, RequestOutput]]:
    """(choice index, delta) from several streams as they come; one stream needs no tasks."""
    if len(streams) == 1:
        async for delta in streams[0]:
            yield 0, delta
        return
    queue: asyncio.Queue = asyncio.Queue()

    async def pump(i: int, stream: RequestStream) -> None:
        try:
            async for delta in stream:
                queue.put_nowait((i, delta, None))
        except Exception as e:  # noqa: BLE001 (handed to the reader)
            queue.put_nowait((i, None, e))
            return
        queue.put_nowait((i, None, None))

    tasks = [asyncio.ensure_future(pump(i, s)) for i, s in enumerate(streams)]
    try:
        left = len(streams)
        while left:
            i, delta, error = await queue.get()
            if error is not None:
                raise error
            if delta is None:
                left -= 1
                continue
            yield i, delta
    finally:
        for t in tasks:
            t.cancel()


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
                serving.sse_events(body, gen),
                media_type="text/event-stream",
                headers={"Cache-Control": "no-cache"},
            )
        # no stream to cancel: watch the connection ourselves, abort when the client leaves
        try:
            answer = await unless_client_leaves(request, serving.full_response(body, gen), "answer")
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
