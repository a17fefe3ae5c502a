"""Self-checks of chapter 05 (prefill vs decode): which steps of a forward write and read the
KV cache (the source chapter's self-check question 1: both happen inside the attention step, as in
`llmlab.ops.attention` and vLLM's attention backends), FLOPs of a decode step, arithmetic
intensity at a batch, where a prefill turns compute-bound on another card, and which phase is
compute-bound."""

from __future__ import annotations

from typing import Any

from llmlab.analysis import costs, roofline
from llmlab.config import get_config
from llmlab.course.check.core import CheckResult, ExerciseInfo, check_choice, check_number
from llmlab.i18n import Bilingual, tr

# the steps of one generation step, in order (the source chapter's self-check question 1)
STEPS = ["tokenize", "embed", "qkv_projection", "attention", "ffn", "lm_head", "sample"]
PRESET = "llama-3-70b"
DECODE_CONTEXT = 1  # "a short context": the KV term is negligible
BATCH = 24  # decode_intensity: FP8 weights (1 byte each) at this batch
WEIGHT_BYTES = 1
RIDGE_MODEL, RIDGE_GPU = "llama-3-8b", "H200"  # prefill_ridge_tokens: BF16 on an H200

# (English, Chinese) per step that neither writes nor reads the cache, resolved with tr when shown.
_NO_CACHE = {
    "tokenize": (
        "tokenizing turns text into ids before the model runs; no K or V exists yet.",
        "分词在模型运行之前把文本变成 id；这时还没有任何 K 或 V。",
    ),
    "embed": (
        "the embedding looks up one row per token; it works on each token alone.",
        "embedding 为每个 token 查出一行；它对每个 token 单独处理。",
    ),
    "ffn": (
        "the FFN (MLP) transforms each token on its own and never looks at other tokens.",
        "FFN（前馈网络，即 MLP）对每个 token 单独做变换，从不看别的 token。",
    ),
    "lm_head": (
        "the lm_head maps the last hidden state to logits; it works on each token alone.",
        "lm_head 把最后的隐藏状态映射成 logits；它对每个 token 单独处理。",
    ),
    "sample": (
        "sampling picks a token from the logits; the model's layers are done by then.",
        "采样是从 logits 里挑出一个 token；到这一步，模型的各层早已算完。",
    ),
}


# Exercise 5: why the attention step stores this step's k and v before it reads the cache.
ORDER_OPTIONS_EN = {
    "same_result": "nothing: the output is the same either way",
    "token_misses_itself": "each new token would attend to every earlier token but not to itself: "
    "its own key and value would be missing from the softmax",
    "cache_overflows": "the cache would run out of slots sooner",
    "earlier_keys_overwritten": "the new k and v would overwrite earlier tokens' entries",
}
ORDER_OPTIONS_ZH = {
    "same_result": "没有影响：两种顺序的输出完全一样",
    "token_misses_itself": "每个新 token 会关注之前所有的 token，却关注不到它自己：softmax 里少了它自己的 key 和 value",
    "cache_overflows": "cache 会更早用完槽位",
    "earlier_keys_overwritten": "新的 k 和 v 会覆盖之前 token 的条目",
}
# shown in the language in use; the keys are what the student answers with
ORDER_OPTIONS = Bilingual(ORDER_OPTIONS_EN, ORDER_OPTIONS_ZH)
_ORDER_HINTS = {  # (English, Chinese)
    "same_result": (
        "with the causal mask, position i attends to the keys of positions up to and "
        "*including* i: is this step's own key in the cache when the read happens?",
        "在因果掩码下，位置 i 关注的是直到 i（*包括* i 本身）的所有 key：读取发生的时候，这一步自己的 key 已经在 cache 里了吗？",
    ),
    "cache_overflows": (
        "the same entries are written either way; only the order of the write and the "
        "read changes.",
        "两种顺序写入的条目一样多；变的只是写和读的先后。",
    ),
    "earlier_keys_overwritten": (
        "each new token is written at its own slot (`slot_mapping`); the "
        "order of write and read does not change where.",
        "每个新 token 写在它自己的槽位上（`slot_mapping`）；写和读的先后不会改变写在哪里。",
    ),
}


def write_before_read(answer: Any) -> CheckResult:
    """The attention step stores this step's k and v in the cache, then attends over everything
    cached. What would go wrong if it attended first and stored afterwards? One key of
    ORDER_OPTIONS."""
    return check_choice(
        "ch05.write_before_read",
        answer,
        "token_misses_itself",
        options=list(ORDER_OPTIONS),
        hints={k: tr(*v) for k, v in _ORDER_HINTS.items()},
    )


def cache_reads(answer: Any) -> CheckResult:
    """A decode step at a long context (many tokens already cached) against one at a short context:
    which step(s) of STEPS take longer? A name or a list of names."""
    hints = {k: tr(*v) for k, v in _NO_CACHE.items()}
    hints["qkv_projection"] = tr(
        "the projections compute this token's own q, k, v from its hidden "
        "state; they need nothing from earlier tokens.",
        "投影从这个 token 自己的隐藏状态算出它的 q、k、v；用不到之前 token 的任何东西。",
    )
    return check_choice("ch05.cache_reads", answer, {"attention"}, options=STEPS, hints=hints)


def decode_flops(answer: Any) -> CheckResult:
    """Llama-3-70B: FLOPs for one decode token at a short context (counting the lm_head)."""
    cfg = get_config(PRESET)
    expected = costs.flops_per_token(cfg, DECODE_CONTEXT, "decode")
    n = costs.param_count(cfg)
    return check_number(
        "ch05.decode_flops",
        answer,
        expected,
        rel=0.03,
        mistakes=[
            (
                n,
                tr(
                    "that is the number of parameters: each weight costs one multiply and one add, 2 FLOPs.",
                    "这是参数个数：每个权重要做一次乘法和一次加法，即 2 FLOPs。",
                ),
            ),
            (
                2 * n * 2,
                tr(
                    "that doubles it again: 2 FLOPs per weight, not 2 per byte.",
                    "又多乘了一个 2：是每个权重 2 FLOPs，不是每个字节 2 FLOPs。",
                ),
            ),
            (
                2 * n / 1e12,
                tr(
                    "that is a TFLOP figure; the question asks for FLOPs.",
                    "这是以 TFLOP 为单位的数；题目问的是 FLOPs。",
                ),
            ),
        ],
        default_hint=tr(
            "not the FLOPs of one decode token; think about what one weight costs a token "
            "passing through it.",
            "不是一个 decode token 的 FLOPs；想一想一个 token 经过一个权重要花多少计算。",
        ),
        formula=tr(
            "every weight a token meets costs one multiply-add (2 FLOPs); at a short context "
            "attention adds almost nothing.",
            "token 遇到的每个权重都要做一次乘加（2 FLOPs）；上下文很短时，注意力带来的计算几乎可以忽略。",
        ),
    )


def decode_intensity(answer: Any) -> CheckResult:
    """Llama-3-70B with FP8 weights (WEIGHT_BYTES byte each), decode at batch BATCH, short context:
    FLOPs per byte read from memory (arithmetic intensity). Count the weights as the only bytes."""
    cfg = get_config(PRESET)
    flops = costs.decode_flops(cfg, BATCH, DECODE_CONTEXT)
    bytes_ = costs.weight_bytes(cfg, WEIGHT_BYTES)
    expected = flops / bytes_
    return check_number(
        "ch05.decode_intensity",
        answer,
        expected,
        rel=0.05,
        mistakes=[
            (
                expected / BATCH,
                tr(
                    "that is batch 1: the weights are read once for the whole batch, but "
                    "every sequence in it does its own FLOPs.",
                    "这是 batch 为 1 时的值：整个 batch 只读一遍权重，但其中每个序列都要做"
                    "自己的那份 FLOPs。",
                ),
            ),
            (
                expected / 2,
                tr(
                    "that counts 2 bytes per weight (BF16); these weights are FP8, 1 byte each.",
                    "这里每个权重按 2 个字节（BF16）算了；这些权重是 FP8，每个 1 个字节。",
                ),
            ),
            (
                bytes_ / flops,
                tr(
                    "upside down: intensity is FLOPs divided by bytes.",
                    "颠倒了：算术强度是 FLOPs 除以字节数。",
                ),
            ),
            (
                expected * BATCH,
                tr(
                    "the bytes are read once per step, not once per sequence: do not "
                    "divide them by the batch again.",
                    "字节是每步读一次，不是每个序列读一次：不要再把它们除以 batch。",
                ),
            ),
            (
                expected / 2 / BATCH,
                tr(
                    "that is one multiply-add per 2 bytes at batch 1; count the whole "
                    "batch and 1 byte per FP8 weight.",
                    "这是 batch 为 1、每 2 个字节一次乘加的值；要算上整个 batch，而且"
                    "每个 FP8 权重只占 1 个字节。",
                ),
            ),
        ],
        default_hint=tr(
            "not the intensity of this step; count the step's FLOPs and the bytes it reads.",
            "不是这一步的算术强度；数一数这一步的 FLOPs 和它读的字节数。",
        ),
        formula=tr(
            "FLOPs of the step (batch × 2 FLOPs per weight) ÷ bytes of the weights (1 per FP8 weight).",
            "这一步的 FLOPs（batch × 每个权重 2 FLOPs）÷ 权重的字节数（每个 FP8 权重 1 个字节）。",
        ),
    )


def _prefill_ridge(gpu: str, model: str = RIDGE_MODEL) -> int:
    cfg = get_config(model)
    return next(
        n
        for n in range(1, 1 << 16)
        if roofline.place(roofline.prefill_step(cfg, n), gpu, "bf16").bound == "compute"
    )


def prefill_ridge_tokens(answer: Any) -> CheckResult:
    """Llama-3-8B in BF16 on an H200: from about how many prompt tokens is a prefill
    compute-bound (its arithmetic intensity past the card's ridge point)?"""
    expected = _prefill_ridge(RIDGE_GPU)
    h100 = _prefill_ridge("H100-SXM")
    return check_number(
        "ch05.prefill_ridge_tokens",
        answer,
        expected,
        rel=0.15,
        mistakes=[
            (
                h100,
                tr(
                    "that is the H100: the H200 has the same arithmetic but faster memory, so its ridge "
                    "point, and with it this length, is lower.",
                    "这是 H100 的值：H200 的算力相同，但显存更快，所以它的拐点更低，这个长度也随之更低。",
                ),
            ),
            (
                1.0,
                tr(
                    "a prefill of one token is a decode step; it is memory-bound.",
                    "只有一个 token 的 prefill 就是一步 decode；它是 memory-bound 的。",
                ),
            ),
        ],
        default_hint=tr(
            "not where this card's prefill turns compute-bound; compare the card's FLOP/s "
            "with its bandwidth.",
            "不是这张卡上 prefill 转为 compute-bound 的位置；拿这张卡的 FLOP/s 和它的带宽比一比。",
        ),
        formula=tr(
            "a prefill of n tokens does about 2n FLOPs per weight and reads each BF16 weight "
            "(2 bytes) once, so its intensity is about n FLOP/byte: find n where it passes "
            "the H200's peak FLOP/s ÷ bandwidth.",
            "n 个 token 的 prefill 每个权重大约做 2n FLOPs，每个 BF16 权重（2 个字节）只读一次，"
            "所以它的算术强度大约是 n FLOP/byte：找出它超过 H200 的峰值 FLOP/s ÷ 带宽的那个 n。",
        ),
    )


# Exercise 4: a short prompt's prefill, a case the chapter's "prefill is compute-bound" does not cover
SHORT_PREFILL_MODEL, SHORT_PREFILL_GPU, SHORT_PREFILL_TOKENS = "llama-3-8b", "H100-SXM", 24


def _short_prefill_bound() -> str:
    step = roofline.prefill_step(get_config(SHORT_PREFILL_MODEL), SHORT_PREFILL_TOKENS)
    return roofline.place(step, SHORT_PREFILL_GPU, "bf16").bound


def short_prefill_bound(answer: Any) -> CheckResult:
    """A chat turn of SHORT_PREFILL_TOKENS prompt tokens, Llama-3-8B in BF16 on an H100: is its
    prefill "compute"-bound or "memory"-bound?"""
    right = _short_prefill_bound()
    wrong = "compute" if right == "memory" else "memory"
    return check_choice(
        "ch05.short_prefill_bound",
        answer,
        right,
        options=["compute", "memory"],
        hints={
            wrong: tr(
                "'prefill is compute-bound' holds for long prompts only: a prefill reads "
                "every weight once whatever its length; how many FLOP per byte do so few "
                "tokens do, against the H100's ridge?",
                "「prefill 是 compute-bound」只对长 prompt 成立：无论多长，一次 prefill 都要把"
                "每个权重读一遍；这么少的 token 每字节做多少 FLOP？和 H100 的拐点比一比。",
            )
        },
    )


EXERCISES: dict[str, ExerciseInfo] = {
    "write_before_read": ExerciseInfo(
        "reasoning",
        ("order thought not to matter", "capacity blamed", "slots thought to move"),
        source_question=1,
    ),
    "cache_reads": ExerciseInfo(
        "reasoning", ("the qkv projection", "the FFN", "the lm_head"), source_question=1
    ),
    "decode_flops": ExerciseInfo(
        "plug-in", ("parameters, not FLOPs", "2 per byte", "TFLOP vs FLOP")
    ),
    "decode_intensity": ExerciseInfo(
        "reasoning",
        ("batch 1", "BF16 bytes for FP8 weights", "upside down", "bytes divided by the batch"),
    ),
    "prefill_ridge_tokens": ExerciseInfo("reasoning", ("the H100's ridge", "one token")),
    "short_prefill_bound": ExerciseInfo("reasoning", ("every prefill taken for compute-bound",)),
}
