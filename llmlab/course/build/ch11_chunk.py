"""Drivers of chapter 11's chunked-prefill build exercise: the student's `plan_step`, the token
plan of one step under `max_num_batched_tokens`, run on its own, inside a scheduler, and in the
real engine.

    plan_step(running, waiting, budget) -> [(request_id, tokens), ...]

`running`: (request id, tokens it has left to compute) of each running request, oldest first (1
for a request that is decoding, more for one part-way through its prompt); `waiting`: (request
id, prompt tokens) of the waiting requests that have a seat, in arrival order; `budget`: the
step's token budget. The plan lists the requests scheduled this step with their tokens, in the
order they are scheduled.

`planned_scheduler(plan_step)` is the package's `Scheduler` with its token decisions taken from
the plan (prefix caching off, so a waiting request's tokens are its prompt): the class the
engine takes through `LLM(..., scheduler_cls=...)`. The drivers return plain data only.
"""

from __future__ import annotations

import time
from typing import Any, Callable

from llmlab.core.request import RequestStatus
from llmlab.core.scheduler import Scheduler, SchedulerOutput

ENGINE_MAX_STEPS = 400
MAX_STEPS = 60


def planned_scheduler(plan_step: Callable[..., Any]) -> type:
    """A `Scheduler` whose each step schedules what `plan_step` plans (ValueError for a plan
    that names a request out of turn; a pool that runs dry is not handled: use a roomy one)."""

    class PlannedScheduler(Scheduler):
        def schedule(self) -> SchedulerOutput:
            out = SchedulerOutput()
            kv, running = self.kv_cache_manager, self.running
            seats = max(self.max_num_seqs - len(running), 0)
            plan = plan_step(
                [(r.request_id, r.num_tokens - r.num_computed_tokens) for r in running],
                [(r.request_id, r.num_tokens) for r in list(self.waiting)[:seats]],
                self.max_num_batched_tokens,
            )
            by_id = {r.request_id: r for r in running}
            for rid, n in plan:
                n = int(n)
                if rid in by_id:
                    req = by_id.pop(rid)
                elif self.waiting and self.waiting[0].request_id == rid:
                    req = self.waiting[0]
                else:
                    raise ValueError(
                        f"your plan scheduled {rid!r}, not a running request nor "
                        f"the next waiting one"
                    )
                if kv.allocate_slots(req, n) is None:
                    raise RuntimeError("the KV pool ran out of blocks")
                if req.status != RequestStatus.RUNNING:
                    self.admit(req, 0)
                out.add(req, n)
            self.record_step(out)
            return out

    PlannedScheduler.__name__ = PlannedScheduler.__qualname__ = "PlannedScheduler"
    return PlannedScheduler


def package_plan(case: dict) -> list[list]:
    """The package's `Scheduler` in the state `case` describes (running requests with the tokens
    they have left, waiting prompts, the budget; a roomy pool, prefix caching off): the requests
    and tokens of its next step, as [[id, tokens], ...]."""
    from llmlab.core.request import Request
    from llmlab.kvcache.manager import KVCacheManager
    from llmlab.sampling import SamplingParams

    kv = KVCacheManager(num_blocks=256, block_size=4, enable_caching=False)
    sched = Scheduler(
        kv,
        max_num_seqs=len(case["running"]) + len(case["waiting"]),
        max_num_batched_tokens=case["budget"],
        max_model_len=512,
    )
    params = SamplingParams(max_tokens=64, ignore_eos=True)
    for rid, left in case["running"]:
        if left == 1:  # decoding: its prompt computed, one sampled token to feed
            req = Request(rid, [5] * 4, params, arrival_time=0.0)
            req.append_output_token(7)
        else:  # part-way through its prompt
            req = Request(rid, [5] * (left + 3), params, arrival_time=0.0)
        done = req.num_tokens - left
        kv.allocate_slots(req, done)
        req.num_computed_tokens = done
        req.status = RequestStatus.RUNNING
        sched.running.append(req)
    for rid, n in case["waiting"]:
        sched.add_request(Request(rid, [9] * n, params, arrival_time=0.0))
    out = sched.schedule()
    return [[r.request_id, int(n)] for r, n in zip(out.requests, out.num_new_tokens)]


def observe_plans(plan_step: Callable[..., Any], cases: list[dict]) -> list[Any]:
    """`plan_step` on each case {"running", "waiting", "budget"} (pairs as lists): its plans as
    lists of [id, tokens], or ["raised", error name, message] where it raised."""
    plans = []
    for case in cases:
        try:
            plan = plan_step(
                [tuple(p) for p in case["running"]],
                [tuple(p) for p in case["waiting"]],
                case["budget"],
            )
            plans.append([[str(rid), int(n)] for rid, n in plan])
        except Exception as e:  # the student's code: what it did on this case
            plans.append(["raised", type(e).__name__, str(e)])
    return plans


def prefill_steps(
    plan_step: Callable[..., Any], prompt_len: int, budget: int, decodes: int
) -> dict:
    """Chapter 11's prediction, run through the plan: `decodes` requests decode when a
    `prompt_len`-token prompt arrives; steps until its first token (fake tokens, no model).
    Returns {"steps", "prefill": [prompt tokens per step], "total": [tokens per step]}."""
    from llmlab.core.request import Request
    from llmlab.kvcache.manager import KVCacheManager
    from llmlab.sampling import SamplingParams

    kv = KVCacheManager(
        num_blocks=(prompt_len + 64 * (decodes + 1)) // 16 + 8, block_size=16, enable_caching=False
    )
    sched = planned_scheduler(plan_step)(
        kv, max_num_seqs=decodes + 1, max_num_batched_tokens=budget, max_model_len=prompt_len + 64
    )
    params = SamplingParams(max_tokens=48, ignore_eos=True)
    for i in range(decodes):  # short prompts, prefilled in one step
        sched.add_request(Request(f"decode{i}", [11 + i] * 8, params, arrival_time=0.0))
    out = sched.schedule()
    sched.update_from_output(out, [1] * out.num_requests, now=0.0)
    long = Request("long", list(range(3, 3 + prompt_len)), params, arrival_time=0.0)
    sched.add_request(long)
    prefill, total = [], []
    while long.num_output_tokens == 0 and len(total) < MAX_STEPS:
        out = sched.schedule()
        prefill.append(sum(n for r, n in zip(out.requests, out.num_new_tokens) if r is long))
        total.append(out.total_num_scheduled_tokens)
        done = sum(
            1
            for r, n, c in zip(out.requests, out.num_new_tokens, out.num_computed_tokens)
            if c + n >= r.num_tokens
        )
        sched.update_from_output(out, [1] * done, now=0.0)
    return {"steps": len(total), "prefill": prefill, "total": total}


def run_engine(plan_step: Callable[..., Any] | None, workload: dict) -> dict:
    """The real engine (chunked prefill on, prefix caching off) with the plan's scheduler, or the
    package's own for None: the `first` requests are added and stepped once, then the rest.
    workload: {"first": [[ids], ...], "later": [[ids], ...], "max_tokens", "engine": keywords}.
    Returns {"tokens": [per request], "steps", "seconds", "finished"}."""
    from llmlab.course.build.ch08 import tiny_engine_model
    from llmlab.engine.llm_engine import LLMEngine
    from llmlab.sampling import SamplingParams

    engine = LLMEngine(
        tiny_engine_model(),
        None,
        scheduler_cls=None if plan_step is None else planned_scheduler(plan_step),
        attention_backend="torch",
        enable_chunked_prefill=True,
        enable_prefix_caching=False,
        **workload["engine"],
    )
    prompts = list(workload["first"]) + list(workload["later"])
    names = [f"r{i}" for i in range(len(prompts))]
    tokens: dict[str, list[int]] = {n: [] for n in names}
    params = SamplingParams(temperature=0.0, max_tokens=workload["max_tokens"], ignore_eos=True)
    steps = 0
    t0 = time.perf_counter()

    def step() -> bool:
        nonlocal steps
        for out in engine.step():
            tokens[out.request_id].extend(out.outputs[0].token_ids)
        if engine.last_scheduler_output is None or engine.last_scheduler_output.is_empty:
            return False
        steps += 1
        return True

    for name, prompt in zip(names, workload["first"]):
        engine.add_request(name, list(prompt), params)
    step()
    for name, prompt in zip(names[len(workload["first"]) :], workload["later"]):
        engine.add_request(name, list(prompt), params)
    while engine.has_unfinished_requests() and steps < ENGINE_MAX_STEPS and step():
        pass
    return {
        "tokens": [tokens[n] for n in names],
        "steps": steps,
        "seconds": time.perf_counter() - t0,
        "finished": not engine.has_unfinished_requests(),
    }
