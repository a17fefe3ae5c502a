"""Chapter 12's questions 2-5 asked again about fresh cases that combine chapters."""

from __future__ import annotations

from typing import Any

from llmlab.course.check.catalog import catalog
from llmlab.course.check.ch11.questions import Q5_CONCEPTS
from llmlab.course.check.core import (
    CheckResult,
    as_number,
    check_dict_keys,
    close,
    not_yet,
    passed,
    record_expected,
    record_expected_word,
    sentences,
    staged,
)
from llmlab.course.check.question import Expected, matching, numeric

M = catalog("ch12")

# ---- questions 2-5 on cases the chapters did not compute ----------------------------------------
# The review asks each of the source chapter's questions again about a fresh case that combines
# chapters, so a reader who passed the chapter's own checker still has a step to take.

Q2_MODEL, Q2_TOKENS, Q2_DTYPE_BYTES = "mistral-7b", 32768, 1  # an FP8 KV cache


@numeric(rel=0.02)
def kv_gb_fresh_case() -> Expected:
    """The source chapter's question 2 for another model and dtype: Mistral-7B with an FP8 KV
    cache (1 byte per number), one request of Q2_TOKENS tokens. How many GB (1e9 bytes) of KV
    cache?"""
    from llmlab.analysis import costs
    from llmlab.config import get_config

    cfg = get_config(Q2_MODEL)
    per_token = costs.kv_bytes_per_token(cfg, dtype_bytes=Q2_DTYPE_BYTES)
    expected = per_token * Q2_TOKENS / 1e9
    hidden_wrong = 2 * cfg.num_hidden_layers * cfg.hidden_size * Q2_DTYPE_BYTES * Q2_TOKENS / 1e9
    return Expected(
        expected,
        mistakes=[
            (expected * 2, M("kv_gb_fresh_case.bf16")),
            (expected / cfg.num_hidden_layers, M("kv_gb_fresh_case.one_layer")),
            (hidden_wrong, M("kv_gb_fresh_case.hidden_size")),
            (expected / 2, M("kv_gb_fresh_case.k_without_v")),
            (expected * 1e9 / 2**30, M("kv_gb_fresh_case.gib")),
        ],
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
        return not_yet(ex, sentences(*problems))
    return passed(ex, M("q3_fresh_case.success", ratio=ratio, batch=Q3_BATCH))


# Q4: two deployments of Llama-3-8B (BF16, one H100, 1024 tokens of context), two products.
Q4_MODEL, Q4_GPU, Q4_CONTEXT = "llama-3-8b", "H100-SXM", 1024
Q4_DEPLOYMENTS = {"A": 8, "B": 64}  # the most sequences a step runs
Q4_TPOT_TARGET_S = 0.006  # the voice assistant's: speech must never stall
# the products, shown in the language in use; the keys are what the student answers with
Q4_PRODUCTS = M.texts("q4_products", ("voice_assistant", "overnight_summaries"))


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


_Q4_HINTS = M.texts("q4_fresh_case", ("voice_assistant", "overnight_summaries"))


@matching(("a", "b"), _Q4_HINTS)
def q4_fresh_case() -> dict:
    """The source chapter's question 4 as two products on one model where TPOT and throughput
    pull apart: answer a dict from each key of Q4_PRODUCTS to the deployment ("A" or "B",
    Q4_DEPLOYMENTS) that serves it, judged by the decode-step floors (chapters 07, 08, 10)."""
    floors = q4_floors()
    meets = [n for n, (t, _) in floors.items() if t <= Q4_TPOT_TARGET_S]
    fastest_meeting = max(meets, key=lambda n: floors[n][1])
    most_throughput = max(floors, key=lambda n: floors[n][1])
    return {
        "voice_assistant": fastest_meeting.lower(),
        "overnight_summaries": most_throughput.lower(),
    }


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
_Q5_HINTS = M.texts(
    "q5_fresh_case",
    (
        "blocks_allocated_as_tokens_arrive",
        "slot_from_block_table_and_offset",
        "shared_block_freed_when_its_last_user_leaves",
    ),
)


@matching(Q5_CONCEPTS, _Q5_HINTS)
def q5_fresh_case() -> dict:
    """The source chapter's question 5 on three mechanisms chapter 11's exercise did not list:
    answer a dict from each of Q5_MECHANISMS to an OS idea of `ch11.Q5_CONCEPTS`."""
    return dict(Q5_ACCEPTED)
