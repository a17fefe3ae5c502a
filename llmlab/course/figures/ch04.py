"""Chapter 04 (KV cache): the timing harness of one generation step with and without a cache,
the same steps' floors on a GPU from the presets, and the chapter's figures."""

from __future__ import annotations

from typing import Any, Sequence

from llmlab.analysis import costs, roofline, speculation
from llmlab.config import ModelConfig, get_config
from llmlab.i18n import tr
from llmlab.utils import best_of


def no_cache_step_seconds(model: Any, ids: Sequence[int], T: int, repeats: int = 2) -> float:
    """One step without a cache at length T: a forward over all T tokens (measured, seconds)."""
    return best_of(lambda: model.logits_for(list(ids[:T]), last_only=True), repeats)


def cached_step_seconds(model: Any, ids: Sequence[int], T: int, repeats: int = 2) -> float:
    """One decode step with a cache at length T: T - 1 tokens prefilled into a cache, then the
    forward of token T alone is timed (measured, seconds): a verify step with no drafts."""
    return speculation.verify_step_seconds(model, ids, T, 1, repeats)


def gpu_step_floors(
    cfg: ModelConfig | str, lengths: Sequence[int], gpu: str = "H100-SXM", dtype_bytes: float = 2
) -> tuple[list[float], list[float]]:
    """The roofline floor (seconds) of one step at each length on `gpu` (presets, not measured):
    without a cache a prefill-like forward over T tokens, with one a decode step at context T."""
    cfg = get_config(cfg) if isinstance(cfg, str) else cfg
    no_cache = [
        roofline.place(
            roofline.prefill_step(cfg, T, dtype_bytes=dtype_bytes),
            gpu,
            roofline.dtype_for_bytes(dtype_bytes),
        ).time_floor
        for T in lengths
    ]
    cached = [roofline.decode_step_floor(cfg, gpu, 1, T, dtype_bytes) for T in lengths]
    return no_cache, cached


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
        gpu_label = tr("Llama-3-8B on H100-SXM, BF16", "Llama-3-8B 在 H100-SXM 上，BF16")
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(12, 3.8))
    for ax, xs, no, yes in ((a1, lengths, t_no, t_yes), (a2, gpu_lengths, gpu_no, gpu_yes)):
        ax.plot(
            xs,
            [1e3 * s for s in no],
            "o-",
            color="#b91c1c",
            label=tr(
                "without cache: forward over T tokens", "没有 KV cache：对 T 个 token 做前向计算"
            ),
        )
        ax.plot(
            xs,
            [1e3 * s for s in yes],
            "o-",
            color="#2563eb",
            label=tr("with cache: one decode step", "有 KV cache：一步 decode"),
        )
        ax.set_xlabel(tr("sequence length T (tokens)", "序列长度 T（token 数）"))
        ax.set_ylim(bottom=0)
        ax.legend(fontsize=8)
    a1.set_ylabel(tr("time per token (ms, measured)", "每个 token 的时间（ms，实测）"))
    a1.set_title(tr("SmolLM2-135M on this machine (measured)", "SmolLM2-135M 在本机上（实测）"))
    a2.set_ylabel(
        tr("time per token (ms, roofline floor)", "每个 token 的时间（ms，roofline 下限）")
    )
    a2.set_title(tr(f"{gpu_label} (presets, not measured)", f"{gpu_label}（预设，不是实测）"))
    fig.suptitle(
        tr(
            "Time per generated token, with and without the KV cache",
            "有和没有 KV cache 时，每生成一个 token 的时间",
        )
    )
    fig.tight_layout()
    return fig


def plot_source_example(gqa_bytes: float, from_hidden_bytes: float) -> Any:
    """The source chapter's Llama-3-70B 4K-request KV cache computed both ways, as two bars (GB)."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 2.6))
    ax.barh(
        [
            tr("GQA: 8 KV heads x 128", "GQA：8 个 KV 头 x 128"),
            tr("from hidden 8192 (wrong)", "按 hidden 8192 算（错误）"),
        ],
        [gqa_bytes / 1e9, from_hidden_bytes / 1e9],
        color=["#2563eb", "#b91c1c"],
    )
    ax.set_xlabel(
        tr("KV cache of one 4K-token request (GB)", "一个 4K token 请求的 KV cache（GB）")
    )
    ax.set_title(
        tr(
            "Llama-3-70B, BF16: the source chapter's example both ways (llmlab.analysis.costs)",
            "Llama-3-70B，BF16：原章节的例子，两种算法（llmlab.analysis.costs）",
        )
    )
    fig.tight_layout()
    return fig


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
    ax.set_ylabel(
        tr("KV cache per token (KiB, log scale)", "每个 token 的 KV cache（KiB，对数坐标）")
    )
    ax.set_title(
        tr(
            "KV bytes per token: the real layout (GQA or MLA) vs the same model as MHA and MQA",
            "每个 token 的 KV 字节数：真实的布局（GQA 或 MLA）与同一模型改成 MHA、MQA 的对比",
        )
    )
    ax.legend()
    fig.tight_layout()
    return fig
