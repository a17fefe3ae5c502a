"""Chapter 04 (KV cache): the timing harness of one generation step with and without a cache,
the same steps' floors on a GPU from the presets, and the chapter's figures."""

from __future__ import annotations

from typing import Any, Sequence

from llmlab.analysis import costs, speculation
from llmlab.config import get_config
from llmlab.course.check.catalog import catalog
from llmlab.course.figures._axes import finish, plot_ms
from llmlab.utils import best_of

M = catalog("figures.ch04")


def no_cache_step_seconds(model: Any, ids: Sequence[int], T: int, repeats: int = 2) -> float:
    """One step without a cache at length T: a forward over all T tokens (measured, seconds)."""
    return best_of(lambda: model.logits_for(list(ids[:T]), last_only=True), repeats)


def cached_step_seconds(model: Any, ids: Sequence[int], T: int, repeats: int = 2) -> float:
    """One decode step with a cache at length T: T - 1 tokens prefilled into a cache, then the
    forward of token T alone is timed (measured, seconds): a verify step with no drafts."""
    return speculation.verify_step_seconds(model, ids, T, 1, repeats)


def plot_step_times(
    lengths: Sequence[int],
    t_no: Sequence[float],
    t_yes: Sequence[float],
    gpu_lengths: Sequence[int],
    gpu_no: Sequence[float],
    gpu_yes: Sequence[float],
    gpu_label: str | None = None,
) -> Any:
    """Left: time per generated token vs length on this machine (measured). Right: the same two
    steps' floors on a GPU (roofline, presets; `gpu_label` by default "Llama-3-8B on H100-SXM,
    BF16"). Times in seconds in, milliseconds drawn."""
    import matplotlib.pyplot as plt

    if gpu_label is None:
        gpu_label = M("plot_step_times.llama_3_8b")
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(12, 3.8))
    for ax, xs, no, yes in ((a1, lengths, t_no, t_yes), (a2, gpu_lengths, gpu_no, gpu_yes)):
        plot_ms(ax, xs, no, "o-", color="#b91c1c", label=M("plot_step_times.without_cache_forward"))
        plot_ms(ax, xs, yes, "o-", color="#2563eb", label=M("plot_step_times.cache_one_decode"))
        ax.set_xlabel(M("plot_step_times.sequence_length_t"))
        ax.set_ylim(bottom=0)
        ax.legend(fontsize=8)
    a1.set_ylabel(M("plot_step_times.time_per_token"))
    a1.set_title(M("plot_step_times.smollm2_135m_machine"))
    a2.set_ylabel(M("plot_step_times.time_per_token_2"))
    a2.set_title(M("plot_step_times.presets_not_measured", gpu_label=gpu_label))
    fig.suptitle(M("plot_step_times.time_per_generated"))
    fig.tight_layout()
    return fig


def plot_source_example(gqa_bytes: float, from_hidden_bytes: float) -> Any:
    """The source chapter's Llama-3-70B 4K-request KV cache computed both ways, as two bars (GB)."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 2.6))
    ax.barh(
        [
            M("plot_source_example.gqa_8_kv"),
            M("plot_source_example.hidden_8192_wrong"),
        ],
        [gqa_bytes / 1e9, from_hidden_bytes / 1e9],
        color=["#2563eb", "#b91c1c"],
    )
    return finish(
        ax, M("plot_source_example.kv_cache_one"), title=M("plot_source_example.llama_3_70b")
    )


KINDS = ("MHA", "GQA", "MQA", "MLA")
_COLOURS = {"MHA": "#94a3b8", "GQA": "#2563eb", "MQA": "#15803d", "MLA": "#f59e0b"}


def plot_kv_layouts(models: Sequence[str], dtype_bytes: float = 2) -> Any:
    """KV bytes per token (KiB, log scale) of each model preset as it is (GQA or MLA) and as the
    same model would be with MHA or MQA (`llmlab.analysis.costs.kv_variants`)."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(11, 3.8))
    width = 0.2
    for j, kind in enumerate(KINDS):
        xs, ys = [], []
        for i, name in enumerate(models):
            v = costs.kv_variants(get_config(name), dtype_bytes)
            if kind in v:
                xs.append(i + (j - 1.5) * width)
                ys.append(v[kind] / 1024)
        ax.bar(xs, ys, width, label=kind, color=_COLOURS[kind])
    ax.set_xticks(range(len(models)), list(models))
    ax.set_yscale("log")
    ax.set_ylabel(M("plot_kv_layouts.kv_cache_per"))
    ax.set_title(M("plot_kv_layouts.kv_bytes_per"))
    ax.legend()
    fig.tight_layout()
    return fig
