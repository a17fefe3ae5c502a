"""OpenAI's request bodies, checked at the door; every refusal names the field it is about.

Mirrors vLLM's `entrypoints/openai/protocol.py`: pydantic models with OpenAI's field names,
vLLM's extra sampling fields (`top_k`, `min_tokens`, `ignore_eos`, `stop_token_ids`,
`include_stop_str_in_output`, `repetition_penalty`, `return_token_ids`), other unknown fields
ignored. Every number has its bounds here (64-bit seeds, finite floats, `top_k` within the
vocabulary), so no value a client can send reaches the engine and breaks a step. Known OpenAI
features this server does not have (`tools`, `suffix`, `reasoning_effort`, audio `modalities`,
chat `echo`) are refused when asked for, never silently dropped: an answer without what a
client asked for would look like a bug in the client. `prediction` (predicted outputs) is
accepted: it only speeds an answer up, the answer is the same. Other unknown fields are
ignored and named in the log, as vLLM does. Structured output (`response_format`, or vLLM's
`structured_outputs`) is served with xgrammar (`llmlab.sampling.structured_output`); a schema keyword
xgrammar would not enforce is refused. Error messages quote at most a short prefix of what
the client sent.

`parse_body(raw, ...)` turns bytes into a checked request (bad JSON, huge numbers, deep nesting
and lone surrogates are 400s); `llmlab.serve.conversion` turns it into the engine's
`SamplingParams`. Errors are `OpenAIError`s, which the server sends as `{"error": {"message",
"type", "param", "code"}}` with their HTTP status.
"""

from __future__ import annotations

import json
import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, ValidationError

from llmlab.sampling.params import (
    INT64_MAX,
    INT64_MIN,
    MAX_LOGPROBS,
    MAX_STOP_STRINGS,
)

# an int or a float, finite; never a str or a bool
Number = Annotated[float, Field(strict=True, allow_inf_nan=False)]
MAX_JSON_DEPTH = 32  # nesting deeper than any request body needs


class OpenAIError(Exception):
    """An error the client caused (4xx) or the server cannot take more (5xx)."""

    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        type_: str = "invalid_request_error",
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.type = status, message, param, type_

    def body(self) -> dict[str, Any]:
        """OpenAI's error shape, `code` the HTTP status (as vLLM sends it)."""
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.status,
            }
        }


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore")
    include_usage: StrictBool = False


class _SamplingFields(BaseModel):
    """Fields both endpoints share (unknown ones are kept, to be named in the log)."""

    model_config = ConfigDict(extra="allow")

    model: str | None = None  # None: the server's (first) model
    max_tokens: StrictInt | None = Field(default=None, ge=1)
    temperature: Number = Field(default=1.0, ge=0)
    top_p: Number = Field(default=1.0, gt=0, le=1)
    top_k: StrictInt | None = Field(default=None, ge=-1)  # -1 or 0: all tokens
    min_tokens: StrictInt = Field(default=0, ge=0)
    ignore_eos: StrictBool = False
    stop_token_ids: list[Annotated[int, Field(strict=True, ge=0)]] | None = None
    seed: StrictInt | None = Field(default=None, ge=INT64_MIN, le=INT64_MAX)
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    return_token_ids: StrictBool = False  # vLLM's extension: token ids in each choice
    n: StrictInt = Field(default=1, ge=1)
    best_of: StrictInt | None = Field(default=None, ge=1)
    stop: str | list[str] | None = None
    include_stop_str_in_output: StrictBool = False
    presence_penalty: Number = Field(default=0.0, ge=-2, le=2)
    frequency_penalty: Number = Field(default=0.0, ge=-2, le=2)
    repetition_penalty: Number = Field(default=1.0, gt=0, le=2)
    logit_bias: dict[str, Number] | None = None  # token id (as JSON keys are) -> [-100, 100]
    user: str | None = None  # accepted: it changes nothing here
    # structured output: OpenAI's response_format, or vLLM's structured_outputs
    response_format: Any = None
    structured_outputs: Any = None
    # accepted, and nothing changes: a hint to go faster, or nothing to do without tools
    prediction: Any = None
    parallel_tool_calls: Any = None
    # not served: refused when asked for (see refuse_unsupported)
    tools: Any = None
    tool_choice: Any = None
    functions: Any = None
    function_call: Any = None
    reasoning_effort: Any = None
    modalities: Any = None
    audio: Any = None

    def refuse_unsupported(self) -> None:
        if self.best_of is not None and self.best_of != self.n:
            raise OpenAIError(
                400,
                f"best_of={self.best_of} is not supported by this server (only best_of equal to n)",
                "best_of",
            )
        if self.stream_options is not None and not self.stream:
            raise OpenAIError(
                400, "stream_options can only be given with stream=true", "stream_options"
            )
        if isinstance(self.stop, list):
            if len(self.stop) > MAX_STOP_STRINGS:
                raise OpenAIError(
                    400,
                    f"stop: at most {MAX_STOP_STRINGS} stop strings, got {len(self.stop)}",
                    "stop",
                )
        if self.stop is not None and any(s == "" for s in as_list(self.stop)):
            raise OpenAIError(400, "stop: a stop string must not be empty", "stop")
        if self.tools:
            raise OpenAIError(
                400, "tools (function calling) are not supported by this server", "tools"
            )
        if self.tool_choice not in (None, "none"):
            raise OpenAIError(
                400, "tool_choice is not supported by this server (only \"none\")", "tool_choice"
            )
        if self.functions or self.function_call not in (None, "none"):
            raise OpenAIError(
                400, "functions (function calling) are not supported by this server", "functions"
            )
        if self.reasoning_effort is not None:
            raise OpenAIError(
                400,
                "reasoning_effort is not supported: this model has no reasoning mode (OpenAI "
                "refuses it for such models too); leave it out",
                "reasoning_effort",
            )
        if self.modalities is not None and self.modalities != ["text"]:
            raise OpenAIError(
                400,
                'modalities: this server writes text only (["text"]), got '
                f"{short(self.modalities)}",
                "modalities",
            )
        if self.audio is not None:
            raise OpenAIError(400, "audio output is not supported by this server", "audio")

    def ignored_fields(self) -> list[str]:
        """The body's fields this server does not know (ignored; the server logs them)."""
        return sorted(self.model_extra or {})


def as_list(stop: str | list[str] | None) -> list[str]:
    """`stop` as a list: OpenAI takes one stop string or a list of them."""
    return [stop] if isinstance(stop, str) else list(stop or [])


class CompletionRequest(_SamplingFields):
    """`POST /v1/completions`. prompt: a str, a list of token ids, or a list of one of these."""

    prompt: Any = None
    echo: StrictBool = False  # the prompt before the completion
    logprobs: StrictInt | None = Field(default=None, ge=0, le=MAX_LOGPROBS)  # top-k per token
    suffix: str | None = None

    def refuse_unsupported(self) -> None:
        super().refuse_unsupported()
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
    max_completion_tokens: StrictInt | None = Field(default=None, ge=1)  # OpenAI's newer name
    logprobs: StrictBool = False
    top_logprobs: StrictInt | None = Field(default=None, ge=0, le=MAX_LOGPROBS)
    echo: Any = None  # vLLM's: the last message before the answer; not served here

    def refuse_unsupported(self) -> None:
        super().refuse_unsupported()
        if self.top_logprobs is not None and not self.logprobs:
            raise OpenAIError(400, "top_logprobs needs logprobs=true", "top_logprobs")
        if self.echo:
            raise OpenAIError(
                400,
                "echo is not supported on /v1/chat/completions by this server (it is on "
                "/v1/completions)",
                "echo",
            )


# ---- parsing ----------------------------------------------------------------------------------

_TYPE_TAG = re.compile(r"^(str|int|float|bool|list\[.*\]|dict\[.*\]|.*\[.*\]|[A-Z]\w*)$")


def _json_path(keys) -> str:
    """'messages[0].content' from the keys and indices that lead to a value, the body's first."""
    path = ""
    for key in keys:
        path += f"[{key}]" if isinstance(key, int) else f".{key}" if path else str(key)
    return path


def _param_of(loc: tuple) -> str:
    """The `_json_path` of pydantic's loc, leaving out the names of union members: ('prompt',
    'str') is a union branch."""
    return _json_path(
        part
        for i, part in enumerate(loc)
        if isinstance(part, int) or not (i and _TYPE_TAG.match(str(part)))
    )


def _no_constant(name: str) -> None:
    raise ValueError(f"{name} is not a JSON number")


# Where a lone surrogate can come from in a UTF-8 body: a `\uD800`-`\uDFFF` escape, or its three
# UTF-8 bytes, which `json.loads` lets through. A UTF-8 body without either holds no such string.
_SURROGATE_SOURCE = re.compile(rb"\\u[dD][89a-fA-F]|\xed[\xa0-\xbf]")


def _check_json(data: Any, raw: bytes) -> None:
    """Bound the nesting and refuse strings no text can hold (lone UTF-16 surrogates: JSON's
    "\\ud800" parses, but no tokenizer can encode it). The error names where it is.

    This runs on every body, up to the body cap (280,000 prompts in 1.1 MB), while the server
    answers others. So the walk keeps one iterator per level it is in, not a record per value
    (which the garbage collector would pass over again and again), a list with no container in
    it is passed in one C call when no string of the body can hold a surrogate, and a path is
    spelled out only for an error."""
    texts = json.detect_encoding(raw) != "utf-8" or _SURROGATE_SOURCE.search(raw) is not None
    keys: list = []  # the keys of the containers being walked, from the body down
    levels = [iter(data.items())]
    while levels:
        for key, value in levels[-1]:
            if texts and isinstance(key, str) and not _is_text(key):
                _refuse_surrogate(keys)  # a dict's key: named by the dict
            if isinstance(value, str):
                if texts and not _is_text(value):
                    _refuse_surrogate([*keys, key])
            elif isinstance(value, (dict, list)) and value:
                if len(levels) >= MAX_JSON_DEPTH:
                    field = str(keys[0] if keys else key)
                    raise OpenAIError(
                        400,
                        f"{field}: the request body is nested more than {MAX_JSON_DEPTH} "
                        "levels deep",
                        field,
                    )
                if (
                    isinstance(value, list)
                    and not texts
                    and _CONTAINERS.isdisjoint(map(type, value))
                ):
                    continue
                keys.append(key)
                levels.append(iter(value.items()) if isinstance(value, dict) else enumerate(value))
                break
        else:
            levels.pop()
            if keys:
                keys.pop()


_CONTAINERS = frozenset((dict, list))


def _is_text(value: str) -> bool:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _refuse_surrogate(keys: list) -> None:
    path = _json_path(keys) or "body"
    raise OpenAIError(
        400,
        f"{path}: the string holds a lone UTF-16 surrogate (such as \\ud800), which is not text",
        path,
    )


def parse_body(raw: bytes, model_cls: type[BaseModel]) -> Any:
    """JSON bytes → a checked request model. Raises OpenAIError(400) naming the field."""
    try:
        data = json.loads(raw, parse_constant=_no_constant)
    except RecursionError:
        raise OpenAIError(
            400, "the request body is not valid JSON: nested too deeply", "body"
        ) from None
    except (ValueError, UnicodeDecodeError) as e:  # JSONDecodeError, NaN, a 5,000-digit int
        raise OpenAIError(400, f"the request body is not valid JSON: {e}"[:500], "body") from None
    if not isinstance(data, dict):
        raise OpenAIError(
            400, f"the request body must be a JSON object, got {type(data).__name__}", "body"
        )
    _check_json(data, raw)
    try:
        body = model_cls.model_validate(data)
    except ValidationError as e:
        err = e.errors()[0]
        param = _param_of(tuple(err["loc"]))
        got = "" if err["type"] == "missing" else f", got {short(err.get('input'))}"
        msg = "is required" if err["type"] == "missing" else err["msg"]
        raise OpenAIError(400, f"{param}: {msg}{got}"[:500], param) from None
    body.refuse_unsupported()
    return body


def short(value: Any) -> str:
    """repr of a value a client sent, cut short for an error message (a 4,000-digit int or a
    100 KB name would fill it)."""
    text = (
        repr(value)
        if not isinstance(value, int) or abs(value) < 10**30
        else (f"an int of {len(str(abs(value)))} digits")
    )
    return text if len(text) <= 80 else text[:77] + "..."
