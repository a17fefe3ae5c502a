"""Log-probabilities as OpenAI's API returns them: for each token, its own logprob and rank under
the model's raw logits, and the k most likely tokens (vLLM: `vllm/v1/sample/logits_processor` and
`Sampler.gather_logprobs`)."""

from __future__ import annotations

from typing import Any, Callable

import torch

from llmlab.sampling.params import Logprob

PROMPT_LOGPROBS_CHUNK = 256  # prompt positions whose [N, vocab] logits are made at once


def logprob_entries(
    logprobs: torch.Tensor, token_ids: list[int], k: int
) -> list[dict[int, Logprob]]:
    """One {token id: Logprob} per row of `logprobs` [N, V]: the given token first (with its
    rank), then the k most likely tokens (OpenAI's top_logprobs). Computed on the logprobs'
    device; only the [N, k + 2] numbers come back to the host."""
    ids = torch.tensor(token_ids, dtype=torch.long).to(logprobs.device).unsqueeze(1)  # [N, 1]
    chosen = logprobs.gather(1, ids)  # [N, 1]
    ranks = ((logprobs > chosen).sum(1) + 1).tolist()  # [N]
    chosen = chosen.squeeze(1).tolist()
    top_vals, top_ids = logprobs.topk(k, dim=1) if k else (None, None)  # [N, k]
    top_vals = top_vals.tolist() if k else None
    top_ids = top_ids.tolist() if k else None
    entries = []
    for i, tok in enumerate(token_ids):
        entry = {tok: Logprob(chosen[i], ranks[i])}
        if k:
            for j, (t, v) in enumerate(zip(top_ids[i], top_vals[i])):
                entry.setdefault(t, Logprob(v, j + 1))
        entries.append(entry)
    return entries


def fill_prompt_logprobs(
    compute_logits: Callable[[torch.Tensor], torch.Tensor], out: Any, hidden: torch.Tensor
) -> None:
    """The logprobs of the prompt tokens a step computes (`out`: its SchedulerOutput; `hidden`:
    [num_tokens, hidden] of the whole step), written into each asking request's
    `prompt_logprobs`: the logits at position p score prompt token p + 1 (vLLM computes them the
    same way, chunk by chunk)."""
    flat = 0
    for req, start, n in zip(out.requests, out.num_computed_tokens, out.num_new_tokens):
        num_prompt = req.num_prompt_tokens
        if req.prompt_logprobs is not None and start < num_prompt - 1:
            last = min(start + n, num_prompt - 1)  # positions start .. last - 1
            k = req.sampling_params.prompt_logprobs
            for lo in range(start, last, PROMPT_LOGPROBS_CHUNK):  # bound the [N, V] logits
                hi = min(lo + PROMPT_LOGPROBS_CHUNK, last)
                rows = hidden[flat + lo - start : flat + hi - start]  # [N, hidden]
                lp = compute_logits(rows).log_softmax(-1)  # [N, vocab]
                targets = req.prompt_token_ids[lo + 1 : hi + 1]
                req.prompt_logprobs[lo + 1 : hi + 1] = logprob_entries(lp, targets, k)
        flat += n
