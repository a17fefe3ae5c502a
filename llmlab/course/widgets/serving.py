"""Serving on a GPU preset: model, GPU, batch, context and a price per hour → the TPOT floor,
output tokens/s and US$ per million output tokens, from the roofline presets
(`llmlab.analysis.roofline`), with whether weights and KV cache fit in the GPU's memory.

`serving_text(...)` gives the explorer's line, "batch <b>, context <c>: TPOT floor <t> ms (meets|
misses the <x> ms target), <n> output tokens/s, $<u> per million output tokens at $<p>/h"
(`SERVING_TEXT_PATTERN` reads the English line; the Chinese one holds the same numbers).
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from llmlab.course.check.catalog import catalog
from llmlab.course.widgets._show import controls_of, defaults, explorer

M = catalog("widgets.serving")

SERVING_MODELS = ("llama-3-8b", "llama-3.2-1b", "qwen2.5-7b", "mistral-7b", "smollm2-135m")
SERVING_HARDWARE = ("H100-SXM", "H200", "A100-80GB", "L4")
SERVING_TEXT_PATTERN = re.compile(
    r"batch (\d+), context (\d+): TPOT floor ([0-9.]+) ms \((meets|misses) the ([0-9.]+) ms "
    r"target\), ([0-9,]+) output tokens/s, \$([0-9.]+) per million output tokens at \$([0-9.]+)/h"
)


def serving_point(
    model: str = "llama-3-8b",
    hardware: str = "H100-SXM",
    batch: int = 16,
    context: int = 1024,
    price_per_hour: float = 2.5,
    dtype_bytes: float = 2,
) -> dict:
    """One decode step of `batch` sequences at `context` tokens each, on a hardware preset, from
    the roofline floor: TPOT (s), output tokens/s, US$ per million output tokens at
    `price_per_hour`, and the bytes that weights + KV cache need (does it fit?)."""
    from llmlab.analysis import costs, roofline
    from llmlab.analysis.hardware import get_hardware
    from llmlab.config import PRESETS as MODELS

    cfg, hw = MODELS[model], get_hardware(hardware)
    step = roofline.decode_step_floor(cfg, hw, batch, context, dtype_bytes)
    need = costs.weight_bytes(cfg, dtype_bytes) + batch * costs.kv_bytes(cfg, context, dtype_bytes)
    tokens_per_s = batch / step
    return {
        "tpot": step,
        "tokens_per_s": tokens_per_s,
        "usd_per_million": price_per_hour / (tokens_per_s * 3600) * 1e6,
        "bytes_needed": need,
        "fits": need <= hw.mem_size,
        "mem_size": hw.mem_size,
    }


def serving_text(tpot_target_ms: float = 20.0, **setting: Any) -> str:
    """The explorer's line for one setting (`SERVING_TEXT_PATTERN`); computed from presets."""
    setting = defaults(serving_point) | setting
    p = serving_point(**setting)
    verdict = (
        M("serving_text.meets") if p["tpot"] * 1e3 <= tpot_target_ms else M("serving_text.misses")
    )
    need, size = p["bytes_needed"] / 1e9, p["mem_size"] / 1e9
    memory = M("serving_text.weights_kv_cache", need=need, size=size) + (
        "" if p["fits"] else M("serving_text.does_not_fit")
    )
    return M(
        "serving_text.bf16_roofline_floor",
        model=setting["model"],
        hardware=setting["hardware"],
        batch=setting["batch"],
        context=setting["context"],
        tpot_ms=p['tpot'] * 1e3,
        verdict=verdict,
        tpot_target_ms=tpot_target_ms,
        tokens_per_s=p['tokens_per_s'],
        usd_per_million=p['usd_per_million'],
        price_per_hour=setting["price_per_hour"],
        memory=memory,
    )


def plot_serving(tpot_target_ms: float = 20.0, max_batch: int = 512, **setting: Any) -> Any:
    """TPOT floor and US$ per million output tokens against the batch (log x), the chosen batch
    marked, the TPOT target drawn; batches whose weights + KV do not fit are greyed."""
    import matplotlib.pyplot as plt

    batches = np.unique(np.geomspace(1, max_batch, 60).astype(int))
    setting = defaults(serving_point) | setting
    batch = setting["batch"]
    pts = [serving_point(**(setting | {"batch": int(b)})) for b in batches]
    here = serving_point(**setting)
    fits = np.array([p["fits"] for p in pts])
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 3.4))
    for ax, key, scale, label in (
        (a1, "tpot", 1e3, M("plot_serving.tpot_floor_ms")),
        (
            a2,
            "usd_per_million",
            1.0,
            M("plot_serving.us_per_million"),
        ),
    ):
        y = np.array([p[key] * scale for p in pts])
        curves = [(fits, "#2563eb", M("plot_serving.fits_memory"))]
        if not fits.all():  # grey from the last batch that fits on, so the curve is unbroken
            grey = ~fits | np.append(~fits[1:], False)
            curves.append((grey, "#9ca3af", M("plot_serving.does_not_fit")))
        for shown, colour, text in curves:
            ax.plot(batches, np.where(shown, y, np.nan), "-", color=colour, label=text)
        ax.plot([batch], [here[key] * scale], "o", color="#dc2626", label=f"batch {batch}")
        ax.set_xscale("log")
        ax.set_xlabel(M("plot_serving.batch_sequences_decoded"))
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    a1.axhline(
        tpot_target_ms,
        color="#f59e0b",
        ls="--",
        label=M("plot_serving.target_ms", tpot_target_ms=tpot_target_ms),
    )
    a1.legend(fontsize=7)
    a2.set_yscale("log")
    fig.suptitle(M("plot_serving.context_h_computed", **setting), fontsize=10)
    fig.tight_layout()
    return fig


def serving_explorer(tpot_target_ms: float = 20.0, **setting: Any) -> Any:
    """Sliders for model, GPU preset, batch, context, price per hour and a TPOT target; the line
    (TPOT, tokens/s, $ per million tokens, memory) and the two curves update. They start at
    `setting` (the arguments of `serving_point`; its defaults for those not given)."""
    start = defaults(serving_point) | setting | {"tpot_target_ms": tpot_target_ms}
    table = {
        "model": ("Dropdown", M("serving_explorer.model"), SERVING_MODELS),
        "hardware": ("Dropdown", M("serving_explorer.gpu_preset"), SERVING_HARDWARE),
        "batch": ("IntSlider", "batch", 1, 512, 1),
        "context": ("IntSlider", M("serving_explorer.context"), 256, 8192, 256),
        "price_per_hour": ("FloatSlider", M("serving_explorer.us_per_hour"), 0.5, 10.0, 0.1),
        "tpot_target_ms": ("FloatSlider", M("serving_explorer.tpot_target_ms"), 2.0, 100.0, 1.0),
    }
    controls = controls_of(table, start, "110px")
    rows = [("model", "hardware"), ("batch", "context"), ("price_per_hour", "tpot_target_ms")]
    return explorer(controls, rows, "llmlab-serving-result", serving_text, plot_serving)
