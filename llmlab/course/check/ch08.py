"""Self-checks of chapter 08 (batching): the source chapter's self-check question 3 (batch 32
gives nearly 32× the throughput at nearly the same step time), why a CPU falls short of it,
continuous against static batching on a small trace, the max batch beyond which the batching
simulator's traffic gains nothing (the widget's task), and why continuous batching wins."""

from __future__ import annotations

from typing import Any

from llmlab.analysis import costs, roofline, sim
from llmlab.config import get_config
from llmlab.course.check.core import (
    NOT_ANSWERED,
    CheckResult,
    ExerciseInfo,
    as_number,
    check_choice,
    check_dict_keys,
    check_number,
    close,
    not_yet,
    passed,
    record_expected,
    report,
    staged,
)
from llmlab.i18n import tr

# the source chapter's H100: 1000 TFLOPS, 3 TB/s
Q3_MODEL, Q3_HW, Q3_CONTEXT = "llama-3-70b", "H100-SXM-source", 1024
Q3_KEYS = ("step_ms_batch1", "step_ms_batch32", "throughput_ratio", "bound")

# the small trace of continuous_mean_latency: all arrive at step 0, max batch 2
TRACE_OUTPUTS = (10, 2, 2, 2)
TRACE_MAX_BATCH = 2

# the widget's task: the batching simulator's trace at this arrival rate (other sliders at their
# defaults); the max batch slider goes up to WIDGET_MAX_BATCH
WIDGET_ARRIVAL_RATE = 1.0
WIDGET_MAX_BATCH = 32

EXERCISES = {
    "source_q3": ExerciseInfo(
        "plug-in",
        (
            "weights read once per sequence",
            "KV cache left out",
            "seconds for milliseconds",
            "3.35 TB/s for the source chapter's 3",
            "throughput as step-time ratio",
            "bound misjudged",
        ),
        source_question=3,
    ),
    "why_cpu_falls_short": ExerciseInfo(
        "reasoning",
        (
            "weights re-read per sequence",
            "memory capacity",
            "Python overhead",
            "floors and measurements incomparable",
        ),
    ),
    "continuous_mean_latency": ExerciseInfo(
        "reasoning", ("static schedule", "mean output length", "makespan instead of mean")
    ),
    "saturating_max_batch": ExerciseInfo(
        "reasoning",
        ("number of requests", "slider maximum", "default max batch", "static batching's curve"),
    ),
    "why_continuous": ExerciseInfo("recall", ("faster steps", "skipped prefill", "fewer tokens")),
}


def _q3_expected() -> dict:
    cfg = get_config(Q3_MODEL)
    t1 = roofline.decode_step_floor(cfg, Q3_HW, 1, Q3_CONTEXT, 2)
    t32 = roofline.decode_step_floor(cfg, Q3_HW, 32, Q3_CONTEXT, 2)
    p = roofline.place(roofline.decode_step(cfg, 32, Q3_CONTEXT, 2), Q3_HW, "bf16")
    return {
        "step_ms_batch1": t1 * 1e3,
        "step_ms_batch32": t32 * 1e3,
        "throughput_ratio": 32 * t1 / t32,
        "bound": p.bound,
    }


def source_q3(answer: Any) -> CheckResult:
    """The source chapter's question 3 with numbers. Llama-3-70B, BF16, the source chapter's H100
    (1000 TFLOPS, 3 TB/s), every sequence has Q3_CONTEXT tokens of KV cache. Answer a dict with
      step_ms_batch1   : decode step floor at batch 1, ms
      step_ms_batch32  : decode step floor at batch 32, ms
      throughput_ratio : tokens/s at batch 32 over tokens/s at batch 1
      bound            : "memory" or "compute" — which resource bounds the batch-32 step
    """
    ex = "ch08.source_q3"
    exp = _q3_expected()
    for key in Q3_KEYS[:3]:
        record_expected(ex, exp[key])
    missing = check_dict_keys(ex, answer, Q3_KEYS)
    if missing is not None:
        return missing
    cfg = get_config(Q3_MODEL)
    weights_ms = roofline.weight_read_time(costs.param_count(cfg), 2, 3e12) * 1e3
    problems, formulas = [], []
    for key in Q3_KEYS[:3]:
        x = as_number(answer[key])
        if x is None:
            problems.append(tr(f"{key} must be a number.", f"{key} 必须是一个数。"))
            continue
        if close(x, exp[key], 0.03):
            continue
        if key == "step_ms_batch1":
            if close(x, exp[key] * 1e-3, 0.03):
                problems.append(
                    tr(
                        "step_ms_batch1 looks like seconds; give milliseconds.",
                        "step_ms_batch1 看起来是秒；请给毫秒。",
                    )
                )
            elif close(x, exp[key] * 3 / 3.35, 0.03):
                problems.append(
                    tr(
                        "step_ms_batch1 uses 3.35 TB/s; this question uses the source chapter's 3 TB/s preset.",
                        "step_ms_batch1 用了 3.35 TB/s；本题用原章节 3 TB/s 的预设。",
                    )
                )
            else:
                problems.append(
                    tr(
                        "step_ms_batch1: count what one batch-1 step must read from memory.",
                        "step_ms_batch1：数一数 batch 为 1 的一步要从显存读哪些东西。",
                    )
                )
                formulas.append(
                    tr(
                        "batch 1 reads every weight once (2 bytes each) plus one sequence's "
                        "KV cache; divide by the bandwidth.",
                        "batch 为 1 时读一遍所有权重（每个 2 字节），再加一条序列的 KV cache；除以带宽。",
                    )
                )
        elif key == "step_ms_batch32":
            if close(x, 32 * exp["step_ms_batch1"], 0.05):
                problems.append(
                    tr(
                        "step_ms_batch32: the weights are read once per step for the whole batch, "
                        "not once per sequence.",
                        "step_ms_batch32：权重每步为整个 batch 读一遍，而不是每条序列读一遍。",
                    )
                )
            elif close(x, weights_ms, 0.01) or close(x, exp["step_ms_batch1"], 0.01):
                problems.append(
                    tr(
                        "step_ms_batch32: each of the 32 sequences also reads its own KV cache "
                        f"of {Q3_CONTEXT} tokens every step.",
                        f"step_ms_batch32：32 条序列每一步还要各自读自己那份 {Q3_CONTEXT} 个 token 的 KV cache。",
                    )
                )
            elif close(x, exp[key] * 1e-3, 0.03):
                problems.append(
                    tr(
                        "step_ms_batch32 looks like seconds; give milliseconds.",
                        "step_ms_batch32 看起来是秒；请给毫秒。",
                    )
                )
            else:
                problems.append(
                    tr(
                        "step_ms_batch32: list what the batch-32 step reads and computes.",
                        "step_ms_batch32：列出 batch 为 32 的一步要读什么、算什么。",
                    )
                )
                formulas.append(
                    tr(
                        "bytes = weights once + 32 KV caches; FLOPs = 32 × the batch-1 FLOPs; "
                        "the floor is the larger of bytes/bandwidth and FLOPs/peak.",
                        "字节 = 权重一遍 + 32 份 KV cache；FLOPs = 32 × batch 为 1 时的 FLOPs；"
                        "下限取两者中较大的：字节数除以带宽，FLOPs 除以峰值。",
                    )
                )
        else:
            if close(x, 1.0, 0.05) or close(
                x, exp["step_ms_batch32"] / exp["step_ms_batch1"], 0.01
            ):
                problems.append(
                    tr(
                        "throughput_ratio: throughput is tokens per second; batch 32 makes 32 "
                        "tokens per step, batch 1 makes one.",
                        "throughput_ratio：吞吐是每秒的 token 数；batch 为 32 时每步产出 32 个 token，"
                        "batch 为 1 时只产出一个。",
                    )
                )
            elif close(x, 32.0, 0.005):
                problems.append(
                    tr(
                        "throughput_ratio: exactly 32 assumes equal step times; use your two step times.",
                        "throughput_ratio：正好 32 等于假设两个单步时间相同；请用你算出的两个单步时间。",
                    )
                )
            else:
                problems.append(
                    tr(
                        "throughput_ratio: compare tokens per second, not step times.",
                        "throughput_ratio：比较的是每秒 token 数，不是单步时间。",
                    )
                )
                formulas.append(
                    tr(
                        "ratio = (32 / step time at 32) / (1 / step time at 1).",
                        "比值 =（32 / batch 32 的单步时间）/（1 / batch 1 的单步时间）。",
                    )
                )
    bound = str(answer["bound"]).strip().lower()
    if bound not in ("memory", "compute"):
        problems.append(
            tr('bound must be "memory" or "compute".', 'bound 必须是 "memory" 或 "compute"。')
        )
    elif bound != exp["bound"]:
        problems.append(
            tr(
                "bound: compare the batch-32 step's FLOP per byte with the ridge point.",
                "bound：把 batch 为 32 的这一步的 FLOP 每字节和拐点比一比。",
            )
        )
        formulas.append(
            tr(
                "ridge = peak FLOP/s / bandwidth; intensity = step FLOPs / step bytes.",
                "拐点 = 峰值 FLOP/s / 带宽；算术强度 = 这一步的 FLOPs / 这一步的字节数。",
            )
        )
    if problems:
        return report(
            not_yet(
                ex,
                staged(ex, " ".join(problems), " ".join(formulas))
                if formulas
                else " ".join(problems),
            )
        )
    return report(
        passed(
            ex,
            tr(
                "right: the weights are read once per step whatever the batch, so the "
                "step barely slows down while 32 sequences share it.",
                "对：不管 batch 多大，权重每步只读一遍，所以 32 条序列共用这一步时，它几乎没有变慢。",
            ),
        )
    )


# A fixed order that does not line up with the answer (shown in this order in the notebook).
CPU_OPTIONS = {
    "a": "this CPU reads the weights once per sequence, an H100 once per step",
    "b": "32 sequences' KV caches do not fit in this machine's memory",
    "c": "at batch 32 the step does more FLOP per byte than this CPU's ridge point, so every "
    "extra sequence's arithmetic costs time",
    "d": "Python's overhead grows with every sequence in the batch",
    "e": "the matrix library reaches only part of the CPU's peak on such thin matrices "
    "(32 rows × hundreds of columns), so even the arithmetic runs slower than its roof",
    "f": "the H100 figure is a floor and the CPU figure a measurement, so they cannot be compared",
}
CPU_RIGHT = {
    "c",
    "e",
}  # both are true of a laptop CPU; c is the roofline reason, e the efficiency one
CPU_WHY_WRONG = {  # (English, Chinese)
    "a": (
        "both run the same batched matmul: one pass over each weight matrix serves the whole batch.",
        "两者跑的是同样的批量 matmul：把每个权重矩阵过一遍，就服务了整个 batch。",
    ),
    "b": (
        "SmolLM2's KV cache for 32 sequences of a few dozen tokens is a few MB; compare with the "
        "machine's memory.",
        "32 条几十个 token 的序列，SmolLM2 的 KV cache 只有几 MB；和本机内存比一比。",
    ),
    "d": (
        "the Python work of a step (scheduling, building tensors) is paid once per step, not per "
        "sequence; the table's step times grow far more than that.",
        "一步里的 Python 开销（调度、构造张量）每步付一次，而不是每条序列付一次；表里单步时间的增长远不止这些。",
    ),
    "f": (
        "a floor is what the hardware allows; comparing the measured step with this machine's own "
        "floor (the table) is exactly how the gap is explained.",
        "下限是硬件允许的极限；把实测的单步时间和本机自己的下限（表里）比较，正是解释这段差距的办法。",
    ),
}


def why_cpu_falls_short(answer: Any) -> CheckResult:
    """Why does this CPU's throughput at batch 32 fall short of 32× batch 1's, while an H100's
    comes close? One letter of CPU_OPTIONS; CPU_RIGHT holds the defensible answers."""
    ex = "ch08.why_cpu_falls_short"
    if answer is None:
        return report(not_yet(ex, NOT_ANSWERED))
    got = str(answer).strip().lower()
    if got not in CPU_OPTIONS:
        return report(
            not_yet(
                ex,
                tr(
                    f"answer one letter of {sorted(CPU_OPTIONS)}.",
                    f"请回答 {sorted(CPU_OPTIONS)} 中的一个字母。",
                ),
            )
        )
    if got in CPU_RIGHT:
        other = (CPU_RIGHT - {got}).pop()
        return report(
            passed(
                ex,
                tr(
                    f"right; option {other} is true as well: the roofline says the "
                    "step is compute-bound here, and the library does not even reach "
                    "the compute roof.",
                    f"对；选项 {other} 也成立：roofline 模型说这一步在这里是 compute-bound 的，"
                    "而矩阵库连算力屋顶都够不着。",
                ),
            )
        )
    return report(
        not_yet(
            ex,
            staged(
                ex,
                tr(*CPU_WHY_WRONG[got]),
                tr(
                    "Look at the table: the FLOP per byte at batch 32 against "
                    "the ridge, and the measured step against its floor.",
                    "看表：batch 为 32 时的 FLOP 每字节和拐点相比如何，实测单步时间和它的下限相比如何。",
                ),
            ),
        )
    )


def _trace() -> list[sim.SimRequest]:
    return [sim.SimRequest(i, 0, n) for i, n in enumerate(TRACE_OUTPUTS)]


def continuous_mean_latency(answer: Any) -> CheckResult:
    """Requests with output lengths TRACE_OUTPUTS all arrive at step 0; max batch TRACE_MAX_BATCH;
    one token per request per step. Mean latency (steps) under continuous batching?"""
    trace = _trace()
    cont = sim.simulate(trace, "continuous", TRACE_MAX_BATCH)
    stat = sim.simulate(trace, "static", TRACE_MAX_BATCH)
    sum_len = sum(TRACE_OUTPUTS)
    return check_number(
        "ch08.continuous_mean_latency",
        answer,
        cont.mean_latency,
        rel=1e-6,
        mistakes=[
            (
                stat.mean_latency,
                tr(
                    "that is static batching: a new request may join as soon as any slot frees.",
                    "这是 static batching 的结果：其实只要有空位，新请求就可以加进来。",
                ),
            ),
            (
                sum_len / len(TRACE_OUTPUTS),
                tr(
                    "that is the mean output length; latency also counts the steps a request waits.",
                    "这是平均输出长度；延迟还要算上请求等待的步数。",
                ),
            ),
            (
                cont.makespan,
                tr(
                    "that is when the last request finishes; average the finish times of all four.",
                    "这是最后一个请求完成的时刻；要对四个请求的完成时刻取平均。",
                ),
            ),
        ],
        default_hint=tr(
            "draw the schedule step by step: which requests hold the two slots, and when "
            "does each one finish?",
            "一步一步画出调度：哪些请求占着那两个位置？每个请求在哪一步完成？",
        ),
        formula=tr(
            "Two run at once, and a waiting request takes a slot in the step after one "
            "finishes; latency = finish step − arrival (0); average the four.",
            "同时跑两个；有请求完成后，等待的请求在下一步占上空位；延迟 = 完成步 − 到达步（0）；四个取平均。",
        ),
    )


def saturation_curve(arrival_rate: float = WIDGET_ARRIVAL_RATE) -> dict[int, float]:
    """Continuous batching's throughput (tokens/step, as the widget prints it: 2 decimals) for
    every max batch of the widget's slider, on the widget's trace at `arrival_rate`."""
    from llmlab.analysis.sim import batching_results

    return {
        b: round(
            batching_results(arrival_rate=arrival_rate, max_batch=b)["continuous"].throughput, 2
        )
        for b in range(1, WIDGET_MAX_BATCH + 1)
    }


def _saturating_batch() -> int:
    curve = saturation_curve()
    best = max(curve.values())
    return min(b for b, t in curve.items() if t == best)


def saturating_max_batch(answer: Any) -> CheckResult:
    """The batching simulator at WIDGET_ARRIVAL_RATE arrivals per step (other sliders at their
    defaults): the smallest max batch at which continuous batching's throughput reaches its
    highest value (raising the max batch further changes nothing)."""
    from llmlab.analysis.sim import batching_results

    expected = _saturating_batch()
    n = len(batching_results(arrival_rate=WIDGET_ARRIVAL_RATE)["continuous"].requests)
    return check_number(
        "ch08.saturating_max_batch",
        answer,
        expected,
        rel=1e-9,
        mistakes=[
            (
                n,
                tr(
                    "that is every request at once; they arrive over time and the first ones finish "
                    "before the last ones come, so they never all run together.",
                    "这是让所有请求同时跑；但请求是陆续到达的，前面的在后面的到来之前就完成了，所以它们从不会全部一起跑。",
                ),
            ),
            (
                WIDGET_MAX_BATCH,
                tr(
                    "that is the slider's end; the throughput stopped growing well before it.",
                    "这是滑块的最右端；吞吐早在这之前就不再增长了。",
                ),
            ),
            (
                8,
                tr(
                    "that is the default max batch; set arrivals/step first, then raise the max batch.",
                    "这是默认的 max batch；先设好 arrivals/step，再调大 max batch。",
                ),
            ),
        ],
        default_hint=tr(
            "set arrivals/step first, then raise the max batch one notch at a time and "
            "watch the continuous line's tok/step: the answer is where it stops changing.",
            "先设好 arrivals/step，再把 max batch 一格一格调大，盯住 continuous 那一行的 tok/step："
            "它不再变化的地方就是答案。",
        ),
        formula=tr(
            "Once the cap is at least the number of requests that are ever running at the "
            "same time, it never binds: the schedule, and so the throughput, stays the same.",
            "一旦上限不小于任何时刻同时在跑的请求数，它就不再起作用：调度不变，吞吐也就不变。",
        ),
    )


WHY_OPTIONS = ["a", "b", "c", "d"]
WHY_TEXT = {
    "a": "its steps run faster than static batching's steps",
    "b": "a finished request's slot is given to a waiting request at the very next step",
    "c": "it skips the prefill of waiting requests",
    "d": "it generates fewer tokens in total",
}


def why_continuous(answer: Any) -> CheckResult:
    """Why does continuous batching finish the same requests sooner than static batching? (a-d, see WHY_TEXT)"""
    return check_choice(
        "ch08.why_continuous",
        answer,
        "b",
        options=WHY_OPTIONS,
        hints={
            "a": tr(
                "a step with the same batch costs the same under both policies; look at how full the batches are.",
                "两种策略下，batch 相同的一步花的时间一样；看看 batch 填得有多满。",
            ),
            "c": tr(
                "every request is still prefilled once under both policies.",
                "两种策略下，每个请求都照样做一次 prefill。",
            ),
            "d": tr(
                "both policies generate exactly the requested tokens (the simulator conserves them).",
                "两种策略生成的 token 数都正好是请求要的数（模拟器保证这一点）。",
            ),
        },
    )


# ---- build exercise: the continuous-batching step (the student's Scheduler.schedule) ---------
BUILDS = {"ch08.build_scheduler": "MyScheduler"}
BUILD_DRIVERS = "llmlab.course.build.ch08"
BUILD_MAX_EXAMPLES = 30
# plugged in: a pool too small for the four requests together, so the engine must preempt
PREEMPT_WORKLOAD = {
    "prompts": [
        list(range(3, 12)),
        list(range(40, 46)),
        list(range(80, 92)),
        list(range(120, 124)),
    ],
    "max_tokens": [8, 10, 6, 9],
    "engine": {
        "block_size": 4,
        "num_kv_blocks": 7,
        "max_model_len": 28,
        "max_num_seqs": 4,
        "max_num_batched_tokens": 16,
    },
}


def _trace_workload(scheduling: str) -> dict:
    """Exercise 3's requests (outputs TRACE_OUTPUTS, TRACE_MAX_BATCH at a time) on the engine."""
    return {
        "prompts": [[10 + 7 * i + j for j in range(4)] for i in range(len(TRACE_OUTPUTS))],
        "max_tokens": list(TRACE_OUTPUTS),
        "engine": {
            "block_size": 4,
            "num_kv_blocks": 32,
            "max_model_len": 32,
            "max_num_seqs": TRACE_MAX_BATCH,
            "scheduling": scheduling,
        },
    }


def schedule_cases():
    """Small scheduler cases: up to 4 requests with their prompt and output lengths and arrival
    steps, a pool that holds at least the longest request, a token budget and a seat cap."""
    from hypothesis import strategies as st

    @st.composite
    def cases(draw):
        n = draw(st.integers(1, 4))
        prompts = draw(st.lists(st.integers(1, 10), min_size=n, max_size=n))
        max_tokens = draw(st.lists(st.integers(1, 8), min_size=n, max_size=n))
        arrivals = draw(st.lists(st.integers(0, 2), min_size=n, max_size=n))
        block_size = draw(st.sampled_from([4, 2]))
        need = max(-(-(p + m) // block_size) for p, m in zip(prompts, max_tokens))
        return {
            "prompts": prompts,
            "max_tokens": max_tokens,
            "arrivals": arrivals,
            "block_size": block_size,
            "num_blocks": need + draw(st.integers(0, 2)),  # tight: preemption is common
            "budget": draw(st.integers(2, 16)),
            "max_num_seqs": draw(st.integers(1, 4)),
        }

    # one case that preempts for sure (two requests outgrow a pool of three blocks), beside
    # the drawn ones
    return st.one_of(st.just(PREEMPT_CASE), cases())


PREEMPT_CASE = {
    "prompts": [3, 2, 2],
    "max_tokens": [2, 3, 3],
    "arrivals": [0, 0, 0],
    "block_size": 2,
    "num_blocks": 4,
    "budget": 8,
    "max_num_seqs": 3,
}


def _names(ids) -> str:
    return ", ".join(ids)


def _fmt_scheduled(pairs) -> str:
    return "[" + ", ".join(f"{rid}:{n}" for rid, n in pairs) + "]"


def _describe_case(case: dict) -> str:
    n = len(case["prompts"])
    names = _names(chr(65 + i) for i in range(n))
    p = ", ".join(map(str, case["prompts"]))
    m = ", ".join(map(str, case["max_tokens"]))
    a = ", ".join(map(str, case["arrivals"]))
    return tr(
        f"requests {names} (prompt tokens {p}; output tokens {m}; arriving at steps {a}), "
        f"a pool of {case['num_blocks']} blocks of {case['block_size']} tokens, budget "
        f"{case['budget']} tokens per step, max_num_seqs {case['max_num_seqs']}",
        f"请求 {names}（prompt token 数 {p}；输出 token 数 {m}；到达的步 {a}），"
        f"块池 {case['num_blocks']} 个块、每块 {case['block_size']} 个 token，"
        f"每步预算 {case['budget']} 个 token，max_num_seqs 为 {case['max_num_seqs']}",
    )


def _fmt_step(obs: dict) -> str:
    pre = obs.get("preempted") or []
    return tr(
        f"{_fmt_scheduled(obs['scheduled'])} and preempted " + (_names(pre) if pre else "nothing"),
        f"{_fmt_scheduled(obs['scheduled'])}，抢占了" + (_names(pre) if pre else "零个请求"),
    )


def _rule(case: dict, before: list[str], got: dict, exp: dict) -> str:
    """Which rule of the step the student's step broke (the state before it was the package's)."""
    got_ids = [rid for rid, _ in got["scheduled"]]
    exp_ids = [rid for rid, _ in exp["scheduled"]]
    if len(set(got_ids)) < len(got_ids):
        return tr(
            "a request scheduled twice in one step: each request is scheduled at most once, "
            "running ones first, then waiting ones.",
            "同一步里一个请求被调度了两次：每个请求一步最多调度一次，先运行中的，再等待中的。",
        )
    if sum(n for _, n in got["scheduled"]) > case["budget"]:
        return tr(
            "over the token budget: subtract each scheduled request's tokens from the budget and "
            "stop when it is spent.",
            "超出了 token 预算：每调度一个请求，都要从预算里减去它的 token 数，预算用完就停。",
        )
    if len(got["running"]) > case["max_num_seqs"]:
        return tr(
            "more requests running than max_num_seqs: admit a waiting request only while "
            "len(self.running) < max_num_seqs.",
            "正在运行的请求超过了 max_num_seqs：只有在 len(self.running) < max_num_seqs 时才能接纳等待中的请求。",
        )
    if got["preempted"] != exp["preempted"]:
        if got["preempted"] and exp["preempted"]:
            return tr(
                "the wrong request preempted: when allocate_slots returns None, preempt the "
                "newest running request (the last of self.running), not an older one.",
                "抢占错了请求：allocate_slots 返回 None 时，要抢占最新的运行中请求（self.running 的最后一个），"
                "而不是更早的请求。",
            )
        return tr(
            "when allocate_slots returns None for a running request, preempt the newest running "
            "request (self.preempt) and try again, until it fits or the request itself was "
            "preempted; admit no waiting request in that step.",
            "当 allocate_slots 对一个运行中的请求返回 None 时，要抢占最新的运行中请求（self.preempt）再试，"
            "直到放得下，或者被抢占的就是它自己；这一步不再接纳等待中的请求。",
        )
    new = [rid for rid in got_ids if rid not in before]
    first_new = min((got_ids.index(r) for r in new), default=len(got_ids))
    running_after_new = any(rid in before for rid in got_ids[first_new:])
    skipped = [rid for rid in exp_ids if rid in before and rid not in got_ids]
    if new and (running_after_new or skipped):
        return tr(
            "running requests come first: give every running request its tokens (oldest first) "
            "before a waiting request is admitted.",
            "运行中的请求优先：先给每个运行中的请求分配 token（从最早的开始），再接纳等待中的请求。",
        )
    return tr(
        "a running request brings min(tokens it has left, budget left): its next prefill chunk "
        "or one decode token; a waiting one its prompt less the cached tokens, or what is left "
        "of the budget.",
        "运行中的请求拿 min(它还剩的 token 数, 剩余预算)：下一个 prefill 分块，或者一个 decode token；"
        "等待中的请求拿它的 prompt 减去已缓存的 token，或者剩余的预算。",
    )


def schedule_hint(case: dict, got: Any, expected: list[dict]) -> str:
    """The shrunk case, the first step where the student's scheduler and the package's differ,
    and the rule broken there."""
    from llmlab.course.build import Raised

    where = _describe_case(case)
    if isinstance(got, Raised):
        return tr(
            f"{where}: your scheduler {got}.",
            f"{where}：你的调度器抛出了 {got.error}：{got.message}。",
        )
    for k, exp in enumerate(expected):
        g = got[k] if k < len(got) else None
        if g == exp:
            continue
        step = k + 1
        if g is None:
            return tr(
                f"{where}: your scheduler finished after step {k}; the package's still scheduled "
                f"{_fmt_step(exp)} at step {step}.",
                f"{where}：你的调度器在第 {k} 步后就结束了；包里的调度器第 {step} 步还调度了 {_fmt_step(exp)}。",
            )
        if "stopped" in exp or "stopped" in g or "scheduled" not in g:
            break
        before = expected[k - 1]["running"] if k else []
        return tr(
            f"{where}: at step {step} your scheduler gave {_fmt_step(g)}; the package's gave "
            f"{_fmt_step(exp)}. {_rule(case, before, g, exp)}",
            f"{where}：第 {step} 步你的调度器给出 {_fmt_step(g)}；包里的调度器给出 {_fmt_step(exp)}。"
            f"{_rule(case, before, g, exp)}",
        )
    return tr(
        f"{where}: your scheduler kept scheduling after the package's had finished every "
        f"request (or never finished within {len(got)} steps).",
        f"{where}：包里的调度器已经完成了所有请求，你的调度器还在继续调度（或者 {len(got)} 步内都没有完成）。",
    )


def _is_scheduler_class(answer: Any) -> bool:
    from llmlab.engine_config import check_scheduler_cls

    if getattr(answer, "grader_stand_in", False):
        return True
    try:
        check_scheduler_cls(answer)
    except ValueError:
        return False
    return isinstance(answer, type)


def build_scheduler(answer: Any) -> CheckResult:
    """Chapter 08's build exercise: `answer` is the student's scheduler class (a subclass of
    `llmlab.engine.Scheduler` whose `schedule()` they wrote). Checked (1) step by step against
    the package's `Scheduler` on small cases drawn by hypothesis (the smallest disagreeing case
    in the hint), (2) in the real engine on a pool small enough to preempt (the same tokens),
    and (3) measured: steps of continuous against static batching on Exercise 3's requests."""
    from llmlab.course.build import drive, find_counterexample
    from llmlab.course.build.ch08 import observe_schedule, run_engine
    from llmlab.engine.scheduler import Scheduler

    ex = "ch08.build_scheduler"
    if answer is None:
        return report(not_yet(ex, NOT_ANSWERED))
    if not _is_scheduler_class(answer):
        return report(
            not_yet(
                ex,
                tr(
                    f"expected your scheduler class (a subclass of Scheduler), got "
                    f"{type(answer).__name__}.",
                    f"这里要你的调度器类（Scheduler 的子类），你给的是 {type(answer).__name__}。",
                ),
            )
        )
    cex = find_counterexample(
        schedule_cases(),
        lambda case: drive(answer, f"{BUILD_DRIVERS}:observe_schedule", case),
        lambda case: observe_schedule(Scheduler, case),
        max_examples=BUILD_MAX_EXAMPLES,
    )
    if cex is not None:
        return report(not_yet(ex, schedule_hint(cex.case, cex.got, cex.expected)))
    try:
        mine = drive(answer, f"{BUILD_DRIVERS}:run_engine", PREEMPT_WORKLOAD)
    except Exception as e:  # the student's class inside the engine
        return report(
            not_yet(
                ex,
                tr(
                    f"plugged into the engine, your scheduler raised {type(e).__name__}: {e}",
                    f"接进引擎后，你的调度器抛出了 {type(e).__name__}：{e}",
                ),
            )
        )
    ref = run_engine(Scheduler, PREEMPT_WORKLOAD)
    if mine["tokens"] != ref["tokens"] or not mine["finished"]:
        return report(
            not_yet(
                ex,
                tr(
                    f"plugged into the engine (LLM(..., scheduler_cls=...)) on a pool of "
                    f"{PREEMPT_WORKLOAD['engine']['num_kv_blocks']} blocks that forces preemption, "
                    f"your scheduler's tokens differ from the package's.",
                    f"接进引擎（LLM(..., scheduler_cls=...)），在只有 "
                    f"{PREEMPT_WORKLOAD['engine']['num_kv_blocks']} 个块、必须抢占的块池上，"
                    f"你的调度器生成的 token 和包里的不一样。",
                ),
            )
        )
    runs = {}
    for policy in ("continuous", "static"):
        runs[("yours", policy)] = drive(
            answer, f"{BUILD_DRIVERS}:run_engine", _trace_workload(policy)
        )
        runs[("package", policy)] = run_engine(Scheduler, _trace_workload(policy))
    return report(passed(ex, build_measurement(mine, ref, runs)))


def build_measurement(mine: dict, ref: dict, runs: dict) -> str:
    """The pass line: the plugged-in run's preemptions, and continuous against static batching
    in steps and tokens per step, the student's scheduler beside the package's."""
    total = sum(TRACE_OUTPUTS)
    yc, ys = runs[("yours", "continuous")], runs[("yours", "static")]
    pc, ps = runs[("package", "continuous")], runs[("package", "static")]
    outs = ", ".join(map(str, TRACE_OUTPUTS))
    return tr(
        f"same tokens as the package's scheduler in the engine, through "
        f"{mine['preemptions']} preemptions (the package's: {ref['preemptions']}). Requests "
        f"wanting {outs} tokens, {TRACE_MAX_BATCH} at a time, in the engine: your scheduler "
        f"takes {yc['steps']} steps continuous, {ys['steps']} static ({total / yc['steps']:.2f} "
        f"vs {total / ys['steps']:.2f} tokens per step); the package's {pc['steps']} and "
        f"{ps['steps']}.",
        f"在引擎里和包里的调度器生成的 token 完全相同，中间经历了 {mine['preemptions']} 次抢占"
        f"（包里的：{ref['preemptions']} 次）。分别要 {outs} 个 token 的请求，每次跑 {TRACE_MAX_BATCH} 个，"
        f"在引擎里：你的调度器 continuous 用 {yc['steps']} 步，static 用 {ys['steps']} 步"
        f"（每步 {total / yc['steps']:.2f} 对 {total / ys['steps']:.2f} 个 token）；"
        f"包里的是 {pc['steps']} 步和 {ps['steps']} 步。",
    )


EXERCISES["build_scheduler"] = ExerciseInfo(
    "reasoning",
    (
        "waiting requests before running ones",
        "oldest running request preempted",
        "max_num_seqs ignored",
        "budget not decreased",
    ),
)


def __getattr__(name: str) -> Any:
    """`seed_q3`: the earlier name of `source_q3`, which notebooks handed out before the rename
    call; the call goes through `source_q3` as the module holds it then, so the grader records it
    under the current id."""
    if name == "seed_q3":
        return lambda answer: source_q3(answer)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
