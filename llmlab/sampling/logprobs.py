"""Log-probabilities as OpenAI's API returns them: for each token, its own logprob and rank under
the model's raw logits, and the k most likely tokens (vLLM: `vllm/v1/sample/logits_processor` and
`Sampler.gather_logprobs`)."""

from __future__ import annotations

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
