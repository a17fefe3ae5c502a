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
from llmlab.course.widgets._show import control, controls_of, defaults, show_figure

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


def plot_kv_memory(axes: Any = None, **spec: Any) -> Any:
    """Left: the GPU's memory split into weights, activations, this batch's KV cache and the rest.
    Right: KV cache size vs context length for this batch, with the usable memory as a line.
    `spec`: the arguments of `llmlab.analysis.kv_budget.kv_summary` (its defaults for those not
    given); `axes`: two matplotlib Axes to draw into (None: a new figure). Returns the figure."""
    import matplotlib.pyplot as plt

    spec = defaults(kv_summary) | spec
    s = kv_summary(**spec)
    if axes is None:
        fig, axes = plt.subplots(1, 2, figsize=(11, 3.2), gridspec_kw={"width_ratios": [1.2, 1]})
    ax1, ax2 = axes
    _plot_memory_bar(ax1, s)
    _plot_kv_vs_context(
        ax2,
        s,
        _kv_config(spec["num_layers"], spec["num_kv_heads"], spec["head_dim"]),
        spec["dtype"],
    )
    ax1.figure.tight_layout()
    return ax1.figure


def _plot_memory_bar(ax: Any, s: KVSummary) -> None:
    """The GPU's memory as one bar: weights, activations, this batch's KV cache, the rest; the
    KV budget hatched over it and the utilisation limit as a line."""
    gb = 1e9
    weights = min(s.weight_bytes, s.gpu_bytes)
    acts = min(s.activation_bytes, s.gpu_bytes - weights)
    kv_shown = min(s.kv_bytes, max(0.0, s.gpu_bytes - weights - acts))
    left = 0.0
    for value, colour, label in (
        (weights, "#94a3b8", M("plot_kv_memory.weights_gb", weight_gb=s.weight_bytes / gb)),
        (
            acts,
            "#a78bfa",
            M("plot_kv_memory.activations_gb", activation_gb=s.activation_bytes / gb),
        ),
        (kv_shown, "#f59e0b", f"KV cache {s.kv_bytes / gb:.3g} GB"),
        (s.gpu_bytes - weights - acts - kv_shown, "#e5e7eb", M("plot_kv_memory.free")),
    ):
        ax.barh([0], [value / gb], left=left / gb, color=colour, label=label)
        left += value
    if s.usable_bytes > 0:
        ax.barh(
            [0],
            [s.usable_bytes / gb],
            left=(weights + acts) / gb,
            fill=False,
            hatch="//",
            edgecolor="#b45309",
            label=M("plot_kv_memory.kv_budget_gb", budget_gb=s.usable_bytes / gb),
        )
    utilization = s.gpu_memory_utilization
    ax.axvline(
        s.gpu_bytes * utilization / gb,
        color="#b91c1c",
        ls="--",
        label=M("plot_kv_memory.utilization_limit", gpu_memory_utilization=utilization),
    )
    ax.set_yticks([])
    ax.set_xlabel(M("plot_kv_memory.gb_1e9_bytes"))
    too_big = s.kv_bytes + s.weight_bytes + s.activation_bytes > s.gpu_bytes
    over = M("plot_kv_memory.does_not_fit") if too_big else ""
    ax.set_title(
        M("plot_kv_memory.memory_gb_preset", gpu=s.gpu, gpu_gb=s.gpu_bytes / gb, over=over)
    )
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.35), ncol=2)


def _plot_kv_vs_context(ax: Any, s: KVSummary, cfg: Any, dtype: str | float) -> None:
    """The batch's KV cache against context length (log-log), the KV budget as a line and this
    context marked."""
    gb = 1e9
    dtype_bytes = costs.dtype_bytes_of(dtype)
    ctxs = sorted({int(x) for x in [2**k for k in range(7, 18)] + [s.context]})
    ax.plot(
        ctxs,
        [s.batch * costs.kv_bytes(cfg, c, dtype_bytes) / gb for c in ctxs],
        marker="o",
        ms=3,
        label=M("plot_kv_memory.kv_cache_batch", batch=s.batch),
    )
    ax.axhline(s.usable_bytes / gb, color="#b91c1c", ls="--", label=M("plot_kv_memory.kv_budget"))
    ax.plot(
        [s.context],
        [s.kv_bytes / gb],
        "s",
        color="#f59e0b",
        ms=8,
        label=M("plot_kv_memory.context", context=s.context),
    )
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel(M("plot_kv_memory.context_length_tokens"))
    ax.set_ylabel("GB")
    ax.set_title(M("plot_kv_memory.kv_cache_grows"))
    ax.legend(fontsize=8)


def _kv_controls(
    model: str,
    context: int,
    batch: int,
    dtype: str,
    gpu: str,
    include_weights: bool,
    gpu_memory_utilization: float,
    activation_gb: float,
) -> dict[str, Any]:
    """The KV calculator's controls by name: the model preset sets the shape's three sliders."""
    import ipywidgets as w

    from llmlab.config import PRESETS

    cfg, width = get_config(model), "110px"
    models = [k for k, c in PRESETS.items() if not costs.is_mla(c)]
    start = {
        "preset": model,
        "layers": cfg.num_hidden_layers,
        "kv_heads": cfg.num_key_value_heads,
        "head_dim": cfg.head_dim,
        "dtype": dtype,
        "context": context,
        "batch": batch,
        "gpu": gpu,
        "util": gpu_memory_utilization,
    }
    table = {
        "preset": ("Dropdown", M("kv_calculator.model_preset"), models),
        "layers": ("IntSlider", M("kv_calculator.layers"), 1, 128),
        "kv_heads": ("IntSlider", M("kv_calculator.kv_heads"), 1, 128),
        "head_dim": ("IntSlider", "head_dim", 16, 256, 16),
        "dtype": ("Dropdown", "KV dtype", ["fp32", "bf16", "fp8"]),
        "context": ("IntSlider", M("kv_calculator.context"), 128, 131072, 128),
        "batch": ("IntSlider", "batch", 1, 256),
        "gpu": ("Dropdown", "GPU", gpu_names()),
        "util": ("FloatSlider", M("kv_calculator.utilisation"), 0.5, 1.0, 0.01),
    }
    return controls_of(table, start, width) | {
        # a checkbox's label is long and sits beside it, so it takes no label width
        "weights": w.Checkbox(value=include_weights, description=M("kv_calculator.put_preset_s")),
        "acts": control(
            "FloatText", activation_gb, M("kv_calculator.activations_gb"), width, step=0.5
        ),
    }


def _kv_args(c: dict[str, Any]) -> dict[str, Any]:
    """`kv_summary`'s arguments from the calculator's controls (weights in BF16 when ticked)."""
    weights = costs.weight_bytes(get_config(c["preset"].value), 2) if c["weights"].value else 0.0
    return dict(
        num_layers=c["layers"].value,
        num_kv_heads=c["kv_heads"].value,
        head_dim=c["head_dim"].value,
        dtype=c["dtype"].value,
        context=c["context"].value,
        batch=c["batch"].value,
        gpu=c["gpu"].value,
        weight_bytes=weights,
        gpu_memory_utilization=c["util"].value,
        activation_bytes=max(0.0, c["acts"].value) * 1e9,
    )


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

    c = _kv_controls(
        model, context, batch, dtype, gpu, include_weights, gpu_memory_utilization, activation_gb
    )
    result = w.HTML()
    out = w.Output()
    loading = {"preset": False}  # a preset sets three sliders: one redraw, not four

    def redraw(*_: Any) -> None:
        if loading["preset"]:
            return
        args = _kv_args(c)
        result.value = f'<pre class="llmlab-kv-result">{kv_text(kv_summary(**args))}</pre>'
        show_figure(out, plot_kv_memory(**args))

    def load_preset(change: dict) -> None:
        cfg = get_config(change["new"])
        loading["preset"] = True
        try:
            c["layers"].value = cfg.num_hidden_layers
            c["kv_heads"].value = cfg.num_key_value_heads
            c["head_dim"].value = cfg.head_dim
        finally:
            loading["preset"] = False
        redraw()

    c["preset"].observe(load_preset, names="value")
    for name, control_w in c.items():
        if name != "preset":
            control_w.observe(redraw, names="value")
    redraw()
    rows = [
        ("preset", "gpu", "dtype"),
        ("layers", "kv_heads", "head_dim"),
        ("context", "batch", "weights"),
        ("util", "acts"),
    ]
    return w.VBox([*(w.HBox([c[n] for n in row]) for row in rows), result, out])
