"""Self-checks of chapter 08 (batching): the seed's self-check question 3 (batch 32 gives nearly
32× the throughput at nearly the same step time), continuous against static batching on a small
trace, and why continuous batching wins."""
from __future__ import annotations

from typing import Any

from llmlab import costs, roofline, sim
from llmlab.check.core import (CheckResult, as_number, check_choice, check_dict_keys, check_number, close,
                               not_yet, passed, report)
from llmlab.config import get_config

Q3_MODEL, Q3_HW, Q3_CONTEXT = "llama-3-70b", "H100-SXM-seed", 1024   # seed's 1000 TFLOPS, 3 TB/s
Q3_KEYS = ("step_ms_batch1", "step_ms_batch32", "throughput_ratio", "bound")

# the small trace of continuous_mean_latency: all arrive at step 0, max batch 2
TRACE_OUTPUTS = (10, 2, 2, 2)
TRACE_MAX_BATCH = 2


def _q3_expected() -> dict:
    cfg = get_config(Q3_MODEL)
    t1 = roofline.decode_step_floor(cfg, Q3_HW, 1, Q3_CONTEXT, 2)
    t32 = roofline.decode_step_floor(cfg, Q3_HW, 32, Q3_CONTEXT, 2)
    p = roofline.place(roofline.decode_step(cfg, 32, Q3_CONTEXT, 2), Q3_HW, "bf16")
    return {"step_ms_batch1": t1 * 1e3, "step_ms_batch32": t32 * 1e3,
            "throughput_ratio": 32 * t1 / t32, "bound": p.bound}


def seed_q3(answer: Any) -> CheckResult:
    """The seed's question 3 with numbers. Llama-3-70B, BF16, the seed's H100 (1000 TFLOPS, 3 TB/s),
    every sequence has Q3_CONTEXT tokens of KV cache. Answer a dict with
      step_ms_batch1   : decode step floor at batch 1, ms
      step_ms_batch32  : decode step floor at batch 32, ms
      throughput_ratio : tokens/s at batch 32 over tokens/s at batch 1
      bound            : "memory" or "compute" — which resource bounds the batch-32 step
    """
    ex = "ch08.seed_q3"
    missing = check_dict_keys(ex, answer, Q3_KEYS)
    if missing is not None:
        return missing
    exp = _q3_expected()
    cfg = get_config(Q3_MODEL)
    weights_ms = roofline.weight_read_time(costs.param_count(cfg), 2, 3e12) * 1e3
    problems = []
    for key in Q3_KEYS[:3]:
        x = as_number(answer[key])
        if x is None:
            problems.append(f"{key} must be a number.")
            continue
        if close(x, exp[key], 0.03):
            continue
        if key == "step_ms_batch1":
            if close(x, exp[key] * 1e-3, 0.03):
                problems.append("step_ms_batch1 looks like seconds; give milliseconds.")
            elif close(x, exp[key] * 3 / 3.35, 0.03):
                problems.append("step_ms_batch1 uses 3.35 TB/s; this question uses the seed's 3 TB/s preset.")
            else:
                problems.append("step_ms_batch1: at batch 1 the step reads every weight once (2 bytes each) "
                                "plus one sequence's KV cache; divide by the bandwidth.")
        elif key == "step_ms_batch32":
            if close(x, 32 * exp["step_ms_batch1"], 0.05):
                problems.append("step_ms_batch32: the weights are read once per step for the whole batch, "
                                "not once per sequence.")
            elif close(x, weights_ms, 0.01) or close(x, exp["step_ms_batch1"], 0.01):
                problems.append("step_ms_batch32: each of the 32 sequences also reads its own KV cache "
                                f"of {Q3_CONTEXT} tokens every step.")
            elif close(x, exp[key] * 1e-3, 0.03):
                problems.append("step_ms_batch32 looks like seconds; give milliseconds.")
            else:
                problems.append("step_ms_batch32: bytes = weights once + 32 KV caches; FLOPs = 32 × the "
                                "batch-1 FLOPs; the floor is the larger of bytes/bandwidth and FLOPs/peak.")
        else:
            if close(x, 1.0, 0.05) or close(x, exp["step_ms_batch32"] / exp["step_ms_batch1"], 0.01):
                problems.append("throughput_ratio: throughput is tokens per second; batch 32 makes 32 "
                                "tokens per step, batch 1 makes one.")
            elif close(x, 32.0, 0.005):
                problems.append("throughput_ratio: exactly 32 assumes equal step times; use your two step times.")
            else:
                problems.append("throughput_ratio: (32 / step time at 32) / (1 / step time at 1).")
    bound = str(answer["bound"]).strip().lower()
    if bound not in ("memory", "compute"):
        problems.append('bound must be "memory" or "compute".')
    elif bound != exp["bound"]:
        problems.append("bound: compare the batch-32 step's FLOP per byte with the ridge point "
                        "(peak FLOP/s / bandwidth ≈ 330 FLOP/byte here).")
    if problems:
        return report(not_yet(ex, " ".join(problems)))
    return report(passed(ex, "right: the weights are read once per step whatever the batch, so the "
                             "step barely slows down while 32 sequences share it."))


def _trace() -> list[sim.SimRequest]:
    return [sim.SimRequest(i, 0, n) for i, n in enumerate(TRACE_OUTPUTS)]


def continuous_mean_latency(answer: Any) -> CheckResult:
    """Requests with output lengths TRACE_OUTPUTS all arrive at step 0; max batch TRACE_MAX_BATCH;
    one token per request per step. Mean latency (steps) under continuous batching?"""
    trace = _trace()
    cont = sim.simulate(trace, "continuous", TRACE_MAX_BATCH)
    stat = sim.simulate(trace, "static", TRACE_MAX_BATCH)
    sum_len = sum(TRACE_OUTPUTS)
    return check_number("ch08.continuous_mean_latency", answer, cont.mean_latency, rel=1e-6, mistakes=[
        (stat.mean_latency, "that is static batching: a new request may join as soon as any slot frees."),
        (sum_len / len(TRACE_OUTPUTS), "that is the mean output length; latency also counts the steps a request waits."),
        (cont.makespan, "that is when the last request finishes; average the finish times of all four."),
    ], default_hint="walk the steps: two run at once, and a waiting request takes a slot in the step "
                    "after one finishes; latency = finish step − arrival (0).")


WHY_OPTIONS = ["a", "b", "c", "d"]
WHY_TEXT = {
    "a": "its steps run faster than static batching's steps",
    "b": "a finished request's slot is given to a waiting request at the very next step",
    "c": "it skips the prefill of waiting requests",
    "d": "it generates fewer tokens in total",
}


def why_continuous(answer: Any) -> CheckResult:
    """Why does continuous batching finish the same requests sooner than static batching? (a-d, see WHY_TEXT)"""
    return check_choice("ch08.why_continuous", answer, "b", options=WHY_OPTIONS, hints={
        "a": "a step with the same batch costs the same under both policies; look at how full the batches are.",
        "c": "every request is still prefilled once under both policies.",
        "d": "both policies generate exactly the requested tokens (the simulator conserves them).",
    })
