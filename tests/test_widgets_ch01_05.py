"""Widgets of chapters 01–05: token viewer, sampling explorer, KV calculator; each also a plain
function. The widget callbacks are driven by setting slider values, as a browser would."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import math

import pytest
import torch

from llmlab.analysis import costs
from llmlab.config import get_config
from llmlab.course.widgets.kv import (
    KV_TEXT_PATTERN,
    kv_calculator,
    kv_summary,
    kv_text,
    plot_kv_memory,
)
from llmlab.course.widgets.sampling import (
    next_token_distribution,
    plot_next_token_distribution,
    prompt_logits,
    sampling_explorer,
)
from llmlab.course.widgets.tokens import token_html, token_viewer
from llmlab.tokenizer import train_bpe

BPE = train_bpe("the cat sat on the mat. the hat. 猫坐在垫子上。猫。" * 3, 300)


# --- token viewer ------------------------------------------------------------------------------


def test_token_html_has_one_box_per_token_with_its_id():
    text = "the cat 猫 👋"
    ids = BPE.encode(text)
    html = token_html(text, BPE)
    assert html.count("display:inline-block") == len(ids)
    for i in ids:
        assert f">{i}</span>" in html
    assert f"{len(ids)} tokens" in html
    assert "猫" in html  # a learned merge: the whole character
    assert "&lt;8b&gt;" in html  # the emoji's last byte alone, shown as hex


def test_token_viewer_rerenders_when_the_text_changes():
    box = token_viewer("the cat", BPE)
    textarea, out = box.children
    before = out.value
    textarea.value = "the mat 猫"
    assert out.value != before
    assert f"{len(BPE.encode('the mat 猫'))} tokens" in out.value


def test_compare_tokenizers_shows_one_row_per_tokenizer():
    from llmlab.course.widgets.tokens import compare_tokenizers

    small = train_bpe("the cat sat", 257)
    h = compare_tokenizers("the cat", {"big BPE": BPE, "tiny BPE": small})
    assert "big BPE" in h.data and "tiny BPE" in h.data
    assert f"{len(BPE.encode('the cat'))} tokens" in h.data
    assert f"{len(small.encode('the cat'))} tokens" in h.data


def test_widgets_package_finds_functions_by_name():
    import llmlab.course.widgets as w

    assert w.kv_calculator is kv_calculator and w.token_html is token_html


@pytest.mark.model
def test_token_html_of_the_real_tokenizer_splits_chinese_into_bytes():
    from llmlab.tokenizer import real_tokenizer

    tok = real_tokenizer()
    html = token_html("今天天气真好", tok)
    n = len(tok.encode("今天天气真好", add_special_tokens=False))
    assert html.count("display:inline-block") == n and n > 6  # more tokens than characters


# --- sampling explorer -------------------------------------------------------------------------

LOGITS = torch.randn(300, generator=torch.Generator().manual_seed(0)) * 3


def test_greedy_keeps_only_the_argmax():
    d = next_token_distribution(LOGITS, temperature=0)
    assert d.num_kept == 1 and d.probs[LOGITS.argmax()] == 1


def test_top_k_keeps_exactly_k_and_probabilities_sum_to_one():
    d = next_token_distribution(LOGITS, temperature=0.7, top_k=5)
    assert d.num_kept == 5
    assert set(LOGITS.topk(5).indices.tolist()) == set(d.kept.nonzero().flatten().tolist())
    assert d.probs.sum().item() == pytest.approx(1.0, abs=1e-5)
    assert d.probs[~d.kept].abs().max() == 0


def test_top_p_keeps_the_smallest_nucleus_reaching_p():
    p = 0.6
    d = next_token_distribution(LOGITS, temperature=1.0, top_p=p)
    probs = LOGITS.softmax(-1)
    kept_mass = probs[d.kept].sum().item()
    assert kept_mass >= p
    smallest_kept = probs[d.kept].min().item()
    assert kept_mass - smallest_kept < p  # dropping any kept token falls below p


def test_higher_temperature_flattens_the_distribution():
    def entropy(t):
        q = next_token_distribution(LOGITS, temperature=t).probs
        return -(q * q.clamp_min(1e-30).log()).sum().item()

    assert entropy(0.5) < entropy(1.0) < entropy(2.0)


@pytest.mark.parametrize(
    "kwargs, match",
    [({"temperature": -1}, "temperature"), ({"top_k": 0}, "top_k"), ({"top_p": 0}, "top_p")],
)
def test_bad_sampling_arguments_are_rejected(kwargs, match):
    with pytest.raises(ValueError, match=match):
        next_token_distribution(LOGITS, **kwargs)


def test_sampling_plot_and_explorer_on_a_tiny_model():
    from llmlab.model import tiny_model

    model = tiny_model(seed=0, vocab_size=BPE.vocab_size)  # one logit per BPE id
    logits = prompt_logits("the cat", model, BPE)
    assert torch.allclose(logits, model.logits_for(BPE.encode("the cat"))[-1])
    ax = plot_next_token_distribution(logits, BPE, temperature=1.0, top_k=7)
    assert "7 token(s) can be sampled" in ax.get_title()
    assert len(ax.patches) == 20
    box = sampling_explorer("the cat", model=model, tokenizer=BPE)
    _, sliders, summary, _ = box.children
    temp, k, p = sliders.children
    k.value = 3
    assert summary.value.endswith(": 3")
    k.value, p.value, temp.value = -1, 1.0, 0.0
    assert summary.value.endswith(": 1")


# --- KV calculator -----------------------------------------------------------------------------


def test_kv_summary_reproduces_the_seed_example_on_an_h100():
    s = kv_summary(
        num_layers=80,
        num_kv_heads=8,
        head_dim=128,
        dtype="bf16",
        context=4096,
        batch=1,
        gpu="H100-SXM",
    )
    assert s.bytes_per_token == 327_680
    assert s.kv_bytes == 1_342_177_280
    assert s.gpu_bytes == 80e9
    assert round(100 * s.share_of_gpu, 1) == 1.7  # the seed: "1.6 %" of an 80 GB H100
    assert s.max_requests == math.floor(0.9 * 80e9 / 1_342_177_280)


def test_kv_text_number_parses_back_to_the_costs_value():
    cfg = get_config("llama-3-8b")
    s = kv_summary(cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.head_dim, "fp8", 8192, 3)
    gb = float(KV_TEXT_PATTERN.search(kv_text(s)).group(1))
    assert gb == pytest.approx(3 * costs.kv_bytes(cfg, 8192, 1) / 1e9, rel=1e-3)


def test_weights_that_do_not_fit_leave_room_for_no_request():
    w = costs.weight_bytes(get_config("llama-3-70b"), 2)
    s = kv_summary(weight_bytes=w, gpu="H100-SXM")
    assert s.max_requests == 0 and "0 requests fit" in kv_text(s)
    assert kv_summary(weight_bytes=w, gpu="H200").max_requests == 0  # 141 GB > 0.9 × 141 GB


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"context": 0}, "context"),
        ({"num_kv_heads": 1.5}, "num_kv_heads"),
        ({"gpu": "TPU"}, "TPU"),
        ({"dtype": "fp7"}, "dtype"),
    ],
)
def test_kv_summary_rejects_bad_input(kwargs, match):
    with pytest.raises(ValueError, match=match):
        kv_summary(**kwargs)


def test_kv_calculator_slider_updates_the_gb_text():
    box = kv_calculator()
    (
        (preset, gpu, dtype),
        (layers, kv_heads, head_dim),
        (ctx, batch, weights),
        (util, acts),
        result,
        _,
    ) = [
        c.children if hasattr(c, "children") and c.__class__.__name__ == "HBox" else c
        for c in box.children
    ]

    def shown_gb():
        return float(KV_TEXT_PATTERN.search(result.value).group(1))

    assert shown_gb() == pytest.approx(1.342, abs=1e-3)
    ctx.value = 16384
    batch.value = 4
    cfg = get_config("llama-3-70b")
    assert shown_gb() == pytest.approx(4 * costs.kv_bytes(cfg, 16384, 2) / 1e9, rel=1e-3)
    preset.value = "llama-3-8b"
    assert (layers.value, kv_heads.value, head_dim.value) == (32, 8, 128)
    assert shown_gb() == pytest.approx(
        4 * costs.kv_bytes(get_config("llama-3-8b"), 16384, 2) / 1e9, rel=1e-3
    )
    gpu.value = "L4"
    assert "of L4 (24 GB)" in result.value


def test_kv_budget_is_utilisation_times_memory_minus_weights_and_activations():
    from llmlab.course.widgets.kv import kv_budget_bytes

    assert kv_budget_bytes("H100-SXM", 0.9, 16e9, 2e9) == pytest.approx(0.9 * 80e9 - 18e9)
    assert kv_budget_bytes("L4", 0.9, 30e9) == 0.0
    cfg = get_config("llama-3-8b")
    args = (cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.head_dim)
    kw = dict(
        context=8192, gpu="H100-SXM", weight_bytes=costs.weight_bytes(cfg, 2), activation_bytes=1e9
    )
    bf16, fp8 = kv_summary(*args, "bf16", **kw), kv_summary(*args, "fp8", **kw)
    assert (
        bf16.usable_bytes
        == fp8.usable_bytes
        == pytest.approx(72e9 - costs.weight_bytes(cfg, 2) - 1e9)
    )
    assert fp8.max_requests in (2 * bf16.max_requests, 2 * bf16.max_requests + 1)  # fp8 doubles it
    assert f"KV budget {fp8.usable_bytes / 1e9:.4g} GB" in kv_text(fp8)
    with pytest.raises(ValueError, match="activation_bytes"):
        kv_summary(activation_bytes=-1)


def test_kv_calculator_utilisation_and_activations_move_the_count():
    box = kv_calculator(model="llama-3-8b", context=16384, dtype="fp8", include_weights=True)
    util, acts = box.children[3].children
    result = box.children[4]
    count = lambda: int(result.value.rsplit(":", 1)[1].split("<")[0])
    before = count()
    acts.value = 1.0
    assert (
        count()
        == kv_summary(
            32,
            8,
            128,
            "fp8",
            16384,
            1,
            "H100-SXM",
            weight_bytes=costs.weight_bytes(get_config("llama-3-8b"), 2),
            activation_bytes=1e9,
        ).max_requests
        <= before
    )
    with_acts = count()
    util.value = 0.95
    assert count() > with_acts


def test_plot_kv_memory_draws_two_labelled_panels():
    fig = plot_kv_memory(weight_bytes=16e9, activation_bytes=2e9)
    ax1, ax2 = fig.axes
    budget = [c[0] for c in ax1.containers if c.get_label().startswith("KV budget")]
    assert budget and budget[0].get_width() == pytest.approx(0.9 * 80 - 18)
    assert "GB" in ax1.get_xlabel() and "context" in ax2.get_xlabel()
    assert "H100-SXM" in ax1.get_title()
