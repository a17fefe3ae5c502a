"""Comparing greedy token streams with Hugging Face, allowing only genuine near-ties."""

from __future__ import annotations

import warnings

import torch

NEAR_TIE = 1e-4


def top2_margin(hf_model, token_ids: list[int]) -> float:
    """Gap between the reference's two best logits for the next token after `token_ids`."""
    with torch.no_grad():
        logits = hf_model(torch.tensor([token_ids])).logits[0, -1].float()
    top = logits.topk(2).values
    return float(top[0] - top[1])


def assert_greedy_match(
    ours: list[int], ref: list[int], prompt_ids: list[int], hf_model, label: str = ""
) -> bool:
    """Equal token for token, or diverging only where the reference's top-2 logits are within 1e-4.

    Returns True on an exact match; reports each accepted near-tie divergence as a warning.
    """
    n = min(len(ours), len(ref))
    for i in range(n):
        if ours[i] != ref[i]:
            margin = top2_margin(hf_model, list(prompt_ids) + ref[:i])
            assert margin <= NEAR_TIE, (
                f"{label}: greedy tokens diverge at step {i} (ours {ours[i]}, reference {ref[i]}) "
                f"where the reference's top-2 logit gap is {margin:.2e} > {NEAR_TIE}: a bug, not a tie"
            )
            warnings.warn(
                f"{label}: near-tie divergence at step {i} (top-2 gap {margin:.1e}); "
                "accepted, tokens after it are not compared"
            )
            return False
    assert len(ours) == len(ref), f"{label}: {len(ours)} tokens vs reference {len(ref)}"
    return True


def hf_greedy(hf_model, prompt_ids: list[int], max_new_tokens: int) -> list[int]:
    """transformers' `generate`, greedy, exactly `max_new_tokens` tokens (EOS does not stop it).

    Unsetting EOS (rather than min_new_tokens, which masks the EOS logit) keeps the reference's
    choice at every step the plain argmax, as with `ignore_eos` in llmlab.
    """
    from transformers import GenerationConfig

    saved = hf_model.generation_config.eos_token_id
    hf_model.generation_config.eos_token_id = None
    try:
        config = GenerationConfig(
            max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=None, pad_token_id=0
        )
        with torch.no_grad():
            out = hf_model.generate(torch.tensor([list(prompt_ids)]), generation_config=config)
    finally:
        hf_model.generation_config.eos_token_id = saved
    return out[0, len(prompt_ids) :].tolist()


def assert_same_or_near_tie(model, prompt: list[int], got: list[int], want: list[int]) -> None:
    """`got` equals `want`, or first differs where `model` (an llmlab model) puts its top-2
    logits after `prompt + want[:i]` within NEAR_TIE (tokens after that are not compared)."""
    for i, (a, b) in enumerate(zip(got, want)):
        if a != b:
            top2 = model.logits_for(prompt + want[:i])[-1].topk(2).values
            gap = float(top2[0] - top2[1])
            assert gap <= NEAR_TIE, f"token {i} differs ({a} vs {b}), top-2 gap {gap}"
            return
    assert len(got) == len(want)
