"""Chapter 02's pieces of a decoder layer, each checked against `llmlab.model`'s own code:
RMSNorm, one head of causal attention, grouped-query attention, RoPE (and what is relative
about it), the SwiGLU MLP."""

from __future__ import annotations

from dataclasses import replace

import torch

from llmlab.course.check.catalog import catalog
from llmlab.course.check.ch02.exercises import MODEL
from llmlab.course.check.ch02.harness import Cases, _close, _seeded, piece, selection

M = catalog("ch02")

# ---- RMSNorm -----------------------------------------------------------------------------------


@piece("fn(x, weight, eps)")
def rms_norm() -> Cases:
    """Your `fn(x, weight, eps)`: RMSNorm of each row of x [T, hidden] (weight [hidden]),
    checked against `llmlab.model.RMSNorm` on random inputs."""
    from llmlab.model import RMSNorm

    g = _seeded(21)
    cases = []
    for T, dim, scale, eps in ((5, 576, 1.0, 1e-5), (3, 40, 3e-3, 1e-5), (4, 24, 0.5, 0.1)):
        x = torch.randn(T, dim, generator=g) * scale
        w = 1.0 + 0.3 * torch.randn(dim, generator=g)
        norm = RMSNorm(dim, eps)
        with torch.no_grad():
            norm.weight.copy_(w)
            cases.append(((x, w, eps), norm(x).detach()))

    def diagnose(args: tuple, got: torch.Tensor) -> str | None:
        x, w, eps = args
        ms = x.pow(2).mean(-1, keepdim=True)
        centred = x - x.mean(-1, keepdim=True)
        var = x.var(-1, keepdim=True, unbiased=False)
        sum_sq, token_ms = x.pow(2).sum(-1, keepdim=True), x.pow(2).mean(0, keepdim=True)
        slips = [
            (w * centred / (var + eps).sqrt(), M("rms_norm.layernorm")),
            (w * x / ms.sqrt(), M("rms_norm.no_eps")),
            (w * x / (ms.sqrt() + eps), M("rms_norm.eps_outside")),
            (x * torch.rsqrt(ms + eps), M("rms_norm.no_weight")),
            (w * x * torch.rsqrt(sum_sq + eps), M("rms_norm.sum_not_mean")),
            (w * x * torch.rsqrt(token_ms + eps), M("rms_norm.wrong_axis")),
        ]
        return next((h for v, h in slips if _close(got, v)), None)

    return cases, diagnose


# ---- attention: one head -------------------------------------------------------------------------


def _reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    # q, k, v [T, d] → [T, d], causal (computed before the student's function runs)
    import torch.nn.functional as F

    return F.scaled_dot_product_attention(q[None], k[None], v[None], is_causal=True)[0]


def _one_head_slips(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
) -> list[tuple[torch.Tensor, str]]:
    T, d = q.shape
    scores = q @ k.T
    causal = torch.ones(T, T, dtype=torch.bool).triu(1)
    scaled = scores / d**0.5

    def attend(s: torch.Tensor, hidden: torch.Tensor = causal, dim: int = -1) -> torch.Tensor:
        return s.masked_fill(hidden, float("-inf")).softmax(dim) @ v

    return [
        (scaled.softmax(-1) @ v, M("attention.no_mask")),
        (attend(scores), M("attention.not_scaled")),
        (attend(scaled, dim=0), M("attention.softmax_axis")),
        (attend(scores / d), M("attention.scaled_by_d")),
        (scaled.softmax(-1).masked_fill(causal, 0.0) @ v, M("attention.mask_after_softmax")),
        (attend(scaled, causal | torch.eye(T, dtype=torch.bool)), M("attention.own_key")),
    ]


@piece("fn(q, k, v)", ban=True)
def attention() -> Cases:
    """Your function `fn(q, k, v)`: causal softmax(q kᵀ / √d) v for q, k, v of shape [T, d],
    written out (a fused attention is refused)."""
    g = torch.Generator().manual_seed(0)
    cases = []
    for T, d in ((1, 4), (5, 8), (7, 16)):
        q, k, v = (torch.randn(T, d, generator=g) for _ in range(3))
        cases.append(((q, k, v), _reference(q, k, v)))

    def diagnose(args: tuple, got: torch.Tensor) -> str | None:
        return next((h for v, h in _one_head_slips(*args) if _close(got, v)), None)

    return cases, diagnose


# ---- grouped-query attention ---------------------------------------------------------------------


def _gqa_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    from llmlab.ops.torch_backend import attend

    return attend(q, k, v, q.shape[-1] ** -0.5, first_pos=0)


@piece("fn(q, k, v)", ban=True)
def gqa_attention() -> Cases:
    """Your `fn(q, k, v)`: causal grouped-query attention, q [T, heads, d], k and v
    [T, kv_heads, d] → [T, heads, d], checked against the model's readable attention (SmolLM2's
    9 query / 3 KV heads of 64, and another grouping). A fused attention is refused."""
    g = _seeded(22)
    cases = []
    for T, H, KVH, d in ((6, 9, 3, 64), (1, 9, 3, 64), (5, 8, 2, 16)):
        q = torch.randn(T, H, d, generator=g)
        k, v = torch.randn(T, KVH, d, generator=g), torch.randn(T, KVH, d, generator=g)
        cases.append(((q, k, v), _gqa_reference(q, k, v)))

    def diagnose(args: tuple, got: torch.Tensor) -> str | None:
        q, k, v = args
        group = q.shape[1] // k.shape[1]
        round_robin = _gqa_reference(q, k.repeat(1, group, 1), v.repeat(1, group, 1))
        if _close(got, round_robin):
            return M("gqa_attention.head_pairing")
        H = q.shape[1]
        first = _gqa_reference(q, k[:, :1].expand(-1, H, -1), v[:, :1].expand(-1, H, -1))
        if k.shape[1] > 1 and _close(got, first):
            return M("gqa_attention.one_kv_head")
        T, H, d = q.shape
        k_h, v_h = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
        for h in range(H):
            for v_slip, hint in _one_head_slips(q[:, h], k_h[:, h], v_h[:, h]):
                if T > 1 and _close(got[:, h], v_slip):
                    return hint
        return None

    return cases, diagnose


GQA_OPTIONS = M.choices(
    "gqa_option",
    (
        "q_proj_weights_x3",
        "kv_cache_per_token_x3",
        "score_matrices_x3",
        "k_and_v_proj_weights_x3",
        "attention_output_shape_changes",
        "mlp_weights_change",
    ),
)
_GQA_RIGHT = frozenset({"kv_cache_per_token_x3", "k_and_v_proj_weights_x3"})
# The hint per wrong option, in the language in use.
_GQA_WHY = M.texts(
    "gqa_consequences",
    (
        "q_proj_weights_x3",
        "score_matrices_x3",
        "attention_output_shape_changes",
        "mlp_weights_change",
    ),
)


@selection(GQA_OPTIONS, _GQA_WHY)
def gqa_consequences() -> frozenset[str]:
    """SmolLM2 has 9 query heads sharing 3 KV heads. Had it used plain multi-head attention (9 KV
    heads), what would change? A list of GQA_OPTIONS (every one that changes, none other)."""
    return _GQA_RIGHT


# ---- RoPE ----------------------------------------------------------------------------------------


def _rope_reference(
    x: torch.Tensor, positions: torch.Tensor, theta: float, inv_freq: torch.Tensor | None = None
) -> torch.Tensor:
    from llmlab.config import get_config
    from llmlab.model import apply_rope, rope_inv_freq

    d = x.shape[-1]
    if inv_freq is None:
        inv_freq = rope_inv_freq(replace(get_config(MODEL), head_dim=d, rope_theta=theta))
    angles = positions.float()[:, None] * inv_freq[None, :]  # [T, d/2]
    return apply_rope(x, angles.cos(), angles.sin())


@piece("fn(x, positions, theta)")
def rope() -> Cases:
    """Your `fn(x, positions, theta)`: x [T, heads, d] rotated by RoPE (Llama's "rotate half"
    layout: x_i pairs with x_{i + d/2}, angle position · theta^(-2i/d)), checked against
    `llmlab.model.apply_rope`."""
    g = _seeded(23)
    cases = []
    for T, H, d, positions, theta in (
        (6, 9, 64, torch.arange(3, 9), 100000.0),
        (4, 3, 16, torch.tensor([0, 7, 2, 30]), 10000.0),
    ):
        x = torch.randn(T, H, d, generator=g)
        cases.append(((x, positions, theta), _rope_reference(x, positions, theta)))

    def diagnose(args: tuple, got: torch.Tensor) -> str | None:
        x, positions, theta = args
        T, _, d = x.shape
        half = d // 2
        inv = theta ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
        angles = (positions.double()[:, None] * inv[None, :]).float()[:, None, :]  # [T, 1, d/2]
        x1, x2 = x[..., 0::2], x[..., 1::2]
        neighbours = torch.stack(
            (x1 * angles.cos() - x2 * angles.sin(), x2 * angles.cos() + x1 * angles.sin()), dim=-1
        ).flatten(-2)
        one_over_d = (theta ** (-torch.arange(half) / d)).float()  # exponent steps of 1/d
        h1, h2 = x[..., :half], x[..., half:]
        cos, sin = angles.cos(), angles.sin()
        slips = [
            (x, M("rope.not_rotated")),
            (torch.cat([h1 * sin - h2 * cos, h2 * sin + h1 * cos], -1), M("rope.cos_sin_swapped")),
            (torch.cat([h2 * cos + h1 * sin, h1 * cos - h2 * sin], -1), M("rope.halves_swapped")),
            (neighbours, M("rope.neighbours")),
            (_rope_reference(x, torch.arange(T), theta), M("rope.wrong_positions")),
            (_rope_reference(x, -positions, theta), M("rope.wrong_direction")),
            (_rope_reference(x, positions, theta, one_over_d), M("rope.frequencies")),
        ]
        return next((h for v, h in slips if _close(got, v)), None)

    return cases, diagnose


RELATIVE_OPTIONS = ("s(14, 6)", "s(107, 103)", "s(3, 7)", "s(8, 4)", "s(7, 7)", "s(70, 30)")
_RELATIVE_RIGHT = frozenset({"s(107, 103)", "s(8, 4)"})
# The catalog key of the hint per wrong option.
_RELATIVE_WHY = {
    "s(14, 6)": M.key("rope_relative.s_14_6"),
    "s(70, 30)": M.key("rope_relative.s_70_30"),
    "s(3, 7)": M.key("rope_relative.s_3_7"),
    "s(7, 7)": M.key("rope_relative.s_7_7"),
}


@selection(RELATIVE_OPTIONS, _RELATIVE_WHY)
def rope_relative() -> frozenset[str]:
    """s(m, n) = rope(q, m) · rope(k, n) for one fixed q and k. Which of RELATIVE_OPTIONS equal
    s(7, 3) for any q and k? A list of them (every one that does, none other)."""
    return _RELATIVE_RIGHT


# ---- SwiGLU MLP ----------------------------------------------------------------------------------


@piece("fn(x, w_gate, w_up, w_down)")
def swiglu() -> Cases:
    """Your `fn(x, w_gate, w_up, w_down)`: Llama's SwiGLU MLP with weights in nn.Linear's layout
    ([out_features, in_features]), checked against `llmlab.model.MLP` with random weights."""
    from llmlab.config import get_config
    from llmlab.model import MLP

    g = _seeded(24)
    cases = []
    for T, hidden, inter in ((5, 48, 80), (2, 24, 40)):
        mlp = MLP(replace(get_config(MODEL), hidden_size=hidden, intermediate_size=inter))
        ws = [
            torch.randn(inter, hidden, generator=g) / hidden**0.5,
            torch.randn(inter, hidden, generator=g) / hidden**0.5,
            torch.randn(hidden, inter, generator=g) / inter**0.5,
        ]
        x = torch.randn(T, hidden, generator=g)
        with torch.no_grad():
            for layer, w in zip((mlp.gate_proj, mlp.up_proj, mlp.down_proj), ws):
                layer.weight.copy_(w)
            cases.append(((x, *ws), mlp(x).detach()))

    def diagnose(args: tuple, got: torch.Tensor) -> str | None:
        import torch.nn.functional as F

        x, wg, wu, wd = args
        gate, up = x @ wg.T, x @ wu.T
        slips = [
            ((gate * F.silu(up)) @ wd.T, M("swiglu.silu_on_up")),
            ((F.relu(gate) * up) @ wd.T, M("swiglu.relu")),
            ((F.gelu(gate) * up) @ wd.T, M("swiglu.gelu")),
            ((torch.sigmoid(gate) * up) @ wd.T, M("swiglu.sigmoid")),
            (F.silu(gate) @ wd.T, M("swiglu.no_up")),
            (F.silu(up) @ wd.T, M("swiglu.one_branch")),
        ]
        return next((h for v, h in slips if _close(got, v)), None)

    return cases, diagnose
