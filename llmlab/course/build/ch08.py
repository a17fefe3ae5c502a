"""Drivers of chapter 08's build exercise: the student's continuous-batching step (a scheduler
class whose `schedule()` they wrote), run on the scheduler level and in the real engine.

Each driver takes the student's class first and returns plain data only (the grader runs it in
the sandbox and reads back its return value):

- `observe_schedule(scheduler_cls, case)`: a `KVCacheManager` and the scheduler, stepped with fake
  sampled tokens and no model; per step the requests scheduled with their token counts, the
  requests preempted and the requests running afterwards;
- `run_engine(scheduler_cls, workload)`: the real `LLMEngine` (on a small random-weight model, so
  it is quick) with `scheduler_cls=`; the tokens of every request, the steps taken, the seconds.

The checker (`llmlab.course.check.ch08.build_scheduler`) calls the same drivers with the
package's `Scheduler` for the reference, in its own process.
"""

from __future__ import annotations

import time
from typing import Any

MAX_STEPS = 120  # a scheduler that makes no progress is stopped here
ENGINE_MAX_STEPS = 400
FAKE_TOKEN = 7


def label(i: int) -> str:
    """The name of the i-th request of a case: A, B, C, ..."""
    return chr(ord("A") + i)


def make_requests(prompts: list[int], max_tokens: list[int]) -> list[Any]:
    """Requests A, B, ... with prompts of the given lengths (distinct tokens, so no two share a
    prefix) that each make exactly their max_tokens tokens."""
    from llmlab.core.request import Request
    from llmlab.sampling import SamplingParams

    return [
        Request(
            label(i),
            [100 * (i + 1) + j for j in range(n)],
            SamplingParams(max_tokens=m, ignore_eos=True),
            arrival_time=0.0,
        )
        for i, (n, m) in enumerate(zip(prompts, max_tokens))
    ]


def observe_schedule(scheduler_cls: Any, case: dict) -> list[dict]:
    """Step `scheduler_cls` over `case` with no model; one observation per step.

    case: {"prompts": [tokens per request], "max_tokens": [...], "arrivals": [step at which each
    request arrives], "block_size", "num_blocks", "budget" (max_num_batched_tokens),
    "max_num_seqs", optionally "scheduling" ("continuous") and "chunked" (True)}.
    Observation: {"scheduled": [[id, tokens], ...] in the order scheduled, "preempted": [ids],
    "running": [ids running after the step]}; a last {"stopped": MAX_STEPS} when it never ended.
    """
    from llmlab.kvcache.manager import KVCacheManager

    prompts, max_tokens, arrivals = case["prompts"], case["max_tokens"], case["arrivals"]
    kv = KVCacheManager(case["num_blocks"], case["block_size"], enable_caching=True)
    sched = scheduler_cls(
        kv,
        max_num_seqs=case["max_num_seqs"],
        max_num_batched_tokens=case["budget"],
        max_model_len=max(p + m for p, m in zip(prompts, max_tokens)),
        enable_chunked_prefill=case.get("chunked", True),
        scheduling=case.get("scheduling", "continuous"),
    )
    requests = make_requests(prompts, max_tokens)
    steps: list[dict] = []
    for step in range(MAX_STEPS):
        for req, at in zip(requests, arrivals):
            if at == step:
                sched.add_request(req)
        if step > max(arrivals) and not sched.has_unfinished_requests():
            return steps
        out = sched.schedule()
        caught_up = sum(
            1
            for r, n, c in zip(out.requests, out.num_new_tokens, out.num_computed_tokens)
            if c + n >= r.num_tokens
        )
        steps.append(
            {
                "scheduled": [
                    [r.request_id, int(n)] for r, n in zip(out.requests, out.num_new_tokens)
                ],
                "preempted": [r.request_id for r in out.preempted],
                "running": [r.request_id for r in sched.running],
            }
        )
        sched.update_from_output(out, [FAKE_TOKEN] * caught_up, now=float(step))
    steps.append({"stopped": MAX_STEPS})
    return steps


def tiny_engine_model() -> Any:
    """The random-weight model the plugged-in runs use (the same weights every time)."""
    from llmlab.model import tiny_model

    return tiny_model(seed=8)


def run_engine(scheduler_cls: Any, workload: dict) -> dict:
    """The real engine with `scheduler_cls`: every request of `workload` added at once, stepped
    until all finish (or ENGINE_MAX_STEPS). workload: {"prompts": [[token ids], ...],
    "max_tokens": [...], "engine": EngineConfig keywords}. Returns {"tokens": [per request],
    "steps", "seconds", "preemptions", "finished"}; steps that scheduled nothing are not counted."""
    from llmlab.engine.llm_engine import LLMEngine
    from llmlab.sampling import SamplingParams

    engine = LLMEngine(
        tiny_engine_model(),
        None,
        scheduler_cls=scheduler_cls,
        attention_backend="torch",
        **workload["engine"],
    )
    tokens: dict[str, list[int]] = {}
    for i, (prompt, m) in enumerate(zip(workload["prompts"], workload["max_tokens"])):
        rid = label(i)
        tokens[rid] = []
        engine.add_request(
            rid, list(prompt), SamplingParams(temperature=0.0, max_tokens=m, ignore_eos=True)
        )
    steps = 0
    t0 = time.perf_counter()
    while engine.has_unfinished_requests() and steps < ENGINE_MAX_STEPS:
        for out in engine.step():
            tokens[out.request_id].extend(out.outputs[0].token_ids)
        if engine.last_scheduler_output is not None and not engine.last_scheduler_output.is_empty:
            steps += 1
        else:
            break  # nothing scheduled while requests wait: the scheduler is stuck
    seconds = time.perf_counter() - t0
    return {
        "tokens": [tokens[label(i)] for i in range(len(workload["prompts"]))],
        "steps": steps,
        "seconds": seconds,
        "preemptions": int(getattr(getattr(engine.scheduler, "stats", None), "num_preemptions", 0)),
        "finished": not engine.has_unfinished_requests(),
    }
