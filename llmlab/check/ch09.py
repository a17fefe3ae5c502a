"""Self-checks of chapter 09 (parallelism): all-reduces per forward under TP, column- vs
row-parallel projections, the pipeline bubble, a ring all-reduce's time over PCIe, and which
kind of parallelism leans on NVLink (the seed's learning goal 3)."""
from __future__ import annotations

from typing import Any

from llmlab.check.core import (CheckResult, check_choice, check_dict_keys, check_number, not_yet,
                               passed, report)
from llmlab.config import get_config
from llmlab.parallel import cost, pp

ALLREDUCE_MODEL, ALLREDUCE_TP = "smollm2-135m", 2
BUBBLE_P, BUBBLE_M = 4, 8
RING_TP, RING_BATCH, RING_MODEL, RING_LINK = 8, 64, "llama-3-70b", "pcie"
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


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
    ], default_hint="count the row-parallel projections in one decoder layer, then multiply by "
                    "the number of layers (model.config.num_hidden_layers).")


def parallel_style(answer: Any) -> CheckResult:
    """Map each projection name (PROJECTIONS) to "column" or "row": how is it split under
    Megatron-style TP so that a layer needs as few all-reduces as possible?"""
    ex = "ch09.parallel_style"
    missing = check_dict_keys(ex, answer, PROJECTIONS)
    if missing is not None:
        return missing
    got = {k: str(answer[k]).strip().lower() for k in PROJECTIONS}
    bad = [k for k, v in got.items() if v not in ("column", "row")]
    if bad:
        return report(not_yet(ex, f'each value must be "column" or "row"; check {bad}.'))
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
    return report(not_yet(ex, "inside one block (attention, or the MLP) only the last matmul "
                              "reads a split input."))


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
    ], default_hint="draw the schedule: stage s works on micro-batch i in slot i + s; count the "
                    "slots a stage waits out of all slots of the pass.")


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
    ], default_hint="message = batch × hidden × 2 bytes; time = 2(p−1)·α + 2(p−1)/p · bytes / bandwidth.")


NVLINK_OPTIONS = ["DP", "TP", "PP"]


def needs_nvlink(answer: Any) -> CheckResult:
    """Which parallelism talks so often (every layer) that it needs NVLink inside one machine:
    "DP", "TP" or "PP"?"""
    return check_choice("ch09.needs_nvlink", answer, "TP", options=NVLINK_OPTIONS, hints={
        "DP": "data-parallel replicas serve different requests and do not talk during inference.",
        "PP": "a pipeline sends one activation per stage boundary, which is why it is the one "
              "that spans machines.",
    })
