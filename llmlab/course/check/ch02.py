"""Self-checks of chapter 02 (one Llama decoder layer, written by the student).

Each piece of the layer is a function the student writes and a checker that runs it on fresh
random inputs against `llmlab.model`'s own code: RMSNorm (`llmlab.model.RMSNorm`), causal
attention of one head and grouped-query attention (the model's readable attention,
`llmlab.ops.torch_backend.attend`), rotary position embedding (`llmlab.model.apply_rope`) and the
SwiGLU MLP (`llmlab.model.MLP`). `layer0_output` then checks the student's whole layer, built
from those pieces, against the real layer 0 of SmolLM2 on a real prompt.

The attention checkers refuse a function that calls a fused attention (PyTorch's, llmlab's):
by its source (and the functions and modules it uses), and at run time, while the function
runs, every such entry point is replaced by one that raises (`fused_attention_banned`). In the
grader the function runs in a sandbox interpreter (`llmlab.course.instructor.sandbox`); the checker
then wraps it in a small function of its own that turns the same ban on there.

The source chapter's numeric questions (`head_size`, `causal_pairs`, `gqa_kv_head`) stay for callers
of earlier versions of the chapter.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import types
from dataclasses import replace
from typing import Any, Callable, Iterator

import torch

from llmlab.course.check.catalog import catalog
from llmlab.course.check.core import (
    NOT_ANSWERED,
    CheckResult,
    ExerciseInfo,
    code_names,
    labelled,
    not_yet,
    passed,
    report,
    staged,
)

M = catalog("ch02")

HIDDEN, HEADS = 4096, 32  # the source chapter's example (Llama-3-8B)
CAUSAL_T = 6  # prompt length for the mask question
GQA_HEADS, GQA_KV_HEADS, GQA_QUERY_HEAD = 32, 8, 13  # Llama-3-8B: 32 query heads share 8 KV heads

MODEL = "smollm2-135m"
PROMPT = "The cat sat on the mat because it was warm"  # the chapter's real prompt
ATOL = 1e-4  # float32, a few hundred terms per sum

EXERCISES: dict[str, ExerciseInfo] = {
    "rms_norm": ExerciseInfo(
        "plug-in",
        (
            "LayerNorm's mean subtraction",
            "eps missing or outside the root",
            "weight missing",
            "sum instead of mean",
            "wrong axis",
        ),
    ),
    "attention": ExerciseInfo(
        "plug-in",
        (
            "mask missing",
            "scale missing",
            "softmax over the wrong axis",
            "scaled by d instead of √d",
            "future masked after the softmax",
            "own key masked too",
            "wrong output shape",
            "a fused attention called",
        ),
    ),
    "gqa_attention": ExerciseInfo(
        "plug-in",
        (
            "round-robin instead of consecutive groups",
            "every query head on KV head 0",
            "mask missing",
            "scale missing",
            "a fused attention called",
        ),
    ),
    "gqa_consequences": ExerciseInfo(
        "reasoning",
        (
            "query projection thought to shrink",
            "fewer score matrices thought",
            "output shape thought to change",
        ),
    ),
    "rope": ExerciseInfo(
        "plug-in",
        (
            "neighbouring pairs instead of (i, i + d/2)",
            "positions ignored",
            "rotated the wrong way",
            "frequencies i/d instead of 2i/d",
            "cos and sin swapped",
            "the rotated halves swapped",
        ),
    ),
    "rope_relative": ExerciseInfo(
        "reasoning",
        (
            "absolute positions thought to matter",
            "ratio instead of difference",
            "direction ignored",
        ),
    ),
    "swiglu": ExerciseInfo(
        "plug-in", ("silu on the up branch", "ReLU or GELU instead of SiLU", "gate missing")
    ),
    "layer0_output": ExerciseInfo(
        "plug-in", ("residual missing", "norm after the residual add", "the input handed back")
    ),
}


# ---- no fused attention ------------------------------------------------------------------------

# Words that give a fused attention away in a function's source or in the names it uses.
_BANNED_WORDS = (
    "scaled_dot_product",
    "multiheadattention",
    "multi_head_attention",
    "flash",
    "llmlab",
)


class FusedAttentionError(RuntimeError):
    """Raised by a fused attention entry point while `fused_attention_banned` is on."""


def _banned_word(text: str) -> str | None:
    low = text.lower()
    return next((w for w in _BANNED_WORDS if w in low), None)


def _ban_targets() -> list[tuple[Any, str]]:
    """(object, attribute) of every fused attention entry point a student could reach."""
    import torch.nn.functional as F
    import torch.nn.modules.activation as activation

    from llmlab import model, ops
    from llmlab.ops import reference, torch_backend

    return [
        (F, "scaled_dot_product_attention"),
        (torch._C._nn, "scaled_dot_product_attention"),
        (F, "multi_head_attention_forward"),
        (torch.nn, "MultiheadAttention"),
        (activation, "MultiheadAttention"),
        (ops, "attention"),
        (ops, "paged_attention_prefill"),
        (ops, "paged_attention_decode"),
        (torch_backend, "attend"),
        (torch_backend, "grouped_attention"),
        (torch_backend, "paged_attention_prefill"),
        (torch_backend, "paged_attention_decode"),
        (reference, "reference_paged_attention_prefill"),
        (reference, "reference_paged_attention_decode"),
        (model, "attention_probs"),
    ]


@contextlib.contextmanager
def fused_attention_banned() -> Iterator[None]:
    """While inside, every fused attention entry point (PyTorch's scaled-dot-product and
    multi-head attention, llmlab's attention ops) raises FusedAttentionError."""
    saved = []
    for owner, name in _ban_targets():
        if hasattr(owner, name):

            def refuse(*args: Any, _name: str = name, **kwargs: Any) -> Any:
                raise FusedAttentionError(M("check_function.fused_refused", name=_name))

            saved.append((owner, name, getattr(owner, name)))
            setattr(owner, name, refuse)
    try:
        yield
    finally:
        for owner, name, original in reversed(saved):
            setattr(owner, name, original)


def _scan_function(fn: Any, seen: set[int]) -> str | None:
    """A banned name in a function of this process (its source, the functions and modules it
    uses, the helpers it calls), "no source" when its source cannot be read, or None."""
    if not isinstance(fn, types.FunctionType):
        name = f"{getattr(fn, '__module__', '') or ''}.{getattr(fn, '__qualname__', type(fn).__name__)}"
        return _banned_word(name) or "no source"
    try:
        source = inspect.getsource(fn)
    except (OSError, TypeError):
        return "no source"
    found = _banned_word(source)
    if found:
        return found
    scope = dict(fn.__globals__)
    for name, cell in zip(fn.__code__.co_freevars, fn.__closure__ or ()):
        with contextlib.suppress(ValueError):
            scope[name] = cell.cell_contents
    for name in sorted(code_names(fn.__code__)):
        value = scope.get(name)
        if isinstance(value, types.ModuleType):
            found = _banned_word(value.__name__)
        elif isinstance(value, types.FunctionType) and value.__module__ == fn.__module__:
            found = None if id(value) in seen else _scan_function(value, seen | {id(fn), id(value)})
            found = None if found == "no source" else found
        elif callable(value):
            found = _banned_word(
                f"{getattr(value, '__module__', '') or ''}.{getattr(value, '__qualname__', '')}"
            )
        else:
            found = None
        if found:
            return found
    return None


def _scan_spec(spec: dict, depth: int = 0) -> str | None:
    """The same scan over a function as the grader carries it (`llmlab.course.instructor.answers`)."""
    if "module" in spec:
        return _banned_word(f"{spec.get('module')}.{spec.get('qualname')}") or "no source"
    found = _banned_word(str(spec.get("source", "")))
    if found or depth > 8:
        return found
    for value in (spec.get("globals") or {}).values():
        if not (isinstance(value, dict) and len(value) == 1):
            continue
        ((tag, body),) = value.items()
        if tag == "__module__" and isinstance(body, str):
            found = _banned_word(body)
        elif tag == "__function__" and isinstance(body, dict) and "source" in body:
            found = _scan_spec(body, depth + 1)
        elif tag == "__function__" and isinstance(body, dict):
            found = _banned_word(f"{body.get('module')}.{body.get('qualname')}")
        if found:
            return found
    return None


def fused_call_in(fn: Any) -> str | None:
    """What gives a fused attention away in `fn` (a banned word, or "no source" when its source
    cannot be read), or None. Works on a function of this process and on the grader's stand-in
    for a student's function (which carries the function's source and globals)."""
    if getattr(type(fn), "grader_stand_in", False):  # the grader's SandboxedFunction
        return _scan_spec(fn.spec)
    return _scan_function(fn, set())


# In the grader's sandbox: the student's function, called with the ban on (built there from
# this source by `llmlab.course.instructor.answers.build_function`, with the student's function as
# `_llmlab_student`).
_GUARD_SOURCE = (
    "def _llmlab_guarded(*args, **kwargs):\n"
    "    from llmlab.course.check.ch02 import fused_attention_banned\n"
    "    with fused_attention_banned():\n"
    "        return _llmlab_student(*args, **kwargs)\n"
)


@contextlib.contextmanager
def _banned_runner(fn: Callable) -> Iterator[Callable]:
    """A callable that runs `fn` with every fused attention switched off, here or in the sandbox."""
    if getattr(type(fn), "grader_stand_in", False) and "source" in fn.spec:
        spec = {
            "name": "_llmlab_guarded",
            "source": _GUARD_SOURCE,
            "globals": {"_llmlab_student": {"__function__": fn.spec}},
        }
        guarded = type(fn)(spec, timeout_s=fn.timeout_s, env=fn.env)
        try:
            yield guarded
        finally:
            guarded.close()
        return

    def guarded(*args: Any, **kwargs: Any) -> Any:
        with fused_attention_banned():
            return fn(*args, **kwargs)

    yield guarded


@contextlib.contextmanager
def _plain_runner(fn: Callable) -> Iterator[Callable]:
    yield fn


# ---- running a student's function on cases ------------------------------------------------------


def _close(got: torch.Tensor, want: torch.Tensor) -> bool:
    # NaN where a slip makes NaN (a row that masks every key) matches: no reference has one
    return got.shape == want.shape and torch.allclose(
        got.float(), want.float(), atol=ATOL, rtol=1e-4, equal_nan=True
    )


def _check_function(
    ex: str,
    fn: Any,
    cases: list[tuple[tuple, torch.Tensor]],
    diagnose: Callable[[tuple, torch.Tensor], str | None],
    *,
    default: str,
    formula: str,
    signature: str,
    success: str,
    ban: bool = False,
) -> CheckResult:
    """Run `fn` on each case's arguments; PASS when every output is allclose to the case's
    expected tensor. A wrong output gets `diagnose`'s hint (a known slip) or `default`, then
    `formula` from the second wrong try on."""
    if fn is None:
        return report(not_yet(ex, NOT_ANSWERED))
    if not callable(fn):
        return report(
            not_yet(
                ex,
                M(
                    "check_function.not_a_function",
                    signature=signature,
                    got_type=type(fn).__name__,
                ),
            )
        )
    if ban:
        found = fused_call_in(fn)
        if found == "no source":
            return report(not_yet(ex, M("check_function.no_source")))
        if found:
            return report(not_yet(ex, M("check_function.fused_in_code", found=found)))
    with (_banned_runner if ban else _plain_runner)(fn) as run:
        for args, want in cases:
            try:
                got = torch.as_tensor(
                    run(*(a.clone() if isinstance(a, torch.Tensor) else a for a in args))
                )
            except Exception as e:  # the learner's code: report, never crash the notebook
                if type(e).__name__ == "FusedAttentionError":
                    return report(not_yet(ex, M("check_function.fused_called")))
                return report(
                    not_yet(ex, M("check_function.raised", error_type=type(e).__name__, error=e))
                )
            if tuple(got.shape) != tuple(want.shape):
                shapes = ", ".join(str(list(a.shape)) for a in args if isinstance(a, torch.Tensor))
                return report(
                    not_yet(
                        ex,
                        M(
                            "check_function.wrong_shape",
                            shapes=shapes,
                            want_shape=list(want.shape),
                            got_shape=list(got.shape),
                        ),
                    )
                )
            if _close(got, want):
                continue
            hint = diagnose(args, got)
            return report(not_yet(ex, hint or staged(ex, default, formula)))
    return report(passed(ex, success))


def _seeded(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# ---- RMSNorm -----------------------------------------------------------------------------------


def rms_norm(fn: Any) -> CheckResult:
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

    return _check_function(
        "ch02.rms_norm",
        fn,
        cases,
        diagnose,
        signature="fn(x, weight, eps)",
        default=M("rms_norm.default_hint"),
        formula=M("rms_norm.formula"),
        success=M("rms_norm.success"),
    )


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


def attention(fn: Any) -> CheckResult:
    """Your function `fn(q, k, v)`: causal softmax(q kᵀ / √d) v for q, k, v of shape [T, d],
    written out (a fused attention is refused)."""
    g = torch.Generator().manual_seed(0)
    cases = []
    for T, d in ((1, 4), (5, 8), (7, 16)):
        q, k, v = (torch.randn(T, d, generator=g) for _ in range(3))
        cases.append(((q, k, v), _reference(q, k, v)))

    def diagnose(args: tuple, got: torch.Tensor) -> str | None:
        return next((h for v, h in _one_head_slips(*args) if _close(got, v)), None)

    return _check_function(
        "ch02.attention",
        fn,
        cases,
        diagnose,
        signature="fn(q, k, v)",
        ban=True,
        default=M("attention.default_hint"),
        formula=M("attention.formula"),
        success=M("attention.success"),
    )


# ---- grouped-query attention ---------------------------------------------------------------------


def _gqa_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    from llmlab.ops.torch_backend import attend

    return attend(q, k, v, q.shape[-1] ** -0.5, first_pos=0)


def gqa_attention(fn: Any) -> CheckResult:
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

    return _check_function(
        "ch02.gqa_attention",
        fn,
        cases,
        diagnose,
        signature="fn(q, k, v)",
        ban=True,
        default=M("gqa_attention.default_hint"),
        formula=M("gqa_attention.formula"),
        success=M("gqa_attention.success"),
    )


def gqa_consequences(answer: Any) -> CheckResult:
    """SmolLM2 has 9 query heads sharing 3 KV heads. Had it used plain multi-head attention (9 KV
    heads), what would change? A list of GQA_OPTIONS (every one that changes, none other)."""
    return _check_set(
        "ch02.gqa_consequences",
        answer,
        GQA_OPTIONS,
        _GQA_RIGHT,
        {k: M(v) for k, v in _GQA_WHY.items()},
        missing=M("gqa_consequences.missing"),
        success=M("gqa_consequences.success"),
    )


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
# The catalog key of the hint per wrong option.
_GQA_WHY = {
    "q_proj_weights_x3": M.key("gqa_consequences.q_proj_weights_x3"),
    "score_matrices_x3": M.key("gqa_consequences.score_matrices_x3"),
    "attention_output_shape_changes": M.key("gqa_consequences.attention_output_shape_changes"),
    "mlp_weights_change": M.key("gqa_consequences.mlp_weights_change"),
}


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


def rope(fn: Any) -> CheckResult:
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

    return _check_function(
        "ch02.rope",
        fn,
        cases,
        diagnose,
        signature="fn(x, positions, theta)",
        default=M("rope.default_hint"),
        formula=M("rope.formula"),
        success=M("rope.success"),
    )


RELATIVE_OPTIONS = ("s(14, 6)", "s(107, 103)", "s(3, 7)", "s(8, 4)", "s(7, 7)", "s(70, 30)")
_RELATIVE_RIGHT = frozenset({"s(107, 103)", "s(8, 4)"})
# The catalog key of the hint per wrong option.
_RELATIVE_WHY = {
    "s(14, 6)": M.key("rope_relative.s_14_6"),
    "s(70, 30)": M.key("rope_relative.s_70_30"),
    "s(3, 7)": M.key("rope_relative.s_3_7"),
    "s(7, 7)": M.key("rope_relative.s_7_7"),
}


def rope_relative(answer: Any) -> CheckResult:
    """s(m, n) = rope(q, m) · rope(k, n) for one fixed q and k. Which of RELATIVE_OPTIONS equal
    s(7, 3) for any q and k? A list of them (every one that does, none other)."""
    return _check_set(
        "ch02.rope_relative",
        answer,
        RELATIVE_OPTIONS,
        _RELATIVE_RIGHT,
        {k: M(v) for k, v in _RELATIVE_WHY.items()},
        missing=M("rope_relative.missing"),
        success=M("rope_relative.success"),
    )


# ---- SwiGLU MLP ----------------------------------------------------------------------------------


def swiglu(fn: Any) -> CheckResult:
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

    return _check_function(
        "ch02.swiglu",
        fn,
        cases,
        diagnose,
        signature="fn(x, w_gate, w_up, w_down)",
        default=M("swiglu.default_hint"),
        formula=M("swiglu.formula"),
        success=M("swiglu.success"),
    )


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
        return report(not_yet(ex, NOT_ANSWERED))
    try:
        got = torch.as_tensor(answer).detach().float()
    except (TypeError, ValueError, RuntimeError):
        return report(not_yet(ex, M("layer0_output.not_a_tensor", got_type=type(answer).__name__)))
    variants = _layer0_variants()
    want = variants["right"]
    if tuple(got.shape) != tuple(want.shape):
        return report(
            not_yet(
                ex,
                M(
                    "layer0_output.wrong_shape",
                    tokens=want.shape[0],
                    hidden=want.shape[1],
                    want_shape=list(want.shape),
                    got_shape=list(got.shape),
                ),
            )
        )
    if not torch.isfinite(got).all():
        return report(not_yet(ex, M("layer0_output.not_finite")))
    if _close(got, want):
        diff = (got - want).abs().max().item()
        return report(passed(ex, M("layer0_output.success", diff=diff)))
    for name, hint in _LAYER_HINTS.items():
        if _close(got, variants[name]):
            return report(not_yet(ex, M(hint)))
    return report(
        not_yet(
            ex,
            staged(ex, M("layer0_output.default_hint"), M("layer0_output.formula")),
        )
    )


# ---- choosing every right option -----------------------------------------------------------------


def _check_set(
    ex: str,
    answer: Any,
    options: tuple[str, ...],
    right: frozenset[str],
    why_wrong: dict[str, str],
    *,
    missing: str,
    success: str,
) -> CheckResult:
    """A multi-select answer (one option or a list of them), graded by content."""
    if answer is None:
        return report(not_yet(ex, NOT_ANSWERED))
    items = [answer] if isinstance(answer, str) else answer
    if not isinstance(items, (list, tuple, set, frozenset)) or not all(
        isinstance(a, str) for a in items
    ):
        return report(not_yet(ex, M("check_set.not_a_list", options=list(options))))
    norm = {" ".join(a.split()).lower(): a for a in items}
    known = {o.lower(): o for o in options}
    unknown = sorted(
        a for n, a in norm.items() if n.replace(" ", "") not in {k.replace(" ", "") for k in known}
    )
    if unknown:
        return report(
            not_yet(ex, M("check_set.unknown_option", options=list(options), unknown=unknown))
        )
    chosen = {
        next(o for k, o in known.items() if k.replace(" ", "") == n.replace(" ", "")) for n in norm
    }
    wrong = sorted(chosen - right)
    if wrong:
        return report(not_yet(ex, labelled(wrong[0], why_wrong[wrong[0]])))
    if chosen != right:
        return report(not_yet(ex, missing))
    return report(passed(ex, success))
