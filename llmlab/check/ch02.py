"""Self-checks of chapter 02 (attention): head size, causal mask, GQA grouping, and an
attention function of your own checked against PyTorch's."""
from __future__ import annotations

from typing import Any

import torch

from llmlab.check.core import CheckResult, NOT_ANSWERED, check_number, not_yet, passed, report

HIDDEN, HEADS = 4096, 32                 # the seed's example (Llama-3-8B)
CAUSAL_T = 6                             # prompt length for the mask question
GQA_HEADS, GQA_KV_HEADS, GQA_QUERY_HEAD = 32, 8, 13  # Llama-3-8B: 32 query heads share 8 KV heads


def head_size(answer: Any) -> CheckResult:
    """The size of one attention head for hidden size HIDDEN and HEADS heads."""
    from llmlab.costs import head_size as _head_size

    expected = _head_size(HIDDEN, HEADS)
    return check_number("ch02.head_size", answer, expected, rel=1e-9, mistakes=[
        (HIDDEN * HEADS, "you multiplied; the heads *split* the hidden vector between them."),
        (HEADS / HIDDEN, "upside down: divide the hidden size by the number of heads."),
        (HIDDEN, "that is the whole hidden vector; each head gets only its slice of it."),
    ], default_hint="the hidden vector is cut into equal slices, one per head.")


def causal_pairs(answer: Any) -> CheckResult:
    """With a causal mask, how many (query i, key j) pairs get a non-zero weight for a
    prompt of CAUSAL_T tokens?"""
    T = CAUSAL_T
    expected = int(torch.ones(T, T).tril().sum())
    return check_number("ch02.causal_pairs", answer, expected, rel=1e-9, mistakes=[
        (T * T, "that is the full matrix: the mask hides every key that comes after its query."),
        (T * (T - 1) // 2, "you left out the diagonal: a token may attend to itself (j <= i)."),
        (T, "that counts only one key per query; query i sees every key j with j <= i."),
    ], default_hint="row i of the mask keeps keys 0..i; add up the kept entries of every row.")


def gqa_kv_head(answer: Any) -> CheckResult:
    """With GQA_HEADS query heads sharing GQA_KV_HEADS KV heads, which KV head (0-based) does
    query head GQA_QUERY_HEAD read?"""
    group = GQA_HEADS // GQA_KV_HEADS
    expected = GQA_QUERY_HEAD // group
    mistakes = [(GQA_QUERY_HEAD % GQA_KV_HEADS, "that is round-robin (modulo); query heads are "
                                                "grouped in consecutive blocks, each block reading one KV head."),
                (GQA_QUERY_HEAD % group, "that is the position inside the group, not the group's number.")]
    mistakes = [(v, h) for v, h in mistakes if v != expected]
    return check_number("ch02.gqa_kv_head", answer, expected, rel=1e-9, mistakes=mistakes,
                        default_hint="work out how many query heads share one KV head, then which "
                                     "consecutive block this query head falls into.")


def _reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    # q, k, v [T, d] → [T, d], causal
    import torch.nn.functional as F

    return F.scaled_dot_product_attention(q[None], k[None], v[None], is_causal=True)[0]


def attention(fn: Any) -> CheckResult:
    """Your function `fn(q, k, v)`: causal softmax(q kᵀ / √d) v for q, k, v of shape [T, d]."""
    ex = "ch02.attention"
    if fn is None:
        return report(not_yet(ex, NOT_ANSWERED))
    if not callable(fn):
        return report(not_yet(ex, f"expected a function fn(q, k, v), got {type(fn).__name__}."))
    g = torch.Generator().manual_seed(0)
    for T, d in ((1, 4), (5, 8), (7, 16)):
        q, k, v = (torch.randn(T, d, generator=g) for _ in range(3))
        want = _reference(q, k, v)
        try:
            got = torch.as_tensor(fn(q.clone(), k.clone(), v.clone()))
        except Exception as e:  # the learner's code: report, never crash the notebook
            return report(not_yet(ex, f"your function raised {type(e).__name__}: {e}"))
        if tuple(got.shape) != (T, d):
            return report(not_yet(ex, f"for q, k, v of shape [{T}, {d}] the output must be [{T}, {d}], "
                                      f"got {list(got.shape)}."))
        if torch.allclose(got.float(), want, atol=1e-4):
            continue
        # diagnose the usual slips by computing what each would give
        scores = q @ k.T
        causal = torch.ones(T, T, dtype=torch.bool).triu(1)
        no_mask = (scores / d ** 0.5).softmax(-1) @ v
        no_scale = scores.masked_fill(causal, float("-inf")).softmax(-1) @ v
        wrong_dim = (scores / d ** 0.5).masked_fill(causal, float("-inf")).softmax(0) @ v
        if torch.allclose(got.float(), no_mask, atol=1e-4):
            return report(not_yet(ex, "the causal mask is missing: set scores of keys after the query to -inf before softmax."))
        if torch.allclose(got.float(), no_scale, atol=1e-4):
            return report(not_yet(ex, "the scores are not scaled: divide q kᵀ by √d before softmax."))
        if torch.allclose(got.float(), wrong_dim, atol=1e-4):
            return report(not_yet(ex, "softmax over the wrong axis: each query's weights over the keys (the last axis) must sum to 1."))
        return report(not_yet(ex, f"wrong values for T={T}, d={d}; compare with "
                                  "torch.nn.functional.scaled_dot_product_attention(..., is_causal=True)."))
    return report(passed(ex, "matches PyTorch's scaled_dot_product_attention."))
