"""One generation request as the scheduler and the KV cache manager both see it (vLLM keeps it
above both too: `vllm/v1/request.py`)."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

import torch

from llmlab.sampling import Logprob, SamplingParams


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"  # back in the waiting queue, K/V freed
    FINISHED_STOPPED = "finished_stopped"  # hit EOS or a stop token
    FINISHED_LENGTH = "finished_length"  # hit max_tokens or max_model_len
    FINISHED_ABORTED = "finished_aborted"
    FINISHED_ERROR = "finished_error"  # its sampling or grammar failed; its batch-mates go on

    @property
    def is_finished(self) -> bool:
        return self.name.startswith("FINISHED")

    @property
    def finish_reason(self) -> str | None:
        """vLLM's finish reason: "stop", "length", "abort", "error", or None while unfinished."""
        return _FINISH_REASONS.get(self)


_FINISH_REASONS = {
    RequestStatus.FINISHED_STOPPED: "stop",
    RequestStatus.FINISHED_LENGTH: "length",
    RequestStatus.FINISHED_ABORTED: "abort",
    RequestStatus.FINISHED_ERROR: "error",
}


@dataclass
class RequestMetrics:
    """Timestamps from `time.perf_counter()`; `token_times` has one entry per output token."""

    arrival_time: float
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    token_times: list[float] = field(default_factory=list)
    finished_time: float | None = None
    # speculative decoding (zero without it): verify steps that had drafts, draft tokens
    # proposed, drafts accepted; acceptance rate = accepted / draft tokens
    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0


@dataclass
class Request:
    """A prompt, the tokens generated so far and how far the K/V cache has got.

    `num_computed_tokens` counts the tokens (prompt and output) whose K/V are in the cache; the
    scheduler advances it. Add output tokens with `append_output_token` only: it keeps
    `all_token_ids` (one list, prompt then outputs) in step without copying.
    """

    request_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    arrival_time: float
    prompt: str | None = None
    output_token_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0  # tokens whose K/V are already in the cache
    num_cached_tokens: int | None = None  # prefix-cache hit at first scheduling (None: not yet)
    status: RequestStatus = RequestStatus.WAITING
    num_preemptions: int = 0
    generator: torch.Generator | None = None  # per-request RNG of a seeded request
    eos_token_ids: frozenset[int] = frozenset()
    max_model_len: int | None = None
    # text as it grows, and stop strings on it (None: text is decoded once at the end)
    detokenizer: Any = None  # llmlab.engine.detokenizer.IncrementalDetokenizer, or None
    stop_reason: str | int | None = None  # the stop string or stop token that ended it
    # one entry per output token (with SamplingParams.logprobs) and per prompt token (with
    # prompt_logprobs; the first prompt token has none): {token id: Logprob}, sampled first
    logprobs: list[dict[int, Logprob]] | None = None
    prompt_logprobs: list[dict[int, Logprob] | None] | None = None
    grammar: Any = None  # the structured-output matcher (its state after the outputs)

    metrics: RequestMetrics = field(init=False)

    def __post_init__(self) -> None:
        self.metrics = RequestMetrics(arrival_time=self.arrival_time)
        self._all_token_ids: list[int] = list(self.prompt_token_ids) + list(self.output_token_ids)
        self._stop_ids = frozenset(self.sampling_params.stop_token_ids or ())
        params = self.sampling_params
        # the runner's per-row check in the hot loop: one attribute
        self.needs_extra_sampling = params.logprobs is not None or params.needs_logits_processing
        self.has_grammar = params.structured_outputs is not None
        if self.sampling_params.logprobs is not None and self.logprobs is None:
            self.logprobs = []
        if self.sampling_params.prompt_logprobs is not None and self.prompt_logprobs is None:
            self.prompt_logprobs = [None] * len(self.prompt_token_ids)

    @property
    def all_token_ids(self) -> list[int]:
        """Prompt then output tokens. The list is shared, not copied: do not modify it."""
        return self._all_token_ids

    @property
    def num_tokens(self) -> int:
        return len(self._all_token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def is_finished(self) -> bool:
        return self.status.is_finished

    def append_output_token(self, token_id: int) -> None:
        self.output_token_ids.append(token_id)
        self._all_token_ids.append(token_id)

    def remove_last_output_tokens(self, num: int) -> None:
        """Drop the last `num` output tokens (a stop string ended the text before them)."""
        if num > 0:
            del self.output_token_ids[-num:]
            del self._all_token_ids[-num:]

    def banned_token_ids(self) -> frozenset[int]:
        """Tokens the next sample may not be: while fewer than `min_tokens` outputs exist, EOS
        (unless `ignore_eos`) and the stop tokens, as vLLM's min-tokens logits processor and
        Hugging Face's `min_new_tokens` do (their logits are set to -inf)."""
        if len(self.output_token_ids) >= self.sampling_params.min_tokens:
            return frozenset()
        return self.stopping_token_ids()

    def stopping_token_ids(self) -> frozenset[int]:
        """The tokens that end this request once sampled: its `stop_token_ids`, and EOS unless
        `ignore_eos`."""
        if self.sampling_params.ignore_eos:
            return self._stop_ids
        return self._stop_ids | self.eos_token_ids

    def check_stop(self) -> RequestStatus | None:
        """The finished status the last appended token puts this request in, or None.

        Order: max_tokens and max_model_len ("length") first, then EOS (unless `ignore_eos`)
        and `stop_token_ids` ("stop"), which cannot be sampled before `min_tokens` outputs
        exist (`banned_token_ids`).
        """
        params = self.sampling_params
        num_out = len(self.output_token_ids)
        if num_out >= params.max_tokens:
            return RequestStatus.FINISHED_LENGTH
        if self.max_model_len is not None and len(self._all_token_ids) >= self.max_model_len:
            return RequestStatus.FINISHED_LENGTH
        last = self.output_token_ids[-1]
        if last in self.stopping_token_ids():
            if last in self._stop_ids:
                self.stop_reason = last
            return RequestStatus.FINISHED_STOPPED
        return None
