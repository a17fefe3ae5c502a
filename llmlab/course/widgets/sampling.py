"""Sampling explorer: temperature / top-k / top-p → the real model's next-token distribution.

`next_token_distribution(logits, ...)` does the arithmetic (with `llmlab.sampling`'s own
`apply_top_k_top_p`, the function the engine samples with); `plot_next_token_distribution`
draws the most likely tokens, greying out the ones the filters removed; `sampling_explorer`
adds sliders.
"""

from __future__ import annotations

from typing import Any

from llmlab.analysis.distribution import (  # noqa: F401
    NextTokenDistribution,
    next_token_distribution,
    prompt_logits,
)
from llmlab.course.check.catalog import catalog
from llmlab.course.figures.ch03 import plot_label, plot_next_token_distribution  # noqa: F401
from llmlab.course.widgets._show import show_figure

M = catalog("widgets.sampling")


def sampling_explorer(
    prompt: str = "The capital of France is",
    model: Any = None,
    tokenizer: Any = None,
    top_n: int = 20,
) -> Any:
    """Sliders for temperature, top-k and top-p over the real model's next-token distribution."""
    import ipywidgets as w

    if model is None or tokenizer is None:
        from llmlab.model import load_model

        model, tokenizer = load_model("smollm2-135m")
    state = {"logits": prompt_logits(prompt, model, tokenizer)}
    text = w.Text(
        value=prompt,
        description="prompt",
        layout=w.Layout(width="90%"),
        continuous_update=False,
    )
    temp = w.FloatSlider(
        value=1.0, min=0.0, max=2.0, step=0.05, description=M("sampling_explorer.temperature")
    )
    k = w.IntSlider(value=-1, min=-1, max=100, description="top_k")
    p = w.FloatSlider(value=1.0, min=0.05, max=1.0, step=0.05, description="top_p")
    summary = w.HTML()
    out = w.Output()

    def redraw(*_: Any) -> None:
        top_k = k.value if k.value != 0 else 1
        dist = next_token_distribution(state["logits"], temp.value, top_k, p.value)
        summary.value = M("redraw.tokens_can_sampled", num_kept=dist.num_kept)
        ax = plot_next_token_distribution(
            state["logits"], tokenizer, temp.value, top_k, p.value, top_n
        )
        show_figure(out, ax.figure)

    def new_prompt(change: dict) -> None:
        state["logits"] = prompt_logits(change["new"], model, tokenizer)
        redraw()

    for s in (temp, k, p):
        s.observe(redraw, names="value")
    text.observe(new_prompt, names="value")
    redraw()
    return w.VBox([text, w.HBox([temp, k, p]), summary, out])
