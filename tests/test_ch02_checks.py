"""Chapter 02's checkers: each piece of the decoder layer the student writes is checked against
llmlab.model's own code (the solutions and the planted slips: tests/test_planted_bugs.py), an
unrotated RoPE is named, a fused attention is refused (by its source and at run time, in this
process and in the grader's sandbox), and the whole layer is compared with SmolLM2's real
layer 0."""

from __future__ import annotations

import inspect
import textwrap

import pytest
import torch
import torch.nn.functional as F

from llmlab.course.check import ch02
from llmlab.course.check.catalog import catalog


def rope(x, positions, theta):
    d = x.shape[-1]
    inv_freq = theta ** (-torch.arange(0, d, 2).float() / d)
    ang = positions.float()[:, None] * inv_freq[None, :]
    cos, sin = ang.cos()[:, None, :], ang.sin()[:, None, :]
    x1, x2 = x[..., : d // 2], x[..., d // 2 :]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def _fails(result, *words):
    assert not result.passed, result.message
    for w in words:
        assert w in result.message, (w, result.message)


def test_an_unrotated_rope_is_named():
    # the solutions and the planted bugs of the five functions: tests/test_planted_bugs.py
    assert ch02.rope(rope).passed
    _fails(ch02.rope(lambda x, p, t: x), "nothing was rotated")


def test_a_declared_piece_checks_as_its_chapter_names_it_with_the_texts_of_its_name():
    M = catalog("ch02")

    def zeros(x, w_gate, w_up, w_down):  # an output no slip explains
        return torch.zeros(x.shape[0], w_down.shape[0])

    first = ch02.swiglu(zeros)
    assert first.exercise == "ch02.swiglu" and first.message == M("swiglu.default_hint")
    assert M("swiglu.formula") in ch02.swiglu(zeros).message
    right = ch02.swiglu(lambda x, wg, wu, wd: (F.silu(x @ wg.T) * (x @ wu.T)) @ wd.T)
    assert right.passed and right.message == M("swiglu.success")
    assert ch02.swiglu.__name__ == "swiglu" and "SwiGLU" in ch02.swiglu.__doc__
    assert list(inspect.signature(ch02.swiglu).parameters) == ["fn"]
    short = ch02.rope_relative(["s(8, 4)"])
    assert short.exercise == "ch02.rope_relative" and short.message == M("rope_relative.missing")
    assert ch02.rope_relative(["s(8, 4)", "s(107, 103)"]).message == M("rope_relative.success")


def test_reasoning_exercises_want_every_right_option_and_say_why_a_wrong_one_is_wrong():
    assert len(ch02.GQA_OPTIONS) > len(ch02.pieces._GQA_RIGHT)
    assert ch02.gqa_consequences(["k_and_v_proj_weights_x3", "kv_cache_per_token_x3"]).passed
    _fails(ch02.gqa_consequences(["kv_cache_per_token_x3"]), "something else")
    _fails(
        ch02.gqa_consequences(
            ["kv_cache_per_token_x3", "k_and_v_proj_weights_x3", "score_matrices_x3"]
        ),
        "per *query* head",
    )
    assert ch02.rope_relative(["s(8, 4)", "s(107,103)"]).passed
    _fails(ch02.rope_relative(["s(8, 4)", "s(107, 103)", "s(14, 6)"]), "not ratios")
    _fails(ch02.rope_relative("s(99, 1)"), "choose from")


def test_the_rope_options_that_pass_are_the_ones_with_equal_scores():
    """The reasoning answer agrees with the model's RoPE on a random q and k."""
    from llmlab.course.figures.ch02 import rope_score_values

    pairs = [(7, 3)] + [tuple(int(n) for n in o[2:-1].split(",")) for o in ch02.RELATIVE_OPTIONS]
    scores = rope_score_values(pairs)
    equal = {f"s({m}, {n})" for m, n in pairs[1:] if abs(scores[(m, n)] - scores[(7, 3)]) < 1e-4}
    assert equal == set(ch02.pieces._RELATIVE_RIGHT)


# ---- a fused attention is refused --------------------------------------------------------------


def fused(q, k, v):
    return F.scaled_dot_product_attention(q[None], k[None], v[None], is_causal=True)[0]


_NAME = "scaled_" + "dot_product_attention"


def hidden(q, k, v):
    return getattr(F, _NAME)(q[None], k[None], v[None], is_causal=True)[0]


def through_llmlab(q, k, v):
    from llmlab.ops.torch_backend import attend

    return attend(q[:, None], k[:, None], v[:, None], q.shape[1] ** -0.5, 0)[:, 0]


@pytest.mark.parametrize("checker", [ch02.attention, ch02.gqa_attention])
def test_a_fused_attention_is_refused_by_source_and_at_run_time(checker):
    original = F.scaled_dot_product_attention
    _fails(checker(fused), "fused attention", "scaled_dot_product")
    _fails(checker(through_llmlab), "fused attention", "llmlab")
    _fails(checker(original), "fused attention")
    _fails(checker(hidden), "switched off")
    assert F.scaled_dot_product_attention is original  # put back after the check
    assert torch._C._nn.scaled_dot_product_attention is original


def test_the_ban_holds_only_inside_and_covers_llmlabs_entry_points():
    from llmlab import ops

    with ch02.fused_attention_banned():
        with pytest.raises(ch02.FusedAttentionError):
            F.scaled_dot_product_attention(
                torch.zeros(1, 1, 2), torch.zeros(1, 1, 2), torch.zeros(1, 1, 2)
            )
        with pytest.raises(ch02.FusedAttentionError):
            ops.paged_attention_decode()
    q = torch.randn(1, 3, 4)
    assert F.scaled_dot_product_attention(q, q, q).shape == q.shape


def test_the_fallback_hint_names_no_fused_call():
    for _ in range(2):  # the first hint, then the one with the formula
        r = ch02.attention(lambda q, k, v: v * 2)
        assert not r.passed
        low = r.message.lower()
        assert not any(w in low for w in ("scaled_dot_product", "flash", "llmlab.ops", "multihead"))


def _record(source: str, **globals_) -> dict:
    g = {"torch": {"__module__": "torch"}, **globals_}
    return {
        "args": [{"__function__": {"name": "my_attention", "source": source, "globals": g}}],
        "kwargs": {},
    }


@pytest.mark.slow
def test_the_ban_holds_in_the_graders_sandbox():
    from llmlab.course.instructor import Exercise
    from llmlab.course.instructor.recheck import judge

    ok = textwrap.dedent("""\
        def my_attention(q, k, v):
            T, d = q.shape
            s = (q @ k.T / d ** 0.5).masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
            return s.softmax(-1) @ v
        """)
    assert judge(Exercise("ch02.attention"), ch02.attention, _record(ok), 60)["passed"]
    sneaky = textwrap.dedent("""\
        def my_attention(q, k, v):
            f = getattr(F, "scaled_" + "dot_product_attention")
            return f(q[None], k[None], v[None], is_causal=True)[0]
        """)
    v = judge(
        Exercise("ch02.attention"),
        ch02.attention,
        _record(sneaky, F={"__module__": "torch.nn.functional"}),
        60,
    )
    assert not v["passed"] and "switched off" in v["message"], v
    imported = "def my_attention(q, k, v):\n    return sdpa(q[None], k[None], v[None], is_causal=True)[0]\n"
    v = judge(
        Exercise("ch02.attention"),
        ch02.attention,
        _record(
            imported,
            sdpa={
                "__function__": {
                    "module": "torch._C._nn",
                    "qualname": "scaled_dot_product_attention",
                }
            },
        ),
        60,
    )
    assert not v["passed"] and "scaled_dot_product" in v["message"], v


# ---- the whole layer ---------------------------------------------------------------------------


@pytest.mark.model
def test_layer0_output_is_the_real_layer_and_slips_are_named(real_model):
    from llmlab.ops.metadata import single_sequence_metadata
    from llmlab.tokenizer import real_tokenizer

    model, _ = real_model
    ids = torch.tensor(real_tokenizer().encode(ch02.PROMPT, add_special_tokens=False))
    T = len(ids)
    x = model.embed_tokens(ids)
    cos, sin = model.rope_cos_sin(torch.arange(T))
    kv = model.allocate_kv_caches(num_blocks=1, block_size=T)
    with torch.inference_mode():
        want = model.layers[0](x, cos, sin, single_sequence_metadata(kv, 0, T, T), 0)
    assert ch02.layer0_output(want).passed
    variants = ch02.layer._layer0_variants()
    _fails(ch02.layer0_output(variants["no residual after the MLP"]), "second residual")
    _fails(ch02.layer0_output(variants["post-norm"]), "pre-norm")
    _fails(ch02.layer0_output(x.detach()), "unchanged")
    _fails(ch02.layer0_output(want[:3]), "must be")
