"""Chapter 12's matching exercises: glossary terms to their Chinese names, vLLM's techniques to the
problems they answer, serving symptoms to their causes; and the source chapter's learning goals
with the exercises that show them."""

from __future__ import annotations

from typing import Any

from llmlab.course.check.catalog import catalog
from llmlab.course.check.core import (
    CheckResult,
    check_dict_keys,
    not_yet,
    passed,
)
from llmlab.course.check.question import matching

M = catalog("ch12")

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
        return not_yet(ex, " ".join(problems))
    return passed(ex)


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
_FIX_WHY = M.texts(
    "vllm_fixes.why", ("kv_cache_quantization", "speculative_decoding", "prefix_caching")
)
_FIX_HINTS = M.texts(
    "vllm_fixes",
    (
        "kv_fragmentation",
        "idle_slots_after_finish",
        "long_prompt_stalls_decodes",
        "repeated_system_prompt",
        "model_too_big_for_one_gpu",
    ),
)


@matching(FIXES, _FIX_HINTS, _FIX_WHY)
def vllm_fixes() -> dict:
    """Answer a dict mapping each of PROBLEMS to the vLLM technique (one of FIXES) that answers it."""
    return _FIX_RIGHT


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
_SYMPTOM_HINTS = M.texts(
    "symptoms",
    (
        "ttft_grows_with_prompt_length",
        "tpot_nearly_flat_from_batch_1_to_8",
        "requests_preempted_with_many_long_chats",
        "tp8_slower_over_pcie_than_over_nvlink",
    ),
)
_SYMPTOM_WHY = M.texts(
    "symptoms.why", ("tokenizer_too_slow", "temperature_too_high", "pipeline_bubble")
)


@matching(CAUSES, _SYMPTOM_HINTS, _SYMPTOM_WHY)
def symptoms() -> dict:
    """Answer a dict mapping each of SYMPTOMS (what a serving team sees) to its cause, one of
    CAUSES."""
    return _SYMPTOM_RIGHT


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
