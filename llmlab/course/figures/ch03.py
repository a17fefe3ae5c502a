"""Figures and the timing harness of chapter 03 (generation)."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import torch

from llmlab.analysis.distribution import next_token_distribution
from llmlab.course.check.catalog import catalog
from llmlab.course.figures._axes import finish, plot_ms
from llmlab.i18n import notebook_text
from llmlab.utils import best_of

M = catalog("figures.ch03")


def forward_seconds(model: Any, ids: Sequence[int], n_tokens: int, repeats: int = 2) -> float:
    """Best of `repeats` wall-clock timings (seconds) of one forward over the first `n_tokens` of
    `ids`: what one step of generation without a cache costs at that length (measured)."""
    if not 1 <= n_tokens <= len(ids):
        raise ValueError(M("forward_seconds.n_tokens_must", len_ids=len(ids), n_tokens=n_tokens))
    return best_of(lambda: model.logits_for(list(ids[:n_tokens])), repeats)


def gpu_forward_floors(
    cfg: Any, lengths: Sequence[int], hw: str = "H100-SXM", dtype_bytes: int = 2
) -> list[float]:
    """Least time (seconds) of one forward over T tokens on the preset `hw`, for each T in
    `lengths` (`llmlab.analysis.roofline.prefill_step`: weights read once, all T tokens computed)."""
    from llmlab.analysis import roofline

    return [
        roofline.place(roofline.prefill_step(cfg, t, dtype_bytes=dtype_bytes), hw).time_floor
        for t in lengths
    ]


def naive_step_times(
    lengths: Sequence[int],
    seconds: Sequence[float],
    step_lengths: Sequence[int] = (),
    step_seconds: Sequence[float] = (),
    gpu_seconds: Sequence[float] | None = None,
    gpu_label: str = "H100",
) -> Any:
    """Time per generated token without a cache against the sequence length T: one forward over
    T tokens (measured), the steps of a naive generate run (measured), and optionally the same
    forward's floor on a GPU preset. Log time axis, in ms. Returns the Figure."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 3.8))
    plot_ms(ax, lengths, seconds, "o-", label=M("naive_step_times.one_forward_over"))
    if step_lengths:
        plot_ms(
            ax,
            step_lengths,
            step_seconds,
            "x",
            color="#b91c1c",
            label=M("naive_step_times.naive_generate_step"),
        )
    if gpu_seconds is not None:
        plot_ms(
            ax,
            lengths,
            gpu_seconds,
            "s--",
            color="#15803d",
            label=M("naive_step_times.same_forward_least", gpu_label=gpu_label),
        )
    ax.set_yscale("log")
    return finish(ax, **M.figure("naive_step_times"), legend=7)


def sampling_settings(
    logits: Any,
    tokenizer: Any,
    settings: Sequence[Mapping[str, float]],
    prompt: str,
    top_n: int = 15,
) -> Any:
    """One panel per sampling setting (temperature / top_k / top_p) of the next-token distribution
    after `prompt` (`plot_next_token_distribution` below). Returns the Figure."""
    import matplotlib.pyplot as plt

    cols = 2
    rows = (len(settings) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(12, 3.5 * rows), squeeze=False)
    for ax, s in zip(axes.flat, settings):
        plot_next_token_distribution(logits, tokenizer, ax=ax, top_n=top_n, **s)
    for ax in list(axes.flat)[len(settings) :]:
        ax.axis("off")
    fig.suptitle(M("sampling_settings.next_token_after", prompt=plot_label(prompt)))
    fig.tight_layout()
    return fig


def plot_label(text: str) -> str:
    """`text` with characters the plotting font cannot draw (e.g. Chinese without a CJK font)
    replaced by their code point, so that labels never turn into empty boxes."""
    from matplotlib import font_manager, ft2font

    font = ft2font.FT2Font(font_manager.findfont(font_manager.FontProperties()))
    return "".join(
        ch if ord(ch) < 128 or font.get_char_index(ord(ch)) else f"U+{ord(ch):04X}" for ch in text
    )


def plot_next_token_distribution(
    logits: torch.Tensor,
    tokenizer: Any,
    temperature: float = 1.0,
    top_k: int = -1,
    top_p: float = 1.0,
    top_n: int = 20,
    ax: Any = None,
    title: str | None = None,
) -> Any:
    """Bar chart of the `top_n` most likely next tokens after temperature, kept ones coloured.

    Blue bars: tokens that can be sampled, with their final probability. Grey bars: tokens that
    top-k / top-p removed (sampling probability 0), drawn at their probability before removal.
    Dots: the raw probabilities at temperature 1. Returns the Axes.
    """
    import matplotlib.pyplot as plt

    from llmlab.tokenizer import format_piece, id_bytes

    title = notebook_text(title)  # a title a notebook cell wrote, in the language in use

    dist = next_token_distribution(logits, temperature, top_k, top_p)
    t = max(temperature, 1e-6)
    shown = (logits.float() / t).softmax(-1)  # [V] after temperature, before filters
    order = shown.argsort(descending=True)[:top_n]
    labels = [plot_label(format_piece(b)) for b in id_bytes(tokenizer, [int(i) for i in order])]
    if ax is None:
        _, ax = plt.subplots(figsize=(9, 3.4))
    xs = range(len(order))
    kept = dist.kept[order]
    heights = torch.where(kept, dist.probs[order], shown[order])
    colours = ["#2563eb" if k else "#d1d5db" for k in kept.tolist()]
    ax.bar(xs, heights.numpy(), color=colours)
    ax.bar(
        [],
        [],
        color="#2563eb",
        label=M("plot_next_token_distribution.kept_sampling_probability"),
    )
    ax.bar(
        [],
        [],
        color="#d1d5db",
        label=M("plot_next_token_distribution.removed_top_k"),
    )
    ax.plot(
        xs,
        dist.probs_raw[order].numpy(),
        "o",
        color="#b45309",
        ms=4,
        label=M("plot_next_token_distribution.raw_probability_temperature"),
    )
    ax.set_xticks(list(xs))
    ax.set_xticklabels(labels, rotation=60, ha="right", fontsize=8)
    ax.set_ylabel(M("plot_next_token_distribution.probability"))
    ax.set_xlabel(M("plot_next_token_distribution.most_likely_next", len_order=len(order)))
    ax.set_title(
        title
        or M(
            "plot_next_token_distribution.t_top_k",
            temperature=temperature,
            top_k=top_k,
            top_p=top_p,
            num_kept=dist.num_kept,
        )
    )
    ax.legend(fontsize=8)
    ax.figure.tight_layout()
    return ax
