"""Self-checks of chapter 10 (serving metrics): TPOT of one request, mean TPOT when a request has
a single token, TTLT from TTFT and TPOT, goodput under an SLO, what burstiness does to arrivals
(the arrival explorer's task), the largest batch an H100 can run under a TPOT target (the serving
explorer's task), cost per million tokens, and the source chapter's self-check question 4 (which
metric matters for chat, batch jobs, code completion)."""

from __future__ import annotations

from typing import Any

from llmlab.analysis import costs, metrics, roofline
from llmlab.config import PRESETS
from llmlab.course.check.core import (
    NOT_ANSWERED,
    CheckResult,
    ExerciseInfo,
    as_number,
    check_matching,
    check_number,
    not_yet,
    passed,
    record_expected,
    report,
    staged,
)
from llmlab.i18n import Bilingual, tr

# one request: arrives at 0 s, its 5 tokens come at these times (s)
TPOT_ARRIVAL, TPOT_TOKENS = 0.0, (0.8, 1.0, 1.3, 1.5, 1.9)

# three requests (arrival, token times): the last has one output token
MEAN_TIMELINES = ((0.0, (0.3, 0.35, 0.40, 0.45)), (0.1, (0.5, 0.6, 0.7)), (0.2, (0.9,)))

TTLT_TTFT, TTLT_TPOT, TTLT_N = 0.2, 0.05, 101

# goodput: these requests over GOODPUT_DURATION seconds, with this SLO
GOODPUT_TIMELINES = (
    (0.0, (0.2, 0.28, 0.36)),
    (0.5, (1.4, 1.45)),
    (1.0, (1.1, 1.6, 2.1)),
    (1.5, (1.7,)),
    (2.0, (2.3, 2.35, 2.4, 2.45)),
    (2.1, (2.2, 2.5, 2.8)),
)
GOODPUT_SLO = {"ttft": 0.5, "tpot": 0.1}
GOODPUT_DURATION = 3.0


def tpot(answer: Any) -> CheckResult:
    """A request arrives at TPOT_ARRIVAL and its tokens come at TPOT_TOKENS (s). Its TPOT, in s?"""
    t = metrics.Timeline(TPOT_ARRIVAL, TPOT_TOKENS)
    n = t.num_output_tokens
    return check_number(
        "ch10.tpot",
        answer,
        t.tpot,
        rel=1e-3,
        mistakes=[
            (
                t.e2el / n,
                tr(
                    "that spreads the whole latency, first-token wait included, over every token; "
                    "TPOT starts after the first token.",
                    "这是把整段延迟（包括等第一个 token 的时间）摊到每个 token 上；TPOT 从第一个 token 之后才开始算。",
                ),
            ),
            (
                (t.e2el - t.ttft) / n,
                tr(
                    "after the first token there are n − 1 gaps, not n.",
                    "第一个 token 之后有 n − 1 个间隔，不是 n 个。",
                ),
            ),
            (
                t.e2el / (n - 1),
                tr(
                    "subtract the TTFT first: the wait for the first token is not a gap between tokens.",
                    "先减去 TTFT：等第一个 token 的时间不算 token 之间的间隔。",
                ),
            ),
            (t.tpot * 1e3, tr("give seconds, not milliseconds.", "请给秒，不要给毫秒。")),
        ],
        default_hint=tr(
            "TPOT is the mean gap between tokens after the first one; check which times "
            "you subtracted and how many gaps you divided by.",
            "TPOT 是第一个 token 之后各 token 之间的平均间隔；检查你减的是哪些时间、除以了几个间隔。",
        ),
        formula="TPOT = (E2EL − TTFT) / (n − 1).",
    )


def mean_tpot(answer: Any) -> CheckResult:
    """Mean TPOT (s) over the requests in MEAN_TIMELINES (arrival, token times), the way
    `llmlab.analysis.metrics.summarize` and vLLM's benchmark client compute it."""
    ts = [metrics.Timeline(a, tok) for a, tok in MEAN_TIMELINES]
    defined = [t.tpot for t in ts if t.tpot is not None]
    expected = sum(defined) / len(defined)
    ex = "ch10.mean_tpot"
    if answer is not None and as_number(answer) is None and isinstance(answer, float):
        record_expected(ex, expected)
        return report(
            not_yet(
                ex,
                tr(
                    "NaN is not a mean: a request without a second token has no "
                    "TPOT and is left out.",
                    "NaN 不是平均值：没有第二个 token 的请求没有 TPOT，应当不计入。",
                ),
            )
        )
    itls = [g for t in ts for g in t.itls]
    return check_number(
        ex,
        answer,
        expected,
        rel=1e-3,
        mistakes=[
            (
                sum(defined) / len(ts),
                tr(
                    "you counted the one-token request as TPOT 0; it has no TPOT "
                    "at all and is left out of the mean.",
                    "你把只有一个 token 的请求算成了 TPOT 为 0；它根本没有 TPOT，不计入平均。",
                ),
            ),
            (
                sum(itls) / len(itls),
                tr(
                    "that pools every gap (that is the mean ITL); TPOT is one value "
                    "per request, then averaged over requests.",
                    "这是把所有间隔混在一起平均（那是平均 ITL）；TPOT 是每个请求一个值，再对请求取平均。",
                ),
            ),
        ],
        default_hint=tr(
            "work request by request: one TPOT each (where it exists), then the mean.",
            "逐个请求来算：每个请求一个 TPOT（如果有的话），再取平均。",
        ),
        formula=tr(
            "Each TPOT = (E2EL − TTFT)/(n − 1), for requests with n ≥ 2; average those.",
            "每个 TPOT =（E2EL − TTFT）/（n − 1），只算 n ≥ 2 的请求；再对它们取平均。",
        ),
    )


def ttlt(answer: Any) -> CheckResult:
    """TTFT = TTLT_TTFT s, TPOT = TTLT_TPOT s, TTLT_N output tokens. Time to the last token (s)?"""
    expected = TTLT_TTFT + (TTLT_N - 1) * TTLT_TPOT
    return check_number(
        "ch10.ttlt",
        answer,
        expected,
        rel=1e-4,
        mistakes=[
            (
                TTLT_TTFT + TTLT_N * TTLT_TPOT,
                tr(
                    "the first token is covered by TTFT; only n − 1 tokens follow it.",
                    "第一个 token 已经算在 TTFT 里了；它后面只有 n − 1 个 token。",
                ),
            ),
            (
                TTLT_N * TTLT_TPOT,
                tr(
                    "add the wait for the first token (TTFT).",
                    "加上等第一个 token 的时间（TTFT）。",
                ),
            ),
            (
                (TTLT_N - 1) * TTLT_TPOT,
                tr(
                    "add the wait for the first token (TTFT).",
                    "加上等第一个 token 的时间（TTFT）。",
                ),
            ),
            (expected * 1e3, tr("give seconds, not milliseconds.", "请给秒，不要给毫秒。")),
        ],
        default_hint=tr(
            "picture the timeline: one wait until the first token, then the gaps after it.",
            "想象一下时间线：先等到第一个 token，然后是它之后的一个个间隔。",
        ),
        formula="TTLT ≈ TTFT + (n − 1) · TPOT.",
    )


def goodput(answer: Any) -> CheckResult:
    """Goodput (requests/s) of GOODPUT_TIMELINES over GOODPUT_DURATION s under GOODPUT_SLO (s):
    a request counts when it meets every target; a request with one token has no TPOT to break."""
    ts = [metrics.Timeline(a, tok) for a, tok in GOODPUT_TIMELINES]
    s = metrics.summarize(ts, duration=GOODPUT_DURATION, slo=GOODPUT_SLO)
    strict = (
        sum(
            1
            for t in ts
            if t.ttft <= GOODPUT_SLO["ttft"]
            and t.tpot is not None
            and t.tpot <= GOODPUT_SLO["tpot"]
        )
        / GOODPUT_DURATION
    )
    only_ttft = metrics.summarize(ts, duration=GOODPUT_DURATION, slo={"ttft": GOODPUT_SLO["ttft"]})
    only_tpot = metrics.summarize(ts, duration=GOODPUT_DURATION, slo={"tpot": GOODPUT_SLO["tpot"]})
    return check_number(
        "ch10.goodput",
        answer,
        s.goodput,
        rel=1e-3,
        mistakes=[
            (
                s.request_throughput,
                tr(
                    "that is the throughput of all requests; goodput counts only those "
                    "that met the SLO.",
                    "这是全部请求的吞吐；goodput 只算满足 SLO 的请求。",
                ),
            ),
            (
                strict,
                tr(
                    "the one-token request has no TPOT, so it cannot miss the TPOT target.",
                    "只有一个 token 的请求没有 TPOT，所以它不可能违反 TPOT 目标。",
                ),
            ),
            (
                only_ttft.goodput,
                tr(
                    "check the TPOT target too: a request must meet every target.",
                    "还要检查 TPOT 目标：一个请求必须满足每一个目标。",
                ),
            ),
            (
                only_tpot.goodput,
                tr(
                    "check the TTFT target too: a request must meet every target.",
                    "还要检查 TTFT 目标：一个请求必须满足每一个目标。",
                ),
            ),
            (
                s.num_good,
                tr(
                    "goodput is a rate: divide the good requests by the duration.",
                    "goodput 是一个速率：用达标的请求数除以时长。",
                ),
            ),
        ],
        default_hint=tr(
            "go request by request against both targets; count only those that meet both.",
            "逐个请求对照两个目标；只数两个都满足的。",
        ),
        formula=tr(
            "Goodput = (requests with TTFT ≤ target and TPOT ≤ target) / duration.",
            "goodput =（TTFT ≤ 目标且 TPOT ≤ 目标的请求数）/ 时长。",
        ),
    )


# ----------------------------------------------------------------- the arrival explorer's task

# Statements about two arrival streams at the same rate, burstiness 0.2 and burstiness 5 (keys
# in a fixed shuffled order; the notebook lists them in this order).
BURSTINESS_STATEMENTS_EN = {
    "fewer_per_second": "at 0.2, fewer requests arrive per second on average",
    "short_gaps": "at 0.2, many more gaps are shorter than a tenth of the mean gap",
    "poisson": "burstiness 5 is what vLLM's benchmark client calls Poisson arrivals",
    "same_mean_gap": "the mean gap between arrivals is about the same at both",
    "ttft_tail": "sent to the same server, the 0.2 stream will likely show the higher p99 TTFT",
    "more_throughput": "over a long run, the 0.2 stream gets more requests/s out of the server",
    "less_spread": "at 5, the gaps vary less than Poisson gaps do",
}
# the statements in Chinese, the notebook prints them through BURSTINESS_STATEMENTS
BURSTINESS_STATEMENTS_ZH = {
    "fewer_per_second": "burstiness 为 0.2 时，平均每秒到达的请求更少",
    "short_gaps": "burstiness 为 0.2 时，短于平均间隔十分之一的间隔要多得多",
    "poisson": "burstiness 为 5 就是 vLLM 的 benchmark 客户端所说的泊松到达",
    "same_mean_gap": "两种设置下，到达之间的平均间隔差不多",
    "ttft_tail": "发给同一台服务器时，0.2 的那股请求流多半会有更高的 p99 TTFT",
    "more_throughput": "长期来看，0.2 的那股请求流能从服务器拿到更多的 requests/s",
    "less_spread": "burstiness 为 5 时，间隔的波动比泊松过程的间隔小",
}
# shown in the language in use; the keys are what the student answers with
BURSTINESS_STATEMENTS = Bilingual(BURSTINESS_STATEMENTS_EN, BURSTINESS_STATEMENTS_ZH)
BURSTINESS_TRUE = frozenset({"short_gaps", "same_mean_gap", "ttft_tail", "less_spread"})
# (English, Chinese) for each false statement, and for each true one a student may miss
BURSTINESS_WHY_WRONG = {
    "fewer_per_second": (
        "burstiness reshapes the gaps, not the rate: compare the mean gap the "
        "explorer prints at both settings.",
        "burstiness 改变的是间隔的分布，不是速率：比较两种设置下探索器打印的平均间隔。",
    ),
    "poisson": (
        "Poisson gaps are exponential, which is a single burstiness value: find the one "
        "at which the explorer prints a CV of 1.",
        "泊松过程的间隔服从指数分布，只对应一个 burstiness 值：找出探索器打印 CV 为 1 的那个值。",
    ),
    "more_throughput": (
        "below capacity the server finishes what is offered: over a long run both "
        "streams deliver the offered rate; clumps change who waits, not how much "
        "gets done.",
        "在容量以内，服务器来多少就完成多少：长期来看两股请求流都按到达速率完成；"
        "扎堆到达改变的是谁在等，而不是完成了多少。",
    ),
}
BURSTINESS_MISSED = {
    "short_gaps": (
        "Look at the gap histogram near zero at both settings.",
        "看两种设置下间隔直方图在 0 附近的部分。",
    ),
    "same_mean_gap": (
        "Compare the mean gap the explorer prints at both settings.",
        "比较两种设置下探索器打印的平均间隔。",
    ),
    "ttft_tail": (
        "Think of what a clump of requests arriving together does to the last of them: "
        "it waits behind the others' prefills.",
        "想一想一堆请求同时到达时，最后那个会怎样：它要排在其他请求的 prefill 后面等。",
    ),
    "less_spread": (
        "Compare the CV of the gaps at 5 with Poisson's (burstiness 1).",
        "把 burstiness 为 5 时间隔的 CV 和泊松过程（burstiness 为 1）的比一比。",
    ),
}


def burstiness(answer: Any) -> CheckResult:
    """The set of keys of BURSTINESS_STATEMENTS that are true (same rate, burstiness 0.2 vs 5)."""
    ex = "ch10.burstiness"
    if answer is None:
        return report(not_yet(ex, NOT_ANSWERED))
    items = [answer] if isinstance(answer, str) else answer
    if not isinstance(items, (list, tuple, set, frozenset)):
        return report(
            not_yet(
                ex,
                tr(
                    "answer a set of keys of ch10.BURSTINESS_STATEMENTS.",
                    "请回答一个由 ch10.BURSTINESS_STATEMENTS 的键组成的集合。",
                ),
            )
        )
    got = {str(a).strip().lower() for a in items}
    unknown = got - set(BURSTINESS_STATEMENTS)
    if unknown:
        return report(
            not_yet(
                ex,
                tr(
                    f"choose keys from {list(BURSTINESS_STATEMENTS)}; got {sorted(unknown)}.",
                    f"请从 {list(BURSTINESS_STATEMENTS)} 中选键；你给的是 {sorted(unknown)}。",
                ),
            )
        )
    wrong = sorted(got - BURSTINESS_TRUE)
    if wrong:
        parts = []
        for k in wrong:
            why = tr(*BURSTINESS_WHY_WRONG[k])
            parts.append(tr(f"{k}: {why}", f"{k}：{why}"))
        return report(not_yet(ex, " ".join(parts)))
    missed = [k for k in BURSTINESS_STATEMENTS if k in BURSTINESS_TRUE - got]
    if missed:
        first = tr(
            f"everything you chose holds, but {len(missed)} more statement(s) hold too.",
            f"你选的都成立，但还有 {len(missed)} 条说法也成立。",
        )
        return report(
            not_yet(ex, staged(ex, first, " ".join(tr(*BURSTINESS_MISSED[k]) for k in missed)))
        )
    return report(
        passed(
            ex,
            tr(
                "right: burstiness keeps the rate and moves the gaps; clumps are "
                "what a TTFT tail is made of.",
                "对：burstiness 保持速率不变，只改变间隔；TTFT 的长尾正是由扎堆的请求造成的。",
            ),
        )
    )


# ----------------------------------------------------------------- the serving explorer's task

SLO_MODEL, SLO_HARDWARE, SLO_CONTEXT, SLO_TPOT = "llama-3-8b", "H100-SXM", 2048, 0.012
SLO_DTYPE_BYTES = 2


def _tpot_floor(batch: int) -> float:
    return roofline.decode_step_floor(
        PRESETS[SLO_MODEL], SLO_HARDWARE, batch, SLO_CONTEXT, SLO_DTYPE_BYTES
    )


def _largest_batch() -> int:
    """The largest batch whose decode-step floor (the TPOT of every request in it) stays within
    SLO_TPOT, for SLO_MODEL on SLO_HARDWARE at SLO_CONTEXT tokens of context each."""
    lo, hi = 1, 1
    while _tpot_floor(hi * 2) <= SLO_TPOT:
        hi *= 2
    hi *= 2
    while hi - lo > 1:  # invariant: floor(lo) within the target, floor(hi) over it
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if _tpot_floor(mid) <= SLO_TPOT else (lo, mid)
    return lo


def largest_batch_under_slo(answer: Any) -> CheckResult:
    """The largest batch (sequences decoded together) of SLO_MODEL on SLO_HARDWARE, BF16, each
    sequence at SLO_CONTEXT tokens of context, whose TPOT stays within SLO_TPOT seconds."""
    ex = "ch10.largest_batch_under_slo"
    expected = _largest_batch()
    record_expected(ex, expected)
    if answer is None:
        return report(not_yet(ex, NOT_ANSWERED))
    x = as_number(answer)
    if x is None or x != int(x) or x < 1:
        return report(
            not_yet(
                ex,
                tr(
                    f"answer a whole number of sequences, got {answer!r}.",
                    f"请回答一个整数（序列条数），你给的是 {answer!r}。",
                ),
            )
        )
    b = int(x)
    if b == expected:
        return report(
            passed(
                ex,
                tr(
                    "right: past this batch every user's tokens come slower than the "
                    "target; below it the card sits partly idle and each token "
                    "costs more.",
                    "对：超过这个 batch，每个用户的 token 都会比目标来得慢；低于它，"
                    "卡有一部分闲着，每个 token 的成本更高。",
                ),
            )
        )
    kv = costs.kv_bytes(PRESETS[SLO_MODEL], SLO_CONTEXT, SLO_DTYPE_BYTES)
    if b > expected:
        hint = tr(
            "at that batch the step takes longer than the TPOT target: every request in the "
            "batch gets its tokens that much slower. Check the context length and target you set.",
            "在这个 batch 下，一步的时间超过了 TPOT 目标：batch 里每个请求拿到 token 都会慢这么多。"
            "检查你设的上下文长度和目标。",
        )
        more = tr(
            f"Each extra sequence adds its own KV cache ({kv / 1e6:.0f} MB at this context) "
            "to the bytes every step reads.",
            f"每多一条序列，就给每一步要读的字节数加上它自己的 KV cache（在这个上下文下是 {kv / 1e6:.0f} MB）。",
        )
    else:
        hint = tr(
            "a larger batch still meets the target; each step would then serve more users for "
            "about the same time, so every token would cost less.",
            "更大的 batch 仍能满足目标；那样每一步在差不多的时间里服务更多用户，每个 token 的成本更低。",
        )
        more = tr(
            "While memory-bound, step time ≈ (weight bytes + batch × KV bytes per sequence) / "
            "memory bandwidth; find where it reaches the target.",
            "在 memory-bound 时，单步时间 ≈（权重字节数 + batch × 每条序列的 KV 字节数）/ 显存带宽；"
            "找出它达到目标的地方。",
        )
    return report(not_yet(ex, staged(ex, hint, more)))


# ----------------------------------------------------------------- break-even throughput

COST_PRICE_PER_HOUR = 3.1  # US$ per hour for the card (a made-up quote)
COST_SELL_PER_MILLION = 0.25  # US$ charged per million output tokens (made up too)


def break_even_tokens_per_s(answer: Any) -> CheckResult:
    """The output tokens per second a card rented at COST_PRICE_PER_HOUR must sustain, busy all
    hour, for a million tokens to cost exactly COST_SELL_PER_MILLION (the price it sells them at)."""
    expected = COST_PRICE_PER_HOUR / COST_SELL_PER_MILLION * 1e6 / 3600
    return check_number(
        "ch10.break_even_tokens_per_s",
        answer,
        expected,
        rel=1e-2,
        mistakes=[
            (
                expected * 3600,
                tr(
                    "that is tokens per hour; the question asks tokens per second.",
                    "这是每小时的 token 数；题目问的是每秒。",
                ),
            ),
            (expected * 60, tr("an hour has more than 60 seconds.", "一小时可不止 60 秒。")),
            (
                COST_SELL_PER_MILLION / COST_PRICE_PER_HOUR * 1e6 / 3600,
                tr(
                    "upside down: a dearer card needs *more* tokens per second to pay for itself.",
                    "除反了：卡越贵，每秒需要的 token 越*多*才能回本。",
                ),
            ),
            (
                COST_PRICE_PER_HOUR / COST_SELL_PER_MILLION / 3600,
                tr(
                    "the selling price is per *million* tokens: how many tokens does one dollar buy?",
                    "售价是按*百万* token 计的：一美元能卖出多少个 token？",
                ),
            ),
        ],
        default_hint=tr(
            "the hour's price must be earned back by the tokens of that hour, sold at the "
            "selling price; solve the section's cost formula for the tokens per second.",
            "这一小时的价格，要靠这一小时产出的 token 按售价卖出去赚回来；把本节的成本公式反过来解出每秒 token 数。",
        ),
        formula=tr(
            "tokens/s = price per hour / (selling price per token) / seconds per hour, with the "
            "price per token = selling price per million / 10⁶.",
            "每秒 token 数 = 每小时价格 / 每个 token 的售价 / 每小时秒数，其中每个 token 的售价 = 每百万 token 售价 / 10⁶。",
        ),
    )


# ----------------------------------------------------------------- the source chapter's question 4

Q4_KEYS = ("chat", "batch_jobs", "code_completion")
# the options, in a fixed order that does not line up with the keys
Q4_METRICS = ("gpu_util", "e2el", "tpot", "throughput", "ttft")
# several answers are defensible; each set holds the ones a good answer may name first
Q4_ACCEPT = {
    "chat": frozenset({"ttft", "tpot"}),
    "batch_jobs": frozenset({"throughput"}),
    "code_completion": frozenset({"ttft", "e2el"}),
}
Q4_HINTS = {  # (English, Chinese)
    "chat": (
        "a person watches the screen while the reply streams in: which waits do they feel?",
        "用户盯着屏幕看回复一点点流出来：他能感觉到哪些等待？",
    ),
    "batch_jobs": (
        "nobody watches an offline job token by token; what decides its cost is how "
        "much work finishes per GPU-hour.",
        "没人会一个 token 一个 token 地盯着离线任务；决定它成本的是每 GPU 小时完成多少工作。",
    ),
    "code_completion": (
        "a completion is short and only useful if it shows up, whole, before the "
        "programmer types on; which wait is that?",
        "一次补全很短，只有在程序员接着敲键盘之前完整出现才有用；这是哪一种等待？",
    ),
}
Q4_WHY_WRONG = {
    "gpu_util": (
        "utilisation says the GPU is busy, not that it turns out useful work fast: a "
        "memory-bound decode at batch 1 keeps it busy reading weights while producing "
        "few tokens. It is a platform gauge, not a product's target.",
        "利用率只说明 GPU 在忙，不说明它在快速产出有用的工作：batch 为 1 的 decode 是 memory-bound 的，"
        "GPU 忙着读权重，却只产出很少的 token。它是平台的监控指标，不是产品的目标。",
    ),
}


def seed_q4(answer: Any) -> CheckResult:
    """The source chapter's question 4. Answer a dict mapping each of Q4_KEYS to the metric that
    matters most, one of Q4_METRICS."""
    return check_matching(
        "ch10.seed_q4",
        answer,
        Q4_ACCEPT,
        choices=Q4_METRICS,
        hints={key: tr(*pair) for key, pair in Q4_HINTS.items()},
        why_wrong={key: tr(*pair) for key, pair in Q4_WHY_WRONG.items()},
        success=tr(
            "right: optimise for one or two targets per product; they pull "
            "in different directions (a bigger batch raises throughput and "
            "TPOT).",
            "对：每个产品只盯一两个目标来优化；这些目标会互相拉扯"
            "（batch 更大，吞吐和 TPOT 都会升高）。",
        ),
    )


EXERCISES: dict[str, ExerciseInfo] = {
    "tpot": ExerciseInfo(
        "plug-in",
        (
            "whole latency over n tokens",
            "n gaps instead of n − 1",
            "TTFT not subtracted",
            "milliseconds",
        ),
    ),
    "mean_tpot": ExerciseInfo(
        "plug-in",
        (
            "one-token request counted as TPOT 0",
            "NaN for the one-token request",
            "pooled gaps (mean ITL)",
        ),
    ),
    "ttlt": ExerciseInfo("plug-in", ("n gaps instead of n − 1", "TTFT left out", "milliseconds")),
    "goodput": ExerciseInfo(
        "plug-in",
        (
            "throughput of all requests",
            "one-token request failing TPOT",
            "one target only",
            "a count, not a rate",
        ),
    ),
    "burstiness": ExerciseInfo(
        "reasoning",
        (
            "burstiness changes the rate",
            "bursty arrivals raise long-run throughput",
            "which burstiness is Poisson",
        ),
    ),
    "largest_batch_under_slo": ExerciseInfo(
        "reasoning", ("batch past the TPOT target", "batch below the largest one that meets it")
    ),
    "break_even_tokens_per_s": ExerciseInfo(
        "reasoning",
        (
            "tokens per hour",
            "minutes vs seconds",
            "upside down",
            "per token instead of per million",
        ),
    ),
    "seed_q4": ExerciseInfo(
        "reasoning",
        ("throughput for chat", "GPU utilisation as a target", "TTFT for batch jobs"),
        source_question=4,
    ),
}
