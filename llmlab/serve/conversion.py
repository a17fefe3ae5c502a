"""From a checked request body to what the engine takes: its prompts, its grammar and its
`SamplingParams`, each refusal an `OpenAIError` naming the field (vLLM: the `to_sampling_params`
methods of `entrypoints/openai/protocol.py`)."""

from __future__ import annotations

import re

from llmlab.sampling.params import SamplingParams
from llmlab.sampling.structured_output import SPEC_FIELDS, StructuredOutputsParams
from llmlab.serve.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    OpenAIError,
    as_list,
    short,
)


def structured_outputs_of(
    body: CompletionRequest | ChatCompletionRequest,
) -> StructuredOutputsParams | None:
    """The grammar a request asks for: OpenAI's `response_format` ({"type": "json_object"} or
    {"type": "json_schema", "json_schema": {"schema": ...}}) or vLLM's `structured_outputs`
    ({"json" | "regex" | "choice" | "grammar" | "json_object": ...}). Refusals name the field."""
    rf, so = body.response_format, body.structured_outputs
    if rf is not None and so is not None:
        raise OpenAIError(
            400, "give response_format or structured_outputs, not both", "structured_outputs"
        )
    if rf is not None:
        kind = rf.get("type") if isinstance(rf, dict) else None
        if kind == "text":
            return None
        if kind == "json_object":
            return StructuredOutputsParams(json_object=True)
        if kind == "json_schema":
            spec = rf.get("json_schema")
            schema = spec.get("schema") if isinstance(spec, dict) else None
            if not isinstance(schema, dict):
                raise OpenAIError(
                    400,
                    "response_format.json_schema.schema must be a JSON schema (an object)",
                    "response_format.json_schema.schema",
                )
            try:
                return StructuredOutputsParams(json=schema)
            except ValueError as e:  # a keyword xgrammar would not enforce
                why = str(e).replace("StructuredOutputsParams.json: ", "")
                raise OpenAIError(
                    400,
                    f"response_format.json_schema.schema: {why}",
                    "response_format.json_schema.schema",
                ) from None
        raise OpenAIError(
            400,
            "response_format.type must be \"text\", \"json_object\" or "
            f"\"json_schema\", got {short(kind if kind is not None else rf)}",
            "response_format.type",
        )
    if so is None:
        return None
    if not isinstance(so, dict):
        raise OpenAIError(
            400,
            f"structured_outputs must be an object with one of {list(SPEC_FIELDS)}",
            "structured_outputs",
        )
    fields = {k: v for k, v in so.items() if k in SPEC_FIELDS}
    try:
        return StructuredOutputsParams(**fields)
    except (TypeError, ValueError) as e:
        raise OpenAIError(
            400,
            f"structured_outputs: {str(e).replace('StructuredOutputsParams', '').lstrip('.: ')}",
            "structured_outputs",
        ) from None


def prompt_count(body: CompletionRequest) -> int:
    """How many prompts a completion request holds, read without looking at each (the server
    refuses a batch that can never fit before it checks or tokenizes any)."""
    p = body.prompt
    if isinstance(p, list) and p and isinstance(p[0], (str, list)):
        return len(p)
    return 1


def prompts_of(body: CompletionRequest) -> list[str | list[int]]:
    """The prompts of a completion request: one text or token-id list, or a list of them."""
    p = body.prompt
    if p is None:
        raise OpenAIError(400, "prompt is required", "prompt")
    if isinstance(p, str) or (
        isinstance(p, list) and p and all(isinstance(t, int) and not isinstance(t, bool) for t in p)
    ):
        batch, params = [p], ["prompt"]
    elif isinstance(p, list) and p and all(isinstance(t, (str, list)) for t in p):
        batch, params = list(p), [f"prompt[{i}]" for i in range(len(p))]
    elif isinstance(p, list) and not p:
        raise OpenAIError(400, "prompt must not be empty", "prompt")
    else:
        raise OpenAIError(
            400,
            f"prompt must be a string, a list of token ids, or a list of "
            f"these, got {type(p).__name__}",
            "prompt",
        )
    for item, param in zip(batch, params):
        if isinstance(item, str):
            if not item:
                raise OpenAIError(400, f"{param} must not be empty", param)
        elif not item:
            raise OpenAIError(400, f"{param} must not be empty", param)
        elif not all(isinstance(t, int) and not isinstance(t, bool) for t in item):
            raise OpenAIError(400, f"{param} must be a string or a list of token ids", param)
    return batch


def check_token_ids(ids: list[int], vocab_size: int, param: str) -> None:
    bad = [t for t in ids if not 0 <= t < vocab_size]
    if bad:
        got = ", ".join(short(t) for t in bad[:5])
        raise OpenAIError(
            400, f"{param}: token ids must be in [0, {vocab_size}), got [{got}]", param
        )


def to_sampling_params(
    body: CompletionRequest | ChatCompletionRequest,
    num_prompt_tokens: int,
    max_model_len: int,
    vocab_size: int,
    default_max_tokens: int | None,
    structured_outputs: StructuredOutputsParams | None = None,
) -> SamplingParams:
    """The engine's parameters for a checked body.

    max_tokens defaults to `default_max_tokens` (OpenAI's 16 for completions) or, when that is
    None (chat), to the room left in the context. prompt + max_tokens must fit max_model_len.
    """
    max_tokens = _max_tokens(body, num_prompt_tokens, max_model_len, default_max_tokens)
    if body.stop_token_ids:
        check_token_ids(body.stop_token_ids, vocab_size, "stop_token_ids")
    if body.top_k is not None and body.top_k > vocab_size:
        raise OpenAIError(
            400,
            f"top_k must be -1 (all tokens) or in [1, {vocab_size}] (the "
            f"vocabulary), got {short(body.top_k)}",
            "top_k",
        )
    if isinstance(body, ChatCompletionRequest):
        logprobs = (body.top_logprobs or 0) if body.logprobs else None
        prompt_logprobs = None
    else:
        logprobs = body.logprobs
        prompt_logprobs = logprobs if body.echo else None
    try:
        return SamplingParams(
            temperature=float(body.temperature),
            top_p=float(body.top_p),
            top_k=-1 if body.top_k in (None, 0) else body.top_k,
            max_tokens=max_tokens,
            min_tokens=body.min_tokens,
            ignore_eos=body.ignore_eos,
            stop_token_ids=list(body.stop_token_ids or []) or None,
            seed=body.seed,
            stop=as_list(body.stop) or None,
            include_stop_str_in_output=body.include_stop_str_in_output,
            presence_penalty=float(body.presence_penalty),
            frequency_penalty=float(body.frequency_penalty),
            repetition_penalty=float(body.repetition_penalty),
            logit_bias=_logit_bias(body.logit_bias, vocab_size),
            logprobs=logprobs,
            prompt_logprobs=prompt_logprobs,
            structured_outputs=structured_outputs,
        )
    except ValueError as e:  # e.g. min_tokens > max_tokens
        m = re.search(r"SamplingParams\.(\w+)", str(e))
        raise OpenAIError(
            400, str(e).replace("SamplingParams.", ""), m.group(1) if m else None
        ) from None


def _max_tokens(
    body: CompletionRequest | ChatCompletionRequest,
    num_prompt_tokens: int,
    max_model_len: int,
    default_max_tokens: int | None,
) -> int:
    """The output length asked for (chat's `max_completion_tokens` first), or the default, within
    the room the prompt leaves in the context."""
    param = "max_tokens"
    max_tokens = body.max_tokens
    if isinstance(body, ChatCompletionRequest) and body.max_completion_tokens is not None:
        max_tokens, param = body.max_completion_tokens, "max_completion_tokens"
    room = max_model_len - num_prompt_tokens
    if room < 1:
        which = "messages" if isinstance(body, ChatCompletionRequest) else "prompt"
        raise OpenAIError(
            400,
            f"{which}: the prompt has {num_prompt_tokens} tokens; this "
            f"model's context is max_model_len={max_model_len} tokens, prompt "
            "and output together",
            which,
        )
    if max_tokens is None:
        return room if default_max_tokens is None else min(default_max_tokens, room)
    if max_tokens > room:
        raise OpenAIError(
            400,
            f"{param}={short(max_tokens)} is too large: the prompt has "
            f"{num_prompt_tokens} tokens and max_model_len is {max_model_len}, "
            f"so at most {room} can be generated",
            param,
        )
    return max_tokens


def _logit_bias(biases: dict[str, float] | None, vocab_size: int) -> dict[int, float] | None:
    """OpenAI's `logit_bias` (token ids as strings) as the engine's {token id: bias}."""
    if not biases:
        return None
    out = {}
    for key, bias in biases.items():
        if not re.fullmatch(r"\d{1,9}", key) or int(key) >= vocab_size:
            raise OpenAIError(
                400,
                f"logit_bias: keys must be token ids in [0, {vocab_size}), got {short(key)}",
                "logit_bias",
            )
        if not -100 <= bias <= 100:
            raise OpenAIError(
                400,
                f"logit_bias: biases must be in [-100, 100], got {bias!r} for token {key}",
                "logit_bias",
            )
        out[int(key)] = float(bias)
    return out
