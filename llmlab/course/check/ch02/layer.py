"""Chapter 02's whole layer: the student's layer 0, built from the pieces, against SmolLM2's real
layer 0 on the chapter's prompt; a slip is named by the variant of the layer it matches."""

from __future__ import annotations

import functools
from typing import Any

import torch

from llmlab.course.check.catalog import catalog
from llmlab.course.check.ch02.exercises import MODEL, PROMPT
from llmlab.course.check.ch02.harness import _close
from llmlab.course.check.core import (
    NOT_ANSWERED,
    CheckResult,
    not_yet,
    passed,
    staged,
)

M = catalog("ch02")

# ---- the whole layer against the real layer 0 ----------------------------------------------------


@functools.lru_cache(maxsize=1)
def _real_layer0() -> tuple[Any, torch.Tensor, torch.Tensor, Any]:
    """(SmolLM2's real layer 0 as a `DecoderLayer`, PROMPT's embeddings [T, hidden], positions,
    the model's inverse RoPE frequencies), read straight from the converted weights."""
    from safetensors import safe_open

    from llmlab.config import get_config
    from llmlab.model import DecoderLayer, rope_inv_freq
    from llmlab.model.weights import model_dir
    from llmlab.tokenizer import real_tokenizer

    cfg = get_config(MODEL)
    ids = real_tokenizer().encode(PROMPT, add_special_tokens=False)
    layer = DecoderLayer(cfg)
    prefix = "model.layers.0."
    with safe_open(str(model_dir(MODEL) / "model.safetensors"), "pt") as f:
        layer.load_state_dict(
            {k.removeprefix(prefix): f.get_tensor(k) for k in f.keys() if k.startswith(prefix)}
        )
        x = f.get_slice("model.embed_tokens.weight")[ids]  # [T, hidden]
    return layer.eval(), x, torch.arange(len(ids)), rope_inv_freq(cfg)


def _layer0_variants() -> dict[str, torch.Tensor]:
    """The real layer 0's output on PROMPT, and what the usual slips would give."""
    from llmlab.ops.metadata import single_sequence_metadata

    layer, x, pos, inv_freq = _real_layer0()
    T = x.shape[0]
    angles = pos.float()[:, None] * inv_freq[None, :]
    cos, sin = angles.cos(), angles.sin()
    a = layer.self_attn
    shape = (1, T, a.num_kv_heads, a.head_dim)

    def attn(h: torch.Tensor) -> torch.Tensor:
        kv = [(torch.zeros(shape), torch.zeros(shape))]
        return a(h, cos, sin, single_sequence_metadata(kv, 0, T, T), 0)

    with torch.inference_mode():
        n1, n2, mlp = layer.input_layernorm, layer.post_attention_layernorm, layer.mlp
        h = x + attn(n1(x))
        no_first = attn(n1(x))
        post = n1(x + attn(x))
        return {
            "right": h + mlp(n2(h)),
            "no residual after the MLP": mlp(n2(h)),
            "no residual after attention": no_first + mlp(n2(no_first)),
            "no residuals": mlp(n2(no_first)),
            "post-norm": n2(post + mlp(post)),
            "input": x.clone(),
        }


# The catalog key of the hint per slip.
_LAYER_HINTS = {
    "no residual after the MLP": M.key("layer0_output.no_residual_after_the_mlp"),
    "no residual after attention": M.key("layer0_output.no_residual_after_attention"),
    "no residuals": M.key("layer0_output.no_residuals"),
    "post-norm": M.key("layer0_output.post_norm"),
    "input": M.key("layer0_output.input"),
}


def layer0_output(answer: Any) -> CheckResult:
    """Your whole decoder layer (your RMSNorm, RoPE, GQA attention and SwiGLU with layer 0's
    weights, and the two residual additions) applied to PROMPT's embeddings: the output
    [T, hidden], compared with SmolLM2's real layer 0."""
    ex = "ch02.layer0_output"
    if answer is None:
        return not_yet(ex, NOT_ANSWERED)
    try:
        got = torch.as_tensor(answer).detach().float()
    except (TypeError, ValueError, RuntimeError):
        return not_yet(ex, M("layer0_output.not_a_tensor", got_type=type(answer).__name__))
    variants = _layer0_variants()
    want = variants["right"]
    if tuple(got.shape) != tuple(want.shape):
        return not_yet(
            ex,
            M(
                "layer0_output.wrong_shape",
                tokens=want.shape[0],
                hidden=want.shape[1],
                want_shape=list(want.shape),
                got_shape=list(got.shape),
            ),
        )
    if not torch.isfinite(got).all():
        return not_yet(ex, M("layer0_output.not_finite"))
    if _close(got, want):
        diff = (got - want).abs().max().item()
        return passed(ex, M("layer0_output.success", diff=diff))
    for name, hint in _LAYER_HINTS.items():
        if _close(got, variants[name]):
            return not_yet(ex, M(hint))
    return not_yet(
        ex,
        staged(ex, M("layer0_output.default_hint"), M("layer0_output.formula")),
    )
