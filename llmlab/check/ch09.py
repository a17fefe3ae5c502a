"""Self-checks of chapter 09 (parallelism): what a second data-parallel replica buys at low load,
column- vs row-parallel projections, all-reduces per forward under TP, the pipeline bubble, a
ring all-reduce's time over PCIe, the fastest TP degree for long contexts over PCIe (the
explorer's task), and which kind of parallelism leans on NVLink (the seed's learning goal 3)."""
from __future__ import annotations

from typing import Any

from llmlab.check.core import (CheckResult, ExerciseInfo, NOT_ANSWERED, check_choice,
                               check_dict_keys, check_number, not_yet, passed, report, staged)
from llmlab.config import get_config
from llmlab.parallel import cost, pp

ALLREDUCE_MODEL, ALLREDUCE_TP = "smollm2-135m", 2
BUBBLE_P, BUBBLE_M = 4, 8
RING_TP, RING_BATCH, RING_MODEL, RING_LINK = 8, 64, "llama-3-70b", "pcie"
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
STYLES = ("column", "row", "replicated")
# the explorer's task: Llama-3-70B decode over PCIe at this batch and context, TP among TP_DEGREES
LONG_MODEL, LONG_LINK, LONG_BATCH, LONG_CONTEXT = "llama-3-70b", "pcie", 64, 16384
TP_DEGREES = (1, 2, 4, 8)

EXERCISES = {
    "dp_at_low_load": ExerciseInfo("reasoning", ("replicas speed up each step",
                                                 "throughput set by capacity, not demand",
                                                 "router overhead")),
    "parallel_style": ExerciseInfo("reasoning", ("kinds swapped", "everything column-parallel",
                                                 "q/k/v split by rows", "replicated projections")),
    "allreduces_per_forward": ExerciseInfo("reasoning", ("one per layer", "counted per rank",
                                                         "embedding/LM head communicating",
                                                         "column-parallel communicating")),
    "bubble_fraction": ExerciseInfo("plug-in", ("m instead of m + p − 1", "percentage",
                                                "busy instead of idle", "stage share")),
    "ring_all_reduce_us": ExerciseInfo("plug-in", ("both-directions bandwidth", "latency term left out",
                                                   "message moved once", "dtype bytes",
                                                   "seconds or ms for µs")),
    "best_tp_long_context": ExerciseInfo("reasoning", ("short-context winner", "weights do not fit",
                                                       "communication only")),
    "needs_nvlink": ExerciseInfo("recall", ("DP talks", "PP talks every layer")),
}

# What a second replica does at an arrival rate one replica serves comfortably (a fixed order
# that does not line up with the answer; shown in this order in the notebook).
DP_OPTIONS = {
    "a": "tokens/s doubles and the mean latency halves",
    "b": "tokens/s doubles and the mean latency stays the same",
    "c": "tokens/s stays about the same and the mean latency drops only a little",
    "d": "tokens/s stays the same and the mean latency halves",
    "e": "tokens/s drops, because the router adds a hop to every request",
}
DP_HINTS = {
    "a": "tokens/s cannot exceed what arrives: at this load one replica already serves every "
         "request as it comes.",
    "b": "tokens/s cannot exceed what arrives: at this load one replica already serves every "
         "request as it comes.",
    "d": "halving a replica's batch does not halve its step: a memory-bound step reads all the "
         "weights whatever the batch.",
    "e": "a router hands a request to a replica once; it adds nothing to the decode steps.",
}


def dp_at_low_load(answer: Any) -> CheckResult:
    """Requests arrive at a rate one replica (Llama-3-8B on one H100, continuous batching) serves
    comfortably. What does a second replica behind a round-robin router do? One letter of DP_OPTIONS."""
    return check_choice("ch09.dp_at_low_load", answer, "c", options=list(DP_OPTIONS), hints=DP_HINTS)


def allreduces_per_forward(answer: Any) -> CheckResult:
    """How many all-reduces does one forward pass of SmolLM2-135M make under TP=2 in
    `llmlab.parallel.tp` (embedding and LM head replicated)? Count each collective once."""
    layers = get_config(ALLREDUCE_MODEL).num_hidden_layers
    expected = 2 * layers
    return check_number("ch09.allreduces_per_forward", answer, expected, rel=1e-9, mistakes=[
        (layers, "that is one per layer; attention and the MLP each end in a row-parallel "
                 "projection, and each of those needs its own sum."),
        (2 * expected, "an all-reduce is one collective that every rank joins; count it once, "
                       "not once per rank."),
        (expected + 1, "the embedding and the LM head are replicated here: no communication."),
        (expected + 2, "the embedding and the LM head are replicated here: no communication."),
        (4 * layers, "column-parallel projections (q/k/v, gate/up) need no communication: each "
                     "rank already has the full input."),
    ], default_hint="ask which projections leave each rank with a partial sum, and how many of "
                    "them one decoder layer has.",
        formula="Count the row-parallel projections in one decoder layer, then multiply by the "
                "number of layers (model.config.num_hidden_layers).")


def parallel_style(answer: Any) -> CheckResult:
    """Map each projection name (PROJECTIONS) to "column", "row" or "replicated": how is it
    split under Megatron-style TP so that a layer needs as few all-reduces as possible?"""
    ex = "ch09.parallel_style"
    missing = check_dict_keys(ex, answer, PROJECTIONS)
    if missing is not None:
        return missing
    got = {k: str(answer[k]).strip().lower() for k in PROJECTIONS}
    bad = [k for k, v in got.items() if v not in STYLES]
    if bad:
        return report(not_yet(ex, f'each value must be "column" or "row" (or "replicated"); check {bad}.'))
    replicated = [k for k, v in got.items() if v == "replicated"]
    if replicated:
        return report(not_yet(ex, staged(ex, f"{replicated}: a replicated projection keeps its whole "
                                             "matrix on every rank, so TP would save no memory and "
                                             "no time there; every projection of a layer is split.",
                                         "Each block splits its first matmul one way and its last "
                                         "the other way.")))
    rows = {k for k, v in got.items() if v == "row"}
    if rows == {"o_proj", "down_proj"}:
        return report(passed(ex, "right: each block splits its first matmul by output columns "
                                 "and its last by input rows, so one all-reduce closes it."))
    if rows == set(PROJECTIONS) - {"o_proj", "down_proj"}:
        return report(not_yet(ex, "the two kinds are swapped: the first matmul of a block must "
                                  "work from the full (replicated) input."))
    if not rows:
        return report(not_yet(ex, "if every matmul keeps whole output columns, who adds up the "
                                  "partial results at the end of the block?"))
    if {"k_proj", "v_proj", "q_proj"} & rows:
        return report(not_yet(ex, "splitting q/k/v by rows would leave every rank with a partial "
                                  "sum of every head; attention needs whole heads per rank."))
    return report(not_yet(ex, staged(ex, "inside one block (attention, or the MLP) only one matmul "
                                         "reads an input that is already split.",
                                     "The block's last matmul reads the heads / channels the "
                                     "ranks computed separately.")))


def bubble_fraction(answer: Any) -> CheckResult:
    """A pipeline of BUBBLE_P equal stages runs BUBBLE_M micro-batches (forward only, free
    communication). What fraction of the time is each stage idle? (a fraction, not %)"""
    p, m = BUBBLE_P, BUBBLE_M
    expected = pp.theoretical_bubble(p, m)
    return check_number("ch09.bubble_fraction", answer, expected, rel=1e-3, mistakes=[
        ((p - 1) / m, "the pass takes m + p − 1 slots, not m; divide the idle slots by all of them."),
        ((p - 1) / (m + p), "count the slots again: the last micro-batch enters stage p at slot m + p − 1."),
        (1 / p, "that is the share of one stage in the model, not its idle time."),
        (100 * expected, "give a fraction between 0 and 1, not a percentage."),
        (m / (m + p - 1), "that is the busy fraction; the question asks for the idle one."),
    ], default_hint="draw the schedule as a grid of slots (stages × time) and count.",
        formula="Stage s works on micro-batch i in slot i + s; count the slots a stage waits "
                "out of all slots of the pass.")


def _ring_expected() -> tuple[float, float, cost.Interconnect]:
    cfg = get_config(RING_MODEL)
    link = cost.get_interconnect(RING_LINK)
    nbytes = RING_BATCH * cfg.hidden_size * 2
    return cost.ring_all_reduce_time(nbytes, RING_TP, link), nbytes, link


def ring_all_reduce_us(answer: Any) -> CheckResult:
    """One TP all-reduce of Llama-3-70B's hidden states for a decode batch of RING_BATCH
    sequences (BF16) over RING_TP GPUs on PCIe 5.0 x16 (`llmlab.parallel.cost.get_interconnect
    ("pcie")`: bandwidth one way, α per ring step). Its time in microseconds, by the ring formula?"""
    expected_s, nbytes, link = _ring_expected()
    p = RING_TP
    steps = 2 * (p - 1)
    expected = expected_s * 1e6
    return check_number("ch09.ring_all_reduce_us", answer, expected, rel=0.01, mistakes=[
        ((steps * link.latency + steps / p * nbytes / (2 * link.bandwidth)) * 1e6,
         "that uses the 128 GB/s both-directions figure; a ring step sends and receives at once, "
         "so use one direction."),
        (steps / p * nbytes / link.bandwidth * 1e6,
         "the latency term is missing: each of the 2(p−1) ring steps costs α too."),
        ((steps * link.latency + nbytes / link.bandwidth) * 1e6,
         "a ring all-reduce moves 2(p−1)/p times the message per GPU, not the message once."),
        ((steps * link.latency + steps / p * nbytes * 2 / link.bandwidth) * 1e6,
         "BF16 is 2 bytes per value: check the message size."),
        (expected_s, "give microseconds, not seconds."),
        (expected_s * 1e3, "give microseconds, not milliseconds."),
    ], default_hint="check the message size (what one all-reduce carries) and both terms of "
                    "the ring formula.",
        formula="message = batch × hidden × 2 bytes; time = 2(p−1)·α + 2(p−1)/p · bytes / bandwidth.")


def _step_s(tp: int) -> float:
    return cost.decode_step_cost(LONG_MODEL, tp=tp, batch=LONG_BATCH, interconnect=LONG_LINK,
                                 context=LONG_CONTEXT).total


def best_tp_long_context(answer: Any) -> CheckResult:
    """With the explorer: Llama-3-70B decode over PCIe at batch LONG_BATCH and context
    LONG_CONTEXT. Which TP degree of TP_DEGREES gives the shortest step?"""
    times = {t: _step_s(t) for t in TP_DEGREES}
    best = min(times, key=times.get)
    short = min(TP_DEGREES, key=lambda t: cost.decode_step_cost(
        LONG_MODEL, tp=t, batch=1, interconnect=LONG_LINK, context=1024).total)
    mistakes = [(1, "at TP=1 the 141 GB of weights do not even fit one 80 GB GPU; and a longer "
                    "context makes the single GPU's KV reads longer still.")]
    if short != best:
        mistakes.append((short, "that is the winner at a short context (the table above). Set the "
                                "context slider: each sequence's KV cache grows with the context, "
                                "and TP splits those reads too, while the all-reduces stay the same size."))
    for t in TP_DEGREES:
        if t not in (best, short, 1):
            mistakes.append((t, "compare the bars of every TP degree at that batch and context; "
                                "another degree is shorter."))
    return check_number("ch09.best_tp_long_context", answer, best, rel=1e-9, mistakes=mistakes,
                        default_hint=f"answer one of the TP degrees {list(TP_DEGREES)}.")


NVLINK_OPTIONS = ["DP", "TP", "PP"]


def needs_nvlink(answer: Any) -> CheckResult:
    """Which parallelism talks so often (every layer) that it needs NVLink inside one machine:
    "DP", "TP" or "PP"?"""
    return check_choice("ch09.needs_nvlink", answer, "TP", options=NVLINK_OPTIONS, hints={
        "DP": "data-parallel replicas serve different requests and do not talk during inference.",
        "PP": "a pipeline sends one activation per stage boundary, which is why it is the one "
              "that spans machines.",
    })
