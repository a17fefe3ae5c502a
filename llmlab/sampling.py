"""Turning logits into the next token: greedy, temperature, top-k, top-p (nucleus).

`SamplingParams` carries vLLM's field names. `sample()` works on a batch of logits, one row
per request, each row with its own parameters, so one engine step samples every request at
once.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from llmlab.i18n import tr


@dataclass
class SamplingParams:
    """How to pick tokens for one request. `temperature=0` means greedy."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1            # -1: all tokens
    max_tokens: int = 16
    min_tokens: int = 0        # EOS and stop tokens are ignored until this many tokens exist
    ignore_eos: bool = False
    stop_token_ids: list[int] | None = None
    seed: int | None = None

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        def bad(field: str, expected: str, expected_zh: str) -> ValueError:
            got = getattr(self, field)
            return ValueError(tr(f"SamplingParams.{field} must be {expected}, got {got!r}",
                                 f"SamplingParams.{field} 必须是{expected_zh}，你给的是 {got!r}"))

        if not isinstance(self.temperature, (int, float)) or not self.temperature >= 0:
            raise bad("temperature", "a number >= 0 (0 means greedy)", " >= 0 的数（0 表示贪心解码）")
        if not isinstance(self.top_p, (int, float)) or not 0 < self.top_p <= 1:
            raise bad("top_p", "in (0, 1]", " (0, 1] 之间的数")
        if not isinstance(self.top_k, int) or isinstance(self.top_k, bool) or self.top_k == 0 or self.top_k < -1:
            raise bad("top_k", "-1 (disabled) or an int >= 1", " -1（关闭）或 >= 1 的整数")
        if not isinstance(self.max_tokens, int) or isinstance(self.max_tokens, bool) or self.max_tokens < 1:
            raise bad("max_tokens", "an int >= 1", " >= 1 的整数")
        if not isinstance(self.min_tokens, int) or not 0 <= self.min_tokens <= self.max_tokens:
            raise bad("min_tokens", f"an int in [0, max_tokens={self.max_tokens}]",
                      f" [0, max_tokens={self.max_tokens}] 之间的整数")
        if self.stop_token_ids is not None and not all(
                isinstance(t, int) and t >= 0 for t in self.stop_token_ids):
            raise bad("stop_token_ids", "a list of non-negative token ids", "由非负 token id 组成的列表")
        if self.seed is not None and (not isinstance(self.seed, int) or self.seed < 0):
            raise bad("seed", "None or an int >= 0", " None 或 >= 0 的整数")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def apply_top_k_top_p(logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Mask (to -inf) every token outside each row's top-k and outside its top-p nucleus.

    logits [B, V]; top_k [B] int (V means off); top_p [B] float (1.0 means off).
    The nucleus is the smallest set of most likely tokens whose probability sums to >= top_p.
    """
    sorted_logits, sorted_idx = logits.sort(dim=-1, descending=True)          # [B, V]
    vocab = logits.shape[-1]
    ranks = torch.arange(vocab, device=logits.device).expand_as(sorted_logits)  # [B, V]
    remove = ranks >= top_k.unsqueeze(1)                                         # outside top-k
    probs = sorted_logits.masked_fill(remove, float("-inf")).softmax(dim=-1)
    # probability mass strictly before each token; a token is kept while that mass < top_p,
    # so the token that crosses top_p is kept and the nucleus is the smallest such set
    mass_before = probs.cumsum(dim=-1) - probs
    # top_p = 1 means off: compare only where it is < 1, since float rounding can make the
    # running sum reach 1.0 before the last token
    remove |= (mass_before >= top_p.unsqueeze(1)) & (top_p.unsqueeze(1) < 1)
    remove[:, 0] = False                                                         # always keep the best
    sorted_logits = sorted_logits.masked_fill(remove, float("-inf"))
    return torch.empty_like(logits).scatter_(1, sorted_idx, sorted_logits)


def sample(logits: torch.Tensor, params: list[SamplingParams],
           generators: list[torch.Generator | None] | None = None) -> torch.Tensor:
    """Pick one token per row of `logits` [B, V] with that row's `SamplingParams` → [B] int64.

    A row whose params have a `seed` must come with its own `torch.Generator` (the engine keeps
    one per request) so that the same seed gives the same tokens whatever else is in the batch.
    """
    if logits.dim() != 2 or logits.shape[0] != len(params):
        raise ValueError(tr(f"logits must be [len(params)={len(params)}, vocab], got {tuple(logits.shape)}",
                            f"logits 的形状必须是 [len(params)={len(params)}, vocab]，你给的是 {tuple(logits.shape)}"))
    logits = logits.float()
    out = logits.argmax(dim=-1)                                                  # greedy default
    rows = [i for i, p in enumerate(params) if not p.greedy]
    if not rows:
        return out
    vocab = logits.shape[-1]
    sub = logits[rows]                                                           # [R, V]
    temp = torch.tensor([params[i].temperature for i in rows], dtype=torch.float32)
    top_k = torch.tensor([params[i].top_k if params[i].top_k > 0 else vocab for i in rows])
    top_p = torch.tensor([float(params[i].top_p) for i in rows])
    sub = apply_top_k_top_p(sub / temp.unsqueeze(1), top_k, top_p)
    probs = sub.softmax(dim=-1)
    # Exponential-race sampling: argmax(p / E) with E ~ Exp(1) picks token i with probability
    # p_i, and lets each row draw its noise from its own generator.
    noise = torch.empty_like(probs)
    for j, i in enumerate(rows):
        g = generators[i] if generators is not None else None
        noise[j].exponential_(generator=g)
    out[rows] = (probs / noise).argmax(dim=-1)
    return out


def make_generator(seed: int | None) -> torch.Generator | None:
    """A per-request generator for a seeded request; None uses the global RNG."""
    if seed is None:
        return None
    g = torch.Generator()
    g.manual_seed(seed)
    return g
