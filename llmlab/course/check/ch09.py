"""Self-checks of chapter 09 (parallelism): what a second data-parallel replica buys at low load,
column- vs row-parallel projections, all-reduces per forward under TP, the pipeline bubble, a
ring all-reduce's time over PCIe, the fastest TP degree for long contexts over PCIe (the
explorer's task), and which kind of parallelism leans on NVLink (the source chapter's learning
goal 3)."""

from __future__ import annotations

import functools
from typing import Any

from llmlab.config import get_config
from llmlab.course.check.core import (
    NOT_ANSWERED,
    CheckResult,
    ExerciseInfo,
    check_choice,
    check_dict_keys,
    check_number,
    not_yet,
    passed,
    refuse_package_piece,
    report,
    staged,
)
from llmlab.i18n import tr
from llmlab.parallel import cost, pp, tp

ALLREDUCE_MODEL, ALLREDUCE_TP = "smollm2-135m", 2
BUBBLE_P, BUBBLE_M = 4, 8
RING_TP, RING_BATCH, RING_MODEL, RING_LINK = 8, 64, "llama-3-70b", "pcie"
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
STYLES = ("column", "row", "replicated")
# the explorer's task: Llama-3-70B decode over PCIe at this batch and context, TP among TP_DEGREES
LONG_MODEL, LONG_LINK, LONG_BATCH, LONG_CONTEXT = "llama-3-70b", "pcie", 64, 16384
TP_DEGREES = (1, 2, 4, 8)

EXERCISES = {
    "dp_at_low_load": ExerciseInfo(
        "reasoning",
        (
            "replicas speed up each step",
            "throughput set by capacity, not demand",
            "router overhead",
        ),
    ),
    "parallel_style": ExerciseInfo(
        "reasoning",
        (
            "kinds swapped",
            "everything column-parallel",
            "q/k/v split by rows",
            "replicated projections",
        ),
    ),
    "allreduces_per_forward": ExerciseInfo(
        "reasoning",
        (
            "one per layer",
            "counted per rank",
            "embedding/LM head communicating",
            "column-parallel communicating",
        ),
    ),
    "bubble_fraction": ExerciseInfo(
        "plug-in", ("m instead of m + p − 1", "percentage", "busy instead of idle", "stage share")
    ),
    "ring_all_reduce_us": ExerciseInfo(
        "plug-in",
        (
            "both-directions bandwidth",
            "latency term left out",
            "message moved once",
            "dtype bytes",
            "seconds or ms for µs",
        ),
    ),
    "best_tp_long_context": ExerciseInfo(
        "reasoning", ("short-context winner", "weights do not fit", "communication only")
    ),
    "split_two_servers": ExerciseInfo(
        "reasoning", ("TP across the slow link", "heads split unevenly", "PP inside a server")
    ),
}

# What a second replica does at an arrival rate one replica serves comfortably (a fixed order
# that does not line up with the answer; shown in this order in the notebook).
DP_OPTIONS = {
    "a": "tokens/s doubles and the mean latency halves",
    "b": "tokens/s doubles and the mean latency stays the same",
    "c": "tokens/s stays about the same and the mean latency drops only a little",
    "d": "tokens/s stays the same and the mean latency halves",
    "e": "tokens/s drops, because the router adds a hop to every request",
}
DP_HINTS = {  # (English, Chinese)
    "a": (
        "tokens/s cannot exceed what arrives: at this load one replica already serves every "
        "request as it comes.",
        "tokens/s 不可能超过到达的量：在这个负载下，一个副本已经能随到随处理每个请求。",
    ),
    "b": (
        "tokens/s cannot exceed what arrives: at this load one replica already serves every "
        "request as it comes.",
        "tokens/s 不可能超过到达的量：在这个负载下，一个副本已经能随到随处理每个请求。",
    ),
    "d": (
        "halving a replica's batch does not halve its step: a memory-bound step reads all the "
        "weights whatever the batch.",
        "副本的 batch 减半，单步时间并不会减半：memory-bound 的一步不管 batch 多大都要读全部权重。",
    ),
    "e": (
        "a router hands a request to a replica once; it adds nothing to the decode steps.",
        "路由器只把请求交给副本一次；它不会给 decode 的每一步增加任何开销。",
    ),
}


def dp_at_low_load(answer: Any) -> CheckResult:
    """Requests arrive at a rate one replica (Llama-3-8B on one H100, continuous batching) serves
    comfortably. What does a second replica behind a round-robin router do? One letter of DP_OPTIONS."""
    return check_choice(
        "ch09.dp_at_low_load",
        answer,
        "c",
        options=list(DP_OPTIONS),
        hints={key: tr(*pair) for key, pair in DP_HINTS.items()},
    )


def allreduces_per_forward(answer: Any) -> CheckResult:
    """How many all-reduces does one forward pass of SmolLM2-135M make under TP=2 in
    `llmlab.parallel.tp` (embedding and LM head replicated)? Count each collective once."""
    layers = get_config(ALLREDUCE_MODEL).num_hidden_layers
    expected = 2 * layers
    return check_number(
        "ch09.allreduces_per_forward",
        answer,
        expected,
        rel=1e-9,
        mistakes=[
            (
                layers,
                tr(
                    "that is one per layer; attention and the MLP each end in a row-parallel "
                    "projection, and each of those needs its own sum.",
                    "这是每层一次；注意力和 MLP 各以一个行并行的投影结尾，每个都需要各自求和一次。",
                ),
            ),
            (
                2 * expected,
                tr(
                    "an all-reduce is one collective that every rank joins; count it once, "
                    "not once per rank.",
                    "一次 all-reduce 是所有 rank 一起参加的一次集合通信；只算一次，不要按 rank 各算一次。",
                ),
            ),
            (
                expected + 1,
                tr(
                    "the embedding and the LM head are replicated here: no communication.",
                    "这里 embedding 和 LM head 是复制的：不需要通信。",
                ),
            ),
            (
                expected + 2,
                tr(
                    "the embedding and the LM head are replicated here: no communication.",
                    "这里 embedding 和 LM head 是复制的：不需要通信。",
                ),
            ),
            (
                4 * layers,
                tr(
                    "column-parallel projections (q/k/v, gate/up) need no communication: each "
                    "rank already has the full input.",
                    "列并行的投影（q/k/v、gate/up）不需要通信：每个 rank 手上已经有完整的输入。",
                ),
            ),
        ],
        default_hint=tr(
            "ask which projections leave each rank with a partial sum, and how many of "
            "them one decoder layer has.",
            "想一想：哪些投影会让每个 rank 只得到部分和？一个 decoder 层里有几个这样的投影？",
        ),
        formula=tr(
            "Count the row-parallel projections in one decoder layer, then multiply by the "
            "number of layers (model.config.num_hidden_layers).",
            "数出一个 decoder 层里行并行的投影个数，再乘以层数（model.config.num_hidden_layers）。",
        ),
    )


def parallel_style(answer: Any) -> CheckResult:
    """Map each projection name (PROJECTIONS) to "column", "row" or "replicated": how is it
    split under Megatron-style TP so that a layer needs as few all-reduces as possible?"""
    ex = "ch09.parallel_style"
    missing = check_dict_keys(ex, answer, PROJECTIONS)
    if missing is not None:
        return missing
    got = {k: str(answer[k]).strip().lower() for k in PROJECTIONS}
    bad = [k for k, v in got.items() if v not in STYLES]
    if bad:
        return report(
            not_yet(
                ex,
                tr(
                    f'each value must be "column" or "row" (or "replicated"); check {bad}.',
                    f'每个值都必须是 "column" 或 "row"（或 "replicated"）；检查 {bad}。',
                ),
            )
        )
    replicated = [k for k, v in got.items() if v == "replicated"]
    if replicated:
        return report(
            not_yet(
                ex,
                staged(
                    ex,
                    tr(
                        f"{replicated}: a replicated projection keeps its whole "
                        "matrix on every rank, so TP would save no memory and "
                        "no time there; every projection of a layer is split.",
                        f"{replicated}：复制的投影在每个 rank 上都保留整个矩阵，"
                        "TP 在那里既省不了显存也省不了时间；一层里的每个投影都要切分。",
                    ),
                    tr(
                        "Each block splits its first matmul one way and its last the other way.",
                        "每个块的第一个 matmul 按一种方式切，最后一个按另一种方式切。",
                    ),
                ),
            )
        )
    rows = {k for k, v in got.items() if v == "row"}
    if rows == {"o_proj", "down_proj"}:
        return report(
            passed(
                ex,
                tr(
                    "right: each block splits its first matmul by output columns "
                    "and its last by input rows, so one all-reduce closes it.",
                    "对：每个块的第一个 matmul 按输出的列拆分，最后一个按输入的行拆分，"
                    "所以一次 all-reduce 就能收尾。",
                ),
            )
        )
    if rows == set(PROJECTIONS) - {"o_proj", "down_proj"}:
        return report(
            not_yet(
                ex,
                tr(
                    "the two kinds are swapped: the first matmul of a block must "
                    "work from the full (replicated) input.",
                    "两种切法弄反了：一个块的第一个 matmul 必须从完整的（复制的）输入开始算。",
                ),
            )
        )
    if not rows:
        return report(
            not_yet(
                ex,
                tr(
                    "if every matmul keeps whole output columns, who adds up the "
                    "partial results at the end of the block?",
                    "如果每个 matmul 都保留完整的输出列，块的末尾由谁来把部分结果加起来？",
                ),
            )
        )
    if {"k_proj", "v_proj", "q_proj"} & rows:
        return report(
            not_yet(
                ex,
                tr(
                    "splitting q/k/v by rows would leave every rank with a partial "
                    "sum of every head; attention needs whole heads per rank.",
                    "把 q/k/v 做成行并行，每个 rank 得到的是每个头的部分和；"
                    "注意力需要每个 rank 拿到完整的头。",
                ),
            )
        )
    return report(
        not_yet(
            ex,
            staged(
                ex,
                tr(
                    "inside one block (attention, or the MLP) only one matmul "
                    "reads an input that is already split.",
                    "在一个块（注意力或 MLP）里，只有一个 matmul 读的是已经切分好的输入。",
                ),
                tr(
                    "The block's last matmul reads the heads / channels the "
                    "ranks computed separately.",
                    "块的最后一个 matmul 读的是各个 rank 分头算出的头 / 通道。",
                ),
            ),
        )
    )


def bubble_fraction(answer: Any) -> CheckResult:
    """A pipeline of BUBBLE_P equal stages runs BUBBLE_M micro-batches (forward only, free
    communication). What fraction of the time is each stage idle? (a fraction, not %)"""
    p, m = BUBBLE_P, BUBBLE_M
    expected = pp.theoretical_bubble(p, m)
    return check_number(
        "ch09.bubble_fraction",
        answer,
        expected,
        rel=1e-3,
        mistakes=[
            (
                (p - 1) / m,
                tr(
                    "the pass takes m + p − 1 slots, not m; divide the idle slots by all of them.",
                    "一趟要 m + p − 1 个时隙，不是 m 个；用空闲的时隙数除以全部时隙数。",
                ),
            ),
            (
                (p - 1) / (m + p),
                tr(
                    "count the slots again: the last micro-batch enters stage p at slot m + p − 1.",
                    "再数一遍时隙：最后一个 micro-batch 在第 m + p − 1 个时隙进入第 p 级。",
                ),
            ),
            (
                1 / p,
                tr(
                    "that is the share of one stage in the model, not its idle time.",
                    "这是一级在整个模型里所占的份额，不是它的空闲时间。",
                ),
            ),
            (
                100 * expected,
                tr(
                    "give a fraction between 0 and 1, not a percentage.",
                    "请给 0 到 1 之间的比例，不要给百分数。",
                ),
            ),
            (
                m / (m + p - 1),
                tr(
                    "that is the busy fraction; the question asks for the idle one.",
                    "这是忙碌的比例；题目问的是空闲的比例。",
                ),
            ),
        ],
        default_hint=tr(
            "draw the schedule as a grid of slots (stages × time) and count.",
            "把调度画成时隙网格（级 × 时间），然后数一数。",
        ),
        formula=tr(
            "Stage s works on micro-batch i in slot i + s; count the slots a stage waits "
            "out of all slots of the pass.",
            "第 s 级在第 i + s 个时隙处理第 i 个 micro-batch；数出一级在整趟所有时隙里等待的时隙数。",
        ),
    )


def _ring_expected() -> tuple[float, float, cost.Interconnect]:
    cfg = get_config(RING_MODEL)
    link = cost.get_interconnect(RING_LINK)
    nbytes = RING_BATCH * cfg.hidden_size * 2
    return cost.ring_all_reduce_time(nbytes, RING_TP, link), nbytes, link


def ring_all_reduce_us(answer: Any) -> CheckResult:
    """One TP all-reduce of Llama-3-70B's hidden states for a decode batch of RING_BATCH
    sequences (BF16) over RING_TP GPUs on PCIe 5.0 x16 (`llmlab.analysis.parallel_cost.get_interconnect
    ("pcie")`: bandwidth one way, α per ring step). Its time in microseconds, by the ring formula?"""
    expected_s, nbytes, link = _ring_expected()
    p = RING_TP
    steps = 2 * (p - 1)
    expected = expected_s * 1e6
    return check_number(
        "ch09.ring_all_reduce_us",
        answer,
        expected,
        rel=0.01,
        mistakes=[
            (
                (steps * link.latency + steps / p * nbytes / (2 * link.bandwidth)) * 1e6,
                tr(
                    "that uses the 128 GB/s both-directions figure; a ring step sends and receives at once, "
                    "so use one direction.",
                    "这用的是 128 GB/s 这个双向相加的数；环上的每一步同时收发，所以要用单向带宽。",
                ),
            ),
            (
                steps / p * nbytes / link.bandwidth * 1e6,
                tr(
                    "the latency term is missing: each of the 2(p−1) ring steps costs α too.",
                    "少了延迟项：环上 2(p−1) 步里的每一步也都要花 α。",
                ),
            ),
            (
                (steps * link.latency + nbytes / link.bandwidth) * 1e6,
                tr(
                    "a ring all-reduce moves 2(p−1)/p times the message per GPU, not the message once.",
                    "环形 all-reduce 每块 GPU 搬运的是消息的 2(p−1)/p 倍，而不是只搬一遍消息。",
                ),
            ),
            (
                (steps * link.latency + steps / p * nbytes * 2 / link.bandwidth) * 1e6,
                tr(
                    "BF16 is 2 bytes per value: check the message size.",
                    "BF16 每个值 2 字节：检查消息大小。",
                ),
            ),
            (expected_s, tr("give microseconds, not seconds.", "请给微秒，不要给秒。")),
            (
                expected_s * 1e3,
                tr("give microseconds, not milliseconds.", "请给微秒，不要给毫秒。"),
            ),
        ],
        default_hint=tr(
            "check the message size (what one all-reduce carries) and both terms of "
            "the ring formula.",
            "检查消息大小（一次 all-reduce 要传什么）以及环形公式里的两项。",
        ),
        formula=tr(
            "message = batch × hidden × 2 bytes; time = 2(p−1)·α + 2(p−1)/p · bytes / bandwidth.",
            "消息 = batch × hidden × 2 字节；时间 = 2(p−1)·α + 2(p−1)/p · 字节数 / 带宽。",
        ),
    )


def _step_s(tp: int) -> float:
    return cost.decode_step_cost(
        LONG_MODEL, tp=tp, batch=LONG_BATCH, interconnect=LONG_LINK, context=LONG_CONTEXT
    ).total


def best_tp_long_context(answer: Any) -> CheckResult:
    """With the explorer: Llama-3-70B decode over PCIe at batch LONG_BATCH and context
    LONG_CONTEXT. Which TP degree of TP_DEGREES gives the shortest step?"""
    times = {t: _step_s(t) for t in TP_DEGREES}
    best = min(times, key=times.get)
    short = min(
        TP_DEGREES,
        key=lambda t: (
            cost.decode_step_cost(
                LONG_MODEL, tp=t, batch=1, interconnect=LONG_LINK, context=1024
            ).total
        ),
    )
    mistakes = [
        (
            1,
            tr(
                "at TP=1 the 141 GB of weights do not even fit one 80 GB GPU; and a longer "
                "context makes the single GPU's KV reads longer still.",
                "TP=1 时，141 GB 的权重连一块 80 GB 的 GPU 都放不下；上下文更长，单卡读 KV 的时间还会更长。",
            ),
        )
    ]
    if short != best:
        mistakes.append(
            (
                short,
                tr(
                    "that is the winner at a short context (the table above). Set the "
                    "context slider: each sequence's KV cache grows with the context, "
                    "and TP splits those reads too, while the all-reduces stay the same size.",
                    "这是短上下文时的最优解（上面的表）。调一下上下文滑块：每条序列的 KV cache "
                    "随上下文增长，TP 也会把这些读取分摊掉，而 all-reduce 的大小不变。",
                ),
            )
        )
    for t in TP_DEGREES:
        if t not in (best, short, 1):
            mistakes.append(
                (
                    t,
                    tr(
                        "compare the bars of every TP degree at that batch and context; "
                        "another degree is shorter.",
                        "在这个 batch 和上下文下比较每种 TP 并行度的柱子；另一种并行度的更短。",
                    ),
                )
            )
    return check_number(
        "ch09.best_tp_long_context",
        answer,
        best,
        rel=1e-9,
        mistakes=mistakes,
        default_hint=tr(
            f"answer one of the TP degrees {list(TP_DEGREES)}.",
            f"请回答 TP 并行度 {list(TP_DEGREES)} 中的一个。",
        ),
    )


# Exercise 6: where the source chapter's rule of thumb ("TP = the GPUs of one machine") meets a
# model whose heads do not split over that many ranks.
SPLIT_GPUS_PER_SERVER, SPLIT_SERVERS = 8, 2  # NVLink inside a server, Ethernet between the two
SPLIT_HEADS, SPLIT_KV_HEADS = 28, 4  # query heads and KV heads of the model
SPLIT_KEYS = ("tp", "pp")


def _heads_split_evenly(tp: int) -> bool:
    """vLLM's rule: every rank gets the same number of query heads, and whole KV heads (or copies)."""
    return SPLIT_HEADS % tp == 0 and (SPLIT_KV_HEADS % tp == 0 or tp % SPLIT_KV_HEADS == 0)


def split_two_servers(answer: Any) -> CheckResult:
    """A model with SPLIT_HEADS query heads and SPLIT_KV_HEADS KV heads, served with vLLM, needs all
    the GPUs of SPLIT_SERVERS servers of SPLIT_GPUS_PER_SERVER GPUs each (NVLink inside a server, a
    slower network between them). Answer a dict {"tp": degree, "pp": degree} with tp × pp = every GPU."""
    ex = "ch09.split_two_servers"
    missing = check_dict_keys(ex, answer, SPLIT_KEYS)
    if missing is not None:
        return missing
    try:
        tp, pp_ = int(answer["tp"]), int(answer["pp"])
    except (TypeError, ValueError):
        return report(not_yet(ex, tr("tp and pp must be whole numbers.", "tp 和 pp 必须是整数。")))
    total = SPLIT_GPUS_PER_SERVER * SPLIT_SERVERS
    if tp < 1 or tp * pp_ != total:
        return report(
            not_yet(
                ex,
                tr(f"tp × pp must use all {total} GPUs.", f"tp × pp 必须用上全部 {total} 块 GPU。"),
            )
        )
    best = max(
        t for t in range(1, SPLIT_GPUS_PER_SERVER + 1) if total % t == 0 and _heads_split_evenly(t)
    )
    if tp > SPLIT_GPUS_PER_SERVER:
        hint = tr(
            "a TP group that spans both servers sends its all-reduces, two per layer and every "
            "step, over the slow link between them.",
            "跨两台服务器的 TP 组，会把它的 all-reduce（每层两次、每一步都有）送过两台机器之间的慢速链路。",
        )
    elif not _heads_split_evenly(tp):
        hint = tr(
            f"vLLM refuses this TP degree: {tp} ranks cannot each hold the same whole number of "
            f"the model's {SPLIT_HEADS} query heads and {SPLIT_KV_HEADS} KV heads.",
            f"vLLM 不接受这个 TP 并行度：{tp} 个 rank 没法每个都分到同样多的整数个注意力头"
            f"（模型有 {SPLIT_HEADS} 个 query 头、{SPLIT_KV_HEADS} 个 KV 头）。",
        )
    elif tp == best:
        return report(
            passed(
                ex,
                tr(
                    "right: the widest TP group whose heads split evenly, inside a server "
                    "over NVLink; the pipeline spans the rest, and only one of its "
                    "boundaries crosses the slow link.",
                    "对：在能把注意力头平均分开的 TP 组里选最宽的，放在一台服务器内部走 NVLink；"
                    "其余交给流水线，它只有一个边界跨过慢速链路。",
                ),
            )
        )
    else:
        hint = staged(
            ex,
            tr(
                "NVLink inside a server goes unused by the pipeline: each extra stage adds "
                "to the bubble, while a wider TP group would still talk over NVLink.",
                "流水线用不上服务器内部的 NVLink：每多一级都会加大气泡，而更宽的 TP 组仍然走 NVLink 通信。",
            ),
            tr(
                "Put the group that talks every layer where the links are fastest, as wide as "
                "the heads allow, and only the rare hand-offs across the slow link.",
                "把每层都要通信的那一组放在链路最快的地方，在注意力头允许的范围内尽量宽，只让偶尔的交接跨过慢速链路。",
            ),
        )
    return report(not_yet(ex, hint))


# ---- the build exercise: the tensor-parallel split of one layer -------------------------------------

BUILDS = {"ch09.tensor_parallel_layer": "TensorParallelLayer"}
DRIVERS = "llmlab.course.build.ch09"
PLUG_MODEL = "smollm2-135m"
# "The capital of France is" in SmolLM2's tokenizer; greedy continuation of PLUG_TOKENS tokens
PLUG_PROMPT = (504, 3575, 282, 4649, 314)
PLUG_TOKENS = 2
PLUG_WORLD = 2
MAX_EXAMPLES = 30
TOLERANCE = 1e-4  # relative to the largest |value| of the unsharded output (float32 sums reordered)
COLUMN_PARALLEL = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")
ROW_PARALLEL = ("o_proj", "down_proj")
NORMS = ("input_layernorm", "post_attention_layernorm")
PACKAGE_SEQUENCE = (
    "q_proj",
    "k_proj",
    "v_proj",
    "attention",
    "o_proj",
    "all-reduce",
    "gate_proj",
    "up_proj",
    "down_proj",
    "all-reduce",
)

EXERCISES["tensor_parallel_layer"] = ExerciseInfo(
    "reasoning",  # a build exercise: the reading time counts it as coding (its BUILDS entry)
    (
        "down_proj split by output rows",
        "all-reduce after gate/up",
        "no all-reduce after o_proj",
        "GQA groups broken",
        "rows missing or on two ranks",
        "ranks disagree on the all-reduces",
    ),
)


def layer_cases():
    """Small layers to split: hidden, intermediate, heads (whole GQA groups), world 2 or 3."""
    from hypothesis import strategies as st

    @st.composite
    def cases(draw):
        world = draw(st.sampled_from([2, 3]))
        return {
            "world": world,
            "kv_heads": draw(st.integers(world, 4)),
            "group": draw(st.integers(1, 3)),
            "head_dim": draw(st.sampled_from([2, 4])),
            "hidden": draw(st.integers(2, 8)),
            "intermediate": draw(st.integers(world, 9)),
            "tokens": draw(st.integers(1, 3)),
            "seed": draw(st.integers(0, 1000)),
        }

    return cases()


def _describe(case: dict) -> str:
    c = case
    heads = c["kv_heads"] * c["group"]
    return tr(
        f"hidden {c['hidden']}, intermediate {c['intermediate']}, {heads} query heads / "
        f"{c['kv_heads']} KV heads of head_dim {c['head_dim']}, world {c['world']}, "
        f"{c['tokens']} token(s)",
        f"hidden {c['hidden']}、intermediate {c['intermediate']}、{heads} 个 query 头 / "
        f"{c['kv_heads']} 个 KV 头（head_dim {c['head_dim']}）、world {c['world']}、"
        f"{c['tokens']} 个 token",
    )


def _span(ids: list[int]) -> str:
    """0–2, or 0, 2, 5 when not contiguous, or "none"."""
    if not ids:
        return tr("none", "无")
    if ids == list(range(ids[0], ids[-1] + 1)):
        return f"{ids[0]}–{ids[-1]}" if len(ids) > 1 else str(ids[0])
    return ", ".join(map(str, ids))


def _shapes(case: dict) -> dict[str, tuple[int, ...]]:
    c = case
    h, i, d = c["hidden"], c["intermediate"], c["head_dim"]
    q, kv = c["kv_heads"] * c["group"] * d, c["kv_heads"] * d
    return tp.layer_shapes(h, q, kv, i)


def _rows(entry: dict, shape: tuple[int, ...]) -> list[int] | None:
    """The rows of the [out, in] weight a shard holds whole and in order, or None."""
    out, inn = shape
    got = entry.get("shape")
    if got is None or len(got) != 2 or got[1] != inn:
        return None
    idx = entry["index"]
    rows = []
    for r in range(got[0]):
        row = idx[r * inn : (r + 1) * inn]
        if row[0] % inn or row != list(range(row[0], row[0] + inn)):
            return None
        rows.append(row[0] // inn)
    return rows


def _cols(entry: dict, shape: tuple[int, ...]) -> list[int] | None:
    """The columns of the [out, in] weight a shard holds whole and in order, or None."""
    out, inn = shape
    got = entry.get("shape")
    if got is None or len(got) != 2 or got[0] != out:
        return None
    idx, m = entry["index"], got[1]
    cols = []
    for j in range(m):
        col = idx[j::m]
        if col != [r * inn + col[0] for r in range(out)]:
            return None
        cols.append(col[0])
    return cols


def _package_split(case: dict) -> str:
    from llmlab.config import tiny_config

    cfg = tiny_config(
        num_attention_heads=case["kv_heads"] * case["group"],
        num_key_value_heads=case["kv_heads"],
        head_dim=case["head_dim"],
        intermediate_size=case["intermediate"],
        hidden_size=case["hidden"],
    )
    s = tp.tp_plan(cfg, case["world"])[0]
    return tr(
        f"The package’s rank 0 takes KV heads {_span(list(s.kv_heads))}, query heads "
        f"{_span(list(s.q_heads))}, MLP channels {_span(list(s.ffn))}.",
        f"包里的 rank 0 拿 KV 头 {_span(list(s.kv_heads))}、query 头 {_span(list(s.q_heads))}、"
        f"MLP 通道 {_span(list(s.ffn))}。",
    )


def _split_problem(case: dict, split: dict) -> str | None:
    """What is wrong with the student's split on `case` (a hint), or None."""
    shapes, world, d, g = _shapes(case), case["world"], case["head_dim"], case["group"]
    at = _describe(case)
    if "error" in split:
        return tr(
            f"on the layer ({at}) your shard raised {split['error']}",
            f"在这个层上（{at}），你的 shard 抛出了 {split['error']}",
        )
    ranks = split["ranks"]
    held: dict[str, list[list[int]]] = {}
    for r, shard in enumerate(ranks):
        for name in PROJECTIONS + NORMS:
            entry, shape = shard[name], shapes[name]
            if "shape" not in entry:
                return tr(
                    f"({at}) your rank {r}'s shard has no tensor {name!r}: return a dict with "
                    f"every weight's name.",
                    f"（{at}）你的 rank {r} 的分片里没有张量 {name!r}：返回的 dict 要包含每个权重的名字。",
                )
            if name in NORMS:
                if entry["index"] != list(range(shape[0])):
                    return tr(
                        f"({at}) your rank {r} did not keep {name} whole: the norms act on the "
                        f"full hidden vector, which every rank has; every rank keeps them whole.",
                        f"（{at}）你的 rank {r} 没有完整保留 {name}：norm 作用在完整的 hidden 向量上，"
                        f"每个 rank 都有这个向量，所以每个 rank 都完整保留 norm。",
                    )
                continue
            rows, cols = _rows(entry, shape), _cols(entry, shape)
            dims = f"[{shape[0]}, {shape[1]}]"
            if name in COLUMN_PARALLEL and rows is None:
                took = (
                    tr(f"input columns {_span(cols)}", f"输入列 {_span(cols)}")
                    if cols is not None
                    else tr("a block that is not whole rows", "一块不是整行的数据")
                )
                return tr(
                    f"({at}) {name}: your rank {r} took {took} of its [out, in] = {dims} weight; "
                    f"{name} is column-parallel: each rank takes whole output rows (its own heads "
                    f"or MLP channels) and multiplies them by the full input.",
                    f"（{at}）{name}：你的 rank {r} 拿了它的 [out, in] = {dims} 权重中的{took}；"
                    f"{name} 是列并行：每个 rank 拿完整的输出行（它自己的头或 MLP 通道），用完整的输入去乘。",
                )
            if name in ROW_PARALLEL and cols is None:
                match = "q_proj" if name == "o_proj" else "gate_proj/up_proj"
                took = (
                    tr(f"output rows {_span(rows)}", f"输出行 {_span(rows)}")
                    if rows is not None
                    else tr("a block that is not whole columns", "一块不是整列的数据")
                )
                return tr(
                    f"({at}) {name}: your rank {r} took {took} of its [out, in] = {dims} weight; "
                    f"{name} is row-parallel: each rank takes the input columns that match the "
                    f"rows it took of {match} (its slice of the {name} input), all output rows, and "
                    f"an all-reduce sums the partial outputs. {_package_split(case)}",
                    f"（{at}）{name}：你的 rank {r} 拿了它的 [out, in] = {dims} 权重中的{took}；"
                    f"{name} 是行并行：每个 rank 拿与它在 {match} 里所拿的行相对应的输入列"
                    f"（{name} 输入的那一段），保留全部输出行，再由一次 all-reduce 把部分输出加起来。"
                    f"{_package_split(case)}",
                )
            held.setdefault(name, []).append(rows if name in COLUMN_PARALLEL else cols)
    for name, per_rank in held.items():
        n = shapes[name][0] if name in COLUMN_PARALLEL else shapes[name][1]
        what = tr("rows", "行") if name in COLUMN_PARALLEL else tr("columns", "列")
        counts = [sum(ids.count(i) for ids in per_rank) for i in range(n)]
        twice = [i for i, c in enumerate(counts) if c > 1]
        none = [i for i, c in enumerate(counts) if c == 0]
        if twice or none:
            problem = (
                tr(
                    f"{what} {_span(twice)} are on more than one rank",
                    f"第 {_span(twice)} {what}在不止一个 rank 上",
                )
                if twice
                else tr(
                    f"{what} {_span(none)} are on no rank",
                    f"第 {_span(none)} {what}不在任何 rank 上",
                )
            )
            return tr(
                f"({at}) {name}: {problem}; over the ranks, every {what[:-1]} must be held exactly "
                f"once. {_package_split(case)}",
                f"（{at}）{name}：{problem}；所有 rank 合起来，每一{what}必须恰好出现一次。"
                f"{_package_split(case)}",
            )
    for r in range(world):
        q, k, v = held["q_proj"][r], held["k_proj"][r], held["v_proj"][r]
        gate, up, o, down = (
            held["gate_proj"][r],
            held["up_proj"][r],
            held["o_proj"][r],
            held["down_proj"][r],
        )
        for name, rows in (("q_proj", q), ("k_proj", k)):
            heads = [rows[i : i + d] for i in range(0, len(rows), d)]
            if any(
                len(hd) != d or hd[0] % d or hd != list(range(hd[0], hd[0] + d)) for hd in heads
            ):
                return tr(
                    f"({at}) {name}: your rank {r}'s rows {_span(rows)} cut a head in two; a "
                    f"head is {d} consecutive rows (head_dim), and a rank takes whole heads.",
                    f"（{at}）{name}：你的 rank {r} 拿的行 {_span(rows)} 把一个头切成了两半；一个头是连续的 "
                    f"{d} 行（head_dim），rank 要拿完整的头。",
                )
        kv_heads, q_heads = [x // d for x in k[::d]], [x // d for x in q[::d]]
        if v != k:
            return tr(
                f"({at}) v_proj: your rank {r} took rows {_span(v)} but k_proj rows {_span(k)}; "
                f"a rank's keys and values are the same KV heads.",
                f"（{at}）v_proj：你的 rank {r} 拿了第 {_span(v)} 行，而 k_proj 拿的是第 {_span(k)} 行；"
                f"一个 rank 的 key 和 value 必须是同一批 KV 头。",
            )
        if not kv_heads:
            return tr(
                f"({at}) your rank {r} holds no KV head: every rank needs at least one whole "
                f"KV head (and the query heads that read it).",
                f"（{at}）你的 rank {r} 一个 KV 头都没有：每个 rank 至少要有一个完整的 KV 头"
                f"（以及读它的那些 query 头）。",
            )
        readers = [h for kv in kv_heads for h in range(kv * g, (kv + 1) * g)]
        if q_heads != readers:
            stray = next((h for h in q_heads if h // g not in kv_heads), None)
            where = ""
            if stray is not None:
                owner = next(s for s in range(world) if stray // g * d in held["k_proj"][s])
                where = tr(
                    f" query head {stray} reads KV head {stray // g}, which is on rank {owner};",
                    f"query 头 {stray} 读的是 KV 头 {stray // g}，它在 rank {owner} 上；",
                )
            return tr(
                f"({at}) GQA groups: your rank {r} holds query heads {_span(q_heads)} but KV heads "
                f"{_span(kv_heads)};{where} query head h reads KV head h // {g} "
                f"(heads / kv_heads), so a rank takes whole KV heads and exactly the query heads "
                f"that read them, in the same order. {_package_split(case)}",
                f"（{at}）GQA 分组：你的 rank {r} 拿了 query 头 {_span(q_heads)}，KV 头却是 "
                f"{_span(kv_heads)}；{where}query 头 h 读的是 KV 头 h // {g}（heads / kv_heads），"
                f"所以一个 rank 要拿完整的 KV 头，并且恰好拿读这些 KV 头的 query 头，顺序一致。"
                f"{_package_split(case)}",
            )
        if up != gate:
            return tr(
                f"({at}) up_proj: your rank {r} took rows {_span(up)} but gate_proj rows "
                f"{_span(gate)}; SwiGLU multiplies them channel by channel, so both take the same.",
                f"（{at}）up_proj：你的 rank {r} 拿了第 {_span(up)} 行，gate_proj 却是第 {_span(gate)} 行；"
                f"SwiGLU 逐通道相乘，所以两者要拿相同的行。",
            )
        for name, cols, rows, source in (
            ("o_proj", o, q, "q_proj"),
            ("down_proj", down, gate, "gate_proj"),
        ):
            if cols != rows:
                return tr(
                    f"({at}) {name}: your rank {r} took input columns {_span(cols)} but its "
                    f"{source} rows are {_span(rows)}; a row-parallel {name} reads what this rank "
                    f"computed, so its columns are those rows, in the same order.",
                    f"（{at}）{name}：你的 rank {r} 拿了输入列 {_span(cols)}，而它的 {source} 行是 "
                    f"{_span(rows)}；行并行的 {name} 读的是这个 rank 自己算出的东西，所以它的列就是那些行，顺序相同。",
                )
    return None


def _all_reduce_steps(trace: list[str]) -> list[str]:
    """The projection each all-reduce of a rank's trace came right after."""
    steps, last = [], "input"
    for event in trace:
        if event == "all-reduce":
            steps.append(last)
        elif event in PROJECTIONS:
            last = event
    return steps


def _forward_problem(case: dict, forward: dict, expected: list[float]) -> str | None:
    at = _describe(case)
    traces = forward.get("traces") or [[]]
    steps = _all_reduce_steps(traces[0])
    ran = " → ".join(traces[0]) or tr("nothing", "什么都没有")
    package = " → ".join(PACKAGE_SEQUENCE)
    seq = tr(
        f" Your rank 0 ran: {ran}; the package's rank runs: {package}.",
        f"你的 rank 0 的执行顺序：{ran}；包里每个 rank 的顺序：{package}。",
    )
    early = [s for s in steps if s in COLUMN_PARALLEL]
    if early:
        return tr(
            f"({at}) your forward all-reduced right after {early[0]}, a column-parallel "
            f"projection: each rank's {early[0]} output is already complete for its own "
            f"heads / channels, and summing over ranks adds different channels together. The sum "
            f"belongs after the row-parallel projection that closes the block (o_proj, down_proj).{seq}",
            f"（{at}）你的 forward 在 {early[0]} 之后立刻做了 all-reduce，而它是列并行的投影：每个 rank 的 "
            f"{early[0]} 输出对它自己的头 / 通道已经是完整的，跨 rank 求和会把不同的通道加在一起。"
            f"求和应该放在结束这个块的行并行投影（o_proj、down_proj）之后。{seq}",
        )
    if "error" in forward:
        return tr(
            f"({at}) your forward raised {forward['error']}.{seq}",
            f"（{at}）你的 forward 抛出了 {forward['error']}。{seq}",
        )
    for block in ("o_proj", "down_proj"):
        if block not in steps:
            return tr(
                f"({at}) after {block} your forward did not all-reduce: {block} is row-parallel, "
                f"so each rank's output is only a partial sum (its heads' or channels' share); "
                f"without the sum every rank continues from a different, incomplete result.{seq}",
                f"（{at}）你的 forward 在 {block} 之后没有做 all-reduce：{block} 是行并行的，每个 rank "
                f"的输出只是部分和（它那几个头或通道的贡献）；不求和，每个 rank 都会从一个不同的、不完整的结果继续算。{seq}",
            )
    if len(steps) != 2:
        return tr(
            f"({at}) your forward all-reduced {len(steps)} times per layer; the package's twice, "
            f"once after o_proj and once after down_proj (a sum taken twice counts the ranks twice).{seq}",
            f"（{at}）你的 forward 每层做了 {len(steps)} 次 all-reduce；包里是两次，o_proj 之后一次，"
            f"down_proj 之后一次（求两次和会把各 rank 的贡献重复计算）。{seq}",
        )
    for r, out in enumerate(forward["outputs"]):
        if out is None or len(out) != len(expected):
            return tr(
                f"({at}) your rank {r}'s forward returned shape {forward['shapes'][r]}; the layer's "
                f"output is [tokens, hidden] = [{case['tokens']}, {case['hidden']}] on every rank.",
                f"（{at}）你的 rank {r} 的 forward 返回的形状是 {forward['shapes'][r]}；这一层的输出在每个 "
                f"rank 上都是 [tokens, hidden] = [{case['tokens']}, {case['hidden']}]。",
            )
        scale = 1 + max(abs(e) for e in expected)
        diff = max(abs(a - b) for a, b in zip(out, expected))
        if not diff <= TOLERANCE * scale:
            return tr(
                f"({at}) your rank {r}'s output differs from the unsharded layer's by up to "
                f"{diff:.2g}, though the all-reduces are where they belong: check the two "
                f"residual adds, the norms (input_layernorm before attention, "
                f"post_attention_layernorm before the MLP) and SwiGLU: silu(gate) · up.",
                f"（{at}）你的 rank {r} 的输出与不切分的层相差最多 {diff:.2g}，而 all-reduce 的位置是对的："
                f"检查两次残差相加、两个 norm（注意力之前是 input_layernorm，MLP 之前是 "
                f"post_attention_layernorm），以及 SwiGLU：silu(gate) · up。",
            )
    return None


def _layer_problem(got: Any, expected: dict) -> str | None:
    case = expected["case"]
    if not isinstance(got, dict) or "split" not in got:
        return tr(f"your class did not run: {got}", f"你的类没有运行起来：{got}")
    split_problem = _split_problem(case, got["split"]) if got["split"] else None
    if split_problem or got["split"].get("none"):
        return split_problem or tr(
            "shard returned None: return this rank's weights as a dict.",
            "shard 返回了 None：请把这个 rank 的权重放在一个 dict 里返回。",
        )
    return _forward_problem(case, got["forward"], expected["output"])


def _layer_reference(case: dict) -> dict:
    from llmlab.course.build.ch09 import unsharded_output

    return {"case": case, "output": unsharded_output(case).reshape(-1).tolist()}


@functools.lru_cache(maxsize=1)
def _plug_reference(model: str, prompt: tuple[int, ...], new_tokens: int):
    """The package's side of the plug-in, in this process: SmolLM2's layer 0 on the prompt's
    embeddings (no split), and the one-process greedy tokens."""
    import torch

    from llmlab.ops.metadata import single_sequence_metadata
    from llmlab.parallel.source import ModelSource

    full = ModelSource(model).build()
    T = len(prompt)
    with torch.inference_mode():
        x = full.embed_tokens(torch.tensor(prompt))
        kv = full.allocate_kv_caches(num_blocks=1, block_size=T)
        meta = single_sequence_metadata(kv, num_cached=0, num_new=T, max_len=T)
        cos, sin = full.rope_cos_sin(torch.arange(T))
        layer0 = full.layers[0](x, cos, sin, meta, 0)
    tokens = tp.greedy_reference(full, list(prompt), new_tokens)
    return (
        layer0.reshape(-1).tolist(),
        tokens,
        full.config.hidden_size,
        full.config.num_hidden_layers,
    )


def tensor_parallel_layer(answer: Any) -> CheckResult:
    """The student's `TensorParallelLayer` (static `shard` and `forward`): properties on small
    layers drawn by hypothesis (the shards partition the weights as Megatron's split does; the
    ranks' forward, simulated in one process, equals the unsharded layer), then SmolLM2 over two
    gloo processes: layer 0 equal to the package's, and the package's TP engine with the
    student's `shard` as its `shard_fn` decoding the same tokens as one process."""
    from llmlab.course.build import drive, find_counterexample

    ex = "ch09.tensor_parallel_layer"
    if answer is None:
        return report(not_yet(ex, NOT_ANSWERED))
    refused = refuse_package_piece(ex, answer, ('shard', 'forward'))
    if refused is not None:
        return refused
    if not all(callable(getattr(answer, m, None)) for m in ("shard", "forward")) and not getattr(
        answer, "grader_stand_in", False
    ):
        return report(
            not_yet(
                ex,
                tr(
                    "expected the class TensorParallelLayer with the static methods shard and forward.",
                    "这里要的是带有静态方法 shard 和 forward 的类 TensorParallelLayer。",
                ),
            )
        )
    first = {"world": 2, "kv_heads": 2, "group": 1, "head_dim": 2, "hidden": 2,
             "intermediate": 2, "tokens": 1, "seed": 0}  # fmt: skip
    try:
        probe = drive(answer, f"{DRIVERS}:observe_layer", first)
    except Exception as e:  # the student's process died, or ran out of time
        return report(not_yet(ex, tr(f"your class did not run: {e}", f"你的类没有运行起来：{e}")))
    if probe.get("split") == {"none": True}:
        return report(not_yet(ex, NOT_ANSWERED))
    cex = find_counterexample(
        layer_cases(),
        lambda case: drive(answer, f"{DRIVERS}:observe_layer", case),
        _layer_reference,
        max_examples=MAX_EXAMPLES,
        compare=lambda got, expected: _layer_problem(got, expected) is None,
    )
    if cex is not None:
        problem = (
            _layer_problem(cex.got, cex.expected)
            if not hasattr(cex.got, "error")
            else tr(
                f"on {_describe(cex.case)}: {cex.got}", f"在 {_describe(cex.case)} 上：{cex.got}"
            )
        )
        hint = staged(
            ex,
            tr(f"Smallest layer found: {problem}", f"找到的最小的层：{problem}"),
            tr(
                " Megatron's rule: the first projection of a block by output rows (no "
                "communication), the last by the matching input columns, then one all-reduce.",
                "Megatron 的规则：一个块的第一个投影切分输出维（列并行，不通信），最后一个切分对应的输入维（行并行），然后做一次 all-reduce。",
            ),
        )
        return report(not_yet(ex, hint))
    return report(_plug_in_verdict(ex, answer))


def _plug_in_verdict(ex: str, answer: Any) -> CheckResult:
    from llmlab.course.build import drive
    from llmlab.course.build.ch09 import tokens_processed

    spec = answer.spec if getattr(answer, "grader_stand_in", False) else None
    try:
        run = drive(answer, f"{DRIVERS}:plug_in", spec, list(PLUG_PROMPT), PLUG_TOKENS)
    except Exception as e:
        return not_yet(
            ex,
            tr(
                f"the properties hold, but the run on {PLUG_WORLD} processes failed: {e}",
                f"性质检查都通过了，但在 {PLUG_WORLD} 个进程上的运行失败了：{e}",
            ),
        )
    layer0, tokens, hidden, layers = _plug_reference(PLUG_MODEL, PLUG_PROMPT, PLUG_TOKENS)
    scale = 1 + max(abs(v) for v in layer0)
    diffs = [
        max(abs(a - b) for a, b in zip(out, layer0)) if len(out) == len(layer0) else float("inf")
        for out in run["layer_out"]
    ]
    if not max(diffs) <= TOLERANCE * scale:
        return not_yet(
            ex,
            tr(
                f"on SmolLM2's layer 0 over {PLUG_WORLD} gloo processes your ranks' outputs differ "
                f"from the unsharded layer's by up to {max(diffs):.2g}.",
                f"在 SmolLM2 的第 0 层上，用 {PLUG_WORLD} 个 gloo 进程运行时，你的各 rank 的输出与不切分的层"
                f"相差最多 {max(diffs):.2g}。",
            ),
        )
    if any(t != tokens for t in run["tokens"]):
        return not_yet(
            ex,
            tr(
                f"with your shard as the engine's shard_fn, SmolLM2 decoded {run['tokens'][0]}; "
                f"one process decodes {tokens}.",
                f"把你的 shard 作为引擎的 shard_fn 时，SmolLM2 decode 出 {run['tokens'][0]}；单进程 decode 出 {tokens}。",
            ),
        )
    T = len(PLUG_PROMPT)
    mine_bytes = run["layer_bytes"][0] / T
    package_bytes = run["package_bytes"][0] / (tokens_processed(T, PLUG_TOKENS) * layers)
    mine_us = 1e6 * run["layer_ar_seconds"][0] / max(run["layer_calls"][0], 1)
    package_us = 1e6 * run["package_ar_seconds"][0] / max(sum(run["package_calls"][0]), 1)
    same = run["package_tokens"][0] == tokens
    return passed(
        ex,
        tr(
            f"your split and layer ran on {PLUG_WORLD} processes over gloo: SmolLM2's layer 0 "
            f"equals the unsharded layer (max |Δ| {max(diffs):.1e}); the package's TP engine with "
            f"your shard as shard_fn decoded {run['tokens'][0]}, the same as one process"
            f"{' and as the package’s own TP=2 split' if same else ''}. Measured (CPU, gloo over "
            f"localhost TCP, this machine): all-reduced per token per layer, yours "
            f"{mine_bytes:.0f} B in {run['layer_calls'][0]} calls, the package's {package_bytes:.0f} B "
            f"(2 × hidden {hidden} × 4 bytes); inside one all-reduce, yours {mine_us:.0f} µs, the "
            f"package's {package_us:.0f} µs on average.",
            f"你的切分和层在 {PLUG_WORLD} 个进程上通过 gloo 运行：SmolLM2 第 0 层的输出等于不切分的层"
            f"（最大 |Δ| {max(diffs):.1e}）；包里的 TP 引擎用你的 shard 作为 shard_fn decode 出 "
            f"{run['tokens'][0]}，与单进程{'以及包自己的 TP=2 切分' if same else ''}相同。实测（CPU，gloo 走本机 TCP，"
            f"这台机器）：每个 token 每层 all-reduce 的字节数，你的 {mine_bytes:.0f} B（{run['layer_calls'][0]} 次调用），"
            f"包里的 {package_bytes:.0f} B（2 × hidden {hidden} × 4 字节）；一次 all-reduce 内部耗时，你的 "
            f"{mine_us:.0f} µs，包里的平均 {package_us:.0f} µs。",
        ),
    )
