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

from llmlab.course.check.core import (
    NOT_ANSWERED,
    CheckResult,
    ExerciseInfo,
    code_names,
    not_yet,
    passed,
    report,
    staged,
)
from llmlab.i18n import tr

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
            "wrong output shape",
            "a fused attention called",
        ),
    ),
    "gqa_attention": ExerciseInfo(
        "plug-in",
        (
            "round-robin instead of consecutive groups",
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
                raise FusedAttentionError(
                    tr(
                        f"{_name} is switched off for this exercise: "
                        "compute the attention yourself",
                        f"{_name} 在这道练习里被关掉了：请自己计算注意力",
                    )
                )

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
    return got.shape == want.shape and torch.allclose(
        got.float(), want.float(), atol=ATOL, rtol=1e-4
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
                tr(
                    f"expected a function {signature}, got {type(fn).__name__}.",
                    f"这里要一个函数 {signature}，你给的是 {type(fn).__name__}。",
                ),
            )
        )
    if ban:
        found = fused_call_in(fn)
        if found == "no source":
            return report(
                not_yet(
                    ex,
                    tr(
                        "write your function with def in a notebook cell: the "
                        "checker reads its source to make sure it computes the "
                        "attention itself.",
                        "请在 notebook 的单元格里用 def 写出你的函数：检查器要读它的"
                        "源码，确认它自己算了注意力。",
                    ),
                )
            )
        if found:
            return report(
                not_yet(
                    ex,
                    tr(
                        f"your function hands the work to a fused attention (its "
                        f"code mentions {found!r}); compute the scores, the mask and "
                        f"the softmax yourself: that is the exercise.",
                        f"你的函数把活交给了现成的融合注意力（代码里出现了 {found!r}）；"
                        f"请自己算分数、掩码和 softmax：这正是这道练习要做的。",
                    ),
                )
            )
    with (_banned_runner if ban else _plain_runner)(fn) as run:
        for args, want in cases:
            try:
                got = torch.as_tensor(
                    run(*(a.clone() if isinstance(a, torch.Tensor) else a for a in args))
                )
            except Exception as e:  # the learner's code: report, never crash the notebook
                if type(e).__name__ == "FusedAttentionError":
                    return report(
                        not_yet(
                            ex,
                            tr(
                                "your function called a fused attention, which is "
                                "switched off while it is checked; compute the "
                                "attention yourself.",
                                "你的函数调用了融合注意力，检查期间它是关掉的；请自己计算注意力。",
                            ),
                        )
                    )
                return report(
                    not_yet(
                        ex,
                        tr(
                            f"your function raised {type(e).__name__}: {e}",
                            f"你的函数抛出了 {type(e).__name__}：{e}",
                        ),
                    )
                )
            if tuple(got.shape) != tuple(want.shape):
                shapes = ", ".join(str(list(a.shape)) for a in args if isinstance(a, torch.Tensor))
                return report(
                    not_yet(
                        ex,
                        tr(
                            f"for inputs of shapes {shapes} the output must be "
                            f"{list(want.shape)}, got {list(got.shape)}.",
                            f"输入形状为 {shapes} 时，输出必须是 {list(want.shape)}，"
                            f"你的是 {list(got.shape)}。",
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
        slips = [
            (
                w
                * (x - x.mean(-1, keepdim=True))
                / (x.var(-1, keepdim=True, unbiased=False) + eps).sqrt(),
                tr(
                    "you subtracted the mean: that is LayerNorm. RMSNorm only divides by the root mean "
                    "square; there is no centring (and no bias).",
                    "你减去了均值：那是 LayerNorm。RMSNorm 只除以均方根，不做中心化（也没有 bias）。",
                ),
            ),
            (
                w * x / ms.sqrt(),
                tr(
                    "eps is missing: it keeps the division finite when a row is near zero.",
                    "少了 eps：某一行接近零时，靠它让除法的结果保持有限。",
                ),
            ),
            (
                w * x / (ms.sqrt() + eps),
                tr(
                    "eps goes inside the square root, added to the mean square.",
                    "eps 要放在平方根里面，加到平方的均值上。",
                ),
            ),
            (
                x * torch.rsqrt(ms + eps),
                tr(
                    "the learned weight is missing: multiply the normalised row by it.",
                    "少了学到的 weight：把归一化后的行乘上它。",
                ),
            ),
            (
                w * x * torch.rsqrt(x.pow(2).sum(-1, keepdim=True) + eps),
                tr(
                    "that divides by the root of the *sum* of squares; RMSNorm uses the *mean* square.",
                    "这除的是平方*和*的平方根；RMSNorm 用的是平方的*均值*。",
                ),
            ),
            (
                w * x * torch.rsqrt(x.pow(2).mean(0, keepdim=True) + eps),
                tr(
                    "you averaged over the tokens (axis 0); each token's own vector (the last axis) is normalised.",
                    "你是沿 token 方向（第 0 维）求的平均；要归一化的是每个 token 自己的向量（最后一维）。",
                ),
            ),
        ]
        return next((h for v, h in slips if _close(got, v)), None)

    return _check_function(
        "ch02.rms_norm",
        fn,
        cases,
        diagnose,
        signature="fn(x, weight, eps)",
        default=tr(
            "wrong values: compare your steps with the formula above.",
            "数值不对：把你的每一步和上面的公式对照一下。",
        ),
        formula=tr(
            "Each row x becomes weight · x / √(mean of x² over the row + eps).",
            "每一行 x 变成 weight · x / √(该行 x² 的均值 + eps)。",
        ),
        success=tr("matches llmlab.model.RMSNorm.", "与 llmlab.model.RMSNorm 一致。"),
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
    return [
        (
            (scores / d**0.5).softmax(-1) @ v,
            tr(
                "the causal mask is missing: set scores of keys after the query to -inf before softmax.",
                "少了因果掩码：softmax 之前，要把 query 之后那些 key 的分数设为 -inf。",
            ),
        ),
        (
            scores.masked_fill(causal, float("-inf")).softmax(-1) @ v,
            tr(
                "the scores are not scaled: divide q kᵀ by √d before softmax.",
                "分数没有缩放：softmax 之前要把 q kᵀ 除以 √d。",
            ),
        ),
        (
            (scores / d**0.5).masked_fill(causal, float("-inf")).softmax(0) @ v,
            tr(
                "softmax over the wrong axis: each query's weights over the keys (the last axis) must sum to 1.",
                "softmax 的维度错了：每个 query 对各个 key 的权重（最后一维）加起来要等于 1。",
            ),
        ),
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
        default=tr(
            "wrong values; check each step: the scores, their scale, the "
            "mask, the softmax's axis, the weighted sum of the values.",
            "数值不对；逐步检查：分数、分数的缩放、掩码、softmax 的维度、对 value 的加权求和。",
        ),
        formula=tr(
            "out = softmax(q kᵀ / √d + mask) v, where mask[i, j] = -inf for j > i and 0 otherwise.",
            "out = softmax(q kᵀ / √d + mask) v，其中 j > i 时 mask[i, j] = -inf，否则为 0。",
        ),
        success=tr(
            "matches PyTorch's scaled_dot_product_attention.",
            "与 PyTorch 的 scaled_dot_product_attention 一致。",
        ),
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
            return tr(
                "query head h must read KV head h // group (consecutive query heads share one "
                "KV head); yours pairs it with h % num_kv_heads (round-robin).",
                "query 头 h 应该读 KV 头 h // group（相邻的几个 query 头共用一个 KV 头）；"
                "你的代码把它配给了 h % num_kv_heads（轮流分配）。",
            )
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
        default=tr(
            "wrong values; check which KV head each query head reads, then "
            "the one-head attention for each head.",
            "数值不对；先检查每个 query 头读的是哪个 KV 头，再检查每个头的单头注意力。",
        ),
        formula=tr(
            "Query head h attends with K and V head h // (heads / kv_heads); "
            "each head is the one-head causal attention you wrote above.",
            "query 头 h 用第 h // (heads / kv_heads) 个 K、V 头算注意力；"
            "每个头就是你上面写的单头因果注意力。",
        ),
        success=tr(
            "matches the model's attention (llmlab.ops.torch_backend.attend).",
            "与模型的注意力（llmlab.ops.torch_backend.attend）一致。",
        ),
    )


def gqa_consequences(answer: Any) -> CheckResult:
    """SmolLM2 has 9 query heads sharing 3 KV heads. Had it used plain multi-head attention (9 KV
    heads), what would change? A list of GQA_OPTIONS (every one that changes, none other)."""
    return _check_set(
        "ch02.gqa_consequences",
        answer,
        GQA_OPTIONS,
        _GQA_RIGHT,
        {k: tr(*v) for k, v in _GQA_WHY.items()},
        missing=tr(
            "something else grows with the number of KV heads: follow k and v "
            "from the weights that make them to where they are kept.",
            "还有别的东西随 KV 头数增长：顺着 k 和 v，从生成它们的权重一直跟到存放它们的地方。",
        ),
        success=tr(
            "right: only what makes and stores K and V scales with the KV heads; "
            "the queries, the score matrices and the output stay as they are.",
            "正确：只有生成和存放 K、V 的部分随 KV 头数变化；query、分数矩阵和输出都保持不变。",
        ),
    )


GQA_OPTIONS = (
    "q_proj_weights_x3",
    "kv_cache_per_token_x3",
    "score_matrices_x3",
    "k_and_v_proj_weights_x3",
    "attention_output_shape_changes",
    "mlp_weights_change",
)
_GQA_RIGHT = frozenset({"kv_cache_per_token_x3", "k_and_v_proj_weights_x3"})
# (English, Chinese) per wrong option, resolved with tr when shown.
_GQA_WHY = {
    "q_proj_weights_x3": (
        "q_proj already makes 9 query heads; GQA changes how many K/V heads there are, not the queries.",
        "q_proj 本来就生成 9 个 query 头；GQA 改变的是 K/V 头的个数，不是 query。",
    ),
    "score_matrices_x3": (
        "there is one score matrix per *query* head: 9 with GQA and 9 without.",
        "每个 *query* 头有一个分数矩阵：用不用 GQA 都是 9 个。",
    ),
    "attention_output_shape_changes": (
        "each of the 9 query heads still returns a 64-wide vector, so the "
        "output (and o_proj) keep their shape.",
        "9 个 query 头各自仍返回 64 维的向量，所以输出（以及 o_proj）的形状不变。",
    ),
    "mlp_weights_change": (
        "the MLP never sees the heads; it is the same with or without GQA.",
        "MLP 根本看不到注意力头；用不用 GQA 它都一样。",
    ),
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
        slips = [
            (
                x,
                tr(
                    "your output equals the input: nothing was rotated.",
                    "你的输出和输入一样：什么也没旋转。",
                ),
            ),
            (
                neighbours,
                tr(
                    "you paired neighbours (x0, x1), (x2, x3), …; Llama's layout pairs x_i "
                    "with x_{i + d/2} (the first half with the second half).",
                    "你把相邻的 (x0, x1)、(x2, x3)…… 配成了对；Llama 的布局是 x_i 与 "
                    "x_{i + d/2} 配对（前一半配后一半）。",
                ),
            ),
            (
                _rope_reference(x, torch.arange(T), theta),
                tr(
                    "you used positions 0..T-1; rotate each token by the position you are given.",
                    "你用的是位置 0..T-1；每个 token 要按给定的位置旋转。",
                ),
            ),
            (
                _rope_reference(x, -positions, theta),
                tr(
                    "rotated the wrong way: the first half becomes "
                    "x1·cos − x2·sin, the second x2·cos + x1·sin.",
                    "转反了：前一半变成 x1·cos − x2·sin，后一半变成 x2·cos + x1·sin。",
                ),
            ),
            (
                _rope_reference(x, positions, theta, (theta ** (-torch.arange(half) / d)).float()),
                tr(
                    "the frequencies: the exponent steps by 2/d per pair (i = 0, 2, 4, … over d), not by 1/d.",
                    "频率不对：指数每一对递增 2/d（i = 0, 2, 4, … 再除以 d），不是 1/d。",
                ),
            ),
        ]
        return next((h for v, h in slips if _close(got, v)), None)

    return _check_function(
        "ch02.rope",
        fn,
        cases,
        diagnose,
        signature="fn(x, positions, theta)",
        default=tr(
            "wrong values: check the frequencies, the angles and which "
            "dimensions are rotated together.",
            "数值不对：检查频率、角度，以及哪些维度是一起旋转的。",
        ),
        formula=tr(
            "For pair i (i = 0 .. d/2 − 1): angle = position · theta^(−2i/d); "
            "(x_i, x_{i+d/2}) → (x_i·cos − x_{i+d/2}·sin, x_{i+d/2}·cos + x_i·sin).",
            "第 i 对（i = 0 .. d/2 − 1）：angle = position · theta^(−2i/d)；"
            "(x_i, x_{i+d/2}) → (x_i·cos − x_{i+d/2}·sin, x_{i+d/2}·cos + x_i·sin)。",
        ),
        success=tr("matches llmlab.model.apply_rope.", "与 llmlab.model.apply_rope 一致。"),
    )


RELATIVE_OPTIONS = ("s(14, 6)", "s(107, 103)", "s(3, 7)", "s(8, 4)", "s(7, 7)", "s(70, 30)")
_RELATIVE_RIGHT = frozenset({"s(107, 103)", "s(8, 4)"})
# (English, Chinese) per wrong option, resolved with tr when shown.
_RELATIVE_WHY = {
    "s(14, 6)": (
        "doubling both positions doubles their distance (8, not 4): RoPE keeps differences, not ratios.",
        "两个位置都翻倍，距离也跟着翻倍（是 8，不是 4）：RoPE 保持的是差，不是比。",
    ),
    "s(70, 30)": (
        "scaling both positions by 10 makes the distance 40: RoPE keeps differences, not ratios.",
        "两个位置都乘以 10，距离就成了 40：RoPE 保持的是差，不是比。",
    ),
    "s(3, 7)": (
        "the distance is −4 there, not 4: the rotation has a direction, and cos/sin of −4θ "
        "differ in the sine's sign.",
        "那里的距离是 −4，不是 4：旋转有方向，−4θ 与 4θ 的 cos 相同，sin 差一个符号。",
    ),
    "s(7, 7)": (
        "distance 0 is another distance: the score depends on m − n.",
        "距离 0 是另一个距离：分数取决于 m − n。",
    ),
}


def rope_relative(answer: Any) -> CheckResult:
    """s(m, n) = rope(q, m) · rope(k, n) for one fixed q and k. Which of RELATIVE_OPTIONS equal
    s(7, 3) for any q and k? A list of them (every one that does, none other)."""
    return _check_set(
        "ch02.rope_relative",
        answer,
        RELATIVE_OPTIONS,
        _RELATIVE_RIGHT,
        {k: tr(*v) for k, v in _RELATIVE_WHY.items()},
        missing=tr(
            "another option keeps what the score depends on; write m − n for each.",
            "还有一个选项保住了分数所依赖的量；把每个选项的 m − n 写出来。",
        ),
        success=tr(
            "right: rotating q by m and k by n leaves a dot product that sees only "
            "m − n, so a score depends on how far apart two tokens are, not where.",
            "正确：q 转 m、k 转 n 之后，点积只看得到 m − n，所以分数取决于两个 "
            "token 相隔多远，而不是它们在哪里。",
        ),
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
            (
                (gate * F.silu(up)) @ wd.T,
                tr(
                    "silu goes on the gate branch (gate_proj), not on up_proj.",
                    "silu 要作用在 gate 分支（gate_proj）上，不是 up_proj。",
                ),
            ),
            (
                (F.relu(gate) * up) @ wd.T,
                tr(
                    "that is ReLU; Llama's gate uses SiLU, x·sigmoid(x).",
                    "那是 ReLU；Llama 的 gate 用的是 SiLU，即 x·sigmoid(x)。",
                ),
            ),
            (
                (F.gelu(gate) * up) @ wd.T,
                tr(
                    "that is GELU; Llama's gate uses SiLU, x·sigmoid(x).",
                    "那是 GELU；Llama 的 gate 用的是 SiLU，即 x·sigmoid(x)。",
                ),
            ),
            (
                (torch.sigmoid(gate) * up) @ wd.T,
                tr(
                    "sigmoid alone is not SiLU: SiLU is x·sigmoid(x).",
                    "单独的 sigmoid 不是 SiLU：SiLU 是 x·sigmoid(x)。",
                ),
            ),
            (
                F.silu(gate) @ wd.T,
                tr(
                    "the up branch is missing: the gate multiplies up_proj(x) channel by channel.",
                    "少了 up 分支：gate 要和 up_proj(x) 逐通道相乘。",
                ),
            ),
            (
                F.silu(up) @ wd.T,
                tr(
                    "only one branch: silu(gate_proj(x)) multiplies up_proj(x).",
                    "只有一个分支：silu(gate_proj(x)) 要乘上 up_proj(x)。",
                ),
            ),
        ]
        return next((h for v, h in slips if _close(got, v)), None)

    return _check_function(
        "ch02.swiglu",
        fn,
        cases,
        diagnose,
        signature="fn(x, w_gate, w_up, w_down)",
        default=tr(
            "wrong values: check which branch goes through SiLU and what multiplies what.",
            "数值不对：检查哪个分支要过 SiLU，以及谁乘谁。",
        ),
        formula=tr(
            "down(silu(gate(x)) * up(x)), each of gate, up, down a matrix "
            "product with the weight transposed (nn.Linear stores [out, in]).",
            "down(silu(gate(x)) * up(x))，其中 gate、up、down 都是与转置后的"
            "权重做矩阵乘法（nn.Linear 按 [out, in] 存权重）。",
        ),
        success=tr("matches llmlab.model.MLP.", "与 llmlab.model.MLP 一致。"),
    )


# ---- the whole layer against the real layer 0 ----------------------------------------------------


@functools.lru_cache(maxsize=1)
def _real_layer0() -> tuple[Any, torch.Tensor, torch.Tensor, Any]:
    """(SmolLM2's real layer 0 as a `DecoderLayer`, PROMPT's embeddings [T, hidden], positions,
    the model's inverse RoPE frequencies), read straight from the converted weights."""
    from safetensors import safe_open

    from llmlab.config import get_config
    from llmlab.model import DecoderLayer, rope_inv_freq
    from llmlab.tokenizer import real_tokenizer
    from llmlab.weights import model_dir

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


# (English, Chinese) per slip, resolved with tr when shown.
_LAYER_HINTS = {
    "no residual after the MLP": (
        "the MLP's output replaces the hidden state: add it to the hidden "
        "state instead (the second residual).",
        "MLP 的输出顶替了隐藏状态：应该把它加到隐藏状态上（第二个残差连接）。",
    ),
    "no residual after attention": (
        "attention's output replaces the hidden state: add it to the "
        "layer's input (the first residual).",
        "注意力的输出顶替了隐藏状态：应该把它加到这一层的输入上（第一个残差连接）。",
    ),
    "no residuals": (
        "both residual additions are missing: each sub-block adds its output to the "
        "stream it read from.",
        "两处残差相加都漏了：每个子块都要把自己的输出加回它读入的那条数据流。",
    ),
    "post-norm": (
        "you normalised after adding; Llama normalises the *input* of each sub-block "
        "(pre-norm) and adds the raw sub-block output back.",
        "你是先相加再归一化；Llama 归一化的是每个子块的*输入*（pre-norm），再把子块未经"
        "归一化的输出加回去。",
    ),
    "input": (
        "that is the layer's input, unchanged: run it through your layer.",
        "这是这一层原封未动的输入：把它送进你的层里算一遍。",
    ),
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
        return report(
            not_yet(
                ex,
                tr(
                    f"expected a tensor [T, hidden], got {type(answer).__name__}.",
                    f"这里要一个形状为 [T, hidden] 的张量，你给的是 {type(answer).__name__}。",
                ),
            )
        )
    variants = _layer0_variants()
    want = variants["right"]
    if tuple(got.shape) != tuple(want.shape):
        return report(
            not_yet(
                ex,
                tr(
                    f"the prompt has {want.shape[0]} tokens of {want.shape[1]} numbers: "
                    f"the output must be {list(want.shape)}, got {list(got.shape)}.",
                    f"prompt 有 {want.shape[0]} 个 token，每个 {want.shape[1]} 个数："
                    f"输出必须是 {list(want.shape)}，你的是 {list(got.shape)}。",
                ),
            )
        )
    if not torch.isfinite(got).all():
        return report(
            not_yet(
                ex,
                tr(
                    "your output holds NaN or infinity: a -inf from the mask reached "
                    "a row with no allowed key, or a division by zero.",
                    "你的输出里有 NaN 或无穷大：要么掩码的 -inf 落到了一个没有任何"
                    "可见 key 的行上，要么出现了除以零。",
                ),
            )
        )
    if _close(got, want):
        diff = (got - want).abs().max().item()
        return report(
            passed(
                ex,
                tr(
                    f"your layer is SmolLM2's layer 0 (largest difference {diff:.1e}).",
                    f"你的层就是 SmolLM2 的第 0 层（最大差值 {diff:.1e}）。",
                ),
            )
        )
    for name, hint in _LAYER_HINTS.items():
        if _close(got, variants[name]):
            return report(not_yet(ex, tr(*hint)))
    return report(
        not_yet(
            ex,
            staged(
                ex,
                tr(
                    "not layer 0's output: check each piece against layer 0 (the comparison cells above), "
                    "then the order of the two sub-blocks.",
                    "不是第 0 层的输出：先把每个部件和第 0 层逐一对照（上面那些比较单元格），再检查两个"
                    "子块的顺序。",
                ),
                tr(
                    "out = h + mlp(norm2(h)) with h = x + attention(norm1(x)); attention uses RoPE on q and k "
                    "at positions 0..T-1 and o_proj on the heads put back side by side.",
                    "out = h + mlp(norm2(h))，其中 h = x + attention(norm1(x))；注意力在位置 0..T-1 上对 q 和 "
                    "k 施加 RoPE，各个头并排拼回去之后再过 o_proj。",
                ),
            ),
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
        return report(
            not_yet(
                ex,
                tr(
                    f"answer a list of options, chosen from {list(options)}.",
                    f"请用一个选项列表作答，选项取自 {list(options)}。",
                ),
            )
        )
    norm = {" ".join(a.split()).lower(): a for a in items}
    known = {o.lower(): o for o in options}
    unknown = sorted(
        a for n, a in norm.items() if n.replace(" ", "") not in {k.replace(" ", "") for k in known}
    )
    if unknown:
        return report(
            not_yet(
                ex,
                tr(
                    f"choose from {list(options)}; got {unknown}.",
                    f"请从 {list(options)} 中选；你给的是 {unknown}。",
                ),
            )
        )
    chosen = {
        next(o for k, o in known.items() if k.replace(" ", "") == n.replace(" ", "")) for n in norm
    }
    wrong = sorted(chosen - right)
    if wrong:
        return report(
            not_yet(
                ex, tr(f"{wrong[0]}: {why_wrong[wrong[0]]}", f"{wrong[0]}：{why_wrong[wrong[0]]}")
            )
        )
    if chosen != right:
        return report(not_yet(ex, missing))
    return report(passed(ex, success))
