"""`SamplingParams`: how one request picks its tokens and when it stops, with vLLM's field
names and bounds (`vllm/sampling_params.py`), validated once when made."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

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
        """Raise a ValueError naming the first field out of its range (`_RULES`, in order)."""
        min_tokens = (
            "min_tokens",
            _int_in(0, self.max_tokens),
            f"an int in [0, max_tokens={self.max_tokens}]",
            f" [0, max_tokens={self.max_tokens}] 之间的整数",
        )
        for field, ok, expected, expected_zh in (*_RULES[:4], min_tokens, *_RULES[4:]):
            got = getattr(self, field)
            if not ok(got):
                raise ValueError(
                    tr(
                        f"SamplingParams.{field} must be {expected}, got {got!r}",
                        f"SamplingParams.{field} 必须是{expected_zh}，你给的是 {got!r}",
                    )
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


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _int_in(lo: int, hi: int) -> Callable[[object], bool]:
    return lambda v: _is_int(v) and lo <= v <= hi


def _number_in(lo: float, hi: float, *, above_lo: bool = False) -> Callable[[object], bool]:
    """A finite number in [lo, hi], or in (lo, hi] with `above_lo`."""
    return lambda v: _finite(v) and (lo < v if above_lo else lo <= v) and v <= hi


def _optional(check: Callable[[object], bool]) -> Callable[[object], bool]:
    return lambda v: v is None or check(v)


def _stop_strings(v: object) -> bool:
    return (
        isinstance(v, list)
        and len(v) <= MAX_STOP_STRINGS
        and all(isinstance(x, str) and x for x in v)
    )


def _token_ids(v: object) -> bool:
    return all(isinstance(t, int) and t >= 0 for t in v)


def _logit_bias(v: object) -> bool:
    return isinstance(v, dict) and all(
        _is_int(t) and t >= 0 and _number_in(-100, 100)(b) for t, b in v.items()
    )


def _structured(v: object) -> bool:
    from llmlab.sampling.structured_output import StructuredOutputsParams

    return isinstance(v, StructuredOutputsParams)


# (field, check of its value, what is expected, the same in Chinese), checked in this order;
# min_tokens, whose range depends on max_tokens, goes after the first four
_RULES: list[tuple[str, Callable[[object], bool], str, str]] = [
    (
        "temperature",
        _number_in(0, MAX_TEMPERATURE),
        f"a number in [0, {MAX_TEMPERATURE:g}] (0 means greedy)",
        f" [0, {MAX_TEMPERATURE:g}] 之间的数（0 表示贪心解码）",
    ),
    ("top_p", _number_in(0, 1, above_lo=True), "in (0, 1]", " (0, 1] 之间的数"),
    (
        "top_k",
        lambda v: _is_int(v) and (v == -1 or 1 <= v <= INT64_MAX),
        "-1 (disabled) or an int >= 1",
        " -1（关闭）或 >= 1 的整数",
    ),
    ("max_tokens", _int_in(1, INT64_MAX), "an int >= 1", " >= 1 的整数"),
    (
        "stop_token_ids",
        _optional(_token_ids),
        "a list of non-negative token ids",
        "由非负 token id 组成的列表",
    ),
    ("seed", _optional(_int_in(INT64_MIN, INT64_MAX)), "None or a 64-bit int", "None 或 64 位整数"),
    (
        "stop",
        _optional(_stop_strings),
        f"None, a non-empty str or a list of at most {MAX_STOP_STRINGS} non-empty str",
        f"None、非空 str，或至多 {MAX_STOP_STRINGS} 个非空 str 的列表",
    ),
    *[
        (name, _number_in(-2.0, 2.0), "a number in [-2.0, 2.0]", " [-2.0, 2.0] 之间的数")
        for name in ("presence_penalty", "frequency_penalty")
    ],
    (
        "repetition_penalty",
        _number_in(0, 2, above_lo=True),
        "a number in (0, 2] (1 means off)",
        " (0, 2] 之间的数（1 表示关闭）",
    ),
    (
        "logit_bias",
        _optional(_logit_bias),
        "a dict {token id >= 0: bias in [-100, 100]}",
        "字典 {token id >= 0: [-100, 100] 之间的偏置}",
    ),
    (
        "structured_outputs",
        _optional(_structured),
        "None or a StructuredOutputsParams",
        "None 或 StructuredOutputsParams",
    ),
    *[
        (
            name,
            _optional(_int_in(0, MAX_LOGPROBS)),
            f"None or an int in [0, {MAX_LOGPROBS}]",
            f"None 或 [0, {MAX_LOGPROBS}] 之间的整数",
        )
        for name in ("logprobs", "prompt_logprobs")
    ],
]
