"""OpenAI's request bodies, checked at the door; every refusal names the field it is about.

Mirrors vLLM's `entrypoints/openai/protocol.py`: pydantic models with OpenAI's field names,
vLLM's extra sampling fields (`top_k`, `min_tokens`, `ignore_eos`, `stop_token_ids`,
`return_token_ids`), unknown fields ignored (vLLM's benchmark client sends some, such as
`repetition_penalty`). Known OpenAI features this engine does not have (`n` > 1, `logprobs`,
`echo`, stop strings, penalties) are refused when asked for, not silently dropped: an answer
without the logprobs a client asked for would look like a bug in the client.

`to_sampling_params(body, ...)` turns a checked body into the engine's `SamplingParams`.
Errors are `OpenAIError`s, which the server sends as `{"error": {"message", "type", "param",
"code"}}` with their HTTP status.
"""
from __future__ import annotations

import json
import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, ValidationError

from llmlab.sampling import SamplingParams

Number = Annotated[float, Field(strict=True)]      # an int or a float; never a str or a bool


class OpenAIError(Exception):
    """An error the client caused (4xx) or the server cannot take more (503)."""

    def __init__(self, status: int, message: str, param: str | None = None,
                 type_: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.type = status, message, param, type_

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param,
                          "code": self.status}}


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore")
    include_usage: StrictBool = False


class _SamplingFields(BaseModel):
    """Fields both endpoints share."""

    model_config = ConfigDict(extra="ignore")

    model: str | None = None                       # None: the server's (first) model
    max_tokens: StrictInt | None = Field(default=None, ge=1)
    temperature: Number = Field(default=1.0, ge=0)
    top_p: Number = Field(default=1.0, gt=0, le=1)
    top_k: StrictInt | None = Field(default=None, ge=-1)    # -1 or 0: all tokens
    min_tokens: StrictInt = Field(default=0, ge=0)
    ignore_eos: StrictBool = False
    stop_token_ids: list[Annotated[int, Field(strict=True, ge=0)]] | None = None
    seed: StrictInt | None = Field(default=None, ge=0)
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    return_token_ids: StrictBool = False           # vLLM's extension: token ids in each choice
    # OpenAI features this engine lacks: accepted at their neutral value only
    n: StrictInt = Field(default=1, ge=1)
    stop: str | list[str] | None = None
    logprobs: Any = None
    presence_penalty: Number = 0.0
    frequency_penalty: Number = 0.0
    repetition_penalty: Number = 1.0
    best_of: StrictInt | None = None

    def refuse_unsupported(self) -> None:
        neutral = {"n": (self.n, 1), "best_of": (self.best_of or 1, 1),
                   "presence_penalty": (self.presence_penalty, 0.0),
                   "frequency_penalty": (self.frequency_penalty, 0.0),
                   "repetition_penalty": (self.repetition_penalty, 1.0)}
        for name, (value, ok) in neutral.items():
            if value != ok:
                raise OpenAIError(400, f"{name}={value!r} is not supported by this server "
                                  f"(only {ok!r})", name)
        if self.stop:
            raise OpenAIError(400, "stop strings are not supported by this server; use "
                              "stop_token_ids", "stop")
        if self.logprobs not in (None, False):
            raise OpenAIError(400, "logprobs are not supported by this server", "logprobs")


class CompletionRequest(_SamplingFields):
    """`POST /v1/completions`. prompt: a str, a list of token ids, or a list of one of these."""

    prompt: Any = None
    echo: StrictBool = False
    suffix: str | None = None

    def refuse_unsupported(self) -> None:
        super().refuse_unsupported()
        if self.echo:
            raise OpenAIError(400, "echo is not supported by this server", "echo")
        if self.suffix:
            raise OpenAIError(400, "suffix is not supported by this server", "suffix")


class TextPart(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: str | list[TextPart] | None = None

    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(p.text for p in self.content)
        return self.content or ""


class ChatCompletionRequest(_SamplingFields):
    """`POST /v1/chat/completions`."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: StrictInt | None = Field(default=None, ge=1)   # OpenAI's newer name


# ---- parsing ----------------------------------------------------------------------------------

_TYPE_TAG = re.compile(r"^(str|int|float|bool|list\[.*\]|dict\[.*\]|.*\[.*\]|[A-Z]\w*)$")


def _param_of(loc: tuple) -> str:
    """'messages[0].content' from pydantic's loc, leaving out the names of union members."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif out and _TYPE_TAG.match(str(part)):
            continue                                   # ('prompt', 'str'): a union branch
        else:
            out += ("." if out else "") + str(part)
    return out


def parse_body(raw: bytes, model_cls: type[BaseModel]) -> Any:
    """JSON bytes → a checked request model. Raises OpenAIError(400) naming the field."""
    try:
        data = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise OpenAIError(400, f"the request body is not valid JSON: {e}", "body") from None
    if not isinstance(data, dict):
        raise OpenAIError(400, f"the request body must be a JSON object, got "
                          f"{type(data).__name__}", "body")
    try:
        body = model_cls.model_validate(data)
    except ValidationError as e:
        err = e.errors()[0]
        param = _param_of(tuple(err["loc"]))
        got = "" if err["type"] == "missing" else f", got {err.get('input')!r}"
        msg = "is required" if err["type"] == "missing" else err["msg"]
        raise OpenAIError(400, f"{param}: {msg}{got}"[:500], param) from None
    body.refuse_unsupported()
    return body


def prompt_of(body: CompletionRequest) -> str | list[int]:
    """The single prompt of a completion request: text or token ids (a batch is refused)."""
    p = body.prompt
    if p is None:
        raise OpenAIError(400, "prompt is required", "prompt")
    if isinstance(p, list) and len(p) == 1 and isinstance(p[0], (str, list)):
        p = p[0]                                   # a batch of one
    if isinstance(p, str):
        if not p:
            raise OpenAIError(400, "prompt must not be empty", "prompt")
        return p
    if isinstance(p, list):
        if not p:
            raise OpenAIError(400, "prompt must not be empty", "prompt")
        if all(isinstance(t, int) and not isinstance(t, bool) for t in p):
            return list(p)
        if all(isinstance(t, (str, list)) for t in p):
            raise OpenAIError(400, f"prompt: a batch of {len(p)} prompts is not supported; "
                              "send one request per prompt", "prompt")
    raise OpenAIError(400, f"prompt must be a string or a list of token ids, got "
                      f"{type(p).__name__}", "prompt")


def check_token_ids(ids: list[int], vocab_size: int, param: str) -> None:
    bad = [t for t in ids if not 0 <= t < vocab_size]
    if bad:
        raise OpenAIError(400, f"{param}: token ids must be in [0, {vocab_size}), got "
                          f"{bad[:5]}", param)


def to_sampling_params(body: _SamplingFields, num_prompt_tokens: int, max_model_len: int,
                       vocab_size: int, default_max_tokens: int | None) -> SamplingParams:
    """The engine's parameters for a checked body.

    max_tokens defaults to `default_max_tokens` (OpenAI's 16 for completions) or, when that is
    None (chat), to the room left in the context. prompt + max_tokens must fit max_model_len.
    """
    param = "max_tokens"
    max_tokens = body.max_tokens
    if isinstance(body, ChatCompletionRequest) and body.max_completion_tokens is not None:
        max_tokens, param = body.max_completion_tokens, "max_completion_tokens"
    room = max_model_len - num_prompt_tokens
    if room < 1:
        which = "messages" if isinstance(body, ChatCompletionRequest) else "prompt"
        raise OpenAIError(400, f"{which}: the prompt has {num_prompt_tokens} tokens; this "
                          f"model's context is max_model_len={max_model_len} tokens, prompt "
                          "and output together", which)
    if max_tokens is None:
        max_tokens = room if default_max_tokens is None else min(default_max_tokens, room)
    elif max_tokens > room:
        raise OpenAIError(400, f"{param}={max_tokens} is too large: the prompt has "
                          f"{num_prompt_tokens} tokens and max_model_len is {max_model_len}, "
                          f"so at most {room} can be generated", param)
    if body.stop_token_ids:
        check_token_ids(body.stop_token_ids, vocab_size, "stop_token_ids")
    try:
        return SamplingParams(
            temperature=float(body.temperature), top_p=float(body.top_p),
            top_k=-1 if body.top_k in (None, 0) else body.top_k, max_tokens=max_tokens,
            min_tokens=body.min_tokens, ignore_eos=body.ignore_eos,
            stop_token_ids=list(body.stop_token_ids or []) or None, seed=body.seed)
    except ValueError as e:                      # e.g. min_tokens > max_tokens
        m = re.search(r"SamplingParams\.(\w+)", str(e))
        raise OpenAIError(400, str(e).replace("SamplingParams.", ""),
                          m.group(1) if m else None) from None
