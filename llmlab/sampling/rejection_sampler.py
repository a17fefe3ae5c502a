"""Verifying proposed tokens against the target model (vLLM: `vllm/v1/sample/rejection_sampler.py`).

A verify step runs the target over a request's last token and its k draft tokens d_1..d_k, and so
gets the target's distribution p_0..p_k at each of the k + 1 positions (p_j predicts the token
after d_j). Then:

- **greedy**: accept d_{j+1} while it equals argmax p_j; at the first mismatch emit argmax p_j
  instead (the correction); if all k are accepted, emit argmax p_k too (the bonus token). Every
  emitted token is the target's argmax after the tokens before it, so the output is the
  non-speculative greedy output, token for token.
- **sampling** (Leviathan et al. 2023, Chen et al. 2023): accept d_{j+1}, drawn from the draft's
  q_j, with probability min(1, p_j(d)/q_j(d)); on the first rejection emit a sample of
  normalise(max(0, p_j - q_j)) and stop; if all are accepted, emit a sample of p_k. Each emitted
  token is then distributed exactly as p (for any q). A draft that proposes deterministically
  (n-gram, a greedy draft model) is the case q_j = one-hot(d): accept with probability p_j(d), on
  rejection sample p_j with d removed.

Either way a step emits between 1 and k + 1 tokens: never fewer than plain decoding.
"""

from __future__ import annotations

import torch

from llmlab.sampling.params import SamplingParams
from llmlab.sampling.sampler import apply_top_k_top_p, check_generators


def greedy_verify(target_token_ids: list[int], draft_token_ids: list[int]) -> list[int]:
    """The tokens a greedy verify step emits: the accepted drafts, then one target token.

    target_token_ids: argmax of the target at each of the k + 1 positions.
    draft_token_ids: the k proposed tokens.
    """
    if len(target_token_ids) != len(draft_token_ids) + 1:
        raise ValueError(
            f"target_token_ids must have len(draft_token_ids) + 1 = "
            f"{len(draft_token_ids) + 1} entries, got {len(target_token_ids)}"
        )
    out = []
    for draft, target in zip(draft_token_ids, target_token_ids):
        out.append(target)
        if draft != target:
            return out  # the correction ends the step
    out.append(target_token_ids[-1])  # all accepted: the bonus token
    return out


def rejection_sample(
    target_probs: torch.Tensor,
    draft_token_ids: list[int],
    draft_probs: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
) -> list[int]:
    """The tokens a sampled verify step emits (accepted drafts, then one more), each
    distributed exactly as the target's `target_probs`.

    target_probs: [k + 1, V], the target's probabilities at each position (after temperature,
    top-k, top-p). draft_token_ids: the k proposed tokens. draft_probs: [k, V], the
    distributions they were drawn from, or None for a deterministic proposal (one-hot q).
    generator: the request's RNG (None: the global one).
    """
    k = len(draft_token_ids)
    if target_probs.dim() != 2 or target_probs.shape[0] != k + 1:
        raise ValueError(
            f"target_probs must be [len(draft_token_ids) + 1 = {k + 1}, vocab], "
            f"got {tuple(target_probs.shape)}"
        )
    if draft_probs is not None and tuple(draft_probs.shape) != (k, target_probs.shape[1]):
        raise ValueError(
            f"draft_probs must be None or [{k}, {target_probs.shape[1]}], "
            f"got {tuple(draft_probs.shape)}"
        )
    device = target_probs.device
    if generator is not None:
        check_generators([generator], device)
    uniform = torch.rand(k, generator=generator, dtype=torch.float64, device=device)  # [k]
    drafts = torch.tensor(draft_token_ids, dtype=torch.long).to(device)  # [k]
    p_of = target_probs[torch.arange(k, device=device), drafts]  # [k]
    q_of = (
        torch.ones_like(p_of)
        if draft_probs is None
        else draft_probs.gather(1, drafts[:, None])[:, 0]
    )
    # u < p/q, without dividing by q; read back once: the first rejection ends the step
    accepted = (uniform * q_of < p_of).tolist()  # [k]
    for j, token in enumerate(draft_token_ids):
        if accepted[j]:
            continue
        p = target_probs[j].double()  # [V]
        if draft_probs is None:
            residual = p.clone()
            residual[token] = 0.0
        else:
            residual = (p - draft_probs[j].double()).clamp_min_(0.0)
        # p == q up to rounding: p itself (decided on the device, no read-back)
        residual = torch.where(residual.sum() > 0, residual, p)
        recovered = torch.multinomial(residual, 1, generator=generator)
        return draft_token_ids[:j] + recovered.tolist()
    bonus = torch.multinomial(target_probs[k].double(), 1, generator=generator)
    return list(draft_token_ids) + bonus.tolist()


def target_probs(logits: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
    """Rows of `logits` [N, V] → the probabilities `llmlab.sampling.sample` draws from [N, V]:
    temperature, then top-k and top-p, then softmax; one SamplingParams per row."""
    vocab = logits.shape[-1]
    temp = torch.tensor([p.temperature for p in params], dtype=torch.float32).to(logits.device)
    top_k = torch.tensor([min(p.top_k, vocab) if p.top_k > 0 else vocab for p in params])
    top_p = torch.tensor([float(p.top_p) for p in params])
    scaled = logits.float() / temp.unsqueeze(1)  # [N, V]
    return apply_top_k_top_p(scaled, top_k, top_p).softmax(dim=-1)
