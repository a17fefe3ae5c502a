"""Prompt lookup (vLLM: `vllm/v1/spec_decode/ngram_proposer.py`): propose the tokens that followed
an earlier occurrence of the context's last n tokens. No model runs; it pays off where text
repeats itself (editing code, a summary that quotes its document, structured output)."""

from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view


class NgramProposer:
    """Match the longest suffix n-gram (prompt_lookup_max down to prompt_lookup_min tokens) at its
    earliest earlier occurrence in prompt + output, and propose up to k tokens that followed it."""

    def __init__(self, prompt_lookup_min: int, prompt_lookup_max: int) -> None:
        self.min_n = prompt_lookup_min
        self.max_n = prompt_lookup_max

    def propose(self, token_ids: list[int], k: int) -> list[int]:
        """Up to `k` draft tokens to follow `token_ids` (empty: no n-gram matched)."""
        num = len(token_ids)
        if k <= 0 or num <= self.min_n:
            return []
        tokens = np.asarray(token_ids, dtype=np.int64)  # [num]
        for n in range(min(self.max_n, num - 1), self.min_n - 1, -1):
            # windows starting at 0 .. num - n - 1: every n-gram but the suffix itself
            windows = sliding_window_view(tokens[:-1], n)  # [num - n, n]
            hits = np.flatnonzero((windows == tokens[num - n :]).all(axis=1))
            if hits.size:
                start = int(hits[0]) + n  # the earliest occurrence's follower
                return token_ids[start : start + k]
        return []

    def propose_step(
        self, requests: list, starts: list[int], num_slots: list[int], *_cache: object
    ) -> list[list[int]]:
        """The drafts of a step's speculating requests (up to `num_slots[i]` for request i, from
        its tokens so far); the KV-cache arguments the draft model needs are not used here."""
        return [self.propose(req.all_token_ids, k) for req, k in zip(requests, num_slots)]
