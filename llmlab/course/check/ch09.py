"""Self-checks of chapter 09 (parallelism): what a second data-parallel replica buys at low load,
column- vs row-parallel projections, all-reduces per forward under TP, the pipeline bubble, a
ring all-reduce's time over PCIe, the fastest TP degree for long contexts over PCIe (the
explorer's task), and which kind of parallelism leans on NVLink (the source chapter's learning
goal 3)."""

from __future__ import annotations

from typing import Any

from llmlab.config import get_config
from llmlab.course.check.core import (
    CheckResult,
    ExerciseInfo,
    check_choice,
    check_dict_keys,
    check_number,
    not_yet,
    passed,
    report,
    staged,
)
from llmlab.i18n import tr
from llmlab.parallel import cost, pp

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
