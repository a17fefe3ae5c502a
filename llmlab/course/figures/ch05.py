"""Chapter 05 (prefill vs decode): the timing harness of a prefill and of a decode step, the same
steps' floors on a GPU from the presets, and the chapter's figures."""

from __future__ import annotations

from typing import Any, Sequence

import torch

from llmlab.analysis import costs
from llmlab.config import ModelConfig, get_config
from llmlab.course.check.catalog import catalog
from llmlab.course.figures._axes import finish, plot_ms
from llmlab.course.figures.ch04 import cached_step_seconds
from llmlab.kvcache import ContiguousKVCache
from llmlab.utils import best_of

M = catalog("figures.ch05")


def prefill_seconds(model: Any, ids: Sequence[int], n: int, repeats: int = 2) -> float:
    """One prefill: a fresh cache, one forward over the first n tokens, the last one's logits
    (measured, seconds)."""

    def run() -> None:
        c = ContiguousKVCache(model.config, batch_size=1, max_len=n)
        h = model(torch.tensor(list(ids[:n])), c.positions([n]), c.context([n]))
        model.compute_logits(h[-1:])

    return best_of(run, repeats)


def decode_seconds(model: Any, ids: Sequence[int], T: int, repeats: int = 2) -> float:
    """One decode step at context T: T - 1 tokens cached, token T's forward timed (measured)."""
    return cached_step_seconds(model, ids, T, repeats)


def plot_prefill_decode(
    prompt_lens: Sequence[int],
    t_prefill: Sequence[float],
    contexts: Sequence[int],
    t_decode: Sequence[float],
    gpu_prefill: Sequence[float],
    gpu_decode: Sequence[float],
    gpu_label: str | None = None,
) -> Any:
    """Time per token of prefill (prefill time / n) and of decode (one step = one token), on this
    machine (left, measured) and on a GPU (right, roofline floors; `gpu_label` by default
    "Llama-3-8B on H100-SXM, BF16"). Seconds in, ms drawn."""
    import matplotlib.pyplot as plt

    if gpu_label is None:
        gpu_label = M("plot_prefill_decode.llama_3_8b")
    fig, axes = plt.subplots(1, 2, figsize=(12, 3.8))
    for ax, pre, dec in ((axes[0], t_prefill, t_decode), (axes[1], gpu_prefill, gpu_decode)):
        ax.plot(
            prompt_lens,
            [1e3 * s / n for s, n in zip(pre, prompt_lens)],
            "o-",
            color="#2563eb",
            label=M("plot_prefill_decode.prefill_time_prompt"),
        )
        plot_ms(
            ax, contexts, dec, "s-", color="#f59e0b", label=M("plot_prefill_decode.decode_one_step")
        )
        ax.set_xlabel(M("plot_prefill_decode.prompt_length_n"))
        ax.set_yscale("log")
        ax.legend(fontsize=8)
    axes[0].set_ylabel(M("plot_prefill_decode.ms_per_token"))
    axes[0].set_title(M("plot_prefill_decode.smollm2_135m_machine"))
    axes[1].set_ylabel(M("plot_prefill_decode.ms_per_token_2"))
    axes[1].set_title(M("plot_prefill_decode.presets_not_measured", gpu_label=gpu_label))
    fig.suptitle(M("plot_prefill_decode.per_token_prefill"))
    fig.tight_layout()
    return fig


def plot_achieved_flops(
    prompt_lens: Sequence[int],
    prefill_gflops: Sequence[float],
    contexts: Sequence[int],
    decode_gflops: Sequence[float],
) -> Any:
    """Achieved GFLOP/s of prefill and decode on this machine (measured speeds, counted FLOPs)."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.5))
    ax.plot(prompt_lens, prefill_gflops, "o-", label="prefill")
    ax.plot(contexts, decode_gflops, "s-", label="decode")
    ax.set_xlabel(M("plot_achieved_flops.prompt_length_context"))
    ax.set_ylabel(M("plot_achieved_flops.achieved_gflop_s"))
    ax.set_title(M("plot_achieved_flops.same_model_same"))
    ax.legend()
    fig.tight_layout()
    return fig


def intensities(
    cfg: ModelConfig | str, tokens: Sequence[int], context: int = 1024, dtype_bytes: float = 2
) -> tuple[list[float], list[float]]:
    """Arithmetic intensity (FLOP/byte) of a prefill of n tokens, and of a decode step of a batch
    of n requests at `context`, for each n in `tokens` (`llmlab.analysis.costs`)."""
    cfg = get_config(cfg) if isinstance(cfg, str) else cfg
    pre = [
        costs.prefill_flops(cfg, n)
        / (costs.weight_bytes(cfg, dtype_bytes) + costs.kv_bytes(cfg, n, dtype_bytes))
        for n in tokens
    ]
    dec = [
        costs.decode_flops(cfg, b, context)
        / costs.decode_bytes_per_step(cfg, b, context, dtype_bytes)
        for b in tokens
    ]
    return pre, dec


def plot_intensity(
    tokens: Sequence[int],
    prefill_ai: Sequence[float],
    decode_ai: Sequence[float],
    ridge: float,
    title: str = "Llama-3-70B, BF16 (llmlab.analysis.costs)",
    ridge_label: str | None = None,
) -> Any:
    """Arithmetic intensity vs tokens per step, log-log, with a GPU's ridge point as a line
    (`ridge_label`, default: "H100 ridge point (preset)")."""
    import matplotlib.pyplot as plt

    if ridge_label is None:
        ridge_label = M("plot_intensity.h100_ridge_point")
    fig, ax = plt.subplots(figsize=(7, 3.6))
    ax.loglog(
        tokens,
        prefill_ai,
        "o-",
        label=M("plot_intensity.prefill_n_prompt"),
    )
    ax.loglog(
        tokens,
        decode_ai,
        "s-",
        label=M("plot_intensity.decode_step_batch"),
    )
    ax.axhline(ridge, color="#b91c1c", ls="--", label=f"{ridge_label} ≈ {ridge:.0f} FLOP/B")
    return finish(
        ax,
        M("plot_intensity.tokens_per_step"),
        M("plot_intensity.arithmetic_intensity_flop"),
        title,
        legend=8,
    )


def plot_timeline(outputs: Sequence[Any]) -> Any:
    """One bar per request: arrival → first token (TTFT), then a tick per decode token, from the
    engine's own timestamps (`RequestOutput.metrics`, measured)."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10, 2.8))
    for row, out in enumerate(outputs):
        m = out.metrics
        ms = [1e3 * (x - m.arrival_time) for x in m.token_times]
        ax.barh(
            row,
            1e3 * (m.first_token_time - m.arrival_time),
            color="#2563eb",
            label=M("plot_timeline.prefill_first_token") if row == 0 else None,
        )
        ax.plot(
            ms,
            [row] * len(ms),
            "|",
            color="#f59e0b",
            ms=18,
            mew=2,
            label=M("plot_timeline.decode_one_token") if row == 0 else None,
        )
    ax.set_yticks(
        range(len(outputs)),
        [M("plot_timeline.token_prompt", prompt_tokens=len(o.prompt_token_ids)) for o in outputs],
    )
    ax.set_xlabel(M("plot_timeline.time_since_arrival"))
    ax.set_title(M("plot_timeline.one_request_time"))
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.3), ncol=2)
    fig.tight_layout()
    return fig
