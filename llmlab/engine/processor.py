"""A request's checks before it is queued (vLLM: `vllm/v1/engine/processor.py`): its id, its
prompt (tokenized here when it is text), its token ids against the vocabulary and the context
length, and the parameters that need a tokenizer. Each raises a ValueError naming what is wrong;
nothing is queued then."""

from __future__ import annotations

from typing import Any

from llmlab.i18n import tr
from llmlab.sampling import SamplingParams


def _bad(en: str, zh: str) -> ValueError:
    return ValueError(tr(en, zh))


def check_request(request_id: Any, params: Any, unfinished: dict) -> None:
    """The id is a new non-empty str and `params` a valid SamplingParams."""
    if not isinstance(request_id, str) or not request_id:
        raise _bad(
            f"request_id must be a non-empty str, got {request_id!r}",
            f"request_id 必须是非空的 str，你给的是 {request_id!r}",
        )
    if request_id in unfinished:
        raise _bad(
            f"request_id {request_id!r} is already in use by an unfinished request",
            f"request_id {request_id!r} 已经被一个尚未完成的请求占用",
        )
    if not isinstance(params, SamplingParams):
        raise _bad(
            f"params must be a SamplingParams, got {type(params).__name__}",
            f"params 必须是 SamplingParams，你给的是 {type(params).__name__}",
        )
    params.validate()


def prompt_token_ids(prompt: Any, tokenizer: Any, request_id: str) -> tuple[list[int], str | None]:
    """(token ids, text) of a prompt given as text (tokenized here) or as token ids."""
    if isinstance(prompt, str):
        if tokenizer is None:
            raise _bad(
                "prompt is a str but this engine has no tokenizer; pass token ids (list[int])",
                "prompt 是 str，但这个引擎没有分词器；请传 token id（list[int]）",
            )
        token_ids, text = list(tokenizer.encode(prompt)), prompt
    elif isinstance(prompt, (list, tuple)):
        token_ids, text = list(prompt), None
        if not all(isinstance(t, int) and not isinstance(t, bool) for t in token_ids):
            raise _bad(
                "prompt must be a str or a list of int token ids",
                "prompt 必须是 str，或由 int token id 组成的列表",
            )
    else:
        name = type(prompt).__name__
        raise _bad(
            f"prompt must be a str or a list of int token ids, got {name}",
            f"prompt 必须是 str，或由 int token id 组成的列表；你给的是 {name}",
        )
    if not token_ids:
        raise _bad(
            f"prompt must not be empty (request {request_id!r})",
            f"prompt 不能为空（请求 {request_id!r}）",
        )
    return token_ids, text


def check_token_ids(
    token_ids: list[int], params: SamplingParams, vocab_size: int, max_model_len: int
) -> None:
    """The prompt's, the stop tokens' and the logit bias's ids are in the vocabulary, and the
    prompt fits the context."""
    for what, what_zh, ids in (
        ("prompt token ids", "prompt 的 token id", token_ids),
        ("SamplingParams.stop_token_ids", "SamplingParams.stop_token_ids", params.stop_token_ids),
        (
            "SamplingParams.logit_bias: token ids",
            "SamplingParams.logit_bias 的 token id",
            params.logit_bias,
        ),
    ):
        bad = [t for t in ids or () if not 0 <= t < vocab_size]
        if bad:
            raise _bad(
                f"{what} must be in [0, {vocab_size}), got {bad[:5]}",
                f"{what_zh} 必须在 [0, {vocab_size}) 之内，你给的有 {bad[:5]}",
            )
    if len(token_ids) > max_model_len:
        raise _bad(
            f"prompt has {len(token_ids)} tokens, more than max_model_len={max_model_len}",
            f"prompt 有 {len(token_ids)} 个 token，超过了 max_model_len={max_model_len}",
        )


def check_needs_tokenizer(params: SamplingParams, tokenizer: Any) -> None:
    """Stop strings and grammars work on text: they need the engine's tokenizer."""
    if tokenizer is not None:
        return
    if params.stop:
        raise _bad(
            "SamplingParams.stop: stop strings need a tokenizer, and this engine has none; "
            "use stop_token_ids",
            "SamplingParams.stop：停止字符串需要分词器，这个引擎没有；请用 stop_token_ids",
        )
    if params.structured_outputs is not None:
        raise _bad(
            "SamplingParams.structured_outputs needs a tokenizer, and this engine has none",
            "SamplingParams.structured_outputs 需要分词器，这个引擎没有",
        )
