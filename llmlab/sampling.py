"""Turning logits into the next token: greedy, temperature, top-k, top-p (nucleus).

`SamplingParams` carries vLLM's field names. `sample()` works on a batch of logits, one row
per request, each row with its own parameters, so one engine step samples every request at
once. Before it, `apply_logits_processors()` adds a request's `logit_bias` and its presence,
frequency and repetition penalties, only to the rows that ask for them (vLLM's
`v1/sample/ops/penalties.py` and its logit-bias processor).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

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
    # a grammar the output must follow (llmlab.structured_output.StructuredOutputsParams)
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
            from llmlab.structured_output import StructuredOutputsParams

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


def apply_logits_processors(
    logits: torch.Tensor,
    row: int,
    params: SamplingParams,
    prompt_ids: list[int],
    output_ids: list[int],
) -> None:
    """In place, on `logits[row]` [V]: the logit bias, then the repetition, frequency and
    presence penalties (vLLM's order and definitions). Every tensor it builds lives on the
    logits' device, and nothing in it waits for the device (no data-dependent shapes)."""
    x = logits[row]  # [V]
    vocab, device = x.shape[0], x.device
    if params.logit_bias:
        items = [(t, b) for t, b in params.logit_bias.items() if t < vocab]
        ids = torch.tensor([t for t, _ in items], dtype=torch.long).to(device)
        bias = torch.tensor([b for _, b in items], dtype=x.dtype).to(device)
        x.index_add_(0, ids, bias)
    if params.repetition_penalty != 1.0:
        seen = torch.zeros(vocab, dtype=torch.bool, device=device)
        seen[torch.tensor(prompt_ids + output_ids, dtype=torch.long).to(device)] = True
        p = params.repetition_penalty
        x.copy_(torch.where(seen, torch.where(x > 0, x / p, x * p), x))
    if (params.frequency_penalty or params.presence_penalty) and output_ids:
        ids = torch.tensor(output_ids, dtype=torch.long).to(device)
        counts = torch.zeros(vocab, dtype=x.dtype, device=device)  # [V]
        counts.scatter_add_(0, ids, torch.ones(ids.shape, dtype=x.dtype, device=device))
        x -= params.frequency_penalty * counts
        x -= params.presence_penalty * (counts > 0).to(x.dtype)


def apply_top_k_top_p(
    logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor
) -> torch.Tensor:
    """Mask (to -inf) every token outside each row's top-k and outside its top-p nucleus.

    logits [B, V] on any device; top_k [B] int (V means off), top_p [B] float (1.0 means off),
    host tensors (they come from the requests' parameters; they are copied to the logits'
    device here). The nucleus is the smallest set of most likely tokens whose probability sums
    to >= top_p. Only the rows that ask for a cut are sorted (vLLM skips the others the same
    way): for a row with neither, the sort would change nothing and costs more than the rest of
    sampling. Which rows those are is read from the host tensors, so the device never waits.
    """
    vocab = logits.shape[-1]
    cut = [i for i, (k, p) in enumerate(zip(top_k.tolist(), top_p.tolist())) if k < vocab or p < 1]
    if not cut:
        return logits.clone()
    knobs = torch.stack([top_k[cut].to(torch.float32), top_p[cut].to(torch.float32)])
    knobs = knobs.to(logits.device)  # [2, C]: one small copy
    if len(cut) == logits.shape[0]:
        return _cut_sorted(logits, knobs[0], knobs[1])
    out = logits.clone()
    out[cut] = _cut_sorted(logits[cut], knobs[0], knobs[1])
    return out


def _cut_sorted(logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """`apply_top_k_top_p` for rows that all ask for a cut: sort each row once, cut, put back.
    top_k, top_p: [B] float32 on the logits' device."""
    sorted_logits, sorted_idx = logits.sort(dim=-1, descending=True)  # [B, V]
    vocab = logits.shape[-1]
    ranks = torch.arange(vocab, device=logits.device).expand_as(sorted_logits)  # [B, V]
    remove = ranks >= top_k.unsqueeze(1)  # outside top-k
    probs = sorted_logits.masked_fill(remove, float("-inf")).softmax(dim=-1)
    # probability mass strictly before each token; a token is kept while that mass < top_p,
    # so the token that crosses top_p is kept and the nucleus is the smallest such set
    mass_before = probs.cumsum(dim=-1) - probs
    # top_p = 1 means off: compare only where it is < 1, since float rounding can make the
    # running sum reach 1.0 before the last token
    remove |= (mass_before >= top_p.unsqueeze(1)) & (top_p.unsqueeze(1) < 1)
    remove[:, 0] = False  # always keep the best
    sorted_logits = sorted_logits.masked_fill(remove, float("-inf"))
    return torch.empty_like(logits).scatter_(1, sorted_idx, sorted_logits)


def sample(
    logits: torch.Tensor,
    params: list[SamplingParams],
    generators: list[torch.Generator | None] | None = None,
) -> torch.Tensor:
    """Pick one token per row of `logits` [B, V] with that row's `SamplingParams` → [B] int64,
    on the logits' device (the caller reads it back once, for the whole batch).

    A row whose params have a `seed` must come with its own `torch.Generator` on the logits'
    device (the engine keeps one per request: `make_generator(seed, device)`) so that the same
    seed gives the same tokens whatever else is in the batch. Rows that share a generator (the
    engine's default one) draw their noise in one call.
    """
    if logits.dim() != 2 or logits.shape[0] != len(params):
        raise ValueError(
            tr(
                f"logits must be [len(params)={len(params)}, vocab], got {tuple(logits.shape)}",
                f"logits 的形状必须是 [len(params)={len(params)}, vocab]，你给的是 {tuple(logits.shape)}",
            )
        )
    if generators is not None:
        check_generators(generators, logits.device)
    logits = logits.float()
    out = logits.argmax(dim=-1)  # [B]: greedy, the default
    rows = [i for i, p in enumerate(params) if not p.greedy]
    if not rows:
        return out
    vocab = logits.shape[-1]
    chosen = [params[i] for i in rows]
    temp = torch.tensor([p.temperature for p in chosen], dtype=torch.float32)
    top_k = torch.tensor([min(p.top_k, vocab) if p.top_k > 0 else vocab for p in chosen])
    top_p = torch.tensor([float(p.top_p) for p in chosen])
    sub = logits if len(rows) == len(params) else logits[rows]  # [R, V]
    sub = apply_top_k_top_p(sub / temp.to(logits.device).unsqueeze(1), top_k, top_p)
    probs = sub.softmax(dim=-1)  # [R, V]
    # Exponential-race sampling: argmax(p / E) with E ~ Exp(1) picks token i with probability
    # p_i, and lets each row draw its noise from its own generator. E = -log U with U uniform
    # on [0, 1): the same law as `exponential_`, several times faster on a CPU (a vectorised log
    # over a uniform draw); U = 0 gives E = inf, so that one token cannot win.
    noise = _uniform_noise(probs, [generators[i] if generators else None for i in rows])
    picked = (probs / noise.log_().neg_()).argmax(dim=-1)  # [R]
    if len(rows) == len(params):
        return picked
    out[rows] = picked
    return out


def _uniform_noise(probs: torch.Tensor, generators: list[torch.Generator | None]) -> torch.Tensor:
    """Uniform [0, 1) noise shaped like `probs` [R, V], row r drawn from `generators[r]`; rows
    that share a generator (or the global RNG, None) are drawn together, in row order."""
    noise = torch.empty_like(probs)
    groups: dict[int, list[int]] = {}
    for r, g in enumerate(generators):
        groups.setdefault(id(g), []).append(r)
    for members in groups.values():
        g = generators[members[0]]
        if len(members) == len(generators):
            noise.uniform_(generator=g)
        elif len(members) == 1:
            noise[members[0]].uniform_(generator=g)
        else:
            drawn = torch.empty((len(members), probs.shape[1]), device=probs.device)
            noise[members] = drawn.uniform_(generator=g)
    return noise


def check_generators(generators: list[torch.Generator | None], device: torch.device) -> None:
    """Every generator must draw on `device` (the logits'): a CPU generator cannot fill a CUDA
    tensor, and on a CPU-only machine the same mistake would go unseen, so it is refused here
    for every device alike."""
    for i, g in enumerate(generators):
        if g is not None and g.device.type != device.type:
            raise ValueError(
                f"generators[{i}] draws on {g.device}, the logits are on {device}: make a "
                f"request's generator on the logits' device (make_generator(seed, device))"
            )


def make_generator(seed: int | None, device: torch.device | str = "cpu") -> torch.Generator | None:
    """A per-request generator on `device` for a seeded request; None uses the global RNG."""
    if seed is None:
        return None
    g = torch.Generator(device=device)
    g.manual_seed(seed)
    return g
