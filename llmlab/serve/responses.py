"""The answers of an OpenAI-compatible server in OpenAI's JSON: choices, logprobs (legacy
completions' and chat's), `usage`, the whole answer, and its server-sent events for a stream
(vLLM: `entrypoints/openai/serving_completion.py`, `serving_chat.py`).

An admitted request is a `Generation`, a `Choice` per sequence the client gets; `failure`
turns what can end an admitted request into the error the client gets.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from typing import Any, AsyncIterator, Callable

from llmlab.engine.outputs import RequestOutput
from llmlab.sampling.params import Logprob, SamplingParams
from llmlab.serve.async_engine import (
    EngineDeadError,
    GrammarFailedError,
    RequestFailedError,
    RequestStream,
    StepFailedError,
)
from llmlab.serve.conversion import prompts_of
from llmlab.serve.protocol import OpenAIError


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


class Answers:
    """The answer to a `Generation`, whole or streamed; `abort` ends what a stream leaves."""

    def __init__(self, tokenizer: Any, abort: Callable[[Generation], None]) -> None:
        self.tokenizer = tokenizer
        self.abort = abort

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
