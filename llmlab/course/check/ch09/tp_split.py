"""Chapter 09's build exercise, the split: the cases drawn for the student's tensor-parallel layer,
and what is wrong with the rows and columns each rank keeps (a hint that names the rule)."""

from __future__ import annotations

from llmlab.course.check.catalog import catalog
from llmlab.course.check.ch09.questions import PROJECTIONS
from llmlab.parallel import tp

M = catalog("ch09")

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


def _shard_problem(case: dict, r: int, shard: dict, held: dict[str, list[list[int]]]) -> str | None:
    """What is wrong with rank `r`'s tensors (a hint), or None; notes the output rows (column
    parallel) or input columns (row parallel) each projection kept in `held`."""
    shapes, at = _shapes(case), _describe(case)
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
            return M("split_problem.column_parallel", at=at, name=name, r=r, took=took, dims=dims)
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
    return None


def _coverage_problem(case: dict, held: dict[str, list[list[int]]]) -> str | None:
    """A row or column of a projection that no rank or two ranks hold (a hint), or None."""
    shapes, at = _shapes(case), _describe(case)
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
    return None


def _rank_problem(case: dict, r: int, held: dict[str, list[list[int]]]) -> str | None:
    """Whether rank `r`'s pieces fit together: whole heads, K with V, each query head with its KV
    head (GQA), up with gate, o_proj and down_proj on the rows their inputs hold; a hint or None."""
    world, d, g, at = case["world"], case["head_dim"], case["group"], _describe(case)
    q, k, v = held["q_proj"][r], held["k_proj"][r], held["v_proj"][r]
    gate, up, o, down = (
        held["gate_proj"][r],
        held["up_proj"][r],
        held["o_proj"][r],
        held["down_proj"][r],
    )
    for name, rows in (("q_proj", q), ("k_proj", k)):
        heads = [rows[i : i + d] for i in range(0, len(rows), d)]
        if any(len(hd) != d or hd[0] % d or hd != list(range(hd[0], hd[0] + d)) for hd in heads):
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


def _split_problem(case: dict, split: dict) -> str | None:
    """What is wrong with the student's split on `case` (a hint), or None."""
    if "error" in split:
        return M("split_problem.raised", at=_describe(case), error=split["error"])
    held: dict[str, list[list[int]]] = {}
    for r, shard in enumerate(split["ranks"]):
        problem = _shard_problem(case, r, shard, held)
        if problem is not None:
            return problem
    problem = _coverage_problem(case, held)
    if problem is not None:
        return problem
    for r in range(case["world"]):
        problem = _rank_problem(case, r, held)
        if problem is not None:
            return problem
    return None
