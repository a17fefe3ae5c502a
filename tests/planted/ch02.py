"""Chapter 02's build exercises: the pieces of a Llama layer written as functions (one-head
causal attention, RMSNorm, grouped-query attention, RoPE, the SwiGLU MLP)."""

from planted import Exercise, bug, notebook_definitions

# torch and F come from the chapter's first cells; gqa_attention calls the student's attention
IMPORTS = "import torch\nimport torch.nn.functional as F\n\n\n"
ATTENTION = IMPORTS + notebook_definitions("02-attention", "attention")
RMS_NORM = IMPORTS + notebook_definitions("02-attention", "rms_norm")
GQA = ATTENTION + "\n\n" + notebook_definitions("02-attention", "gqa_attention")
ROPE = IMPORTS + notebook_definitions("02-attention", "rope")
SWIGLU = IMPORTS + notebook_definitions("02-attention", "swiglu")

SCORES = "scores = q @ k.T / d ** 0.5"
FUTURE = "future = torch.ones(T, T, dtype=torch.bool).triu(1)"
SOFTMAX = 'scores.masked_fill(future, float("-inf")).softmax(dim=-1) @ v'
MEAN_SQUARE = "x.pow(2).mean(-1, keepdim=True)"
HALVES = "x1, x2 = x[..., : d // 2], x[..., d // 2 :]"
ROTATED = "torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)"
GATE = "F.silu(x @ w_gate.T)"


def attention_bugs(source: str, *only: str) -> tuple:
    """The slips of one-head attention planted in `source` (the attention exercise's, or the
    copy of it that gqa_attention calls)."""
    bugs = (
        bug(
            "no_causal_mask",
            source,
            "ch02:attention.no_mask",
            SOFTMAX,
            "scores.softmax(dim=-1) @ v",
        ),
        bug("not_scaled", source, "ch02:attention.not_scaled", SCORES, "scores = q @ k.T"),
        bug("scaled_by_d", source, "ch02:attention.scaled_by_d", SCORES, "scores = q @ k.T / d"),
        bug(
            "softmax_over_the_queries",
            source,
            "ch02:attention.softmax_axis",
            "softmax(dim=-1)",
            "softmax(dim=0)",
        ),
        bug(
            "mask_after_the_softmax",
            source,
            "ch02:attention.mask_after_softmax",
            SOFTMAX,
            "scores.softmax(dim=-1).masked_fill(future, 0.0) @ v",
        ),
        bug(
            "own_key_masked", source, "ch02:attention.own_key", FUTURE, FUTURE.replace("(1)", "(0)")
        ),
    )
    return tuple(b for b in bugs if not only or b.name in only)


EXERCISES = [
    Exercise("ch02.attention", "attention", ATTENTION, attention_bugs(ATTENTION)),
    Exercise(
        "ch02.rms_norm",
        "rms_norm",
        RMS_NORM,
        (
            bug(
                "layernorm",
                RMS_NORM,
                "ch02:rms_norm.layernorm",
                f"weight * x * torch.rsqrt({MEAN_SQUARE} + eps)",
                "weight * (x - x.mean(-1, keepdim=True)) * torch.rsqrt("
                "x.var(-1, keepdim=True, unbiased=False) + eps)",
            ),
            bug("no_eps", RMS_NORM, "ch02:rms_norm.no_eps", " + eps)", ")"),
            bug(
                "eps_outside_the_root",
                RMS_NORM,
                "ch02:rms_norm.eps_outside",
                f"x * torch.rsqrt({MEAN_SQUARE} + eps)",
                f"x / ({MEAN_SQUARE}.sqrt() + eps)",
            ),
            bug("no_weight", RMS_NORM, "ch02:rms_norm.no_weight", "weight * x *", "x *"),
            bug("sum_not_mean", RMS_NORM, "ch02:rms_norm.sum_not_mean", ".mean(-1", ".sum(-1"),
            bug("over_the_tokens", RMS_NORM, "ch02:rms_norm.wrong_axis", ".mean(-1", ".mean(0"),
        ),
    ),
    Exercise(
        "ch02.gqa_attention",
        "gqa_attention",
        GQA,
        (
            bug(
                "round_robin_heads",
                GQA,
                "ch02:gqa_attention.head_pairing",
                "k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)",
                "k, v = k.repeat(1, group, 1), v.repeat(1, group, 1)",
            ),
            bug(
                "every_head_reads_kv_head_0",
                GQA,
                "ch02:gqa_attention.one_kv_head",
                "attention(q[:, h], k[:, h], v[:, h])",
                "attention(q[:, h], k[:, 0], v[:, 0])",
            ),
            bug(
                "heads_stacked_first",
                GQA,
                "ch02:check_function.wrong_shape",
                "torch.stack(heads, dim=1)",
                "torch.stack(heads, dim=0)",
            ),
            *attention_bugs(GQA, "no_causal_mask", "scaled_by_d", "softmax_over_the_queries"),
        ),
    ),
    Exercise(
        "ch02.rope",
        "rope",
        ROPE,
        (
            bug(
                "neighbours_paired",
                ROPE,
                "ch02:rope.neighbours",
                HALVES,
                "x1, x2 = x[..., 0::2], x[..., 1::2]",
                ROTATED,
                ROTATED.replace("torch.cat", "torch.stack").replace(
                    "dim=-1)", "dim=-1).flatten(-2)"
                ),
            ),
            bug(
                "positions_from_zero",
                ROPE,
                "ch02:rope.wrong_positions",
                "positions.float()",
                "torch.arange(len(positions)).float()",
            ),
            bug(
                "rotated_the_wrong_way",
                ROPE,
                "ch02:rope.wrong_direction",
                ROTATED,
                "torch.cat([x1 * cos + x2 * sin, x2 * cos - x1 * sin], dim=-1)",
            ),
            bug(
                "exponent_steps_of_one_over_d",
                ROPE,
                "ch02:rope.frequencies",
                "torch.arange(0, d, 2).float() / d",
                "torch.arange(0, d // 2).float() / d",
            ),
            bug(
                "cos_and_sin_swapped",
                ROPE,
                "ch02:rope.cos_sin_swapped",
                "cos, sin = angle.cos()[:, None, :], angle.sin()[:, None, :]",
                "cos, sin = angle.sin()[:, None, :], angle.cos()[:, None, :]",
            ),
            bug(
                "halves_swapped",
                ROPE,
                "ch02:rope.halves_swapped",
                ROTATED,
                "torch.cat([x2 * cos + x1 * sin, x1 * cos - x2 * sin], dim=-1)",
            ),
        ),
    ),
    Exercise(
        "ch02.swiglu",
        "swiglu",
        SWIGLU,
        (
            bug(
                "silu_on_up",
                SWIGLU,
                "ch02:swiglu.silu_on_up",
                f"{GATE} * (x @ w_up.T)",
                "(x @ w_gate.T) * F.silu(x @ w_up.T)",
            ),
            bug("relu", SWIGLU, "ch02:swiglu.relu", "F.silu", "F.relu"),
            bug("gelu", SWIGLU, "ch02:swiglu.gelu", "F.silu", "F.gelu"),
            bug("sigmoid", SWIGLU, "ch02:swiglu.sigmoid", "F.silu", "torch.sigmoid"),
            bug("no_up_branch", SWIGLU, "ch02:swiglu.no_up", f"({GATE} * (x @ w_up.T))", GATE),
            bug(
                "up_branch_alone",
                SWIGLU,
                "ch02:swiglu.one_branch",
                f"({GATE} * (x @ w_up.T))",
                "F.silu(x @ w_up.T)",
            ),
        ),
    ),
]
