"""Logits processors: a request's `logit_bias` and its presence, frequency and repetition
penalties, applied only to the rows that ask for them, before sampling (vLLM's
`v1/sample/ops/penalties.py` and its logit-bias processor)."""

from __future__ import annotations

import torch

from llmlab.sampling.params import SamplingParams


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
