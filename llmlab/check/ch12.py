"""Self-checks of chapter 12 (glossary and review): the generation loop of the seed's question
1 put in order, glossary terms matched across English and Chinese, and the problem each vLLM
technique answers. The seed's five questions are checked by the chapters that teach them;
`SEED_QUESTIONS` says which checker covers which question, and chapter 12 calls them all."""
from __future__ import annotations

from typing import Any

from llmlab.check.core import (NOT_ANSWERED, CheckResult, check_dict_keys, check_matching, not_yet,
                               passed, report)
from llmlab.check.ch05 import STEPS as FORWARD_STEPS

# The seed's five self-check questions and the checkers (module, function) that answer them.
SEED_QUESTIONS: dict[int, tuple[str, tuple[tuple[str, str], ...]]] = {
    1: ("Draw the loop input -> tokens -> forward -> sample; mark where the KV cache is read and written.",
        (("ch12", "generation_loop_order"), ("ch05", "cache_writes"), ("ch05", "cache_reads"))),
    2: ("Llama-3-70B (80 layers, BF16, GQA): KV bytes per token, and GB for a 4K-token request.",
        (("ch04", "kv_bytes_per_token"), ("ch04", "kv_gb_for_request"))),
    3: ("Why does batch 32 give nearly 32x the throughput at nearly the same latency?",
        (("ch08", "seed_q3"),)),
    4: ("Which of TTFT / TPOT / throughput matters most for chat, batch jobs, code completion?",
        (("ch10", "seed_q4"),)),
    5: ("Map an operating-system idea to a vLLM design.",
        (("ch11", "seed_q5"),)),
}

# ---- question 1: the loop in order ------------------------------------------------------------
LOOP_STEPS = (*FORWARD_STEPS, "append")        # one generation step, then back to "embed"
LOOP_SHUFFLED = ("sample", "attention", "append", "tokenize", "lm_head", "embed", "ffn",
                 "qkv_projection")


def generation_loop_order(answer: Any) -> CheckResult:
    """Put LOOP_SHUFFLED in the order one generation step runs them (a list of the 8 names)."""
    ex = "ch12.generation_loop_order"
    if answer is None:
        return report(not_yet(ex, NOT_ANSWERED))
    if not isinstance(answer, (list, tuple)) or not all(isinstance(a, str) for a in answer):
        return report(not_yet(ex, "answer a list of the step names."))
    got = [a.strip().lower() for a in answer]
    if sorted(got) != sorted(LOOP_STEPS):
        missing = sorted(set(LOOP_STEPS) - set(got))
        extra = sorted(set(got) - set(LOOP_STEPS))
        return report(not_yet(ex, f"use each of the 8 names exactly once (missing {missing}, "
                                  f"unknown {extra})."))
    pos = {name: i for i, name in enumerate(got)}
    for earlier, later in zip(LOOP_STEPS, LOOP_STEPS[1:]):
        if pos[earlier] > pos[later]:
            return report(not_yet(ex, f"{later!r} needs what {earlier!r} produces; "
                                      f"look at what each step takes as input."))
    return report(passed(ex, "right: and with a KV cache the loop goes back to 'embed' with "
                             "only the one new token."))


# ---- glossary terms -----------------------------------------------------------------------------
GLOSSARY_QUIZ = ("prefill", "decode", "block table", "prefix caching", "tensor parallelism")


def glossary_match(answer: Any) -> CheckResult:
    """Answer a dict mapping each English term of GLOSSARY_QUIZ to its Chinese name (as in the
    glossary; its listed alternatives count too)."""
    from llmlab.glossary import find_zh, load_glossary, lookup

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
            problems.append(f"{term}: {given!r} is not a Chinese name in the glossary; look it up there.")
        elif got.term != want.term:
            problems.append(f"{term}: {given!r} is the Chinese for {got.term!r}.")
    if problems:
        return report(not_yet(ex, " ".join(problems)))
    return report(passed(ex))


# ---- what each vLLM technique answers --------------------------------------------------------
PROBLEMS = ("kv_fragmentation", "idle_slots_after_finish", "long_prompt_stalls_decodes",
            "repeated_system_prompt", "model_too_big_for_one_gpu")
FIXES = ("paged_attention", "continuous_batching", "chunked_prefill", "prefix_caching",
         "tensor_parallelism")
_FIX_HINTS = {
    "kv_fragmentation": "which technique stores the KV cache in fixed-size blocks anywhere in memory?",
    "idle_slots_after_finish": "which technique refills a finished request's place at the very next step?",
    "long_prompt_stalls_decodes": "which technique cuts a long prompt into pieces that share steps with decodes?",
    "repeated_system_prompt": "which technique reuses the K/V of tokens another request already computed?",
    "model_too_big_for_one_gpu": "which technique splits every layer's weights across devices?",
}


def vllm_fixes(answer: Any) -> CheckResult:
    """Answer a dict mapping each of PROBLEMS to the vLLM technique (one of FIXES) that answers it."""
    return check_matching("ch12.vllm_fixes", answer, dict(zip(PROBLEMS, FIXES)), choices=FIXES,
                          hints=_FIX_HINTS,
                          success="right: each of vLLM's techniques removes one bottleneck this "
                                  "series measured.")
