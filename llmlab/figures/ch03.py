"""Figures and the timing harness of chapter 03 (generation)."""
from __future__ import annotations

import time
from typing import Any, Mapping, Sequence

from llmlab.i18n import tr


def forward_seconds(model: Any, ids: Sequence[int], n_tokens: int, repeats: int = 2) -> float:
    """Best of `repeats` wall-clock timings (seconds) of one forward over the first `n_tokens` of
    `ids`: what one step of generation without a cache costs at that length (measured)."""
    if not 1 <= n_tokens <= len(ids):
        raise ValueError(tr(f"n_tokens must be in [1, {len(ids)}] (the ids given), got {n_tokens}",
                            f"n_tokens 必须在 [1, {len(ids)}]（给出的 ids 的个数）之间，你给的是 {n_tokens}"))
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        model.logits_for(list(ids[:n_tokens]))
        best = min(best, time.perf_counter() - t0)
    return best


def gpu_forward_floors(cfg: Any, lengths: Sequence[int], hw: str = "H100-SXM",
                       dtype_bytes: int = 2) -> list[float]:
    """Least time (seconds) of one forward over T tokens on the preset `hw`, for each T in
    `lengths` (`llmlab.roofline.prefill_step`: weights read once, all T tokens computed)."""
    from llmlab import roofline

    return [roofline.place(roofline.prefill_step(cfg, t, dtype_bytes=dtype_bytes), hw).time_floor
            for t in lengths]


def naive_step_times(lengths: Sequence[int], seconds: Sequence[float],
                     step_lengths: Sequence[int] = (), step_seconds: Sequence[float] = (),
                     gpu_seconds: Sequence[float] | None = None, gpu_label: str = "H100") -> Any:
    """Time per generated token without a cache against the sequence length T: one forward over
    T tokens (measured), the steps of a naive generate run (measured), and optionally the same
    forward's floor on a GPU preset. Log time axis, in ms. Returns the Figure."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 3.8))
    ax.plot(lengths, [1e3 * s for s in seconds], "o-",
            label=tr("one forward over T tokens (= naive step at length T), measured on this CPU",
                     "对 T 个 token 做一次前向计算（= 朴素生成在长度 T 时的一步），本机 CPU 实测"))
    if step_lengths:
        ax.plot(step_lengths, [1e3 * s for s in step_seconds], "x", color="#b91c1c",
                label=tr("naive generate: its step times, measured on this CPU",
                         "朴素 generate：它每一步的耗时，本机 CPU 实测"))
    if gpu_seconds is not None:
        ax.plot(lengths, [1e3 * s for s in gpu_seconds], "s--", color="#15803d",
                label=tr(f"same forward on an {gpu_label}: least time from the presets (bf16)",
                         f"同样的前向计算放到 {gpu_label} 上：按预设算出的最短时间（bf16）"))
    ax.set_yscale("log")
    ax.set_xlabel(tr("sequence length T (tokens)", "序列长度 T（token 数）"))
    ax.set_ylabel(tr("time per generated token (ms, log scale)", "每生成一个 token 的时间（ms，对数坐标）"))
    ax.set_title(tr("Generation without a KV cache: time per token against length",
                    "没有 KV cache 的生成：每个 token 的时间随长度增长"))
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def sampling_settings(logits: Any, tokenizer: Any, settings: Sequence[Mapping[str, float]],
                      prompt: str, top_n: int = 15) -> Any:
    """One panel per sampling setting (temperature / top_k / top_p) of the next-token distribution
    after `prompt` (`llmlab.widgets.sampling.plot_next_token_distribution`). Returns the Figure."""
    import matplotlib.pyplot as plt

    from llmlab.widgets.sampling import plot_label, plot_next_token_distribution

    cols = 2
    rows = (len(settings) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(12, 3.5 * rows), squeeze=False)
    for ax, s in zip(axes.flat, settings):
        plot_next_token_distribution(logits, tokenizer, ax=ax, top_n=top_n, **s)
    for ax in list(axes.flat)[len(settings):]:
        ax.axis("off")
    fig.suptitle(tr(f"Next token after {plot_label(prompt)!r} (SmolLM2)",
                    f"{plot_label(prompt)!r} 之后的下一个 token（SmolLM2）"))
    fig.tight_layout()
    return fig
