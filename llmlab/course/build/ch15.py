"""Driver of chapter 15's build exercise, a grammar's token mask written by hand.

The student writes `allowed_tokens(generated, pieces, eos_id)`: a bool tensor over the whole
vocabulary, True for each token that may come next when the output so far is `generated` and the
output must be `{"age": ` then one or more digits then `}`. The driver calls it on a few states
and hands back, per state, the ids it allows (plain data), or what was wrong with its return.
"""

from __future__ import annotations

from typing import Any, Callable

import torch


def allowed_ids(allowed_tokens: Callable, case: tuple) -> dict[str, Any]:
    """`case` = (pieces: every token's text, eos_id, states: outputs so far)."""
    pieces, eos_id, states = case
    pieces = list(pieces)
    out = []
    for text in states:
        got = allowed_tokens(text, pieces, eos_id)
        try:
            mask = torch.as_tensor(got)
        except (TypeError, ValueError, RuntimeError):
            return {"bad": "not_a_mask", "state": text, "got": type(got).__name__}
        if mask.shape != (len(pieces),):
            return {"bad": "shape", "state": text, "got": list(mask.shape), "want": len(pieces)}
        if mask.dtype != torch.bool:
            return {"bad": "dtype", "state": text, "got": str(mask.dtype)}
        out.append(mask.nonzero().flatten().tolist())
    return {"bad": None, "allowed": out}
