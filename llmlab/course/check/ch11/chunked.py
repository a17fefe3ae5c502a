"""Chapter 11's build exercise: the student's chunked-prefill `plan_step`
(`llmlab.course.build.ch11_chunk`), checked against the package's `Scheduler` on drawn step
states, on the chapter's prediction, and plugged into the engine."""

from __future__ import annotations

from typing import Any

from llmlab.course.check.build_guard import refuse_build_answer
from llmlab.course.check.catalog import catalog
from llmlab.course.check.ch11.block_pool import BUILDS
from llmlab.course.check.ch11.questions import CHUNK_BUDGET, CHUNK_DECODES, CHUNK_PROMPT_LEN
from llmlab.course.check.core import (
    CheckResult,
    not_yet,
    passed,
)

M = catalog("ch11")

# ---- build exercise: chunked prefill (the student's plan_step) ----------------------------------
BUILDS["ch11.build_chunked_prefill"] = "plan_step"
CHUNK_DRIVERS = "llmlab.course.build.ch11_chunk"
CHUNK_MAX_EXAMPLES = 50
# plugged in: three short requests decode when a prompt of CHUNK_ENGINE_LONG tokens arrives
CHUNK_ENGINE_LONG = 70
CHUNK_ENGINE_WORKLOAD = {
    "first": [list(range(20 + 9 * i, 26 + 9 * i)) for i in range(CHUNK_DECODES)],
    "later": [list(range(100, 100 + CHUNK_ENGINE_LONG))],
    "max_tokens": 6,
    "engine": {
        "block_size": 16,
        "num_kv_blocks": 64,
        "max_model_len": 128,
        "max_num_seqs": 4,
        "max_num_batched_tokens": 16,
    },
}


def plan_cases():
    """Step states: some requests decoding (1 token left each), perhaps one part-way through its
    prompt (the last running one), waiting prompts, and the step's budget."""
    from hypothesis import strategies as st

    @st.composite
    def cases(draw):
        decodes = draw(st.integers(0, 4))
        partial = draw(st.one_of(st.none(), st.integers(2, 40)))
        lefts = [1] * decodes + ([] if partial is None else [partial])
        waiting = draw(st.lists(st.integers(1, 40), max_size=3))
        names = [chr(65 + i) for i in range(len(lefts) + len(waiting))]
        return {
            "running": [[names[i], n] for i, n in enumerate(lefts)],
            "waiting": [[names[len(lefts) + i], n] for i, n in enumerate(waiting)],
            "budget": draw(st.integers(1, 48)),
        }

    return cases()


def _fmt_plan(plan: Any) -> str:
    if plan and plan[0] == "raised":
        return M("fmt_plan.raised_plan_plan", plan_1=plan[1], plan_2=plan[2])
    return "[" + ", ".join(f"{rid}:{n}" for rid, n in plan) + "]"


def _plan_rule(case: dict, got: list, expected: list) -> str:
    """Which rule of chunked prefill the student's plan broke on `case`."""
    budget = case["budget"]
    running = {rid for rid, _ in case["running"]}
    if not got or got[0] == "raised":
        return ""
    counts = [n for _, n in got]
    ids = [rid for rid, _ in got]
    if any(n > budget for n in counts):
        return M("plan_rule.prompt_longer_what")
    if sum(counts) > budget:
        return M("plan_rule.over_budget_tokens")
    if any(n <= 0 for n in counts):
        return M("plan_rule.chunk_tokens_makes")
    first_waiting = next((i for i, rid in enumerate(ids) if rid not in running), len(ids))
    skipped = [rid for rid, _ in expected if rid in running and rid not in ids]
    if any(rid in running for rid in ids[first_waiting:]) or (first_waiting < len(ids) and skipped):
        return M("plan_rule.decodes_first_every")
    return M("plan_rule.order_each_request")


def _describe_plan_case(case: dict) -> str:
    running = ", ".join(f"{rid}:{n}" for rid, n in case["running"]) or "-"
    waiting = ", ".join(f"{rid}:{n}" for rid, n in case["waiting"]) or "-"
    return M(
        "describe_plan_case.running_running_tokens",
        running=running,
        waiting=waiting,
        budget=case['budget'],
    )


def _plan_disagreement(answer: Any) -> str | None:
    """The smallest step state (drawn by hypothesis) on which the student's plan differs from
    the package's `Scheduler`'s, as a hint; None when none was found."""
    from llmlab.course.build import drive, find_counterexample
    from llmlab.course.build.ch11_chunk import package_plan

    cex = find_counterexample(
        plan_cases(),
        lambda case: drive(answer, f"{CHUNK_DRIVERS}:observe_plans", [case])[0],
        package_plan,
        max_examples=CHUNK_MAX_EXAMPLES,
    )
    if cex is None:
        return None
    got = cex.got
    if not isinstance(got, list):  # the sandbox itself failed (a Raised)
        got = ["raised", getattr(got, "error", "Error"), getattr(got, "message", str(got))]
    return M(
        "build_chunked_prefill.describe_plan_case",
        describe_plan_case=_describe_plan_case(cex.case),
        got=_fmt_plan(got),
        expected=_fmt_plan(cex.expected),
        plan_rule=_plan_rule(cex.case, got, cex.expected),
    )


def _chunk_run_problem(mine: dict, engine: dict, ref: dict, expected_steps: int) -> str | None:
    """What the student's plan got wrong on the chapter's prediction (`mine`) or in the engine
    (`engine` against the package's `ref`), as a hint; None when both agree."""
    if mine["steps"] != expected_steps:
        return M(
            "build_chunked_prefill.plan_prefills_chunk_2",
            chunk_prompt_len=CHUNK_PROMPT_LEN,
            chunk_decodes=CHUNK_DECODES,
            steps=mine["steps"],
            chunk_budget=CHUNK_BUDGET,
        )
    if engine["tokens"] != ref["tokens"] or engine["steps"] != ref["steps"]:
        if engine["tokens"] == ref["tokens"]:
            key = M.key("build_chunked_prefill.engine_tokens_equal")
        else:
            key = M.key("build_chunked_prefill.engine_tokens_differ")
        return M(key, steps=engine["steps"], package_steps=ref["steps"])
    return None


def build_chunked_prefill(answer: Any) -> CheckResult:
    """Chapter 11's build exercise: `answer` is the student's `plan_step(running, waiting,
    budget)` (see `llmlab.course.build.ch11_chunk`). Checked (1) against the package's
    `Scheduler` on step states drawn by hypothesis (the smallest disagreeing one in the hint),
    (2) on the chapter's prediction (CHUNK_PROMPT_LEN tokens beside CHUNK_DECODES decodes under
    CHUNK_BUDGET), (3) plugged into the engine: the same tokens and steps as the package's
    `enable_chunked_prefill=True`."""
    from llmlab.analysis.blocks import chunked_prefill_schedule
    from llmlab.course.build import drive
    from llmlab.course.build.ch11_chunk import run_engine

    ex = "ch11.build_chunked_prefill"
    hint = M("build_chunked_prefill.expected_function_plan", answer_type=type(answer).__name__)
    refused = refuse_build_answer(ex, answer, hint=hint)
    if refused is not None:
        return refused
    hint = _plan_disagreement(answer)
    if hint is not None:
        return not_yet(ex, hint)
    expected_steps = len(chunked_prefill_schedule(CHUNK_PROMPT_LEN, CHUNK_BUDGET, CHUNK_DECODES))
    try:
        mine = drive(
            answer, f"{CHUNK_DRIVERS}:prefill_steps", CHUNK_PROMPT_LEN, CHUNK_BUDGET, CHUNK_DECODES
        )
        engine = drive(answer, f"{CHUNK_DRIVERS}:run_engine", CHUNK_ENGINE_WORKLOAD)
    except Exception as e:  # the student's function inside the scheduler
        hint = M("build_chunked_prefill.inside_scheduler_plan", e_type=type(e).__name__, e=e)
        return not_yet(ex, hint)
    ref = run_engine(None, CHUNK_ENGINE_WORKLOAD)
    hint = _chunk_run_problem(mine, engine, ref, expected_steps)
    if hint is not None:
        return not_yet(ex, hint)
    message = M(
        "build_chunked_prefill.plan_prefills_chunk",
        chunk_prompt_len=CHUNK_PROMPT_LEN,
        chunk_decodes=CHUNK_DECODES,
        steps=mine["steps"],
        chunk_budget=CHUNK_BUDGET,
        chunks=", ".join(map(str, mine["prefill"])),
        expected_steps=expected_steps,
        engine_steps=engine["steps"],
        ref_steps=ref["steps"],
    )
    return passed(ex, message)
