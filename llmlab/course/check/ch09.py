"""Self-checks of chapter 09 (parallelism): what a second data-parallel replica buys at low load,
column- vs row-parallel projections, all-reduces per forward under TP, the pipeline bubble, a
ring all-reduce's time over PCIe, the fastest TP degree for long contexts over PCIe (the
explorer's task), and which kind of parallelism leans on NVLink (the source chapter's learning
goal 3)."""

from __future__ import annotations

import functools
from typing import Any

from llmlab.analysis import parallel_cost
from llmlab.config import get_config
from llmlab.course.check.catalog import catalog
from llmlab.course.check.core import (
    NOT_ANSWERED,
    CheckResult,
    ExerciseInfo,
    check_choice,
    check_dict_keys,
    check_number,
    not_yet,
    passed,
    refuse_package_piece,
    report,
    staged,
)
from llmlab.parallel import pp, tp

M = catalog("ch09")

ALLREDUCE_MODEL, ALLREDUCE_TP = "smollm2-135m", 2
BUBBLE_P, BUBBLE_M = 4, 8
RING_TP, RING_BATCH, RING_MODEL, RING_LINK = 8, 64, "llama-3-70b", "pcie"
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
STYLES = ("column", "row", "replicated")
# the explorer's task: Llama-3-70B decode over PCIe at this batch and context, TP among TP_DEGREES
LONG_MODEL, LONG_LINK, LONG_BATCH, LONG_CONTEXT = "llama-3-70b", "pcie", 64, 16384
TP_DEGREES = (1, 2, 4, 8)

EXERCISES = {
    "dp_at_low_load": ExerciseInfo(
        "reasoning",
        (
            "replicas speed up each step",
            "throughput set by capacity, not demand",
            "router overhead",
        ),
    ),
    "parallel_style": ExerciseInfo(
        "reasoning",
        (
            "kinds swapped",
            "everything column-parallel",
            "q/k/v split by rows",
            "replicated projections",
        ),
    ),
    "allreduces_per_forward": ExerciseInfo(
        "reasoning",
        (
            "one per layer",
            "counted per rank",
            "embedding/LM head communicating",
            "column-parallel communicating",
        ),
    ),
    "bubble_fraction": ExerciseInfo(
        "plug-in", ("m instead of m + p − 1", "percentage", "busy instead of idle", "stage share")
    ),
    "ring_all_reduce_us": ExerciseInfo(
        "plug-in",
        (
            "both-directions bandwidth",
            "latency term left out",
            "message moved once",
            "dtype bytes",
            "seconds or ms for µs",
        ),
    ),
    "best_tp_long_context": ExerciseInfo(
        "reasoning", ("short-context winner", "weights do not fit", "communication only")
    ),
    "split_two_servers": ExerciseInfo(
        "reasoning", ("TP across the slow link", "heads split unevenly", "PP inside a server")
    ),
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
DP_HINTS = {  # keys of the chapter's catalog
    "a": M.key("dp_at_low_load.more_than_arrives"),
    "b": M.key("dp_at_low_load.more_than_arrives"),
    "d": M.key("dp_at_low_load.batch_halved"),
    "e": M.key("dp_at_low_load.router"),
}


def dp_at_low_load(answer: Any) -> CheckResult:
    """Requests arrive at a rate one replica (Llama-3-8B on one H100, continuous batching) serves
    comfortably. What does a second replica behind a round-robin router do? One letter of DP_OPTIONS."""
    return check_choice(
        "ch09.dp_at_low_load",
        answer,
        "c",
        options=list(DP_OPTIONS),
        hints={option: M(key) for option, key in DP_HINTS.items()},
    )


def allreduces_per_forward(answer: Any) -> CheckResult:
    """How many all-reduces does one forward pass of SmolLM2-135M make under TP=2 in
    `llmlab.parallel.tp` (embedding and LM head replicated)? Count each collective once."""
    layers = get_config(ALLREDUCE_MODEL).num_hidden_layers
    expected = 2 * layers
    return check_number(
        "ch09.allreduces_per_forward",
        answer,
        expected,
        rel=1e-9,
        mistakes=[
            (layers, M("allreduces_per_forward.one_per_layer")),
            (2 * expected, M("allreduces_per_forward.per_rank")),
            (expected + 1, M("allreduces_per_forward.replicated")),
            (expected + 2, M("allreduces_per_forward.replicated")),
            (4 * layers, M("allreduces_per_forward.column_parallel")),
        ],
        default_hint=M("allreduces_per_forward.default_hint"),
        formula=M("allreduces_per_forward.formula"),
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
        return report(not_yet(ex, M("parallel_style.not_a_style", bad=bad)))
    replicated = [k for k, v in got.items() if v == "replicated"]
    if replicated:
        first = M("parallel_style.replicated", replicated=replicated)
        return report(not_yet(ex, staged(ex, first, M("parallel_style.first_and_last"))))
    rows = {k for k, v in got.items() if v == "row"}
    if rows == {"o_proj", "down_proj"}:
        return report(passed(ex, M("parallel_style.success")))
    if rows == set(PROJECTIONS) - {"o_proj", "down_proj"}:
        return report(not_yet(ex, M("parallel_style.swapped")))
    if not rows:
        return report(not_yet(ex, M("parallel_style.all_column")))
    if {"k_proj", "v_proj", "q_proj"} & rows:
        return report(not_yet(ex, M("parallel_style.qkv_by_rows")))
    first, then = M("parallel_style.one_split_input"), M("parallel_style.last_reads_split")
    return report(not_yet(ex, staged(ex, first, then)))


def bubble_fraction(answer: Any) -> CheckResult:
    """A pipeline of BUBBLE_P equal stages runs BUBBLE_M micro-batches (forward only, free
    communication). What fraction of the time is each stage idle? (a fraction, not %)"""
    p, m = BUBBLE_P, BUBBLE_M
    expected = pp.theoretical_bubble(p, m)
    return check_number(
        "ch09.bubble_fraction",
        answer,
        expected,
        rel=1e-3,
        mistakes=[
            ((p - 1) / m, M("bubble_fraction.m_slots")),
            ((p - 1) / (m + p), M("bubble_fraction.count_again")),
            (1 / p, M("bubble_fraction.stage_share")),
            (100 * expected, M("bubble_fraction.percentage")),
            (m / (m + p - 1), M("bubble_fraction.busy")),
        ],
        default_hint=M("bubble_fraction.default_hint"),
        formula=M("bubble_fraction.formula"),
    )


def _ring_expected() -> tuple[float, float, parallel_cost.Interconnect]:
    cfg = get_config(RING_MODEL)
    link = parallel_cost.get_interconnect(RING_LINK)
    nbytes = RING_BATCH * cfg.hidden_size * 2
    return parallel_cost.ring_all_reduce_time(nbytes, RING_TP, link), nbytes, link


def ring_all_reduce_us(answer: Any) -> CheckResult:
    """One TP all-reduce of Llama-3-70B's hidden states for a decode batch of RING_BATCH
    sequences (BF16) over RING_TP GPUs on PCIe 5.0 x16 (`llmlab.analysis.parallel_cost.get_interconnect
    ("pcie")`: bandwidth one way, α per ring step). Its time in microseconds, by the ring formula?"""
    expected_s, nbytes, link = _ring_expected()
    p = RING_TP
    steps = 2 * (p - 1)
    alpha = steps * link.latency  # the latency term, seconds
    expected = expected_s * 1e6
    return check_number(
        "ch09.ring_all_reduce_us",
        answer,
        expected,
        rel=0.01,
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
        default_hint=M("ring_all_reduce_us.default_hint"),
        formula=M("ring_all_reduce_us.formula"),
    )


def _step_s(tp: int) -> float:
    return parallel_cost.decode_step_cost(
        LONG_MODEL, tp=tp, batch=LONG_BATCH, interconnect=LONG_LINK, context=LONG_CONTEXT
    ).total


def best_tp_long_context(answer: Any) -> CheckResult:
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
    return check_number(
        "ch09.best_tp_long_context",
        answer,
        best,
        rel=1e-9,
        mistakes=mistakes,
        default_hint=M("best_tp_long_context.default_hint", degrees=list(TP_DEGREES)),
    )


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
        return report(not_yet(ex, M("split_two_servers.whole_numbers")))
    total = SPLIT_GPUS_PER_SERVER * SPLIT_SERVERS
    if tp < 1 or tp * pp_ != total:
        return report(not_yet(ex, M("split_two_servers.all_gpus", total=total)))
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
        return report(passed(ex, M("split_two_servers.success")))
    else:
        first, then = M("split_two_servers.pipeline_inside"), M("split_two_servers.then")
        hint = staged(ex, first, then)
    return report(not_yet(ex, hint))


# ---- the build exercise: the tensor-parallel split of one layer -------------------------------------

BUILDS = {"ch09.tensor_parallel_layer": "TensorParallelLayer"}
DRIVERS = "llmlab.course.build.ch09"
PLUG_MODEL = "smollm2-135m"
# "The capital of France is" in SmolLM2's tokenizer; greedy continuation of PLUG_TOKENS tokens
PLUG_PROMPT = (504, 3575, 282, 4649, 314)
PLUG_TOKENS = 2
PLUG_WORLD = 2
MAX_EXAMPLES = 30
TOLERANCE = 1e-4  # relative to the largest |value| of the unsharded output (float32 sums reordered)
COLUMN_PARALLEL = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")
ROW_PARALLEL = ("o_proj", "down_proj")
NORMS = ("input_layernorm", "post_attention_layernorm")
PACKAGE_SEQUENCE = (
    "q_proj",
    "k_proj",
    "v_proj",
    "attention",
    "o_proj",
    "all-reduce",
    "gate_proj",
    "up_proj",
    "down_proj",
    "all-reduce",
)

EXERCISES["tensor_parallel_layer"] = ExerciseInfo(
    "reasoning",  # a build exercise: the reading time counts it as coding (its BUILDS entry)
    (
        "down_proj split by output rows",
        "all-reduce after gate/up",
        "no all-reduce after o_proj",
        "GQA groups broken",
        "rows missing or on two ranks",
        "ranks disagree on the all-reduces",
    ),
)


def layer_cases():
    """Small layers to split: hidden, intermediate, heads (whole GQA groups), world 2 or 3."""
    from hypothesis import strategies as st

    @st.composite
    def cases(draw):
        world = draw(st.sampled_from([2, 3]))
        return {
            "world": world,
            "kv_heads": draw(st.integers(world, 4)),
            "group": draw(st.integers(1, 3)),
            "head_dim": draw(st.sampled_from([2, 4])),
            "hidden": draw(st.integers(2, 8)),
            "intermediate": draw(st.integers(world, 9)),
            "tokens": draw(st.integers(1, 3)),
            "seed": draw(st.integers(0, 1000)),
        }

    return cases()


def _describe(case: dict) -> str:
    c = case
    return M(
        "describe.case",
        hidden=c["hidden"],
        intermediate=c["intermediate"],
        heads=c["kv_heads"] * c["group"],
        kv_heads=c["kv_heads"],
        head_dim=c["head_dim"],
        world=c["world"],
        tokens=c["tokens"],
    )


def _span(ids: list[int]) -> str:
    """0–2, or 0, 2, 5 when not contiguous, or "none"."""
    if not ids:
        return M("span.none")
    if ids == list(range(ids[0], ids[-1] + 1)):
        return f"{ids[0]}–{ids[-1]}" if len(ids) > 1 else str(ids[0])
    return ", ".join(map(str, ids))


def _shapes(case: dict) -> dict[str, tuple[int, ...]]:
    c = case
    h, i, d = c["hidden"], c["intermediate"], c["head_dim"]
    q, kv = c["kv_heads"] * c["group"] * d, c["kv_heads"] * d
    return tp.layer_shapes(h, q, kv, i)


def _rows(entry: dict, shape: tuple[int, ...]) -> list[int] | None:
    """The rows of the [out, in] weight a shard holds whole and in order, or None."""
    out, inn = shape
    got = entry.get("shape")
    if got is None or len(got) != 2 or got[1] != inn:
        return None
    idx = entry["index"]
    rows = []
    for r in range(got[0]):
        row = idx[r * inn : (r + 1) * inn]
        if row[0] % inn or row != list(range(row[0], row[0] + inn)):
            return None
        rows.append(row[0] // inn)
    return rows


def _cols(entry: dict, shape: tuple[int, ...]) -> list[int] | None:
    """The columns of the [out, in] weight a shard holds whole and in order, or None."""
    out, inn = shape
    got = entry.get("shape")
    if got is None or len(got) != 2 or got[0] != out:
        return None
    idx, m = entry["index"], got[1]
    cols = []
    for j in range(m):
        col = idx[j::m]
        if col != [r * inn + col[0] for r in range(out)]:
            return None
        cols.append(col[0])
    return cols


def _package_split(case: dict) -> str:
    from llmlab.config import tiny_config

    cfg = tiny_config(
        num_attention_heads=case["kv_heads"] * case["group"],
        num_key_value_heads=case["kv_heads"],
        head_dim=case["head_dim"],
        intermediate_size=case["intermediate"],
        hidden_size=case["hidden"],
    )
    s = tp.tp_plan(cfg, case["world"])[0]
    return M(
        "package_split.rank0",
        kv_heads=_span(list(s.kv_heads)),
        q_heads=_span(list(s.q_heads)),
        ffn=_span(list(s.ffn)),
    )


def _split_problem(case: dict, split: dict) -> str | None:
    """What is wrong with the student's split on `case` (a hint), or None."""
    shapes, world, d, g = _shapes(case), case["world"], case["head_dim"], case["group"]
    at = _describe(case)
    if "error" in split:
        return M("split_problem.raised", at=at, error=split["error"])
    ranks = split["ranks"]
    held: dict[str, list[list[int]]] = {}
    for r, shard in enumerate(ranks):
        for name in PROJECTIONS + NORMS:
            entry, shape = shard[name], shapes[name]
            if "shape" not in entry:
                return M("split_problem.missing_tensor", at=at, r=r, name=name)
            if name in NORMS:
                if entry["index"] != list(range(shape[0])):
                    return M("split_problem.norm_not_whole", at=at, r=r, name=name)
                continue
            rows, cols = _rows(entry, shape), _cols(entry, shape)
            dims = f"[{shape[0]}, {shape[1]}]"
            if name in COLUMN_PARALLEL and rows is None:
                took = (
                    M("split_problem.took_input_columns", cols=_span(cols))
                    if cols is not None
                    else M("split_problem.took_not_rows")
                )
                return M(
                    "split_problem.column_parallel", at=at, name=name, r=r, took=took, dims=dims
                )
            if name in ROW_PARALLEL and cols is None:
                took = (
                    M("split_problem.took_output_rows", rows=_span(rows))
                    if rows is not None
                    else M("split_problem.took_not_columns")
                )
                return M(
                    "split_problem.row_parallel",
                    at=at,
                    name=name,
                    r=r,
                    took=took,
                    dims=dims,
                    match="q_proj" if name == "o_proj" else "gate_proj/up_proj",
                    package=_package_split(case),
                )
            held.setdefault(name, []).append(rows if name in COLUMN_PARALLEL else cols)
    for name, per_rank in held.items():
        by_rows = name in COLUMN_PARALLEL
        n = shapes[name][0] if by_rows else shapes[name][1]
        what = M("split_problem.rows") if by_rows else M("split_problem.columns")
        counts = [sum(ids.count(i) for ids in per_rank) for i in range(n)]
        twice = [i for i, c in enumerate(counts) if c > 1]
        none = [i for i, c in enumerate(counts) if c == 0]
        if twice or none:
            problem = (
                M("split_problem.twice", what=what, ids=_span(twice))
                if twice
                else M("split_problem.nowhere", what=what, ids=_span(none))
            )
            return M(
                "split_problem.exactly_once",
                at=at,
                name=name,
                problem=problem,
                one=M("split_problem.row") if by_rows else M("split_problem.column"),
                package=_package_split(case),
            )
    for r in range(world):
        q, k, v = held["q_proj"][r], held["k_proj"][r], held["v_proj"][r]
        gate, up, o, down = (
            held["gate_proj"][r],
            held["up_proj"][r],
            held["o_proj"][r],
            held["down_proj"][r],
        )
        for name, rows in (("q_proj", q), ("k_proj", k)):
            heads = [rows[i : i + d] for i in range(0, len(rows), d)]
            if any(
                len(hd) != d or hd[0] % d or hd != list(range(hd[0], hd[0] + d)) for hd in heads
            ):
                return M("split_problem.head_cut", at=at, name=name, r=r, rows=_span(rows), d=d)
        kv_heads, q_heads = [x // d for x in k[::d]], [x // d for x in q[::d]]
        if v != k:
            return M("split_problem.v_not_k", at=at, r=r, v=_span(v), k=_span(k))
        if not kv_heads:
            return M("split_problem.no_kv_head", at=at, r=r)
        readers = [h for kv in kv_heads for h in range(kv * g, (kv + 1) * g)]
        if q_heads != readers:
            stray = next((h for h in q_heads if h // g not in kv_heads), None)
            where = ""
            if stray is not None:
                owner = next(s for s in range(world) if stray // g * d in held["k_proj"][s])
                where = M("split_problem.stray_query_head", stray=stray, kv=stray // g, owner=owner)
            return M(
                "split_problem.gqa_groups",
                at=at,
                r=r,
                q_heads=_span(q_heads),
                kv_heads=_span(kv_heads),
                where=where,
                g=g,
                package=_package_split(case),
            )
        if up != gate:
            return M("split_problem.up_not_gate", at=at, r=r, up=_span(up), gate=_span(gate))
        for name, cols, rows, source in (
            ("o_proj", o, q, "q_proj"),
            ("down_proj", down, gate, "gate_proj"),
        ):
            if cols != rows:
                return M(
                    "split_problem.columns_not_rows",
                    at=at,
                    name=name,
                    r=r,
                    cols=_span(cols),
                    source=source,
                    rows=_span(rows),
                )
    return None


def _all_reduce_steps(trace: list[str]) -> list[str]:
    """The projection each all-reduce of a rank's trace came right after."""
    steps, last = [], "input"
    for event in trace:
        if event == "all-reduce":
            steps.append(last)
        elif event in PROJECTIONS:
            last = event
    return steps


def _forward_problem(case: dict, forward: dict, expected: list[float]) -> str | None:
    at = _describe(case)
    traces = forward.get("traces") or [[]]
    steps = _all_reduce_steps(traces[0])
    ran = " → ".join(traces[0]) or M("forward_problem.nothing")
    seq = M("forward_problem.sequence", ran=ran, package=" → ".join(PACKAGE_SEQUENCE))
    early = [s for s in steps if s in COLUMN_PARALLEL]
    if early:
        return M("forward_problem.early_all_reduce", at=at, proj=early[0], seq=seq)
    if "error" in forward:
        return M("forward_problem.raised", at=at, error=forward["error"], seq=seq)
    for block in ("o_proj", "down_proj"):
        if block not in steps:
            return M("forward_problem.no_all_reduce", at=at, block=block, seq=seq)
    if len(steps) != 2:
        return M("forward_problem.count", at=at, n=len(steps), seq=seq)
    for r, out in enumerate(forward["outputs"]):
        if out is None or len(out) != len(expected):
            return M(
                "forward_problem.shape",
                at=at,
                r=r,
                shape=forward["shapes"][r],
                tokens=case["tokens"],
                hidden=case["hidden"],
            )
        scale = 1 + max(abs(e) for e in expected)
        diff = max(abs(a - b) for a, b in zip(out, expected))
        if not diff <= TOLERANCE * scale:
            return M("forward_problem.differs", at=at, r=r, diff=diff)
    return None


def _layer_problem(got: Any, expected: dict) -> str | None:
    case = expected["case"]
    if not isinstance(got, dict) or "split" not in got:
        return M("tensor_parallel_layer.did_not_run", error=got)
    split = got["split"] or {}
    if split.get("none"):  # every rank's shard was None: nothing to look into
        return M("tensor_parallel_layer.shard_none")
    problem = _split_problem(case, split) if split else None
    return problem or _forward_problem(case, got["forward"], expected["output"])


def _layer_reference(case: dict) -> dict:
    from llmlab.course.build.ch09 import unsharded_output

    return {"case": case, "output": unsharded_output(case).reshape(-1).tolist()}


@functools.lru_cache(maxsize=1)
def _plug_reference(model: str, prompt: tuple[int, ...], new_tokens: int):
    """The package's side of the plug-in, in this process: SmolLM2's layer 0 on the prompt's
    embeddings (no split), and the one-process greedy tokens."""
    import torch

    from llmlab.ops.metadata import single_sequence_metadata
    from llmlab.parallel.source import ModelSource

    full = ModelSource(model).build()
    T = len(prompt)
    with torch.inference_mode():
        x = full.embed_tokens(torch.tensor(prompt))
        kv = full.allocate_kv_caches(num_blocks=1, block_size=T)
        meta = single_sequence_metadata(kv, num_cached=0, num_new=T, max_len=T)
        cos, sin = full.rope_cos_sin(torch.arange(T))
        layer0 = full.layers[0](x, cos, sin, meta, 0)
    tokens = tp.greedy_reference(full, list(prompt), new_tokens)
    return (
        layer0.reshape(-1).tolist(),
        tokens,
        full.config.hidden_size,
        full.config.num_hidden_layers,
    )


def tensor_parallel_layer(answer: Any) -> CheckResult:
    """The student's `TensorParallelLayer` (static `shard` and `forward`): properties on small
    layers drawn by hypothesis (the shards partition the weights as Megatron's split does; the
    ranks' forward, simulated in one process, equals the unsharded layer), then SmolLM2 over two
    gloo processes: layer 0 equal to the package's, and the package's TP engine with the
    student's `shard` as its `shard_fn` decoding the same tokens as one process."""
    from llmlab.course.build import drive, find_counterexample

    ex = "ch09.tensor_parallel_layer"
    if answer is None:
        return report(not_yet(ex, NOT_ANSWERED))
    refused = refuse_package_piece(ex, answer, ('shard', 'forward'))
    if refused is not None:
        return refused
    if not all(callable(getattr(answer, m, None)) for m in ("shard", "forward")) and not getattr(
        answer, "grader_stand_in", False
    ):
        return report(not_yet(ex, M("tensor_parallel_layer.not_a_class")))
    first = {"world": 2, "kv_heads": 2, "group": 1, "head_dim": 2, "hidden": 2,
             "intermediate": 2, "tokens": 1, "seed": 0}  # fmt: skip
    try:
        probe = drive(answer, f"{DRIVERS}:observe_layer", first)
    except Exception as e:  # the student's process died, or ran out of time
        return report(not_yet(ex, M("tensor_parallel_layer.did_not_run", error=e)))
    if probe.get("split") == {"none": True}:
        return report(not_yet(ex, NOT_ANSWERED))
    cex = find_counterexample(
        layer_cases(),
        lambda case: drive(answer, f"{DRIVERS}:observe_layer", case),
        _layer_reference,
        max_examples=MAX_EXAMPLES,
        compare=lambda got, expected: _layer_problem(got, expected) is None,
    )
    if cex is not None:
        problem = (
            _layer_problem(cex.got, cex.expected)
            if not hasattr(cex.got, "error")
            else M("tensor_parallel_layer.raised_on", case=_describe(cex.case), raised=cex.got)
        )
        first = M("tensor_parallel_layer.smallest", problem=problem)
        hint = staged(ex, first, M("tensor_parallel_layer.megatron_rule"))
        return report(not_yet(ex, hint))
    return report(_plug_in_verdict(ex, answer))


def _plug_in_verdict(ex: str, answer: Any) -> CheckResult:
    from llmlab.course.build import drive
    from llmlab.course.build.ch09 import tokens_processed

    spec = answer.spec if getattr(answer, "grader_stand_in", False) else None
    try:
        run = drive(answer, f"{DRIVERS}:plug_in", spec, list(PLUG_PROMPT), PLUG_TOKENS)
    except Exception as e:
        return not_yet(ex, M("plug_in_verdict.run_failed", world=PLUG_WORLD, error=e))
    layer0, tokens, hidden, layers = _plug_reference(PLUG_MODEL, PLUG_PROMPT, PLUG_TOKENS)
    scale = 1 + max(abs(v) for v in layer0)
    diffs = [
        max(abs(a - b) for a, b in zip(out, layer0)) if len(out) == len(layer0) else float("inf")
        for out in run["layer_out"]
    ]
    if not max(diffs) <= TOLERANCE * scale:
        return not_yet(ex, M("plug_in_verdict.layer_differs", world=PLUG_WORLD, diff=max(diffs)))
    if any(t != tokens for t in run["tokens"]):
        return not_yet(
            ex, M("plug_in_verdict.tokens_differ", decoded=run["tokens"][0], tokens=tokens)
        )
    T = len(PLUG_PROMPT)
    mine_bytes = run["layer_bytes"][0] / T
    package_bytes = run["package_bytes"][0] / (tokens_processed(T, PLUG_TOKENS) * layers)
    # No time is compared: an all-reduce of the student's and one of the package's are the same
    # gloo call over localhost, and one run's times measure the machine's load (6018 against
    # 2305 µs was seen for equal bytes); the bytes and the calls are the split's own
    same = run["package_tokens"][0] == tokens
    return passed(
        ex,
        M(
            "plug_in_verdict.success",
            world=PLUG_WORLD,
            diff=max(diffs),
            decoded=run["tokens"][0],
            same=M("plug_in_verdict.same_as_package") if same else "",
            mine_bytes=mine_bytes,
            calls=run["layer_calls"][0],
            package_bytes=package_bytes,
            hidden=hidden,
        ),
    )
