"""Drivers of chapter 14's build exercise, the accept/reject step of speculative sampling.

The student writes `verify_drafts(target_probs, draft_tokens, generator)`: the tokens one verify
step emits for a deterministic proposal (n-gram: the draft is a token, not a distribution). The
driver runs it many times on one case and hands back counts only (plain data): at each position
0 … k, how often each token was emitted there (among the runs that reached it; position k is the
bonus token), how often the step emitted 1 … k + 1 tokens, and how often an emitted sequence
broke a rule that holds on every single run (the accepted tokens are the drafts in order; a
rejected draft is never the token emitted in its place).
"""

from __future__ import annotations

from typing import Any, Callable

import torch


def emitted_counts(verify: Callable, case: tuple) -> dict[str, Any]:
    """`case` = (target probabilities [k + 1][V] as lists, the k draft ids, trials, seed): the
    student's function run `trials` times with one generator seeded `seed`."""
    rows, drafts, trials, seed = case
    probs = torch.tensor(rows, dtype=torch.float64)
    k, vocab = len(drafts), probs.shape[1]
    generator = torch.Generator().manual_seed(seed)
    positions = [[0] * vocab for _ in range(k + 1)]  # [k + 1][V]: token counts per position
    lengths = [0] * (k + 1)
    broken = {"not_drafts_in_order": 0, "rejected_token_emitted": 0}
    for _ in range(trials):
        got = verify(probs.clone(), list(drafts), generator)
        if hasattr(got, "tolist"):
            got = got.tolist()
        try:
            out = [int(t) for t in got]
        except (TypeError, ValueError):
            return {"bad": "not_token_ids", "got": repr(got)[:80]}
        if not 1 <= len(out) <= k + 1:
            return {"bad": "length", "got": repr(out)[:80], "k": k}
        if any(not 0 <= t < vocab for t in out):
            return {"bad": "out_of_vocab", "got": repr(out)[:80], "vocab": vocab}
        for position, token in enumerate(out):
            positions[position][token] += 1
        lengths[len(out) - 1] += 1
        if out[:-1] != list(drafts[: len(out) - 1]):
            broken["not_drafts_in_order"] += 1
        elif len(out) <= k and out[-1] == drafts[len(out) - 1]:
            broken["rejected_token_emitted"] += 1
    return {
        "bad": None,
        "positions": positions,
        "lengths": lengths,
        "broken": broken,
        "trials": trials,
    }
