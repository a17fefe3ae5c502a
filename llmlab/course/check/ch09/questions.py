"""Chapter 09's questions: data parallelism at low load, all-reduces per forward, which style
splits a projection, the pipeline bubble, a ring all-reduce's time, the best TP degree at a long
context, and two servers for a model whose heads do not split over eight ranks; the chapter's
exercises, read from its catalog."""

from __future__ import annotations

from typing import Any

from llmlab.analysis import parallel_cost
from llmlab.config import get_config
from llmlab.course.check.catalog import catalog
from llmlab.course.check.core import (
    CheckResult,
    check_dict_keys,
    not_yet,
    passed,
    staged,
)
from llmlab.course.check.question import Expected, choice, numeric
from llmlab.parallel import pp

M = catalog("ch09")

ALLREDUCE_MODEL, ALLREDUCE_TP = "smollm2-135m", 2
BUBBLE_P, BUBBLE_M = 4, 8
RING_TP, RING_BATCH, RING_MODEL, RING_LINK = 8, 64, "llama-3-70b", "pcie"
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
STYLES = ("column", "row", "replicated")
# the explorer's task: Llama-3-70B decode over PCIe at this batch and context, TP among TP_DEGREES
LONG_MODEL, LONG_LINK, LONG_BATCH, LONG_CONTEXT = "llama-3-70b", "pcie", 64, 16384
TP_DEGREES = (1, 2, 4, 8)

EXERCISES = M.exercises()  # kind, source question, mistakes: the catalog's "exercises"


# What a second replica does at an arrival rate one replica serves comfortably: the letters of
# the options the notebook lists (their text, in the student's language, is the notebook's)
DP_OPTIONS = ("a", "b", "c", "d", "e")
DP_HINTS = {  # keys of the chapter's catalog
    "a": M.key("dp_at_low_load.more_than_arrives"),
    "b": M.key("dp_at_low_load.more_than_arrives"),
    "d": M.key("dp_at_low_load.batch_halved"),
    "e": M.key("dp_at_low_load.router"),
}


@choice(DP_OPTIONS, DP_HINTS)
def dp_at_low_load() -> str:
    """Requests arrive at a rate one replica (Llama-3-8B on one H100, continuous batching) serves
    comfortably. What does a second replica behind a round-robin router do? One letter of
    DP_OPTIONS (tokens/s and mean latency: a, doubles and halves; b, doubles and the same; c,
    about the same and a little lower; d, the same and halved; e, tokens/s drops: the router's
    hop)."""
    return "c"


@numeric(rel=1e-9)
def allreduces_per_forward() -> Expected:
    """How many all-reduces does one forward pass of SmolLM2-135M make under TP=2 in
    `llmlab.parallel.tp` (embedding and LM head replicated)? Count each collective once."""
    layers = get_config(ALLREDUCE_MODEL).num_hidden_layers
    expected = 2 * layers
    return Expected(
        expected,
        mistakes=[
            (layers, M("allreduces_per_forward.one_per_layer")),
            (2 * expected, M("allreduces_per_forward.per_rank")),
            (expected + 1, M("allreduces_per_forward.replicated")),
            (expected + 2, M("allreduces_per_forward.replicated")),
            (4 * layers, M("allreduces_per_forward.column_parallel")),
        ],
    )


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
        return not_yet(ex, M("parallel_style.not_a_style", bad=bad))
    replicated = [k for k, v in got.items() if v == "replicated"]
    if replicated:
        first = M("parallel_style.replicated", replicated=replicated)
        return not_yet(ex, staged(ex, first, M("parallel_style.first_and_last")))
    rows = {k for k, v in got.items() if v == "row"}
    if rows == {"o_proj", "down_proj"}:
        return passed(ex, M("parallel_style.success"))
    if rows == set(PROJECTIONS) - {"o_proj", "down_proj"}:
        return not_yet(ex, M("parallel_style.swapped"))
    if not rows:
        return not_yet(ex, M("parallel_style.all_column"))
    if {"k_proj", "v_proj", "q_proj"} & rows:
        return not_yet(ex, M("parallel_style.qkv_by_rows"))
    first, then = M("parallel_style.one_split_input"), M("parallel_style.last_reads_split")
    return not_yet(ex, staged(ex, first, then))


@numeric(rel=1e-3)
def bubble_fraction() -> Expected:
    """A pipeline of BUBBLE_P equal stages runs BUBBLE_M micro-batches (forward only, free
    communication). What fraction of the time is each stage idle? (a fraction, not %)"""
    p, m = BUBBLE_P, BUBBLE_M
    expected = pp.theoretical_bubble(p, m)
    return Expected(
        expected,
        mistakes=[
            ((p - 1) / m, M("bubble_fraction.m_slots")),
            ((p - 1) / (m + p), M("bubble_fraction.count_again")),
            (1 / p, M("bubble_fraction.stage_share")),
            (100 * expected, M("bubble_fraction.percentage")),
            (m / (m + p - 1), M("bubble_fraction.busy")),
        ],
    )


def _ring_expected() -> tuple[float, float, parallel_cost.Interconnect]:
    cfg = get_config(RING_MODEL)
    link = parallel_cost.get_interconnect(RING_LINK)
    nbytes = RING_BATCH * cfg.hidden_size * 2
    return parallel_cost.ring_all_reduce_time(nbytes, RING_TP, link), nbytes, link


@numeric(rel=0.01)
def ring_all_reduce_us() -> Expected:
    """One TP all-reduce of Llama-3-70B's hidden states for a decode batch of RING_BATCH
    sequences (BF16) over RING_TP GPUs on PCIe 5.0 x16 (`llmlab.analysis.parallel_cost.get_interconnect
    ("pcie")`: bandwidth one way, α per ring step). Its time in microseconds, by the ring formula?"""
    expected_s, nbytes, link = _ring_expected()
    p = RING_TP
    steps = 2 * (p - 1)
    alpha = steps * link.latency  # the latency term, seconds
    return Expected(
        expected_s * 1e6,
        mistakes=[
            (
                (alpha + steps / p * nbytes / (2 * link.bandwidth)) * 1e6,
                M("ring_all_reduce_us.both_directions"),
            ),
            (steps / p * nbytes / link.bandwidth * 1e6, M("ring_all_reduce_us.no_latency")),
            ((alpha + nbytes / link.bandwidth) * 1e6, M("ring_all_reduce_us.message_once")),
            (
                (alpha + steps / p * nbytes * 2 / link.bandwidth) * 1e6,
                M("ring_all_reduce_us.dtype_bytes"),
            ),
            (expected_s, M("ring_all_reduce_us.seconds")),
            (expected_s * 1e3, M("ring_all_reduce_us.milliseconds")),
        ],
    )


def _step_s(tp: int) -> float:
    return parallel_cost.decode_step_cost(
        LONG_MODEL, tp=tp, batch=LONG_BATCH, interconnect=LONG_LINK, context=LONG_CONTEXT
    ).total


@numeric(rel=1e-9)
def best_tp_long_context() -> Expected:
    """With the explorer: Llama-3-70B decode over PCIe at batch LONG_BATCH and context
    LONG_CONTEXT. Which TP degree of TP_DEGREES gives the shortest step?"""
    times = {t: _step_s(t) for t in TP_DEGREES}
    best = min(times, key=times.get)
    short = min(
        TP_DEGREES,
        key=lambda t: (
            parallel_cost.decode_step_cost(
                LONG_MODEL, tp=t, batch=1, interconnect=LONG_LINK, context=1024
            ).total
        ),
    )
    mistakes = [(1, M("best_tp_long_context.tp1_does_not_fit"))]
    if short != best:
        mistakes.append((short, M("best_tp_long_context.short_context_winner")))
    mistakes += [
        (t, M("best_tp_long_context.another_shorter"))
        for t in TP_DEGREES
        if t not in (best, short, 1)
    ]
    hint = M("best_tp_long_context.default_hint", degrees=list(TP_DEGREES))
    return Expected(best, mistakes, default_hint=hint)


# Exercise 6: where the source chapter's rule of thumb ("TP = the GPUs of one machine") meets a
# model whose heads do not split over that many ranks.
SPLIT_GPUS_PER_SERVER, SPLIT_SERVERS = 8, 2  # NVLink inside a server, Ethernet between the two
SPLIT_HEADS, SPLIT_KV_HEADS = 28, 4  # query heads and KV heads of the model
SPLIT_KEYS = ("tp", "pp")


def _heads_split_evenly(tp: int) -> bool:
    """vLLM's rule: every rank gets the same number of query heads, and whole KV heads (or copies)."""
    return SPLIT_HEADS % tp == 0 and (SPLIT_KV_HEADS % tp == 0 or tp % SPLIT_KV_HEADS == 0)


def split_two_servers(answer: Any) -> CheckResult:
    """A model with SPLIT_HEADS query heads and SPLIT_KV_HEADS KV heads, served with vLLM, needs all
    the GPUs of SPLIT_SERVERS servers of SPLIT_GPUS_PER_SERVER GPUs each (NVLink inside a server, a
    slower network between them). Answer a dict {"tp": degree, "pp": degree} with tp × pp = every GPU."""
    ex = "ch09.split_two_servers"
    missing = check_dict_keys(ex, answer, SPLIT_KEYS)
    if missing is not None:
        return missing
    try:
        tp, pp_ = int(answer["tp"]), int(answer["pp"])
    except (TypeError, ValueError):
        return not_yet(ex, M("split_two_servers.whole_numbers"))
    total = SPLIT_GPUS_PER_SERVER * SPLIT_SERVERS
    if tp < 1 or tp * pp_ != total:
        return not_yet(ex, M("split_two_servers.all_gpus", total=total))
    best = max(
        t for t in range(1, SPLIT_GPUS_PER_SERVER + 1) if total % t == 0 and _heads_split_evenly(t)
    )
    if tp > SPLIT_GPUS_PER_SERVER:
        hint = M("split_two_servers.across_servers")
    elif not _heads_split_evenly(tp):
        hint = M(
            "split_two_servers.heads_uneven", tp=tp, heads=SPLIT_HEADS, kv_heads=SPLIT_KV_HEADS
        )
    elif tp == best:
        return passed(ex, M("split_two_servers.success"))
    else:
        first, then = M("split_two_servers.pipeline_inside"), M("split_two_servers.then")
        hint = staged(ex, first, then)
    return not_yet(ex, hint)
