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
from llmlab.course.check.catalog import catalog
from llmlab.course.widgets._show import show_figure

M = catalog("widgets.kv")

# "KV cache: 1.342 GB ..." → group 1 is the number of GB (1 GB = 1e9 bytes)
KV_TEXT_PATTERN = re.compile(r"KV cache: ([0-9.]+(?:e[+-]?[0-9]+)?) GB")
KV_TEXT_PATTERN_ZH = re.compile(r"KV cache：([0-9.]+(?:e[+-]?[0-9]+)?) GB")  # the same, in Chinese


def kv_text(s: KVSummary) -> str:
    """One line: 'KV cache: 1.342 GB (1.25 GiB) | ...'; the GB number matches KV_TEXT_PATTERN."""
    if s.usable_bytes > 0:
        fits = M(
            "kv_text.kv_budget_gb",
            budget_gb=s.usable_bytes / 1e9,
            context=s.context,
            max_requests=s.max_requests,
        )
    else:
        fits = M("kv_text.weights_alone_exceed")
    return M(
        "kv_text.kv_cache_gb",
        kv_gb=s.kv_bytes / 1e9,
        kv_gib=s.kv_bytes / 2**30,
        batch=s.batch,
        context=s.context,
        bytes_per_token=s.bytes_per_token,
        share_of_gpu=100 * s.share_of_gpu,
        gpu=s.gpu,
        gpu_gb=s.gpu_bytes / 1e9,
        fits=fits,
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
            M("plot_kv_memory.weights_gb", weight_gb=s.weight_bytes / gb),
        ),
        (
            acts,
            "#a78bfa",
            M("plot_kv_memory.activations_gb", activation_gb=s.activation_bytes / gb),
        ),
        (kv_shown, "#f59e0b", f"KV cache {s.kv_bytes / gb:.3g} GB"),
        (s.gpu_bytes - weights - acts - kv_shown, "#e5e7eb", M("plot_kv_memory.free")),
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
            label=M("plot_kv_memory.kv_budget_gb", budget_gb=s.usable_bytes / gb),
        )
    ax1.axvline(
        s.gpu_bytes * gpu_memory_utilization / gb,
        color="#b91c1c",
        ls="--",
        label=M("plot_kv_memory.utilization_limit", gpu_memory_utilization=gpu_memory_utilization),
    )
    ax1.set_yticks([])
    ax1.set_xlabel(M("plot_kv_memory.gb_1e9_bytes"))
    too_big = s.kv_bytes + s.weight_bytes + s.activation_bytes > s.gpu_bytes
    over = M("plot_kv_memory.does_not_fit") if too_big else ""
    ax1.set_title(
        M("plot_kv_memory.memory_gb_preset", gpu=s.gpu, gpu_gb=s.gpu_bytes / gb, over=over)
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
        label=M("plot_kv_memory.kv_cache_batch", batch=batch),
    )
    ax2.axhline(s.usable_bytes / gb, color="#b91c1c", ls="--", label=M("plot_kv_memory.kv_budget"))
    ax2.plot(
        [context],
        [s.kv_bytes / gb],
        "s",
        color="#f59e0b",
        ms=8,
        label=M("plot_kv_memory.context", context=context),
    )
    ax2.set_xscale("log", base=2)
    ax2.set_yscale("log")
    ax2.set_xlabel(M("plot_kv_memory.context_length_tokens"))
    ax2.set_ylabel("GB")
    ax2.set_title(M("plot_kv_memory.kv_cache_grows"))
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
        description=M("kv_calculator.model_preset"),
        style=style,
    )
    layers = w.IntSlider(
        value=cfg.num_hidden_layers,
        min=1,
        max=128,
        description=M("kv_calculator.layers"),
        style=style,
    )
    kv_heads = w.IntSlider(
        value=cfg.num_key_value_heads,
        min=1,
        max=128,
        description=M("kv_calculator.kv_heads"),
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
        description=M("kv_calculator.context"),
        style=style,
    )
    bat = w.IntSlider(value=batch, min=1, max=256, description="batch", style=style)
    gpu_w = w.Dropdown(options=gpu_names(), value=gpu, description="GPU", style=style)
    weights = w.Checkbox(
        value=include_weights,
        description=M("kv_calculator.put_preset_s"),
    )
    util = w.FloatSlider(
        value=gpu_memory_utilization,
        min=0.5,
        max=1.0,
        step=0.01,
        description=M("kv_calculator.utilisation"),
        style=style,
    )
    acts = w.FloatText(
        value=activation_gb, step=0.5, description=M("kv_calculator.activations_gb"), style=style
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
