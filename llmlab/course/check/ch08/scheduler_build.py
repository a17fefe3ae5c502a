"""Chapter 08's build exercise: the student's continuous-batching step (`Scheduler.schedule`), run
on drawn step states beside the package's scheduler (hand-built cases first), the hint naming
the rule of vLLM's it breaks, then plugged into the engine and measured."""

from __future__ import annotations

from typing import Any

from llmlab.course.check.build_guard import refuse_build_answer
from llmlab.course.check.catalog import catalog
from llmlab.course.check.ch08.questions import TRACE_MAX_BATCH, TRACE_OUTPUTS
from llmlab.course.check.core import (
    CheckResult,
    not_yet,
    passed,
    staged,
)

M = catalog("ch08")

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

    return cases()


# Cases built to preempt, tried before the drawn ones (about 1 drawn case in 100 reaches the
# second situation). PREEMPT_CASE: three requests outgrow a pool of four blocks at step 2.
# READMIT_CASE: at step 2, B's next chunk needs a block the pool no longer has, so B (the
# newest) is preempted; its freed block and the budget left would let it straight back in, and
# only the rule "no admission in a step that preempted" keeps it waiting.
PREEMPT_CASE = {
    "prompts": [3, 2, 2],
    "max_tokens": [2, 3, 3],
    "arrivals": [0, 0, 0],
    "block_size": 2,
    "num_blocks": 4,
    "budget": 8,
    "max_num_seqs": 3,
}
READMIT_CASE = {
    "prompts": [2, 3],
    "max_tokens": [3, 3],
    "arrivals": [0, 0],
    "block_size": 2,
    "num_blocks": 3,
    "budget": 3,
    "max_num_seqs": 3,
}
BUILT_CASES = (PREEMPT_CASE, READMIT_CASE)


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
    return M(
        "describe_case.requests_names_prompt",
        names=names,
        p=p,
        m=m,
        a=a,
        case=case,
    )


def _fmt_step(obs: dict) -> str:
    pre = obs.get("preempted") or []
    preempted = _names(pre) if pre else M("fmt_step.nothing")
    return M("fmt_step.preempted", scheduled=_fmt_scheduled(obs["scheduled"]), preempted=preempted)


def _rule(case: dict, before: list[str], got: dict, exp: dict) -> str:
    """Which rule of the step the student's step broke (the state before it was the package's)."""
    got_ids = [rid for rid, _ in got["scheduled"]]
    exp_ids = [rid for rid, _ in exp["scheduled"]]
    if len(set(got_ids)) < len(got_ids):
        return M("rule.request_scheduled_twice")
    if any(n <= 0 for _, n in got["scheduled"]):  # a scheduled request brings no token
        return M("rule.running_request_brings")
    if sum(n for _, n in got["scheduled"]) > case["budget"]:
        return M("rule.over_token_budget")
    if len(got["running"]) > case["max_num_seqs"]:
        return M("rule.more_requests_running")
    # admitted: scheduled without running before the step, or preempted and running after it
    admitted = [rid for rid in got_ids if rid not in before]
    admitted += [rid for rid in got["preempted"] if rid in got["running"]]
    if got["preempted"] and admitted:
        return M("rule.no_admission_after_preemption")
    if got["preempted"] != exp["preempted"]:
        if got["preempted"] and exp["preempted"]:
            return M("rule.wrong_request_preempted")
        return M("rule.when_allocate_slots")
    new = [rid for rid in got_ids if rid not in before]
    first_new = min((got_ids.index(r) for r in new), default=len(got_ids))
    running_after_new = any(rid in before for rid in got_ids[first_new:])
    skipped = [rid for rid in exp_ids if rid in before and rid not in got_ids]
    if new and (running_after_new or skipped):
        return M("rule.running_requests_come")
    return M("rule.running_request_brings")


def schedule_hint(case: dict, got: Any, expected: list[dict]) -> str:
    """The shrunk case, the first step where the student's scheduler and the package's differ,
    and the rule broken there."""
    from llmlab.course.build import Raised

    where = _describe_case(case)
    if isinstance(got, Raised):
        return M("schedule_hint.raised", where=where, error=got.error, message=got.message)
    for k, exp in enumerate(expected):
        g = got[k] if k < len(got) else None
        if g == exp:
            continue
        step = k + 1
        if g is None:
            return M(
                "schedule_hint.where_scheduler_finished",
                where=where,
                k=k,
                fmt_step=_fmt_step(exp),
                step=step,
            )
        if "stopped" in exp or "stopped" in g or "scheduled" not in g:
            break
        before = expected[k - 1]["running"] if k else []
        return M(
            "schedule_hint.where_step_step",
            where=where,
            step=step,
            fmt_step=_fmt_step(g),
            fmt_step_2=_fmt_step(exp),
            rule=_rule(case, before, g, exp),
        )
    return M("schedule_hint.where_scheduler_kept", where=where, n_got=len(got))


def _is_scheduler_class(answer: Any) -> bool:
    from llmlab.config.engine import check_scheduler_cls

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
    from llmlab.core.scheduler import Scheduler
    from llmlab.course.build import drive, find_counterexample
    from llmlab.course.build.ch08 import observe_schedule, run_engine

    ex = "ch08.build_scheduler"
    hint = M("build_scheduler.expected_scheduler_class", answer_type=type(answer).__name__)
    refused = refuse_build_answer(ex, answer, ("schedule",), fits=_is_scheduler_class, hint=hint)
    if refused is not None:
        return refused
    cex = find_counterexample(
        schedule_cases(),
        lambda case: drive(answer, f"{BUILD_DRIVERS}:observe_schedule", case),
        lambda case: observe_schedule(Scheduler, case),
        max_examples=BUILD_MAX_EXAMPLES,
        examples=BUILT_CASES,
    )
    if cex is not None:  # the rule first; the step's recipe from the second wrong try
        first = schedule_hint(cex.case, cex.got, cex.expected)
        return not_yet(ex, staged(ex, first, M("schedule_hint.then")))
    try:
        mine = drive(answer, f"{BUILD_DRIVERS}:run_engine", PREEMPT_WORKLOAD)
    except Exception as e:  # the student's class inside the engine
        return not_yet(ex, M("build_scheduler.plugged_into_engine_2", e_type=type(e).__name__, e=e))
    ref = run_engine(Scheduler, PREEMPT_WORKLOAD)
    if mine["tokens"] != ref["tokens"] or not mine["finished"]:
        return not_yet(
            ex,
            M(
                "build_scheduler.plugged_into_engine",
                num_kv_blocks=PREEMPT_WORKLOAD['engine']['num_kv_blocks'],
            ),
        )
    runs = {}
    for policy in ("continuous", "static"):
        runs[("yours", policy)] = drive(
            answer, f"{BUILD_DRIVERS}:run_engine", _trace_workload(policy)
        )
        runs[("package", policy)] = run_engine(Scheduler, _trace_workload(policy))
    return passed(ex, build_measurement(mine, ref, runs))


def build_measurement(mine: dict, ref: dict, runs: dict) -> str:
    """The pass line: the plugged-in run's preemptions, and continuous against static batching
    in steps and tokens per step, the student's scheduler beside the package's."""
    total = sum(TRACE_OUTPUTS)
    yc, ys = runs[("yours", "continuous")], runs[("yours", "static")]
    pc, ps = runs[("package", "continuous")], runs[("package", "static")]
    outs = ", ".join(map(str, TRACE_OUTPUTS))
    return M(
        "build_measurement.same_tokens_package",
        preemptions=mine['preemptions'],
        ref_preemptions=ref['preemptions'],
        outs=outs,
        trace_max_batch=TRACE_MAX_BATCH,
        steps=yc['steps'],
        ys_steps=ys['steps'],
        total=total / yc['steps'],
        value=total / ys['steps'],
        pc_steps=pc['steps'],
        ps_steps=ps['steps'],
    )
