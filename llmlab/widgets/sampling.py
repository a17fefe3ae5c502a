"""Sampling explorer: temperature / top-k / top-p → the real model's next-token distribution.

`next_token_distribution(logits, ...)` does the arithmetic (with `llmlab.sampling`'s own
`apply_top_k_top_p`, the function the engine samples with); `plot_next_token_distribution`
draws the most likely tokens, greying out the ones the filters removed; `sampling_explorer`
adds sliders.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from llmlab.i18n import tr
from llmlab.sampling import apply_top_k_top_p


@dataclass
class NextTokenDistribution:
    probs_raw: torch.Tensor      # [V] softmax(logits), temperature 1, no filtering
    probs: torch.Tensor          # [V] what the sampler draws from: temperature, top-k, top-p applied
    kept: torch.Tensor           # [V] bool, tokens that can still be sampled

    @property
    def num_kept(self) -> int:
        return int(self.kept.sum())


def next_token_distribution(logits: torch.Tensor, temperature: float = 1.0, top_k: int = -1,
                            top_p: float = 1.0) -> NextTokenDistribution:
    """The distribution the sampler draws the next token from, for logits [V].

    temperature 0 (greedy) keeps only the most likely token. top_k -1 and top_p 1.0 are off.
    """
    if logits.dim() != 1:
        raise ValueError(tr(f"logits must be [vocab], got shape {tuple(logits.shape)}",
                            f"logits 的形状必须是 [vocab]，你给的是 {tuple(logits.shape)}"))
    if not temperature >= 0:
        raise ValueError(tr(f"temperature must be >= 0, got {temperature!r}",
                            f"temperature 必须 >= 0，你给的是 {temperature!r}"))
    if not (top_k == -1 or top_k >= 1):
        raise ValueError(tr(f"top_k must be -1 (off) or >= 1, got {top_k!r}",
                            f"top_k 必须是 -1（关闭）或 >= 1，你给的是 {top_k!r}"))
    if not 0 < top_p <= 1:
        raise ValueError(tr(f"top_p must be in (0, 1], got {top_p!r}",
                            f"top_p 必须在 (0, 1] 之间，你给的是 {top_p!r}"))
    logits = logits.float()
    vocab = logits.shape[0]
    raw = logits.softmax(-1)
    if temperature == 0:
        kept = torch.zeros(vocab, dtype=torch.bool)
        kept[logits.argmax()] = True
        return NextTokenDistribution(raw, kept.float(), kept)
    k = torch.tensor([top_k if top_k > 0 else vocab])
    # top_p = 1 means "off": pass +inf so that float rounding of the running sum (which can
    # reach 1.0 before the last token) never cuts the far tail
    p = torch.tensor([float(top_p) if top_p < 1 else float("inf")])
    masked = apply_top_k_top_p((logits / temperature)[None], k, p)[0]
    probs = masked.softmax(-1)
    return NextTokenDistribution(raw, probs, masked != float("-inf"))


def plot_label(text: str) -> str:
    """`text` with characters the plotting font cannot draw (e.g. Chinese without a CJK font)
    replaced by their code point, so that labels never turn into empty boxes."""
    from matplotlib import font_manager, ft2font

    font = ft2font.FT2Font(font_manager.findfont(font_manager.FontProperties()))
    return "".join(ch if ord(ch) < 128 or font.get_char_index(ord(ch)) else f"U+{ord(ch):04X}"
                   for ch in text)


def prompt_logits(prompt: str, model: Any = None, tokenizer: Any = None) -> torch.Tensor:
    """Logits [V] of the next token after `prompt` (the real model unless given one)."""
    if model is None or tokenizer is None:
        from llmlab.model import load_model
        model, tokenizer = load_model("smollm2-135m")
    from llmlab.tokenizer import encode_ids

    ids = encode_ids(tokenizer, prompt)
    if not ids:
        raise ValueError(tr("prompt must contain at least one token", "prompt 里至少要有一个 token"))
    return model.logits_for(ids)[-1]


def plot_next_token_distribution(logits: torch.Tensor, tokenizer: Any, temperature: float = 1.0,
                                 top_k: int = -1, top_p: float = 1.0, top_n: int = 20,
                                 ax: Any = None, title: str | None = None) -> Any:
    """Bar chart of the `top_n` most likely next tokens after temperature, kept ones coloured.

    Blue bars: tokens that can be sampled, with their final probability. Grey bars: tokens that
    top-k / top-p removed (sampling probability 0), drawn at their probability before removal.
    Dots: the raw probabilities at temperature 1. Returns the Axes.
    """
    import matplotlib.pyplot as plt

    from llmlab.tokenizer import format_piece, id_bytes

    dist = next_token_distribution(logits, temperature, top_k, top_p)
    t = max(temperature, 1e-6)
    shown = (logits.float() / t).softmax(-1)              # [V] after temperature, before filters
    order = shown.argsort(descending=True)[:top_n]
    labels = [plot_label(format_piece(b)) for b in id_bytes(tokenizer, [int(i) for i in order])]
    if ax is None:
        _, ax = plt.subplots(figsize=(9, 3.4))
    xs = range(len(order))
    kept = dist.kept[order]
    heights = torch.where(kept, dist.probs[order], shown[order])
    colours = ["#2563eb" if k else "#d1d5db" for k in kept.tolist()]
    ax.bar(xs, heights.numpy(), color=colours)
    ax.bar([], [], color="#2563eb", label=tr("kept: sampling probability after the filters",
                                             "保留：过滤之后的采样概率"))
    ax.bar([], [], color="#d1d5db", label=tr("removed by top-k / top-p (height: before removal)",
                                             "被 top-k / top-p 去掉（高度：去掉之前的概率）"))
    ax.plot(xs, dist.probs_raw[order].numpy(), "o", color="#b45309", ms=4,
            label=tr("raw probability (temperature 1)", "原始概率（温度 1）"))
    ax.set_xticks(list(xs))
    ax.set_xticklabels(labels, rotation=60, ha="right", fontsize=8)
    ax.set_ylabel(tr("probability", "概率"))
    ax.set_xlabel(tr(f"the {len(order)} most likely next tokens (grey: removed)",
                     f"最可能的 {len(order)} 个下一个 token（灰色：已去掉）"))
    ax.set_title(title or tr(f"T={temperature:g}, top_k={top_k}, top_p={top_p:g}: "
                             f"{dist.num_kept} token(s) can be sampled",
                             f"T={temperature:g}，top_k={top_k}，top_p={top_p:g}："
                             f"有 {dist.num_kept} 个 token 可以被采样"))
    ax.legend(fontsize=8)
    ax.figure.tight_layout()
    return ax


def sampling_explorer(prompt: str = "The capital of France is", model: Any = None,
                      tokenizer: Any = None, top_n: int = 20) -> Any:
    """Sliders for temperature, top-k and top-p over the real model's next-token distribution."""
    import ipywidgets as w
    import matplotlib.pyplot as plt
    from IPython.display import display

    if model is None or tokenizer is None:
        from llmlab.model import load_model
        model, tokenizer = load_model("smollm2-135m")
    state = {"logits": prompt_logits(prompt, model, tokenizer)}
    text = w.Text(value=prompt, description=tr("prompt", "提示词"), layout=w.Layout(width="90%"),
                  continuous_update=False)
    temp = w.FloatSlider(value=1.0, min=0.0, max=2.0, step=0.05, description=tr("temperature", "温度"))
    k = w.IntSlider(value=-1, min=-1, max=100, description="top_k")
    p = w.FloatSlider(value=1.0, min=0.05, max=1.0, step=0.05, description="top_p")
    summary = w.HTML()
    out = w.Output()

    def redraw(*_: Any) -> None:
        top_k = k.value if k.value != 0 else 1
        dist = next_token_distribution(state["logits"], temp.value, top_k, p.value)
        summary.value = tr(f"tokens that can be sampled: {dist.num_kept}", f"可以被采样的 token：{dist.num_kept} 个")
        with out:
            out.clear_output(wait=True)
            ax = plot_next_token_distribution(state["logits"], tokenizer, temp.value, top_k,
                                              p.value, top_n)
            display(ax.figure)
            plt.close(ax.figure)

    def new_prompt(change: dict) -> None:
        state["logits"] = prompt_logits(change["new"], model, tokenizer)
        redraw()

    for s in (temp, k, p):
        s.observe(redraw, names="value")
    text.observe(new_prompt, names="value")
    redraw()
    return w.VBox([text, w.HBox([temp, k, p]), summary, out])
