"""The next-token distribution the sampler draws from, for given logits and temperature /
top-k / top-p (with `llmlab.sampling`'s own `apply_top_k_top_p`): what chapter 03's explorer
shows and its checker grades."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from llmlab.i18n import tr
from llmlab.sampling import apply_top_k_top_p


@dataclass
class NextTokenDistribution:
    probs_raw: torch.Tensor  # [V] softmax(logits), temperature 1, no filtering
    probs: torch.Tensor  # [V] what the sampler draws from: temperature, top-k, top-p applied
    kept: torch.Tensor  # [V] bool, tokens that can still be sampled

    @property
    def num_kept(self) -> int:
        return int(self.kept.sum())


def next_token_distribution(
    logits: torch.Tensor, temperature: float = 1.0, top_k: int = -1, top_p: float = 1.0
) -> NextTokenDistribution:
    """The distribution the sampler draws the next token from, for logits [V].

    temperature 0 (greedy) keeps only the most likely token. top_k -1 and top_p 1.0 are off.
    """
    if logits.dim() != 1:
        raise ValueError(
            tr(
                f"logits must be [vocab], got shape {tuple(logits.shape)}",
                f"logits 形状必须是 [vocab]，你给了 {tuple(logits.shape)}",
            )
        )
    if not temperature >= 0:
        raise ValueError(
            tr(
                f"temperature must be >= 0, got {temperature!r}",
                f"temperature 必须 >= 0，你给了 {temperature!r}",
            )
        )
    if not (top_k == -1 or top_k >= 1):
        raise ValueError(
            tr(
                f"top_k must be -1 (off) or >= 1, got {top_k!r}",
                f"top_k 必须是 -1（关闭）或 >= 1，你给了 {top_k!r}",
            )
        )
    if not 0 < top_p <= 1:
        raise ValueError(
            tr(
                f"top_p must be in (0, 1], got {top_p!r}",
                f"top_p 必须在 (0, 1] 之间，你给了 {top_p!r}",
            )
        )
    logits = logits.float()
    vocab = logits.shape[0]
    raw = logits.softmax(-1)
    if temperature == 0:
        kept = torch.zeros(vocab, dtype=torch.bool)
        kept[logits.argmax()] = True
        return NextTokenDistribution(raw, kept.float(), kept)
    k = torch.tensor([top_k if top_k > 0 else vocab])
    # top_p = 1 means "off": pass +inf so that float rounding of the running sum (which can
    # reach 1.0 before the last token) never cuts the far tail
    p = torch.tensor([float(top_p) if top_p < 1 else float("inf")])
    masked = apply_top_k_top_p((logits / temperature)[None], k, p)[0]
    probs = masked.softmax(-1)
    return NextTokenDistribution(raw, probs, masked != float("-inf"))


def prompt_logits(prompt: str, model: Any = None, tokenizer: Any = None) -> torch.Tensor:
    """Logits [V] of the next token after `prompt` (the real model unless given one)."""
    if model is None or tokenizer is None:
        from llmlab.model import load_model

        model, tokenizer = load_model("smollm2-135m")
    from llmlab.tokenizer import encode_ids

    ids = encode_ids(tokenizer, prompt)
    if not ids:
        raise ValueError(
            tr("prompt must contain at least one token", "prompt 里至少要有一个 token")
        )
    return model.logits_for(ids)[-1]
