"""Figures and the timing harness of chapter 03 (generation)."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import torch

from llmlab.analysis.distribution import next_token_distribution
from llmlab.i18n import notebook_text, tr
from llmlab.utils import best_of


def forward_seconds(model: Any, ids: Sequence[int], n_tokens: int, repeats: int = 2) -> float:
    """Best of `repeats` wall-clock timings (seconds) of one forward over the first `n_tokens` of
    `ids`: what one step of generation without a cache costs at that length (measured)."""
    if not 1 <= n_tokens <= len(ids):
        raise ValueError(
            tr(
                f"n_tokens must be in [1, {len(ids)}] (the ids given), got {n_tokens}",
                f"n_tokens 必须在 [1, {len(ids)}]（给出的 ids 的个数）之间，你给的是 {n_tokens}",
            )
        )
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
    ax.plot(
        lengths,
        [1e3 * s for s in seconds],
        "o-",
        label=tr(
            "one forward over T tokens (= naive step at length T), measured on this CPU",
            "对 T 个 token 做一次前向计算（= 朴素生成在长度 T 时的一步），本机 CPU 实测",
        ),
    )
    if step_lengths:
        ax.plot(
            step_lengths,
            [1e3 * s for s in step_seconds],
            "x",
            color="#b91c1c",
            label=tr(
                "naive generate: its step times, measured on this CPU",
                "朴素 generate：它每一步的耗时，本机 CPU 实测",
            ),
        )
    if gpu_seconds is not None:
        ax.plot(
            lengths,
            [1e3 * s for s in gpu_seconds],
            "s--",
            color="#15803d",
            label=tr(
                f"same forward on an {gpu_label}: least time from the presets (bf16)",
                f"同样的前向计算放到 {gpu_label} 上：按预设算出的最短时间（bf16）",
            ),
        )
    ax.set_yscale("log")
    ax.set_xlabel(tr("sequence length T (tokens)", "序列长度 T（token 数）"))
    ax.set_ylabel(
        tr("time per generated token (ms, log scale)", "每生成一个 token 的时间（ms，对数坐标）")
    )
    ax.set_title(
        tr(
            "Generation without a KV cache: time per token against length",
            "没有 KV cache 的生成：每个 token 的时间随长度增长",
        )
    )
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


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
    fig.suptitle(
        tr(
            f"Next token after {plot_label(prompt)!r} (SmolLM2)",
            f"{plot_label(prompt)!r} 之后的下一个 token（SmolLM2）",
        )
    )
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
        label=tr("kept: sampling probability after the filters", "保留：过滤之后的采样概率"),
    )
    ax.bar(
        [],
        [],
        color="#d1d5db",
        label=tr(
            "removed by top-k / top-p (height: before removal)",
            "被 top-k / top-p 去掉（高度：去掉之前的概率）",
        ),
    )
    ax.plot(
        xs,
        dist.probs_raw[order].numpy(),
        "o",
        color="#b45309",
        ms=4,
        label=tr("raw probability (temperature 1)", "原始概率（温度 1）"),
    )
    ax.set_xticks(list(xs))
    ax.set_xticklabels(labels, rotation=60, ha="right", fontsize=8)
    ax.set_ylabel(tr("probability", "概率"))
    ax.set_xlabel(
        tr(
            f"the {len(order)} most likely next tokens (grey: removed)",
            f"最可能的 {len(order)} 个下一个 token（灰色：已去掉）",
        )
    )
    ax.set_title(
        title
        or tr(
            f"T={temperature:g}, top_k={top_k}, top_p={top_p:g}: "
            f"{dist.num_kept} token(s) can be sampled",
            f"T={temperature:g}，top_k={top_k}，top_p={top_p:g}："
            f"有 {dist.num_kept} 个 token 可以被采样",
        )
    )
    ax.legend(fontsize=8)
    ax.figure.tight_layout()
    return ax
