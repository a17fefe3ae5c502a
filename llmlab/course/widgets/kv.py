"""KV calculator: model shape, dtype, context, batch and GPU → KV cache size, share of the GPU's
memory, the KV budget and how many such requests fit at once.

The KV budget is what an engine gives the cache once the model is loaded:
utilisation × GPU memory − weights − activations (vLLM: `--gpu-memory-utilization`, default 0.9,
with weights and the activation peak profiled at start-up). An fp8 KV cache (`--kv-cache-dtype
fp8`) stores 1 byte per number instead of BF16's 2, so the same budget holds twice the tokens.

`kv_summary(...)` computes (with `llmlab.analysis.costs`, the same functions the tests pin to the
source chapter's numbers); `kv_text(summary)` renders one line that starts with "KV cache: <x> GB"
(parse it with `KV_TEXT_PATTERN`, which reads the English line; the Chinese one holds the same
numbers); `plot_kv_memory(...)` draws it; `kv_calculator()` adds sliders. GPU memory sizes come from
`llmlab.analysis.hardware.PRESETS` (datasheet figures in data/hardware.json).
"""

from __future__ import annotations

import re
from typing import Any

from llmlab.analysis import costs
from llmlab.analysis.kv_budget import (  # noqa: F401
    GPU_MEMORY_UTILIZATION,
    KVSummary,
    _kv_config,
    gpu_memory_bytes,
    gpu_names,
    kv_budget_bytes,
    kv_summary,
)
from llmlab.config import get_config
from llmlab.course.widgets._show import show_figure
from llmlab.i18n import tr

# "KV cache: 1.342 GB ..." → group 1 is the number of GB (1 GB = 1e9 bytes)
KV_TEXT_PATTERN = re.compile(r"KV cache: ([0-9.]+(?:e[+-]?[0-9]+)?) GB")
KV_TEXT_PATTERN_ZH = re.compile(r"KV cache：([0-9.]+(?:e[+-]?[0-9]+)?) GB")  # the same, in Chinese


def kv_text(s: KVSummary) -> str:
    """One line: 'KV cache: 1.342 GB (1.25 GiB) | ...'; the GB number matches KV_TEXT_PATTERN."""
    if s.usable_bytes > 0:
        fits = tr(
            f"KV budget {s.usable_bytes / 1e9:.4g} GB | max concurrent {s.context}-token requests: "
            f"{s.max_requests}",
            f"KV 预算 {s.usable_bytes / 1e9:.4g} GB | 最多能同时容纳 {s.context} token 的请求："
            f"{s.max_requests} 个",
        )
    else:
        fits = tr(
            "the weights alone exceed the usable memory: 0 requests fit",
            "光是权重就超过了可用显存：一个请求也放不下（0 个）",
        )
    return tr(
        f"KV cache: {s.kv_bytes / 1e9:.4g} GB ({s.kv_bytes / 2**30:.4g} GiB) for "
        f"{s.batch} × {s.context} tokens at {s.bytes_per_token:,.0f} B/token | "
        f"{100 * s.share_of_gpu:.3g}% of {s.gpu} ({s.gpu_bytes / 1e9:.0f} GB) | {fits}",
        f"KV cache：{s.kv_bytes / 1e9:.4g} GB（{s.kv_bytes / 2**30:.4g} GiB），"
        f"{s.batch} × {s.context} 个 token，每个 token {s.bytes_per_token:,.0f} B | "
        f"占 {s.gpu}（{s.gpu_bytes / 1e9:.0f} GB）的 {100 * s.share_of_gpu:.3g}% | {fits}",
    )


def plot_kv_memory(
    num_layers: int = 80,
    num_kv_heads: int = 8,
    head_dim: int = 128,
    dtype: str | float = "bf16",
    context: int = 4096,
    batch: int = 1,
    gpu: str = "H100-SXM",
    weight_bytes: float = 0.0,
    gpu_memory_utilization: float = GPU_MEMORY_UTILIZATION,
    axes: Any = None,
    activation_bytes: float = 0.0,
) -> Any:
    """Left: the GPU's memory split into weights, activations, this batch's KV cache and the rest.
    Right: KV cache size vs context length for this batch, with the usable memory as a line.
    Returns the figure."""
    import matplotlib.pyplot as plt

    s = kv_summary(
        num_layers,
        num_kv_heads,
        head_dim,
        dtype,
        context,
        batch,
        gpu,
        weight_bytes,
        gpu_memory_utilization,
        activation_bytes,
    )
    if axes is None:
        fig, axes = plt.subplots(1, 2, figsize=(11, 3.2), gridspec_kw={"width_ratios": [1.2, 1]})
    ax1, ax2 = axes
    gb = 1e9
    weights = min(s.weight_bytes, s.gpu_bytes)
    acts = min(s.activation_bytes, s.gpu_bytes - weights)
    kv_shown = min(s.kv_bytes, max(0.0, s.gpu_bytes - weights - acts))
    left = 0.0
    for value, colour, label in (
        (
            weights,
            "#94a3b8",
            tr(f"weights {s.weight_bytes / gb:.1f} GB", f"权重 {s.weight_bytes / gb:.1f} GB"),
        ),
        (
            acts,
            "#a78bfa",
            tr(
                f"activations {s.activation_bytes / gb:.1f} GB",
                f"激活 {s.activation_bytes / gb:.1f} GB",
            ),
        ),
        (kv_shown, "#f59e0b", f"KV cache {s.kv_bytes / gb:.3g} GB"),
        (s.gpu_bytes - weights - acts - kv_shown, "#e5e7eb", tr("free", "空闲")),
    ):
        ax1.barh([0], [value / gb], left=left / gb, color=colour, label=label)
        left += value
    if s.usable_bytes > 0:
        ax1.barh(
            [0],
            [s.usable_bytes / gb],
            left=(weights + acts) / gb,
            fill=False,
            hatch="//",
            edgecolor="#b45309",
            label=tr(
                f"KV budget {s.usable_bytes / gb:.3g} GB", f"KV 预算 {s.usable_bytes / gb:.3g} GB"
            ),
        )
    ax1.axvline(
        s.gpu_bytes * gpu_memory_utilization / gb,
        color="#b91c1c",
        ls="--",
        label=tr(
            f"{gpu_memory_utilization:.0%} utilization limit",
            f"{gpu_memory_utilization:.0%} 利用率上限",
        ),
    )
    ax1.set_yticks([])
    ax1.set_xlabel(tr("GB (1e9 bytes)", "GB（1e9 字节）"))
    too_big = s.kv_bytes + s.weight_bytes + s.activation_bytes > s.gpu_bytes
    over = tr(" — does not fit!", "——放不下！") if too_big else ""
    ax1.set_title(
        tr(
            f"{s.gpu} memory ({s.gpu_bytes / gb:.0f} GB, preset){over}",
            f"{s.gpu} 的显存（{s.gpu_bytes / gb:.0f} GB，预设）{over}",
        )
    )
    ax1.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.35), ncol=2)
    cfg = _kv_config(num_layers, num_kv_heads, head_dim)
    dtype_bytes = costs.dtype_bytes_of(dtype)
    ctxs = sorted({int(x) for x in [2**k for k in range(7, 18)] + [context]})
    ax2.plot(
        ctxs,
        [batch * costs.kv_bytes(cfg, c, dtype_bytes) / gb for c in ctxs],
        marker="o",
        ms=3,
        label=tr(f"KV cache, batch {batch}", f"KV cache，batch {batch}"),
    )
    ax2.axhline(s.usable_bytes / gb, color="#b91c1c", ls="--", label=tr("KV budget", "KV 预算"))
    ax2.plot(
        [context],
        [s.kv_bytes / gb],
        "s",
        color="#f59e0b",
        ms=8,
        label=tr(f"context {context}", f"上下文 {context}"),
    )
    ax2.set_xscale("log", base=2)
    ax2.set_yscale("log")
    ax2.set_xlabel(tr("context length (tokens)", "上下文长度（token 数）"))
    ax2.set_ylabel("GB")
    ax2.set_title(tr("KV cache grows linearly with context", "KV cache 随上下文长度线性增长"))
    ax2.legend(fontsize=8)
    ax1.figure.tight_layout()
    return ax1.figure


def kv_calculator(
    model: str = "llama-3-70b",
    context: int = 4096,
    batch: int = 1,
    dtype: str = "bf16",
    gpu: str = "H100-SXM",
    include_weights: bool = False,
    gpu_memory_utilization: float = GPU_MEMORY_UTILIZATION,
    activation_gb: float = 0.0,
) -> Any:
    """Sliders for the KV calculator. Choosing a model preset sets layers, KV heads and
    head_dim; with the checkbox ticked its BF16 weights take their share of the GPU too; the
    utilisation slider and the activations box set the rest of the KV budget. The result line
    (`kv_text`) updates on every change."""
    import ipywidgets as w

    from llmlab.config import PRESETS

    cfg = get_config(model)
    style = {"description_width": "110px"}
    preset = w.Dropdown(
        options=[k for k, c in PRESETS.items() if not costs.is_mla(c)],
        value=model,
        description=tr("model preset", "模型预设"),
        style=style,
    )
    layers = w.IntSlider(
        value=cfg.num_hidden_layers, min=1, max=128, description=tr("layers", "层数"), style=style
    )
    kv_heads = w.IntSlider(
        value=cfg.num_key_value_heads,
        min=1,
        max=128,
        description=tr("KV heads", "KV 头数"),
        style=style,
    )
    head_dim = w.IntSlider(
        value=cfg.head_dim, min=16, max=256, step=16, description="head_dim", style=style
    )
    dtype_w = w.Dropdown(
        options=["fp32", "bf16", "fp8"], value=dtype, description="KV dtype", style=style
    )
    ctx = w.IntSlider(
        value=context,
        min=128,
        max=131072,
        step=128,
        description=tr("context", "上下文"),
        style=style,
    )
    bat = w.IntSlider(value=batch, min=1, max=256, description="batch", style=style)
    gpu_w = w.Dropdown(options=gpu_names(), value=gpu, description="GPU", style=style)
    weights = w.Checkbox(
        value=include_weights,
        description=tr(
            "put the preset's BF16 weights on the GPU", "把这个预设的 BF16 权重也放到 GPU 上"
        ),
    )
    util = w.FloatSlider(
        value=gpu_memory_utilization,
        min=0.5,
        max=1.0,
        step=0.01,
        description=tr("utilisation", "利用率"),
        style=style,
    )
    acts = w.FloatText(
        value=activation_gb, step=0.5, description=tr("activations (GB)", "激活（GB）"), style=style
    )
    result = w.HTML()
    out = w.Output()
    loading = {"preset": False}

    def redraw(*_: Any) -> None:
        if loading["preset"]:
            return
        wb = costs.weight_bytes(get_config(preset.value), 2) if weights.value else 0.0
        args = dict(
            num_layers=layers.value,
            num_kv_heads=kv_heads.value,
            head_dim=head_dim.value,
            dtype=dtype_w.value,
            context=ctx.value,
            batch=bat.value,
            gpu=gpu_w.value,
            weight_bytes=wb,
            gpu_memory_utilization=util.value,
            activation_bytes=max(0.0, acts.value) * 1e9,
        )
        result.value = f'<pre class="llmlab-kv-result">{kv_text(kv_summary(**args))}</pre>'
        show_figure(out, plot_kv_memory(**args))

    def load_preset(change: dict) -> None:
        c = get_config(change["new"])
        loading["preset"] = True
        try:
            layers.value, kv_heads.value, head_dim.value = (
                c.num_hidden_layers,
                c.num_key_value_heads,
                c.head_dim,
            )
        finally:
            loading["preset"] = False
        redraw()

    preset.observe(load_preset, names="value")
    for s in (layers, kv_heads, head_dim, dtype_w, ctx, bat, gpu_w, weights, util, acts):
        s.observe(redraw, names="value")
    redraw()
    return w.VBox(
        [
            w.HBox([preset, gpu_w, dtype_w]),
            w.HBox([layers, kv_heads, head_dim]),
            w.HBox([ctx, bat, weights]),
            w.HBox([util, acts]),
            result,
            out,
        ]
    )
