"""Self-checks of chapter 03 (generation): forwards per generated token, tokens processed without
a cache, top-p by hand and as a function you write, temperature, and what top-p keeps at two temperatures (found with the
sampling explorer)."""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import torch

from llmlab.course.check.core import (
    NOT_ANSWERED,
    CheckResult,
    ExerciseInfo,
    as_number,
    check_number,
    not_yet,
    passed,
    record_expected,
    report,
    staged,
)
from llmlab.i18n import tr

PROMPT_LEN, NEW_TOKENS = 20, 100
SAMPLING_LOGITS = [3.0, 2.0, 1.0, 0.5, 0.0, -1.0]  # token ids 0..5
TOP_P = 0.8
TEMPERATURE = 0.5
TEMP_LOGITS = [2.0, 1.0, 0.0]


def forwards(answer: Any) -> CheckResult:
    """How many forward passes does the model run to generate NEW_TOKENS tokens from a
    PROMPT_LEN-token prompt (no stop token; with or without a cache, the count is the same)?"""
    expected = NEW_TOKENS
    return check_number(
        "ch03.forwards",
        answer,
        expected,
        rel=1e-9,
        mistakes=[
            (
                PROMPT_LEN + NEW_TOKENS,
                tr(
                    "the prompt is not fed one token per forward: one forward "
                    "takes the whole prompt at once.",
                    "prompt 不是每次前向计算喂一个 token：一次前向计算就吃下整个 prompt。",
                ),
            ),
            (
                NEW_TOKENS - 1,
                tr(
                    "the first new token also needs a forward: the one over the prompt "
                    "(prefill) produces it.",
                    "第一个新 token 也需要一次前向计算：正是对 prompt 的那一次（prefill）"
                    "产生了它。",
                ),
            ),
            (
                NEW_TOKENS + 1,
                tr(
                    "no extra forward for the prompt alone: the forward over the prompt "
                    "already yields the first new token.",
                    "不用为 prompt 单独多做一次前向计算：对 prompt 的那次前向计算已经产出"
                    "了第一个新 token。",
                ),
            ),
            (
                1,
                tr(
                    "a forward yields one next token only; the next one depends on it.",
                    "一次前向计算只产出下一个 token；再下一个要依赖它。",
                ),
            ),
        ],
        default_hint=tr(
            "not the number of forwards: think about what one forward hands back.",
            "不是前向计算的次数：想一想一次前向计算交回来的是什么。",
        ),
        formula=tr(
            "Each forward ends in one sampled token; count the tokens you need.",
            "每次前向计算最后采样出一个 token；数一数你需要多少个 token。",
        ),
    )


def tokens_processed_no_cache(answer: Any) -> CheckResult:
    """Without a KV cache, how many token positions go through the model in total while
    generating NEW_TOKENS tokens from a PROMPT_LEN-token prompt?"""
    n, p = NEW_TOKENS, PROMPT_LEN
    expected = sum(p + i for i in range(n))
    return check_number(
        "ch03.tokens_processed_no_cache",
        answer,
        expected,
        rel=1e-9,
        mistakes=[
            (
                p + n,
                tr(
                    "that is the final length; without a cache every forward re-reads the whole "
                    "sequence so far.",
                    "这是最终长度；没有 KV cache 时，每次前向计算都要把到目前为止的整个序列重新过一遍。",
                ),
            ),
            (
                sum(p + i for i in range(n + 1)),
                tr(
                    "one step too many: the last token is sampled, never fed back in.",
                    "多算了一步：最后一个 token 只是采样出来，不会再喂回模型。",
                ),
            ),
            (
                sum(p + i for i in range(1, n + 1)),
                tr(
                    "the first forward sees the prompt only; the sequence "
                    "grows by one token per forward after that.",
                    "第一次前向计算只看到 prompt；此后每做一次前向计算，序列才长一个 token。",
                ),
            ),
            (
                n * (p + n),
                tr(
                    "not every forward sees the final length: the sequence grows one token per forward.",
                    "不是每次前向计算都看到最终长度：序列每次前向计算只长一个 token。",
                ),
            ),
        ],
        default_hint=tr(
            "not the total: think about how long the sequence is at each forward.",
            "不是总数：想一想每次前向计算时序列有多长。",
        ),
        formula=tr(
            "Forward k (k = 0, 1, ...) sees the prompt plus the k tokens generated so far; add them up.",
            "第 k 次前向计算（k = 0, 1, ...）看到的是 prompt 加上已生成的 k 个 token；把它们加起来。",
        ),
    )


def _kept(logits: list[float], top_p: float) -> set[int]:
    from llmlab.sampling import apply_top_k_top_p

    x = torch.tensor([logits])
    out = apply_top_k_top_p(x, torch.tensor([len(logits)]), torch.tensor([top_p]))
    return {i for i, v in enumerate(out[0].tolist()) if v != float("-inf")}


def top_p_kept(answer: Any) -> CheckResult:
    """With top-p = TOP_P on SAMPLING_LOGITS (temperature 1), which token ids stay in the nucleus?
    Answer with a set of ints."""
    ex = "ch03.top_p_kept"
    if answer is None:
        return report(not_yet(ex, NOT_ANSWERED))
    try:
        got = {int(a) for a in answer}
    except (TypeError, ValueError):
        return report(
            not_yet(
                ex,
                tr(
                    "answer with a set of token ids (ints), e.g. {4, 5}.",
                    "请用一个 token id（int）的集合作答，例如 {4, 5}。",
                ),
            )
        )
    expected = _kept(SAMPLING_LOGITS, TOP_P)
    for token_id in sorted(expected):
        record_expected(ex, token_id)
    if got == expected:
        return report(passed(ex))
    order = sorted(range(len(SAMPLING_LOGITS)), key=lambda i: -SAMPLING_LOGITS[i])
    top_n = set(order[: len(got)])
    if got != top_n:
        return report(
            not_yet(
                ex,
                tr(
                    "the nucleus is always the most likely tokens first; your set skips "
                    "a more likely token.",
                    "top-p 留下的集合总是从最可能的 token 取起；你的集合跳过了一个更可能的 token。",
                ),
            )
        )
    if len(got) < len(expected):
        return report(
            not_yet(
                ex,
                tr(
                    "one short: the token whose probability pushes the running sum past "
                    "top_p is kept (the nucleus is the smallest set that reaches top_p).",
                    "少了一个：让累计和越过 top_p 的那个 token 也要留下（top-p 留下的"
                    "是累计概率达到 top_p 的最小集合）。",
                ),
            )
        )
    return report(
        not_yet(
            ex,
            tr(
                "too many: stop as soon as the running sum of probabilities reaches top_p.",
                "多了：概率的累计和一达到 top_p 就该停下。",
            ),
        )
    )


def _top_p_cases() -> list[tuple[torch.Tensor, float]]:
    """Probability vectors and top_p values with no running sum within 1e-3 of top_p (so float
    rounding cannot move the edge of the nucleus), the ids shuffled so that id order != rank."""
    g = torch.Generator().manual_seed(3)
    cases = []
    for size, p in ((6, 0.8), (10, 0.5), (50, 0.9), (8, 0.3), (200, 0.95), (5, 0.999)):
        while True:
            probs = torch.rand(size, generator=g, dtype=torch.float64) ** 3
            probs = probs / probs.sum()
            running = probs.sort(descending=True).values.cumsum(0)
            if (running - p).abs().min() > 1e-3:
                break
        cases.append((probs, p))
    cases.append((torch.tensor([0.9, 0.05, 0.05], dtype=torch.float64), 0.5))  # the top token alone
    return cases


def _nucleus(probs: torch.Tensor, top_p: float) -> set[int]:
    from llmlab.sampling import apply_top_k_top_p

    out = apply_top_k_top_p(probs.log()[None], torch.tensor([probs.numel()]), torch.tensor([top_p]))
    return {i for i, v in enumerate(out[0].tolist()) if v != float("-inf")}


def top_p_function(fn: Any) -> CheckResult:
    """Write the nucleus yourself: fn(probs, top_p) takes a 1-D tensor of probabilities (summing to
    1) and top_p in (0, 1), and returns the set of token ids in the nucleus (the smallest set of
    most likely tokens whose probabilities sum to at least top_p)."""
    ex = "ch03.top_p_function"
    if fn is None:
        return report(not_yet(ex, NOT_ANSWERED))
    if not callable(fn):
        return report(
            not_yet(
                ex,
                tr(
                    f"expected a function, got {type(fn).__name__}.",
                    f"这里要一个函数，你给的是 {type(fn).__name__}。",
                ),
            )
        )
    then = tr(
        "Sort the ids by probability, largest first; walk down the list adding probabilities, "
        "and keep each token whose probability mass *before* it is still below top_p.",
        "把 id 按概率从大到小排好；沿着列表往下走，边走边累加概率，凡是它*之前*的累计概率还"
        "低于 top_p 的 token 都留下。",
    )
    for probs, p in _top_p_cases():
        want = _nucleus(probs, p)
        try:
            got = fn(probs.clone(), p)
            got = {int(i) for i in (got.tolist() if hasattr(got, "tolist") else got)}
        except Exception as e:  # the learner's code: report, never crash the notebook
            return report(
                not_yet(
                    ex,
                    tr(
                        f"your function raised {type(e).__name__}: {e}",
                        f"你的函数抛出了 {type(e).__name__}：{e}",
                    ),
                )
            )
        if got == want:
            continue
        order = probs.argsort(descending=True).tolist()
        if got == set(order[: len(want) - 1]):
            first = tr(
                "one short: you stop before the token whose probability carries the sum past "
                "top_p; the nucleus includes it.",
                "少了一个：你在让累计和越过 top_p 的那个 token 之前就停了；它也该留下。",
            )
        elif got == set(order[: len(want) + 1]):
            first = tr(
                "one too many: the token after the one that reaches top_p is not in the nucleus.",
                "多了一个：累计和达到 top_p 的那个 token 之后的 token 不该留下。",
            )
        elif got == set(range(len(got))) and got != set(order[: len(got)]):
            first = tr(
                "you walked the ids in index order; the nucleus takes the most likely tokens "
                "first, whatever their ids.",
                "你是按 id 的顺序走的；top-p 先取最可能的 token，不管它们的 id 是多少。",
            )
        elif len(got) == len(want):
            first = tr(
                "the right number of tokens, but not the most likely ones.",
                "token 的个数对了，但不是最可能的那几个。",
            )
        else:
            first = tr(
                f"wrong nucleus for a vector of {probs.numel()} probabilities with top_p={p}.",
                f"对含 {probs.numel()} 个概率、top_p={p} 的向量，留下的集合不对。",
            )
        return report(not_yet(ex, staged(ex, first, then)))
    return report(
        passed(
            ex,
            tr(
                "correct: that is the nucleus llmlab.sampling and vLLM's sampler keep.",
                "正确：llmlab.sampling 和 vLLM 的采样器留下的正是这个集合。",
            ),
        )
    )


def temperature_prob(answer: Any) -> CheckResult:
    """Probability of token 0 for logits TEMP_LOGITS at temperature TEMPERATURE."""
    x = torch.tensor(TEMP_LOGITS)
    expected = float((x / TEMPERATURE).softmax(0)[0])
    return check_number(
        "ch03.temperature_prob",
        answer,
        expected,
        rel=1e-3,
        mistakes=[
            (
                float(x.softmax(0)[0]),
                tr(
                    "that is temperature 1: divide the logits by the temperature first.",
                    "这是温度为 1 时的值：先把 logits 除以温度。",
                ),
            ),
            (
                float((x * TEMPERATURE).softmax(0)[0]),
                tr("you multiplied by the temperature; divide by it.", "你乘了温度；应该除以它。"),
            ),
            (
                float((x.softmax(0) / TEMPERATURE)[0]),
                tr(
                    "divide the logits, not the probabilities, then softmax.",
                    "要除的是 logits，不是概率，然后再做 softmax。",
                ),
            ),
        ],
        default_hint=tr(
            "not the probability at this temperature: check each step and its order.",
            "不是这个温度下的概率：检查每一步和它们的先后顺序。",
        ),
        formula=tr(
            "Softmax(logits / temperature), then read entry 0.",
            "Softmax(logits / temperature)，然后读第 0 项。",
        ),
    )


# ----------------------------------------------------------------------------- the sampling explorer

EXPLORER_PROMPT = "My favourite fruit is the"
EXPLORER_TOP_P = 0.9
EXPLORER_TEMPERATURES = (1.0, 0.5)


@lru_cache(maxsize=1)
def _explorer_logits():
    from llmlab.analysis.distribution import prompt_logits
    from llmlab.model import load_model

    model, tok = load_model("smollm2-135m")
    return prompt_logits(EXPLORER_PROMPT, model, tok)


def samplable_counts() -> dict[float, int]:
    """How many tokens can be sampled after EXPLORER_PROMPT with top-p EXPLORER_TOP_P, at each of
    EXPLORER_TEMPERATURES (the real model; what the explorer's summary line shows)."""
    from llmlab.analysis.distribution import next_token_distribution

    logits = _explorer_logits()
    return {
        t: next_token_distribution(logits, t, -1, EXPLORER_TOP_P).num_kept
        for t in EXPLORER_TEMPERATURES
    }


def _close_count(got: float, want: int) -> bool:
    # float rounding of the running sum can move the nucleus edge by a token between machines
    return abs(got - want) <= max(1, 0.02 * want)


def samplable_tokens(answer: Any) -> CheckResult:
    """With the sampling explorer on EXPLORER_PROMPT and top_p = EXPLORER_TOP_P: how many tokens
    can be sampled at each temperature of EXPLORER_TEMPERATURES? A dict {temperature: count}."""
    ex = "ch03.samplable_tokens"
    want = samplable_counts()
    for count in want.values():
        record_expected(ex, count)
    if answer is None:
        return report(not_yet(ex, NOT_ANSWERED))
    got = (
        {as_number(k): as_number(v) for k, v in answer.items()} if isinstance(answer, dict) else {}
    )
    if set(got) != set(want) or any(v is None for v in got.values()):
        keys = ", ".join(f"{t:g}" for t in EXPLORER_TEMPERATURES)
        return report(
            not_yet(
                ex,
                tr(
                    f"answer a dict from each temperature ({keys}) to a count of tokens.",
                    f"请用一个 dict 作答：每个温度（{keys}）对应一个 token 数。",
                ),
            )
        )
    hi, lo = max(want), min(want)
    if all(_close_count(got[t], want[t]) for t in want):
        return report(
            passed(
                ex,
                tr(
                    "correct: at the lower temperature the distribution is sharper, "
                    "so fewer tokens are needed to reach the same top_p.",
                    "正确：温度越低，分布越尖，达到同样的 top_p 所需的 token 就越少。",
                ),
            )
        )
    if _close_count(got[hi], want[lo]) and _close_count(got[lo], want[hi]):
        return report(
            not_yet(
                ex,
                tr(
                    "the two counts are the wrong way round: which temperature "
                    "makes the distribution sharper?",
                    "两个数弄反了：哪个温度让分布更尖？",
                ),
            )
        )
    if got[hi] == got[lo]:
        return report(
            not_yet(
                ex,
                staged(
                    ex,
                    tr(
                        "the counts differ between the two temperatures: "
                        "did you move the temperature slider between readings?",
                        "两个温度下的数并不相同：两次读数之间，你移动温度滑块了吗？",
                    ),
                    tr(
                        "Temperature is applied before top-p, so it changes how "
                        "many tokens the nucleus needs.",
                        "温度在 top-p 之前起作用，所以它会改变 top-p 要留下多少个 token。",
                    ),
                ),
            )
        )
    return report(
        not_yet(
            ex,
            staged(
                ex,
                tr(
                    "at least one count is off: set top_p first, then read the "
                    "line above the chart at each temperature.",
                    "至少有一个数不对：先设好 top_p，再在每个温度下读图表上方的那一行。",
                ),
                tr(
                    "Keep top_k at -1 (off) and the prompt unchanged; the line "
                    "reads 'tokens that can be sampled: N'.",
                    "top_k 保持 -1（关闭），prompt 不要改；那一行给出的是可以采样的 token 数 N。",
                ),
            ),
        )
    )


EXERCISES: dict[str, ExerciseInfo] = {
    "forwards": ExerciseInfo(
        "reasoning",
        mistakes=(
            "one forward per prompt token",
            "first token not counted",
            "an extra forward for the prompt alone",
        ),
    ),
    "tokens_processed_no_cache": ExerciseInfo(
        "reasoning",
        mistakes=("final length only", "last token fed back", "every forward at the final length"),
    ),
    "top_p_kept": ExerciseInfo(
        "plug-in",
        mistakes=(
            "a more likely token skipped",
            "the token that crosses top_p left out",
            "kept past top_p",
        ),
    ),
    "top_p_function": ExerciseInfo(
        "reasoning",
        mistakes=(
            "the crossing token left out",
            "one token past top_p kept",
            "ids walked in index order, not by probability",
        ),
    ),
    "temperature_prob": ExerciseInfo(
        "plug-in",
        mistakes=("temperature 1", "multiplied by T", "probabilities divided instead of logits"),
    ),
    "samplable_tokens": ExerciseInfo(
        "plug-in", mistakes=("temperatures swapped", "temperature not changed between readings")
    ),
}
