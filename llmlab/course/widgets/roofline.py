"""Roofline explorer: hardware, dtype, model, batch and context → where a decode step sits on
the roof, what bounds it, and its time floor; the prefill explorer does the same for one prompt's
prefill (`prefill_summary`, `prefill_text` with `PREFILL_TEXT_PATTERN`, `plot_prefill_explorer`,
`prefill_explorer`).

`roofline_summary(...)` computes with `llmlab.analysis.roofline`; `roofline_text(summary)` renders lines
of which the first is "Decode step floor: <x> ms (<memory|compute>-bound)" (parse it with
`ROOFLINE_TEXT_PATTERN`, which reads the English line; the Chinese one holds the same numbers);
`plot_roofline_explorer(...)` draws it; `roofline_explorer()` adds sliders.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from llmlab.analysis import roofline
from llmlab.analysis.hardware import PRESETS, get_hardware
from llmlab.config import get_config
from llmlab.course.check.catalog import catalog
from llmlab.course.figures.ch07 import plot_roofline
from llmlab.course.widgets._show import controls_of, defaults, explorer

M = catalog("widgets.roofline")

# "Decode step floor: 42.1 ms (memory-bound)" → groups: milliseconds, bound
ROOFLINE_TEXT_PATTERN = re.compile(r"Decode step floor: ([0-9.]+) ms \((memory|compute)-bound\)")
DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1}
BATCHES = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024]  # the sweep the plots mark
MAX_BATCH = 1024  # the batch slider moves one sequence at a time from 1 to here


@dataclass(frozen=True)
class RooflineSummary:
    hardware: str
    model: str
    dtype: str
    batch: int
    context: int
    intensity: float  # FLOP/byte of the whole decode step
    ridge: float  # FLOP/byte
    step_floor: float  # seconds
    bound: str  # "memory" | "compute"
    tokens_per_s: float  # batch / step_floor
    memory_time: float  # seconds
    compute_time: float  # seconds


def _check_dtype(dtype: str) -> None:
    """A ValueError naming `dtype` and the ones `DTYPE_BYTES` holds, where it holds no `dtype`."""
    if dtype not in DTYPE_BYTES:
        raise ValueError(
            M("roofline_summary.dtype_must_one", dtypes=sorted(DTYPE_BYTES), dtype=dtype)
        )


def roofline_summary(
    hardware: str = "H100-SXM",
    model: str = "llama-3-70b",
    dtype: str = "bf16",
    batch: int = 1,
    context: int = 1024,
) -> RooflineSummary:
    """One decode step of `model` (weights and KV cache in `dtype`) on `hardware`'s roof."""
    _check_dtype(dtype)
    hw = get_hardware(hardware)
    cfg = get_config(model)
    p = roofline.place(roofline.decode_step(cfg, batch, context, DTYPE_BYTES[dtype]), hw, dtype)
    return RooflineSummary(
        hw.name,
        model,
        dtype,
        batch,
        context,
        p.op.intensity,
        p.ridge,
        p.time_floor,
        p.bound,
        batch / p.time_floor,
        p.memory_time,
        p.compute_time,
    )


def roofline_text(s: RooflineSummary) -> str:
    """Result lines; the first is stable and parseable (ROOFLINE_TEXT_PATTERN)."""
    return M(
        "roofline_text.decode_step_floor",
        s=s,
        step_floor_ms=s.step_floor * 1e3,
        memory_ms=s.memory_time * 1e3,
        compute_ms=s.compute_time * 1e3,
    )


def plot_roofline_explorer(**setting: Any) -> Any:
    """The device's roof with the decode step (and its GEMV and attention parts) placed on it, at
    `setting` (the arguments of `roofline_summary`; its defaults for those not given)."""
    setting = defaults(roofline_summary) | setting
    s = roofline_summary(**setting)
    cfg, batch, context, nbytes = get_config(s.model), s.batch, s.context, DTYPE_BYTES[s.dtype]
    ops = [
        roofline.decode_step(cfg, batch, context, nbytes),
        roofline.decode_gemv(cfg, batch, nbytes),
        roofline.decode_attention(cfg, batch, context, nbytes),
    ]
    title = M(
        "plot_roofline_explorer.batch_context_ms",
        model=s.model,
        batch=batch,
        context=context,
        step_floor_ms=s.step_floor * 1e3,
        bound=s.bound,
    )
    return _on_the_roof(setting["hardware"], s.dtype, ops, title)


def _on_the_roof(hardware: str, dtype: str, ops: list, title: str) -> Any:
    """A new figure: the roof of the preset `hardware` in `dtype`, `ops` placed on it."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    plot_roofline([hardware], dtype=dtype, ops=ops, ax=ax, title=title)
    return fig


def _roof_controls(hardware: str, model: str, dtype: str) -> dict[str, Any]:
    """The hardware, model and dtype dropdowns both explorers start with (models without MLA,
    whose costs the roofline's decode step counts)."""
    from llmlab.analysis import costs
    from llmlab.config import PRESETS as MODELS

    models = [k for k, c in MODELS.items() if not costs.is_mla(c)]
    start = {"hardware": hardware, "model": model, "dtype": dtype}
    table = {
        "hardware": ("Dropdown", M("roofline_explorer.hardware"), list(PRESETS)),
        "model": ("Dropdown", M("roofline_explorer.model"), models),
        "dtype": ("Dropdown", "dtype", list(DTYPE_BYTES)),
    }
    return controls_of(table, start, "90px")


def _no_peak(hardware: str, dtype: str, **_: Any) -> str | None:
    """Why the roof cannot be drawn (`hardware` has no peak in `dtype`), or None."""
    hw = get_hardware(hardware)
    if dtype in hw.peak_flops:
        return None
    return M(
        "redraw.has_no_peak", name=hw.name, value=dtype, peaks=", ".join(sorted(hw.peak_flops))
    )


def roofline_explorer(**setting: Any) -> Any:
    """Sliders for the roofline explorer, starting at `setting` (the arguments of
    `roofline_summary`; its defaults for those not given); the result line updates on every
    change."""
    start = defaults(roofline_summary) | setting
    # one by one, so the batch where the bound changes can be found exactly; redrawn on release
    table = {
        "batch": ("IntSlider", "batch", 1, MAX_BATCH, 1),
        "context": ("IntSlider", M("roofline_explorer.context"), 1, 32768, 1),
    }
    controls = _roof_controls(start["hardware"], start["model"], start["dtype"]) | controls_of(
        table, start, "90px", continuous_update=False
    )
    return explorer(
        controls,
        [("hardware", "model", "dtype"), ("batch", "context")],
        "llmlab-roofline-result",
        lambda **args: roofline_text(roofline_summary(**args)),
        plot_roofline_explorer,
        refuse=_no_peak,
    )


# --------------------------------------------------------------------------- a prefill on the roof

# "Prefill floor: 3.1 ms (compute-bound)" -> groups: milliseconds, bound
PREFILL_TEXT_PATTERN = re.compile(r"Prefill floor: ([0-9.]+) ms \((memory|compute)-bound\)")
MAX_PROMPT = 4096  # the prompt slider moves one token at a time from 1 to here


@dataclass(frozen=True)
class PrefillSummary:
    hardware: str
    model: str
    dtype: str
    prompt_len: int
    intensity: float  # FLOP/byte of the whole prefill forward
    ridge: float  # FLOP/byte
    floor: float  # seconds: the prefill's time floor, its TTFT at least
    bound: str  # "memory" | "compute"
    decode_floor: float  # seconds: one decode step after it (batch 1)


def prefill_summary(
    hardware: str = "H100-SXM", model: str = "llama-3-8b", dtype: str = "bf16", prompt_len: int = 16
) -> PrefillSummary:
    """A prefill of `prompt_len` tokens (one prompt) of `model` on `hardware`'s roof, beside the
    decode step that follows it."""
    _check_dtype(dtype)
    hw, cfg, nbytes = get_hardware(hardware), get_config(model), DTYPE_BYTES[dtype]
    p = roofline.place(roofline.prefill_step(cfg, prompt_len, dtype_bytes=nbytes), hw, dtype)
    d = roofline.place(roofline.decode_step(cfg, 1, prompt_len + 1, nbytes), hw, dtype)
    return PrefillSummary(
        hw.name,
        model,
        dtype,
        prompt_len,
        p.op.intensity,
        p.ridge,
        p.time_floor,
        p.bound,
        d.time_floor,
    )


def prefill_text(s: PrefillSummary) -> str:
    """Result lines; the first is stable and parseable (PREFILL_TEXT_PATTERN)."""
    per_token = s.floor / s.prompt_len
    return M(
        "prefill_text.prefill_floor_ms",
        s=s,
        floor_ms=s.floor * 1e3,
        per_token_ms=per_token * 1e3,
        decode_floor_ms=s.decode_floor * 1e3,
    )


def plot_prefill_explorer(**setting: Any) -> Any:
    """The device's roof with the prefill and the decode step after it placed on it, at `setting`
    (the arguments of `prefill_summary`; its defaults for those not given)."""
    setting = defaults(prefill_summary) | setting
    s = prefill_summary(**setting)
    cfg, prompt_len, nbytes = get_config(s.model), s.prompt_len, DTYPE_BYTES[s.dtype]
    ops = [
        roofline.prefill_step(cfg, prompt_len, dtype_bytes=nbytes),
        roofline.decode_step(cfg, 1, prompt_len + 1, nbytes),
    ]
    title = M(
        "plot_prefill_explorer.token_prefill_ms",
        model=s.model,
        prompt_len=prompt_len,
        floor_ms=s.floor * 1e3,
        bound=s.bound,
    )
    return _on_the_roof(setting["hardware"], s.dtype, ops, title)


def prefill_explorer(**setting: Any) -> Any:
    """Sliders for a prefill on the roof, starting at `setting` (the arguments of
    `prefill_summary`; its defaults for those not given); the result line updates on every
    change."""
    start = defaults(prefill_summary) | setting
    # one token at a time, so the prompt length where the bound changes can be found exactly
    table = {"prompt_len": ("IntSlider", M("prefill_explorer.prompt_tokens"), 1, MAX_PROMPT, 1)}
    controls = _roof_controls(start["hardware"], start["model"], start["dtype"]) | controls_of(
        table, start, "90px", continuous_update=False
    )
    return explorer(
        controls,
        [("hardware", "model", "dtype"), ("prompt_len",)],
        "llmlab-prefill-result",
        lambda **args: prefill_text(prefill_summary(**args)),
        plot_prefill_explorer,
        refuse=_no_peak,
    )
