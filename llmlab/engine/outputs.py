"""What the engine hands back: vLLM's `RequestOutput` and `CompletionOutput`."""

from __future__ import annotations

from dataclasses import dataclass, field

from llmlab.core.request import RequestMetrics
from llmlab.sampling import Logprob


@dataclass
class CompletionOutput:
    """One generated sequence: its text, token ids and why it stopped ("stop" | "length").

    `stop_reason`: the stop string or stop token id that ended it (None for EOS or length).
    `logprobs`: with `SamplingParams.logprobs`, one {token id: Logprob} per token, the sampled
    token first, then the top ones.
    """

    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None = None  # None while the request is still running
    stop_reason: str | int | None = None
    logprobs: list[dict[int, Logprob]] | None = None


@dataclass
class RequestOutput:
    """The result for one request.

    From `LLM.generate` (and `LLMEngine.get_request_output`) it is cumulative: every output
    token and the decoded text. From `LLMEngine.step()` it is a *delta*: `outputs[0].token_ids`
    holds only the tokens produced in that step and `text` is empty (decode as you stream).
    """

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache
    prompt_logprobs: list[dict[int, Logprob] | None] | None = None  # with prompt_logprobs
    metrics: RequestMetrics | None = field(default=None, repr=False)
