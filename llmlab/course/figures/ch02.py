"""Figures of chapter 02 (one decoder layer): which KV head each query head reads, attention
heat-maps of a real prompt, and RoPE scores against the two tokens' positions; and the printed
comparison of one of the student's pieces with the real layer 0 (`against_layer0`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from llmlab.course.check.catalog import catalog
from llmlab.course.figures._axes import finish

M = catalog("figures.ch02")


def gqa_grouping(names: Sequence[str] = ("smollm2-135m", "llama-3-8b")):
    """One panel per model preset: a cell (KV head, query head) is filled when that query head
    reads that KV head (query head h reads KV head h // (heads / kv_heads))."""
    import matplotlib.pyplot as plt

    from llmlab.config import get_config

    fig, axes = plt.subplots(1, len(names), figsize=(5 * len(names), 2.8), squeeze=False)
    for ax, name in zip(axes[0], names):
        c = get_config(name)
        grid = torch.zeros(c.num_key_value_heads, c.num_attention_heads)
        for h in range(c.num_attention_heads):
            grid[h // c.num_queries_per_kv, h] = 1
        ax.imshow(grid.numpy(), cmap="Blues", aspect="auto", vmin=0, vmax=1)
        ax.set_xlabel(M("gqa_grouping.query_head"))
        ax.set_ylabel(M("gqa_grouping.kv_head"))
        ax.set_title(
            M(
                "gqa_grouping.preset_query_heads",
                name=name,
                num_attention_heads=c.num_attention_heads,
                num_key_value_heads=c.num_key_value_heads,
            ),
            fontsize=10,
        )
    fig.tight_layout()
    return fig


def attention_heatmaps(
    model,
    token_ids: Sequence[int],
    labels: Sequence[str],
    layers: Sequence[int] = (0,),
    heads: Sequence[int] = (0,),
):
    """A grid of softmax attention weights (`llmlab.model.attention_probs`), one row per layer
    and one column per head; rows of each map are the tokens that look, columns the tokens they
    look at."""
    import matplotlib.pyplot as plt

    from llmlab.model import attention_probs

    T = len(token_ids)
    fig, axes = plt.subplots(
        len(layers), len(heads), figsize=(3.4 * len(heads), 3.2 * len(layers)), squeeze=False
    )
    for r, layer in enumerate(layers):
        probs = attention_probs(model, list(token_ids), layer=layer)  # [heads, T, T]
        for c, head in enumerate(heads):
            ax = axes[r, c]
            ax.imshow(probs[head].numpy(), cmap="magma", vmin=0, vmax=1)
            ax.set_title(M("attention_heatmaps.layer_head", layer=layer, head=head), fontsize=9)
            ax.set_xticks(range(T), labels, rotation=90, fontsize=7)
            ax.set_yticks(range(T), labels, fontsize=7)
    fig.suptitle(M("attention_heatmaps.attention_weights_smollm2"))
    fig.supxlabel(M("attention_heatmaps.key_token_looked"))
    fig.supylabel(M("attention_heatmaps.query_token_looking"))
    fig.tight_layout()
    return fig


def rope_score_values(
    pairs: Sequence[tuple[int, int]], head_dim: int = 64, theta: float = 100000.0, seed: int = 0
) -> dict[tuple[int, int], float]:
    """s(m, n) = rope(q, m) · rope(k, n) for one random q and k of `head_dim`, rotated with the
    model's own RoPE (`llmlab.model.apply_rope`), for each (m, n) of `pairs`."""
    from dataclasses import replace

    from llmlab.config import get_config
    from llmlab.model import apply_rope, rope_inv_freq

    g = torch.Generator().manual_seed(seed)
    q, k = torch.randn(1, 1, head_dim, generator=g), torch.randn(1, 1, head_dim, generator=g)
    inv_freq = rope_inv_freq(
        replace(get_config("smollm2-135m"), head_dim=head_dim, rope_theta=theta)
    )

    def rotated(x: torch.Tensor, position: int) -> torch.Tensor:
        angle = torch.tensor([float(position)])[:, None] * inv_freq[None, :]  # [1, d/2]
        return apply_rope(x, angle.cos(), angle.sin())

    return {(m, n): float((rotated(q, m) * rotated(k, n)).sum()) for m, n in pairs}


def rope_scores(values: dict[tuple[int, int], float]):
    """Bar chart of RoPE scores s(m, n), one bar per (query position m, key position n)."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3))
    names = [f"s({m}, {n})\nm−n = {m - n}" for m, n in values]
    ax.bar(names, list(values.values()), color="#2563eb")
    ax.axhline(0, color="black", linewidth=0.8)
    return finish(ax, **M.figure("rope_scores"))


def against_layer0(label: str, fn: Any, args: tuple, reference: torch.Tensor) -> float | None:
    """Print how far `fn(*args)` lies from `reference` (what the real layer 0 computes on the
    same real inputs) and return the largest difference; a note instead when `fn` is not
    written yet or raises."""
    if fn is None:
        print(M("against_layer0.write_function_above", label=label))
        return None
    try:
        with torch.no_grad():
            got = torch.as_tensor(fn(*args)).float()
    except Exception as e:  # the learner's code
        print(M("against_layer0.your_function_raised", label=label, error=type(e).__name__, e=e))
        return None
    want = reference.detach().float()
    if got.shape != want.shape:
        print(
            M(
                "against_layer0.shape_layer_0",
                label=label,
                got=list(got.shape),
                want=list(want.shape),
            )
        )
        return None
    diff = (got - want).abs().max().item()
    same = diff <= 1e-4 + 1e-4 * want.abs().max().item()
    verdict = M("against_layer0.same") if same else M("against_layer0.different")
    print(M("against_layer0.largest_yours_layer", label=label, diff=diff, verdict=verdict))
    return diff
