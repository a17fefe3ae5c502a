"""Self-checks of chapter 07 (roofline): the ridge point, the intensity of a batched decode
GEMV and of GQA decode attention, which roof a decode step sits under, the batch at which it
leaves the memory roof (the roofline explorer's task), and why context moves that batch.

Build exercise `step_cost`: the student counts the FLOPs and bytes of every operation of one
engine step; checked against `llmlab.analysis.costs.step_costs` on steps drawn with hypothesis,
then plugged into `roofline.engine_step` on the real engine's steps of SmolLM2 (measured)."""

from __future__ import annotations

import functools
import math
from typing import Any

from llmlab.analysis import costs, roofline
from llmlab.analysis.hardware import PRESETS
from llmlab.config import PRESETS as MODEL_PRESETS
from llmlab.config import ModelConfig, get_config
from llmlab.course.build import drive, find_counterexample
from llmlab.course.check.ch01 import combine_mistakes
from llmlab.course.check.core import (
    NOT_ANSWERED,
    CheckResult,
    ExerciseInfo,
    as_number,
    check_choice,
    check_number,
    not_yet,
    passed,
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


# ---------------------------------------------------------------------------------------------
# build exercise: the cost of one step

BUILDS = {"ch07.step_cost": "step_cost"}  # exercise -> the name of the student's function
STEP_COST_DRIVER = "llmlab.course.build.ch07:observe_step_cost"
ENGINE_STEPS_DRIVER = "llmlab.course.build.ch07:predict_engine_steps"
STEP_CASES = 40  # steps drawn per check
SHOWN_OPS = 2  # operations a hint details (the others are counted)
CONFIG_FIELDS = (
    "name",
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
)
LINEAR_OPS = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj", "lm_head")
# the rule of each operation (the skeleton's docstring says the same), shown from the second try
STEP_OP_HINTS = {
    "embed_tokens": (
        "embed_tokens is a lookup: no FLOPs; it reads one row of hidden_size numbers per new token.",
        "embed_tokens 是查表：没有 FLOPs；每个新 token 读出一行 hidden_size 个数。",
    ),
    "qkv_proj": (
        "qkv_proj multiplies every new token by W [hidden, (heads + 2·kv_heads)·head_dim] in every "
        "layer, 2 FLOP per multiply-add; its weights are read once per step.",
        "qkv_proj 在每一层把每个新 token 乘以 W [hidden, (heads + 2·kv_heads)·head_dim]，"
        "一次乘加算 2 FLOP；权重每步只读一遍。",
    ),
    "attention": (
        "attention: the j-th of a sequence's n new tokens attends to context − n + j tokens, "
        "4·head_dim FLOP per attended token, query head and layer; every token of each context "
        "moves its K and V once: 2·kv_heads·head_dim·dtype_bytes per token and layer.",
        "attention：一条序列的 n 个新 token 中，第 j 个关注 context − n + j 个 token，"
        "每个被关注的 token、每个 query 头、每层 4·head_dim FLOP；每条序列上下文里的每个 token "
        "把它的 K 和 V 搬运一次：每个 token、每层 2·kv_heads·head_dim·dtype_bytes 字节。",
    ),
    "o_proj": (
        "o_proj multiplies every new token by W [heads·head_dim, hidden] in every layer, 2 FLOP "
        "per multiply-add; its weights are read once per step.",
        "o_proj 在每一层把每个新 token 乘以 W [heads·head_dim, hidden]，一次乘加算 2 FLOP；"
        "权重每步只读一遍。",
    ),
    "gate_up_proj": (
        "gate_up_proj is two matrices [hidden, intermediate] in every layer, for every new token, "
        "2 FLOP per multiply-add; its weights are read once per step.",
        "gate_up_proj 是每层两个 [hidden, intermediate] 矩阵，作用于每个新 token，一次乘加算 "
        "2 FLOP；权重每步只读一遍。",
    ),
    "down_proj": (
        "down_proj multiplies every new token by W [intermediate, hidden] in every layer, 2 FLOP "
        "per multiply-add; its weights are read once per step.",
        "down_proj 在每一层把每个新 token 乘以 W [intermediate, hidden]，一次乘加算 2 FLOP；"
        "权重每步只读一遍。",
    ),
    "lm_head": (
        "lm_head is one matrix [hidden, vocab] (not one per layer), applied to one row per "
        "sequence, its sampled position; its weights are read once per step.",
        "lm_head 是一个 [hidden, vocab] 矩阵（不是每层一个），每条序列只作用于一行，"
        "即它采样的那个位置；权重每步只读一遍。",
    ),
}
# (mistake, English, Chinese): what a recognised wrong count means, first match shown
STEP_COST_MISTAKES = (
    (
        "weights_per_sequence",
        "the weights are counted once per sequence: a step reads each weight once, and every "
        "sequence of the batch uses it.",
        "权重按每条序列各算了一遍：一步只读一遍每个权重，batch 里的每条序列都用它。",
    ),
    (
        "query_heads_for_kv",
        "the K/V bytes use num_attention_heads: with GQA only num_key_value_heads K and V heads "
        "are cached, shared by the query heads of a group.",
        "K/V 的字节用了 num_attention_heads：用 GQA 时，缓存里只有 num_key_value_heads 个 K、V 头，"
        "由一组 query 头共用。",
    ),
    (
        "half_the_flops",
        "a matmul [m, k] × [k, n] is m·n·k multiply-adds, and one multiply-add is 2 FLOP.",
        "矩阵乘 [m, k] × [k, n] 有 m·n·k 次乘加，一次乘加是 2 FLOP。",
    ),
    (
        "lm_head_every_token",
        "the lm head runs on every new token: logits are computed only at the sampled positions, "
        "one row per sequence (a prompt's earlier positions sample nothing).",
        "lm head 作用在了每个新 token 上：只有采样的位置才算 logits，每条序列一行"
        "（prompt 前面的位置什么也不采样）。",
    ),
    (
        "whole_embedding_table",
        "embed_tokens reads the whole table: a lookup reads only the rows of the step's tokens.",
        "embed_tokens 读了整张表：查表只读这一步的 token 对应的那几行。",
    ),
    (
        "no_causal_mask",
        "every new token attends to the whole context: with the causal mask a prompt token sees "
        "only the tokens up to itself.",
        "每个新 token 都关注了整个上下文：有因果掩码时，prompt 里的一个 token 只看得到它自己及之前的 token。",
    ),
    (
        "kv_per_new_token",
        "the K/V bytes are counted once per new token: a sequence's cached K and V move once per "
        "step, shared by all its new tokens.",
        "K/V 字节按每个新 token 各算了一遍：一条序列缓存的 K 和 V 每步只搬运一次，它的所有新 token 共用。",
    ),
)


def config_fields(cfg: ModelConfig) -> dict:
    """The fields of `cfg` a step's cost depends on, as plain data (what travels to a driver)."""
    return {name: getattr(cfg, name) for name in CONFIG_FIELDS}


def _drawn_config(
    layers: int,
    kv_heads: int,
    group: int,
    head_dim: int,
    hidden: int,
    intermediate: int,
    vocab: int,
) -> dict:
    return {
        "name": "drawn",
        "vocab_size": vocab,
        "hidden_size": hidden,
        "intermediate_size": intermediate,
        "num_hidden_layers": layers,
        "num_attention_heads": kv_heads * group,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
    }


def step_cases() -> Any:
    """Hypothesis strategy of (config fields, batch, dtype_bytes): drawn configs of 1-4 layers
    with MHA, GQA or MQA (up to 8 query heads per K/V head) and sizes up to real models'; 1-6
    sequences, each decoding, bringing a whole prompt, or bringing prompt tokens after a cached
    prefix; contexts up to 8K. Shrinking leads to the smallest model and batch that disagree."""
    from hypothesis import strategies as st

    configs = st.builds(
        _drawn_config,
        layers=st.integers(1, 4),
        kv_heads=st.integers(1, 8),
        group=st.integers(1, 8),
        head_dim=st.integers(1, 128),
        hidden=st.integers(1, 8192),
        intermediate=st.integers(1, 28_672),
        vocab=st.integers(1, 128_256),
    )
    sequence = st.one_of(
        st.integers(1, 8192).map(lambda c: (1, c)),  # decoding one token
        st.integers(1, 2048).map(lambda n: (n, n)),  # a whole prompt
        st.tuples(st.integers(1, 512), st.integers(1, 8192)).map(lambda t: (t[0], t[0] + t[1])),
    )
    return st.tuples(
        configs, st.lists(sequence, min_size=1, max_size=6), st.sampled_from([2, 1, 4])
    )


def _package_costs(case: tuple) -> dict[str, list[float]]:
    fields, batch, dtype_bytes = case
    ops = costs.step_costs(ModelConfig(**fields), [tuple(p) for p in batch], dtype_bytes)
    return {op: [f, b] for op, (f, b) in ops.items()}


def _same(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-6)


def _same_costs(got: Any, expected: dict) -> bool:
    return (
        isinstance(got, dict)
        and set(got) == set(expected)
        and all(_same(got[op][i], expected[op][i]) for op in expected for i in (0, 1))
    )


def _num(x: float) -> str:
    return f"{x:,.0f}" if float(x).is_integer() else f"{x:,.6g}"


def _describe_sequence(new: int, context: int) -> tuple[str, str]:
    if new == 1:
        return f"decoding 1 token at context {context}", f"在上下文 {context} 处 decode 1 个 token"
    if new == context:
        return f"bringing a whole prompt of {new} tokens", f"带来一个 {new} 个 token 的完整 prompt"
    return (
        f"bringing {new} prompt tokens after {context - new} cached ones (context {context})",
        f"在已缓存的 {context - new} 个 token 之后带来 {new} 个 prompt token（上下文 {context}）",
    )


def describe_step(fields: dict, batch: list, dtype_bytes: float) -> str:
    """A drawn step in words: the batch, the model's shape and the bytes per number."""
    seqs = [_describe_sequence(n, c) for n, c in batch]
    if len(seqs) == 1:
        en, zh = f"1 sequence {seqs[0][0]}", f"1 条序列，{seqs[0][1]}"
    elif len(set(seqs)) == 1:
        en, zh = (
            f"{len(seqs)} sequences, each {seqs[0][0]}",
            f"{len(seqs)} 条序列，每条都{seqs[0][1]}",
        )
    else:
        en = f"{len(seqs)} sequences: " + "; ".join(f"({i + 1}) {s[0]}" for i, s in enumerate(seqs))
        zh = f"{len(seqs)} 条序列：" + "；".join(f"({i + 1}) {s[1]}" for i, s in enumerate(seqs))
    preset = MODEL_PRESETS.get(fields["name"])
    if preset is not None and config_fields(preset) == fields:
        model_en, model_zh = f"the {fields['name']} preset", f"预设 {fields['name']}"
    else:
        f = fields
        model_en = (
            f"a model of {f['num_hidden_layers']} layer(s), hidden_size {f['hidden_size']}, "
            f"{f['num_attention_heads']} query head(s) and {f['num_key_value_heads']} K/V head(s) "
            f"of head_dim {f['head_dim']}, intermediate_size {f['intermediate_size']}, "
            f"vocab_size {f['vocab_size']}"
        )
        model_zh = (
            f"一个 {f['num_hidden_layers']} 层的模型，hidden_size {f['hidden_size']}，"
            f"{f['num_attention_heads']} 个 query 头、{f['num_key_value_heads']} 个 K/V 头，"
            f"head_dim {f['head_dim']}，intermediate_size {f['intermediate_size']}，"
            f"vocab_size {f['vocab_size']}"
        )
    return tr(
        f"{en}; {model_en}; {_num(dtype_bytes)} byte(s) per number",
        f"{zh}；{model_zh}；每个数 {_num(dtype_bytes)} 字节",
    )


def _step_cost_mistake(case: tuple, got: dict, expected: dict) -> tuple[str, str, str] | None:
    """The first row of STEP_COST_MISTAKES that explains the student's counts on `case`."""
    fields, batch, dtype_bytes = case
    seqs, tokens = len(batch), sum(n for n, _ in batch)
    group = fields["num_attention_heads"] // fields["num_key_value_heads"]
    layers, head_dim = fields["num_hidden_layers"], fields["head_dim"]
    kv = fields["num_key_value_heads"] * head_dim
    q = fields["num_attention_heads"] * head_dim
    all_pairs = sum(n * c for n, c in batch)

    def ratio(op: str, i: int) -> float | None:
        return got[op][i] / expected[op][i] if expected[op][i] else None

    def is_(x: float | None, y: float) -> bool:
        return x is not None and _same(x, y)

    def differs(op: str, i: int) -> bool:
        return not _same(got[op][i], expected[op][i])

    checks = {
        "weights_per_sequence": seqs > 1
        and any(is_(ratio(op, 1), seqs) or is_(ratio(op, 1), tokens) for op in LINEAR_OPS),
        "query_heads_for_kv": group > 1 and is_(ratio("attention", 1), group),
        "half_the_flops": any(is_(ratio(op, 0), 0.5) for op in LINEAR_OPS),
        "lm_head_every_token": tokens > seqs and is_(ratio("lm_head", 0), tokens / seqs),
        "whole_embedding_table": differs("embed_tokens", 1)
        and is_(got["embed_tokens"][1], fields["vocab_size"] * fields["hidden_size"] * dtype_bytes),
        "no_causal_mask": differs("attention", 0)
        and is_(got["attention"][0], 4 * q * layers * all_pairs),
        "kv_per_new_token": differs("attention", 1)
        and is_(got["attention"][1], 2 * kv * layers * dtype_bytes * all_pairs),
    }
    return next((row for row in STEP_COST_MISTAKES if checks[row[0]]), None)


def step_cost_hint(cex: Any) -> str:
    """The hint of a counterexample: the shrunk step, each operation counted differently (the
    student's and the package's), the mistake when it is a known one; from the second try on,
    the rule of the first wrong operation."""
    from llmlab.course.build import Raised

    fields, batch, dtype_bytes = cex.case
    where = describe_step(fields, batch, dtype_bytes)
    got, expected = cex.got, cex.expected
    if isinstance(got, Raised):
        return tr(
            f"on the step {where}: your step_cost raised {got.error}: {got.message}",
            f"在这一步（{where}）上：你的 step_cost 抛出了 {got.error}：{got.message}",
        )
    if not isinstance(got, dict) or set(got) != set(expected):
        ops = sorted(got) if isinstance(got, dict) else got
        return tr(
            f"on the step {where}: your step_cost returned the operations {ops}; "
            f"count each of {list(costs.STEP_OPS)}, no more.",
            f"在这一步（{where}）上：你的 step_cost 返回的操作是 {ops}；"
            f"请逐个统计 {list(costs.STEP_OPS)}，不多也不少。",
        )
    wrong = [op for op in costs.STEP_OPS if not _same_costs({op: got[op]}, {op: expected[op]})]
    shown, more = wrong[:SHOWN_OPS], len(wrong) - SHOWN_OPS
    diffs_en = "; ".join(
        f"{op}: yours (FLOPs, bytes) = ({_num(got[op][0])}, {_num(got[op][1])}), "
        f"the package's = ({_num(expected[op][0])}, {_num(expected[op][1])})"
        for op in shown
    ) + (f"; and {more} more operation(s) differ" if more > 0 else "")
    diffs_zh = "；".join(
        f"{op}：你的 (FLOPs, bytes) = ({_num(got[op][0])}, {_num(got[op][1])})，"
        f"package 的 = ({_num(expected[op][0])}, {_num(expected[op][1])})"
        for op in shown
    ) + (f"；另有 {more} 个操作也不同" if more > 0 else "")
    first = tr(f"on the step {where}: {diffs_en}.", f"在这一步（{where}）上：{diffs_zh}。")
    mistake = _step_cost_mistake(cex.case, got, expected)
    if mistake is not None:
        first = tr(f"{first} {mistake[1]}", f"{first}{mistake[2]}")
    return staged("ch07.step_cost", first, tr(*STEP_OP_HINTS[wrong[0]]))


@functools.lru_cache(maxsize=1)
def engine_steps() -> tuple[ModelConfig, tuple[roofline.EngineStep, ...], int]:
    """SmolLM2-135M's real engine steps (cached per process, one model load per kernel): a
    prompt alone (prefill), then it decoding beside a prompt whose first 32 tokens it had
    cached and a fresh one (mixed), then all three decoding."""
    import torch

    from llmlab.engine.llm import LLM
    from llmlab.model import load_model
    from llmlab.sampling import SamplingParams

    model, _ = load_model("smollm2-135m")
    llm = LLM(model, max_model_len=128)
    first = list(range(1000, 1048))
    steps = roofline.record_engine_steps(
        llm,
        [first, first[:32] + list(range(2000, 2005)), list(range(3000, 3010))],
        SamplingParams(temperature=0, max_tokens=2, ignore_eos=True),
        arrive_at=[0, 1, 1],
    )
    return model.config, tuple(steps), torch.tensor([], dtype=model.dtype).element_size()


def _plugged_in(answer: Any) -> CheckResult:
    """The student's counter on the engine's real steps, through `roofline.engine_step`'s
    `step_cost`: its totals must equal the package's; the measured times are shown beside."""
    ex = "ch07.step_cost"
    cfg, steps, dtype_bytes = engine_steps()
    batches = [[list(p) for p in s.batch] for s in steps]
    try:
        mine = drive(answer, ENGINE_STEPS_DRIVER, config_fields(cfg), batches, dtype_bytes)
    except TimeoutError:
        raise
    except Exception as e:  # the student's code, on a step of the real engine
        return report(
            not_yet(
                ex,
                tr(
                    f"on the engine's steps your step_cost raised {type(e).__name__}: {e}",
                    f"在引擎真实的步上，你的 step_cost 抛出了 {type(e).__name__}：{e}",
                ),
            )
        )
    hw = roofline.quick_roof("cpu")
    ridge = roofline.ridge_point(hw, "fp32")
    lines = [
        tr(
            f"measured on this machine (quick roof: {hw.mem_bw / 1e9:.1f} GB/s, "
            f"{hw.flops('fp32') / 1e9:.0f} GFLOP/s fp32, ridge {ridge:.1f} FLOP/B), "
            f"{cfg.name} in fp32, the engine's {len(steps)} steps (new/context per sequence):",
            f"在本机实测（快速测得的屋顶：{hw.mem_bw / 1e9:.1f} GB/s，"
            f"fp32 {hw.flops('fp32') / 1e9:.0f} GFLOP/s，拐点 {ridge:.1f} FLOP/B），"
            f"{cfg.name}（fp32），引擎的 {len(steps)} 步（每条序列的 新token数/上下文）：",
        )
    ]
    for i, (step, (flops, nbytes)) in enumerate(zip(steps, mine), 1):
        ref = roofline.engine_step(cfg, step.batch, dtype_bytes)
        shape = " ".join(f"{n}/{c}" for n, c in step.batch)
        if not (_same(flops, ref.flops) and _same(nbytes, ref.bytes)):
            return report(
                not_yet(
                    ex,
                    tr(
                        f"on the engine's step {i} ({step.kind} [{shape}]) your counter sums to "
                        f"{_num(flops)} FLOPs and {_num(nbytes)} bytes, the package's to "
                        f"{_num(ref.flops)} and {_num(ref.bytes)}.",
                        f"在引擎的第 {i} 步（{step.kind} [{shape}]）上，你的计数加起来是 "
                        f"{_num(flops)} FLOPs、{_num(nbytes)} 字节，package 的是 "
                        f"{_num(ref.flops)} 和 {_num(ref.bytes)}。",
                    ),
                )
            )
        yours = roofline.place(roofline.Operation("", flops, nbytes), hw, "fp32")
        pkg = roofline.place(ref, hw, "fp32")
        lines.append(
            tr(
                f"  step {i} {step.kind} [{shape}]: yours {yours.op.intensity:.1f} FLOP/B -> "
                f"{yours.time_floor * 1e3:.2f} ms ({yours.bound}-bound) | package "
                f"{pkg.op.intensity:.1f} FLOP/B -> {pkg.time_floor * 1e3:.2f} ms | "
                f"measured {step.seconds * 1e3:.1f} ms",
                f"  第 {i} 步 {step.kind} [{shape}]：你的 {yours.op.intensity:.1f} FLOP/B -> "
                f"{yours.time_floor * 1e3:.2f} ms（{yours.bound}-bound）| package "
                f"{pkg.op.intensity:.1f} FLOP/B -> {pkg.time_floor * 1e3:.2f} ms | "
                f"实测 {step.seconds * 1e3:.1f} ms",
            )
        )
    print("\n".join(lines))
    return report(
        passed(
            ex,
            tr(
                f"your counter equals the package's on every drawn step and predicts the "
                f"engine's {len(steps)} real steps as the package does (measured times above).",
                f"你的计数在每个随机抽取的步上都与 package 的相同，对引擎真实的 {len(steps)} 步"
                f"也给出与 package 相同的预测（实测时间见上）。",
            ),
        )
    )


def step_cost(answer: Any) -> CheckResult:
    """Build exercise: the student's `step_cost(cfg, batch, dtype_bytes)` -> {op: (flops, bytes)}
    against `costs.step_costs` on STEP_CASES drawn steps (the smallest disagreement shown), then
    plugged into `roofline.engine_step` on the real engine's steps of SmolLM2, measured."""
    ex = "ch07.step_cost"
    if answer is None:
        return report(not_yet(ex, NOT_ANSWERED))
    if not callable(answer):
        return report(
            not_yet(
                ex,
                tr(
                    f"expected your function step_cost, got {type(answer).__name__}.",
                    f"这里要你写的函数 step_cost，你给的是 {type(answer).__name__}。",
                ),
            )
        )
    cex = find_counterexample(
        step_cases(),
        lambda case: drive(answer, STEP_COST_DRIVER, case),
        _package_costs,
        max_examples=STEP_CASES,
        compare=_same_costs,
    )
    if cex is not None:
        return report(not_yet(ex, step_cost_hint(cex)))
    return _plugged_in(answer)


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
    "step_cost": ExerciseInfo(
        "reasoning",
        tuple(row[0].replace("_", " ") for row in STEP_COST_MISTAKES),
    ),
}
