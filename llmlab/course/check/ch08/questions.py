"""Chapter 08's questions: the source chapter's question 3 (why a batch of 32 gives nearly 32x the
throughput), why the CPU falls short of it, continuous batching's mean latency, the batch at
which a server saturates, why continuous batching wins; the chapter's exercises, read from its
catalog."""

from __future__ import annotations

from typing import Any

from llmlab.analysis import costs, roofline, sim
from llmlab.config import get_config
from llmlab.course.check.catalog import catalog
from llmlab.course.check.core import (
    NOT_ANSWERED,
    CheckResult,
    as_number,
    check_dict_keys,
    close,
    not_yet,
    passed,
    record_expected,
    record_expected_word,
    staged,
)
from llmlab.course.check.question import Expected, choice, numeric

M = catalog("ch08")

# the source chapter's H100: 1000 TFLOPS, 3 TB/s
Q3_MODEL, Q3_HW, Q3_CONTEXT = "llama-3-70b", "H100-SXM-source", 1024
Q3_KEYS = ("step_ms_batch1", "step_ms_batch32", "throughput_ratio", "bound")

# the small trace of continuous_mean_latency: all arrive at step 0, max batch 2
TRACE_OUTPUTS = (10, 2, 2, 2)
TRACE_MAX_BATCH = 2

# the widget's task: the batching simulator's trace at this arrival rate (other sliders at their
# defaults); the max batch slider goes up to WIDGET_MAX_BATCH
WIDGET_ARRIVAL_RATE = 1.0
WIDGET_MAX_BATCH = 32

EXERCISES = M.exercises()  # kind, source question, mistakes: the catalog's "exercises"


def _q3_expected() -> dict:
    cfg = get_config(Q3_MODEL)
    t1 = roofline.decode_step_floor(cfg, Q3_HW, 1, Q3_CONTEXT, 2)
    t32 = roofline.decode_step_floor(cfg, Q3_HW, 32, Q3_CONTEXT, 2)
    p = roofline.place(roofline.decode_step(cfg, 32, Q3_CONTEXT, 2), Q3_HW, "bf16")
    return {
        "step_ms_batch1": t1 * 1e3,
        "step_ms_batch32": t32 * 1e3,
        "throughput_ratio": 32 * t1 / t32,
        "bound": p.bound,
    }


def source_q3(answer: Any) -> CheckResult:
    """The source chapter's question 3 with numbers. Llama-3-70B, BF16, the source chapter's H100
    (1000 TFLOPS, 3 TB/s), every sequence has Q3_CONTEXT tokens of KV cache. Answer a dict with
      step_ms_batch1   : decode step floor at batch 1, ms
      step_ms_batch32  : decode step floor at batch 32, ms
      throughput_ratio : tokens/s at batch 32 over tokens/s at batch 1
      bound            : "memory" or "compute" — which resource bounds the batch-32 step
    """
    ex = "ch08.source_q3"
    exp = _q3_expected()
    for key in Q3_KEYS[:3]:
        record_expected(ex, exp[key])
    other = "compute" if exp["bound"] == "memory" else "memory"
    record_expected_word(ex, exp["bound"], (32, Q3_CONTEXT), [other])
    missing = check_dict_keys(ex, answer, Q3_KEYS)
    if missing is not None:
        return missing
    cfg = get_config(Q3_MODEL)
    weights_ms = roofline.weight_read_time(costs.param_count(cfg), 2, 3e12) * 1e3
    problems, formulas = [], []
    for key in Q3_KEYS[:3]:
        x = as_number(answer[key])
        if x is None:
            problems.append(M("source_q3.key_must_number", key=key))
            continue
        if close(x, exp[key], 0.03):
            continue
        if key == "step_ms_batch1":
            if close(x, exp[key] * 1e-3, 0.03):
                problems.append(M("source_q3.step_ms_batch1"))
            elif close(x, exp[key] * 3 / 3.35, 0.03):
                problems.append(M("source_q3.step_ms_batch1_2"))
            else:
                problems.append(M("source_q3.step_ms_batch1_3"))
                formulas.append(M("source_q3.batch_reads_every"))
        elif key == "step_ms_batch32":
            if close(x, 32 * exp["step_ms_batch1"], 0.05):
                problems.append(M("source_q3.step_ms_batch32"))
            elif close(x, weights_ms, 0.01) or close(x, exp["step_ms_batch1"], 0.01):
                problems.append(M("source_q3.step_ms_batch32_2", q3_context=Q3_CONTEXT))
            elif close(x, exp[key] * 1e-3, 0.03):
                problems.append(M("source_q3.step_ms_batch32_3"))
            else:
                problems.append(M("source_q3.step_ms_batch32_4"))
                formulas.append(M("source_q3.bytes_weights_once"))
        else:
            if close(x, 1.0, 0.05) or close(
                x, exp["step_ms_batch32"] / exp["step_ms_batch1"], 0.01
            ):
                problems.append(M("source_q3.throughput_ratio_throughput"))
            elif close(x, 32.0, 0.005):
                problems.append(M("source_q3.throughput_ratio_exactly"))
            else:
                problems.append(M("source_q3.throughput_ratio_compare"))
                formulas.append(M("source_q3.ratio_step_time"))
    bound = str(answer["bound"]).strip().lower()
    if bound not in ("memory", "compute"):
        problems.append(M("source_q3.bound_must_memory"))
    elif bound != exp["bound"]:
        problems.append(M("source_q3.bound_compare_batch"))
        formulas.append(M("source_q3.ridge_peak_flop"))
    if problems:
        return not_yet(
            ex,
            staged(ex, " ".join(problems), " ".join(formulas)) if formulas else " ".join(problems),
        )
    return passed(ex, M("source_q3.right_weights_read"))


# the letters of the options the notebook's exercise lists (its text, in the student's language)
CPU_OPTIONS = ("a", "b", "c", "d", "e", "f")
CPU_RIGHT = {
    "c",
    "e",
}  # both are true of a laptop CPU; c is the roofline reason, e the efficiency one
CPU_WHY_WRONG = M.texts("cpu_why_wrong", ("a", "b", "d", "f"))


def why_cpu_falls_short(answer: Any) -> CheckResult:
    """Why does this CPU's throughput at batch 32 fall short of 32× batch 1's, while an H100's
    comes close? One letter of CPU_OPTIONS (a: the weights read once per sequence; b: the KV
    caches do not fit; c: past the CPU's ridge point; d: Python's overhead; e: the matrix library
    below peak on thin matrices; f: a floor against a measurement); CPU_RIGHT holds the
    defensible answers."""
    ex = "ch08.why_cpu_falls_short"
    if answer is None:
        return not_yet(ex, NOT_ANSWERED)
    got = str(answer).strip().lower()
    if got not in CPU_OPTIONS:
        return not_yet(
            ex, M("why_cpu_falls_short.answer_letter_cpu", cpu_options=sorted(CPU_OPTIONS))
        )
    if got in CPU_RIGHT:
        other = (CPU_RIGHT - {got}).pop()
        return passed(ex, M("why_cpu_falls_short.right_option_other", other=other))
    return not_yet(
        ex,
        staged(
            ex,
            CPU_WHY_WRONG[got],
            M("why_cpu_falls_short.look_table_flop"),
        ),
    )


def _trace() -> list[sim.SimRequest]:
    return [sim.SimRequest(i, 0, n) for i, n in enumerate(TRACE_OUTPUTS)]


@numeric(rel=1e-6)
def continuous_mean_latency() -> Expected:
    """Requests with output lengths TRACE_OUTPUTS all arrive at step 0; max batch TRACE_MAX_BATCH;
    one token per request per step. Mean latency (steps) under continuous batching?"""
    trace = _trace()
    cont = sim.simulate(trace, "continuous", TRACE_MAX_BATCH)
    stat = sim.simulate(trace, "static", TRACE_MAX_BATCH)
    sum_len = sum(TRACE_OUTPUTS)
    return Expected(
        cont.mean_latency,
        mistakes=[
            (stat.mean_latency, M("continuous_mean_latency.static_batching_new")),
            (sum_len / len(TRACE_OUTPUTS), M("continuous_mean_latency.mean_output_length")),
            (cont.makespan, M("continuous_mean_latency.when_last_request")),
        ],
    )


def saturation_curve(arrival_rate: float = WIDGET_ARRIVAL_RATE) -> dict[int, float]:
    """Continuous batching's throughput (tokens/step, as the widget prints it: 2 decimals) for
    every max batch of the widget's slider, on the widget's trace at `arrival_rate`."""
    from llmlab.analysis.sim import batching_results

    return {
        b: round(
            batching_results(arrival_rate=arrival_rate, max_batch=b)["continuous"].throughput, 2
        )
        for b in range(1, WIDGET_MAX_BATCH + 1)
    }


def _saturating_batch() -> int:
    curve = saturation_curve()
    best = max(curve.values())
    return min(b for b, t in curve.items() if t == best)


@numeric(rel=1e-9)
def saturating_max_batch() -> Expected:
    """The batching simulator at WIDGET_ARRIVAL_RATE arrivals per step (other sliders at their
    defaults): the smallest max batch at which continuous batching's throughput reaches its
    highest value (raising the max batch further changes nothing)."""
    from llmlab.analysis.sim import batching_results

    expected = _saturating_batch()
    n = len(batching_results(arrival_rate=WIDGET_ARRIVAL_RATE)["continuous"].requests)
    return Expected(
        expected,
        mistakes=[
            (n, M("saturating_max_batch.every_request_once")),
            (WIDGET_MAX_BATCH, M("saturating_max_batch.slider_s_end")),
            (8, M("saturating_max_batch.default_max_batch")),
        ],
    )


WHY_OPTIONS = ["a", "b", "c", "d"]
WHY_HINTS = {  # keys of the chapter's catalog
    "a": M.key("why_continuous.step_same_batch"),
    "c": M.key("why_continuous.every_request_still"),
    "d": M.key("why_continuous.both_policies_generate"),
}


@choice(WHY_OPTIONS, WHY_HINTS)
def why_continuous() -> str:
    """Why does continuous batching finish the same requests sooner than static batching? (a:
    faster steps; b: a finished request's slot goes to a waiting one at the next step; c: no
    prefill for waiting requests; d: fewer tokens in total)"""
    return "b"
