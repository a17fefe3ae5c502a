"""`SamplingParams`: how one request picks its tokens and when it stops, with vLLM's field
names and bounds (`vllm/sampling_params.py`), validated once when made."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from llmlab.i18n import tr

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
MAX_LOGPROBS = 20  # vLLM's default max_logprobs
MAX_STOP_STRINGS = 16
# temperatures as vLLM bounds them (vllm/sampling_params.py): a tiny one overflows float32
# (1e-40 is 0 there, so logits / T are inf and the softmax NaN) and a huge one is inf (a masked
# -inf logit / inf is NaN). Below SAMPLING_EPS (vLLM's _SAMPLING_EPS) is greedy, below
# MIN_TEMPERATURE (vLLM's _MAX_TEMP) is raised to it, above MAX_TEMPERATURE (vLLM's and
# OpenAI's bound) is refused
SAMPLING_EPS = 1e-5
MIN_TEMPERATURE = 1e-2
MAX_TEMPERATURE = 2.0


@dataclass
class Logprob:
    """A token's log-probability under the model's raw logits, and its rank (1: the most likely)."""

    logprob: float
    rank: int


@dataclass
class SamplingParams:
    """How to pick tokens for one request. `temperature=0` means greedy.

    A temperature below `SAMPLING_EPS` becomes 0 (greedy), one below `MIN_TEMPERATURE` becomes
    `MIN_TEMPERATURE`, one above `MAX_TEMPERATURE` is refused: no temperature makes NaN.
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1  # -1: all tokens
    max_tokens: int = 16
    min_tokens: int = 0  # EOS and stop tokens cannot be sampled before this many outputs
    ignore_eos: bool = False
    stop_token_ids: list[int] | None = None
    seed: int | None = None
    # stop strings: the output ends before the first one that appears in its text (kept in the
    # output with include_stop_str_in_output); matched on the detokenized text, as vLLM does
    stop: list[str] | None = None
    include_stop_str_in_output: bool = False
    # penalties, as vLLM and OpenAI define them: presence and frequency over the output tokens,
    # repetition over prompt and output (a logit > 0 is divided by it, a logit < 0 multiplied)
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: dict[int, float] | None = None  # token id -> added to its logit
    logprobs: int | None = None  # per output token: its log-probability and the top k
    prompt_logprobs: int | None = None  # the same for every prompt token but the first
    # a grammar the output must follow (llmlab.sampling.structured_output.StructuredOutputsParams)
    structured_outputs: Any = None

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        if _finite(self.temperature) and 0 < self.temperature < MIN_TEMPERATURE:
            self.temperature = 0.0 if self.temperature < SAMPLING_EPS else MIN_TEMPERATURE
        self.validate()

    def validate(self) -> None:
        def bad(field: str, expected: str, expected_zh: str) -> ValueError:
            got = getattr(self, field)
            return ValueError(
                tr(
                    f"SamplingParams.{field} must be {expected}, got {got!r}",
                    f"SamplingParams.{field} 必须是{expected_zh}，你给的是 {got!r}",
                )
            )

        if not _finite(self.temperature) or not 0 <= self.temperature <= MAX_TEMPERATURE:
            raise bad(
                "temperature",
                f"a number in [0, {MAX_TEMPERATURE:g}] (0 means greedy)",
                f" [0, {MAX_TEMPERATURE:g}] 之间的数（0 表示贪心解码）",
            )
        if not _finite(self.top_p) or not 0 < self.top_p <= 1:
            raise bad("top_p", "in (0, 1]", " (0, 1] 之间的数")
        if (
            not isinstance(self.top_k, int)
            or isinstance(self.top_k, bool)
            or self.top_k == 0
            or self.top_k < -1
        ):
            raise bad("top_k", "-1 (disabled) or an int >= 1", " -1（关闭）或 >= 1 的整数")
        if (
            not isinstance(self.max_tokens, int)
            or isinstance(self.max_tokens, bool)
            or self.max_tokens < 1
        ):
            raise bad("max_tokens", "an int >= 1", " >= 1 的整数")
        if not isinstance(self.min_tokens, int) or not 0 <= self.min_tokens <= self.max_tokens:
            raise bad(
                "min_tokens",
                f"an int in [0, max_tokens={self.max_tokens}]",
                f" [0, max_tokens={self.max_tokens}] 之间的整数",
            )
        if self.stop_token_ids is not None and not all(
            isinstance(t, int) and t >= 0 for t in self.stop_token_ids
        ):
            raise bad(
                "stop_token_ids", "a list of non-negative token ids", "由非负 token id 组成的列表"
            )
        if self.seed is not None and (
            not isinstance(self.seed, int)
            or isinstance(self.seed, bool)
            or not INT64_MIN <= self.seed <= INT64_MAX
        ):
            raise bad("seed", "None or a 64-bit int", "None 或 64 位整数")
        if self.top_k > INT64_MAX:
            raise bad("top_k", "-1 (disabled) or an int >= 1", " -1（关闭）或 >= 1 的整数")
        if self.stop is not None and not (
            isinstance(self.stop, list)
            and len(self.stop) <= MAX_STOP_STRINGS
            and all(isinstance(x, str) and x for x in self.stop)
        ):
            raise bad(
                "stop",
                f"None, a non-empty str or a list of at most {MAX_STOP_STRINGS} non-empty str",
                f"None、非空 str，或至多 {MAX_STOP_STRINGS} 个非空 str 的列表",
            )
        for name, lo, hi in (("presence_penalty", -2.0, 2.0), ("frequency_penalty", -2.0, 2.0)):
            v = getattr(self, name)
            if not _finite(v) or not lo <= v <= hi:
                raise bad(name, f"a number in [{lo}, {hi}]", f" [{lo}, {hi}] 之间的数")
        if not _finite(self.repetition_penalty) or not 0 < self.repetition_penalty <= 2:
            raise bad(
                "repetition_penalty",
                "a number in (0, 2] (1 means off)",
                " (0, 2] 之间的数（1 表示关闭）",
            )
        if self.logit_bias is not None and not (
            isinstance(self.logit_bias, dict)
            and all(
                isinstance(t, int)
                and not isinstance(t, bool)
                and t >= 0
                and _finite(b)
                and -100 <= b <= 100
                for t, b in self.logit_bias.items()
            )
        ):
            raise bad(
                "logit_bias",
                "a dict {token id >= 0: bias in [-100, 100]}",
                "字典 {token id >= 0: [-100, 100] 之间的偏置}",
            )
        if self.structured_outputs is not None:
            from llmlab.sampling.structured_output import StructuredOutputsParams

            if not isinstance(self.structured_outputs, StructuredOutputsParams):
                raise bad(
                    "structured_outputs",
                    "None or a StructuredOutputsParams",
                    "None 或 StructuredOutputsParams",
                )
        for name in ("logprobs", "prompt_logprobs"):
            v = getattr(self, name)
            if v is not None and (
                not isinstance(v, int) or isinstance(v, bool) or not 0 <= v <= MAX_LOGPROBS
            ):
                raise bad(
                    name,
                    f"None or an int in [0, {MAX_LOGPROBS}]",
                    f"None 或 [0, {MAX_LOGPROBS}] 之间的整数",
                )

    @property
    def greedy(self) -> bool:
        return self.temperature < SAMPLING_EPS

    @property
    def needs_logits_processing(self) -> bool:
        """Whether a penalty or a logit bias changes this request's logits before sampling."""
        return bool(
            self.presence_penalty
            or self.frequency_penalty
            or self.logit_bias
            or self.repetition_penalty != 1.0
        )


def _finite(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
