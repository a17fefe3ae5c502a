"""Self-checks of chapter 07 (roofline): the ridge point, the intensity of a batched decode
GEMV and of GQA decode attention, which roof a decode step sits under, the batch at which it
leaves the memory roof (the roofline explorer's task), and why context moves that batch."""

from __future__ import annotations

from typing import Any

from llmlab.analysis import roofline
from llmlab.analysis.hardware import PRESETS
from llmlab.config import get_config
from llmlab.course.check.ch01 import combine_mistakes
from llmlab.course.check.core import (
    CheckResult,
    ExerciseInfo,
    as_number,
    check_choice,
    check_number,
    not_yet,
    record_expected,
    report,
    staged,
)
from llmlab.i18n import tr

GEMV_BATCH = 8  # decode_gemv_intensity: batch size
BOUND_BATCH = 64  # decode_bound: batch size of the Llama-3-70B decode step on H100 SXM
BOUND_CONTEXT = 1024
TASK_HARDWARE = "H100-SXM"  # compute_bound_batch: the roofline explorer's defaults
TASK_MODEL = "llama-3-70b"
TASK_CONTEXT = 1024

# why_crossover_grows: keys of the options (the notebook lists them in another order)
CROSSOVER_OPTIONS = (
    "ridge_moves",
    "attention_flops",
    "kv_bytes_per_sequence",
    "weights_per_sequence",
    "hbm_capacity",
)
# (English, Chinese) for each wrong option
CROSSOVER_WHY_WRONG = {
    "ridge_moves": (
        "the ridge is peak FLOP/s over bandwidth: a property of the device, the same at any context.",
        "拐点是峰值 FLOP/s 除以带宽：它是设备的属性，上下文多长都一样。",
    ),
    "attention_flops": (
        "more attention FLOPs would push the step towards compute, so the crossover would come "
        "sooner, not later; look at what grows in the denominator of the intensity.",
        "注意力的 FLOPs 变多会把这一步推向 compute-bound，交叉点只会来得更早，而不是更晚；"
        "看看算术强度的分母里是什么在变大。",
    ),
    "weights_per_sequence": (
        "the weights are read once per step whatever the batch: that is why batching helps.",
        "不管 batch 多大，每步只读一遍权重：batching 之所以有用，正是因为这一点。",
    ),
    "hbm_capacity": (
        "true on one card, but the roofline knows nothing of capacity: its floor moved for a "
        "reason in the bytes each step moves.",
        "单卡上确实如此，但 roofline 模型不管容量：它的下限移动，原因在每一步搬运的字节数里。",
    ),
}


def ridge_point(answer: Any) -> CheckResult:
    """Ridge point of the H100-SXM preset (datasheet) in BF16, in FLOP/byte."""
    h = PRESETS["H100-SXM"]
    expected = roofline.ridge_point(h, "bf16")
    return check_number(
        "ch07.ridge_point",
        answer,
        expected,
        rel=0.02,
        mistakes=combine_mistakes(
            (
                roofline.ridge_point(PRESETS["H100-SXM-source"], "bf16"),
                tr(
                    "that is the source chapter's round 1000 TFLOPS / 3 TB/s; use the datasheet preset H100-SXM.",
                    "这是原章节取整的 1000 TFLOPS / 3 TB/s；请用按规格表设定的预设 H100-SXM。",
                ),
            ),
            (
                1 / expected,
                tr(
                    "upside down: the ridge is in FLOP per byte.",
                    "除反了：拐点的单位是 FLOP 每字节。",
                ),
            ),
            (
                roofline.ridge_point(h, "fp32"),
                tr(
                    "that is the FP32 peak; the question asks for BF16 (tensor cores).",
                    "这是 FP32 峰值；题目问的是 BF16（tensor core）。",
                ),
            ),
            (
                roofline.ridge_point(h, "fp8"),
                tr(
                    "that is the FP8 peak; the question asks for BF16.",
                    "这是 FP8 峰值；题目问的是 BF16。",
                ),
            ),
            (
                2 * h.peak_flops["bf16"] / h.mem_bw,
                tr(
                    "that uses the 2:4-sparsity peak; the roofline uses the dense peak.",
                    "这用的是 2:4 稀疏的峰值；roofline 模型用稠密峰值。",
                ),
            ),
        ),
        default_hint=tr(
            "the ridge is where the slanted roof meets the flat one; which two figures of "
            "the preset set those roofs?",
            "拐点是斜屋顶和平屋顶相交的地方；预设里哪两个数决定了这两条屋顶？",
        ),
        formula=tr(
            "Ridge = peak FLOP/s (bf16, dense) / memory bandwidth (bytes/s).",
            "拐点 = 峰值 FLOP/s（bf16，稠密）/ 显存带宽（bytes/s）。",
        ),
    )


def decode_gemv_intensity(answer: Any) -> CheckResult:
    """Arithmetic intensity (FLOP/byte) of a decode step's linear layers at batch GEMV_BATCH, BF16
    weights, counting only the weight bytes (a large model: activations are negligible)."""
    b = GEMV_BATCH
    expected = 2 * b / 2  # 2 FLOP per weight per token, 2 bytes per weight
    return check_number(
        "ch07.decode_gemv_intensity",
        answer,
        expected,
        rel=0.05,
        mistakes=combine_mistakes(
            (
                2 * b,
                tr(
                    "that forgets that each BF16 weight is 2 bytes.",
                    "这忘了每个 BF16 权重占 2 字节。",
                ),
            ),
            (
                b / 2,
                tr(
                    "a multiply-add is 2 FLOP per weight per token, not 1.",
                    "一次乘加算 2 FLOP（每个权重、每个 token），不是 1。",
                ),
            ),
            (
                1.0,
                tr(
                    "that is batch 1: with a batch every weight read from memory is used by every sequence.",
                    "这是 batch 为 1 的情形：有了 batch，从显存读出的每个权重会被每条序列都用上。",
                ),
            ),
            (
                2 * b / 4,
                tr(
                    "that uses 4 bytes per weight (FP32); the weights are BF16.",
                    "这里每个权重按 4 字节（FP32）算了；权重是 BF16。",
                ),
            ),
        ),
        default_hint=tr(
            "count per weight: how many FLOPs does one weight take part in across the batch, "
            "and how many bytes does reading it once cost?",
            "按单个权重来数：在整个 batch 里，一个权重参与多少 FLOPs？把它读一遍又要多少字节？",
        ),
        formula=tr(
            "FLOPs: 2 × weights × batch; bytes: weights × 2; divide.",
            "FLOPs：2 × 权重个数 × batch；字节：权重个数 × 2；两者相除。",
        ),
    )


def attention_intensity(answer: Any) -> CheckResult:
    """Arithmetic intensity (FLOP/byte) of Llama-3-70B's decode attention (GQA, BF16 KV cache)."""
    cfg = get_config("llama-3-70b")
    op = roofline.decode_attention(cfg, batch=1, context=1024, dtype_bytes=2)
    expected = op.intensity
    group = cfg.num_attention_heads // cfg.num_key_value_heads
    return check_number(
        "ch07.attention_intensity",
        answer,
        expected,
        rel=0.02,
        mistakes=combine_mistakes(
            (
                expected / group,
                tr(
                    "that is plain multi-head attention: with GQA each K/V head serves several query heads.",
                    "这是普通多头注意力的结果：用 GQA 时，每个 K/V 头要服务好几个 query 头。",
                ),
            ),
            (
                expected * 2,
                tr("each cached number is 2 bytes (BF16).", "缓存里的每个数占 2 字节（BF16）。"),
            ),
            (
                expected / 2,
                tr(
                    "a multiply-add is 2 FLOP; count QKᵀ and the weighted sum of V both.",
                    "一次乘加是 2 FLOP；QKᵀ 和对 V 的加权求和都要算上。",
                ),
            ),
            (
                expected * cfg.num_attention_heads / group,
                tr(
                    "count the query heads per K/V head, not all heads.",
                    "数的是每个 K/V 头对应的 query 头，不是全部的头。",
                ),
            ),
        ),
        default_hint=tr(
            "count per cached token and per layer: the FLOPs every query head spends on it, "
            "and the bytes of its K and V; layers and context cancel.",
            "按每个缓存的 token、每层来数：每个 query 头在它上面花的 FLOPs，以及它的 K、V 占的字节；"
            "层数和上下文长度会约掉。",
        ),
        formula=tr(
            "FLOPs per cached token: 2·heads·head_dim (scores) + 2·heads·head_dim (values); "
            "bytes per cached token: 2·kv_heads·head_dim·2.",
            "每个缓存 token 的 FLOPs：2·heads·head_dim（打分）+ 2·heads·head_dim（取值）；"
            "每个缓存 token 的字节：2·kv_heads·head_dim·2。",
        ),
    )


def decode_bound(answer: Any) -> CheckResult:
    """Llama-3-70B, BF16, on the H100-SXM preset: is a decode step at batch BOUND_BATCH (context
    BOUND_CONTEXT) "memory"- or "compute"-bound?"""
    cfg = get_config("llama-3-70b")
    p = roofline.place(roofline.decode_step(cfg, BOUND_BATCH, BOUND_CONTEXT, 2), "H100-SXM", "bf16")
    wrong = "compute" if p.bound == "memory" else "memory"
    hint = staged(
        "ch07.decode_bound",
        tr(
            "compare the step's intensity with the device's ridge point.",
            "把这一步的算术强度和设备的拐点比一比。",
        ),
        tr(
            "For the weights the intensity is about the batch (FLOP per byte), and the KV reads lower it.",
            "对权重来说，算术强度约等于 batch（FLOP 每字节），而读 KV 会把它拉低。",
        ),
    )
    return check_choice(
        "ch07.decode_bound", answer, p.bound, options=["memory", "compute"], hints={wrong: hint}
    )


def _crossover(hardware: str = TASK_HARDWARE, context: int = TASK_CONTEXT) -> int | None:
    return roofline.crossover_batch(get_config(TASK_MODEL), hardware, context=context)


def compute_bound_batch(answer: Any) -> CheckResult:
    """The smallest batch at which a decode step of Llama-3-70B (BF16, TASK_CONTEXT tokens of
    context per sequence) on the H100-SXM preset is no longer memory-bound: the roofline
    explorer's task."""
    expected = _crossover()
    mistakes = combine_mistakes(
        (
            _crossover(context=1),
            tr(
                "that is the crossover without a KV cache (context 1); each sequence here "
                "reads its own cache of the given context.",
                "这是没有 KV cache（上下文为 1）时的交叉点；这里每条序列都要读自己那份给定上下文长度的缓存。",
            ),
        ),
        (
            roofline.ridge_point(TASK_HARDWARE),
            tr(
                "that is the ridge point, an intensity; the question asks for a "
                "batch, and with KV reads batch and intensity differ.",
                "这是拐点，是一个算术强度；题目问的是 batch，而算上读 KV，batch 和算术强度并不相等。",
            ),
        ),
        (
            _crossover("H100-SXM-source"),
            tr(
                "that is the source chapter's round H100; use the H100-SXM preset.",
                "这是原章节取整的 H100；请用 H100-SXM 预设。",
            ),
        ),
        (
            _crossover("H200"),
            tr("that is H200; the question is about H100-SXM.", "这是 H200；题目问的是 H100-SXM。"),
        ),
        (
            expected - 1,
            tr(
                "at that batch the step is still memory-bound; the question asks for the first batch that is not.",
                "在这个 batch 下这一步仍是 memory-bound 的；题目要的是第一个不再 memory-bound 的 batch。",
            ),
        ),
        (
            1024,
            tr(
                "the batch slider moves one by one: the crossover lies below that power of two.",
                "batch 滑块是一格一格动的：交叉点在这个 2 的幂之下。",
            ),
        ),
    )
    record_expected("ch07.compute_bound_batch", expected)
    x = as_number(answer)
    if x is not None and expected < x < 1024 and x == int(x):
        return report(
            not_yet(
                "ch07.compute_bound_batch",
                tr(
                    "that batch is compute-bound, but a smaller one already "
                    "is: move the slider down one step at a time.",
                    "这个 batch 确实是 compute-bound 的，但更小的 batch 就已经是了："
                    "把滑块一格一格往下调。",
                ),
            )
        )
    return check_number(
        "ch07.compute_bound_batch",
        answer,
        expected,
        rel=0.1 / expected,
        mistakes=mistakes,
        default_hint=tr(
            "move the batch slider (context at its default) and watch the word "
            "in brackets on the result's first line; find the batch where it changes.",
            "拖动 batch 滑块（上下文保持默认），盯住结果第一行括号里的那个词；找出它变化的那个 batch。",
        ),
        formula=tr(
            "It is the first batch whose step intensity (weights' and every sequence's KV "
            "bytes counted) reaches the ridge point.",
            "它是第一个让这一步的算术强度（权重和每条序列的 KV 字节都算上）达到拐点的 batch。",
        ),
    )


def why_crossover_grows(answer: Any) -> CheckResult:
    """Why does the batch at which decode turns compute-bound grow with the context, and at long
    contexts never come? One of CROSSOVER_OPTIONS."""
    return check_choice(
        "ch07.why_crossover_grows",
        answer,
        "kv_bytes_per_sequence",
        options=list(CROSSOVER_OPTIONS),
        hints={key: tr(*pair) for key, pair in CROSSOVER_WHY_WRONG.items()},
    )


EXERCISES: dict[str, ExerciseInfo] = {
    "ridge_point": ExerciseInfo(
        "plug-in", ("source preset", "upside down", "FP32 peak", "FP8 peak", "sparse peak")
    ),
    "decode_gemv_intensity": ExerciseInfo(
        "plug-in", ("BF16 bytes forgotten", "1 FLOP per multiply-add", "batch 1", "FP32 bytes")
    ),
    "attention_intensity": ExerciseInfo(
        "reasoning", ("MHA instead of GQA", "bytes per number", "half the FLOPs", "all heads")
    ),
    "decode_bound": ExerciseInfo("reasoning", ("intensity vs ridge",)),
    "compute_bound_batch": ExerciseInfo(
        "plug-in",
        (
            "no KV cache",
            "ridge instead of batch",
            "source preset",
            "H200",
            "last memory-bound batch",
            "power of two",
        ),
    ),
    "why_crossover_grows": ExerciseInfo(
        "reasoning", ("ridge moves", "attention FLOPs", "weights per sequence", "HBM capacity")
    ),
}
