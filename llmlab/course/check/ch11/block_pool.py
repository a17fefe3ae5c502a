"""Chapter 11's build exercise: the student's block pool (`llmlab.course.build.ch11_pool`), run
on drawn cases of operations beside the package's `BlockPool`; the hint walks the shrunk case
step by step to its first difference."""

from __future__ import annotations

import functools
from typing import Any

from llmlab.course.check.build_guard import refuse_build_answer
from llmlab.course.check.catalog import catalog
from llmlab.course.check.core import (
    CheckResult,
    clauses,
    not_yet,
    passed,
    staged,
)

M = catalog("ch11")


# ---- build exercise: the block pool (llmlab.course.build.ch11_pool) -----------------------------
POOL_MAX_EXAMPLES = 60  # drawn cases of operations (then the failing one is shrunk)
POOL_DRIVER = "llmlab.course.build.ch11_pool:"
# the build exercises of this chapter: exercise id -> the name of the student's class
BUILDS = {"ch11.block_pool": "MyBlockPool"}


@functools.lru_cache(maxsize=1)
def _package_pool_run() -> dict:
    """The package's BlockPool under the engine on the exercise's workload (tokens and
    measurements), computed once per process."""
    from llmlab.course.build.ch11_pool import run_engine
    from llmlab.kvcache import BlockPool

    return run_engine(BlockPool)


# ---- the block pool's hint: the shrunk case, step by step, and the first difference -------------


def _ids(ids: list) -> str:
    return "[" + ", ".join(str(i) for i in ids) + "]"


def _blocks_of(contents: str) -> str:
    return " ".join(contents)


def _which(ids: list) -> str:
    """ "block 2" or "blocks 1 and 2"."""
    ids = [str(i) for i in ids]
    if len(ids) == 1:
        return M("pool_hint.which_one", id=ids[0])
    return M("pool_hint.which_many", ids=", ".join(ids[:-1]), last=ids[-1])


def _given(result: Any) -> str:
    """What an arrival got: its block table and how many blocks were hits."""
    if result == "no room":
        return M("pool_hint.given_no_room")
    ids, hits = result
    if hits:
        return M("pool_hint.given_blocks_hits", ids=_ids(ids), hits=hits)
    return M("pool_hint.given_blocks", ids=_ids(ids))


def _op_text(op: Any) -> str:
    """One op of a case, without what it did."""
    kind = op[0]
    if kind == "arrive":
        _, rid, contents, partial = op
        if partial:
            return M("pool_hint.op_arrive_partial", rid=rid, contents=_blocks_of(contents))
        return M("pool_hint.op_arrive", rid=rid, contents=_blocks_of(contents))
    if kind == "together":
        _, rid, rid2, contents = op
        return M("pool_hint.op_together", rid=rid, rid2=rid2, contents=_blocks_of(contents))
    if kind == "lookup":
        return M("pool_hint.op_lookup", contents=_blocks_of(op[1]))
    return M("pool_hint.op_finish", rid=op[1])


def _did(op: Any, result: Any) -> str | None:
    """What the package's pool did on `op` (its `result`), or None when there is nothing to say."""
    kind = op[0]
    if kind == "arrive" and (isinstance(result, list) or result == "no room"):
        return _given(result)
    if kind == "together" and isinstance(result, list):
        (given, given2), rid, rid2 = [_given(g) for g in result], op[1], op[2]
        return M("pool_hint.did_together", rid=rid, given=given, rid2=rid2, given2=given2)
    if kind == "lookup" and isinstance(result, list):
        return M("pool_hint.did_lookup", ids=_ids(result))
    return None


def describe_op(op: Any, result: Any = None) -> str:
    """One op, with what the package's pool did (`result`) when given."""
    text, did = _op_text(op), _did(op, result)
    if did is None:
        return text
    if op[0] == "together":
        return M("pool_hint.op_then_together", op=text, did=did)
    return M("pool_hint.op_then", op=text, did=did)


def _result_text(result: Any) -> str:
    if result is None:
        return M("pool_hint.result_nothing")
    if result == "no room":
        return M("pool_hint.result_no_room")
    if isinstance(result, list) and len(result) == 2 and isinstance(result[1], int):
        ids, hits = result
        return M("pool_hint.result_got", ids=_ids(ids), hits=hits)
    if isinstance(result, list) and all(isinstance(r, int) for r in result):
        return M("pool_hint.result_lookup", ids=_ids(result))
    return M("pool_hint.result_other", result=result)


def _difference(got: list, expected: list) -> str:
    """How the student's pool's observation after one op differs from the package's."""
    if got and got[0] == "raised":
        return M("pool_hint.raised", error=got[1], message=got[2])
    result, queue, refs, cached = got
    e_result, e_queue, e_refs, e_cached = expected
    parts: list[str] = []
    if result != e_result:
        yours, package = _result_text(result), _result_text(e_result)
        parts.append(M("pool_hint.went_differently", yours=yours, package=package))
    extra = [b for b in queue if b not in e_queue]
    missing = [b for b in e_queue if b not in queue]
    held = [b for b in extra if b < len(e_refs) and e_refs[b] > 0]
    if held:
        which = _which(held)
        one = len(held) == 1
        parts.append(
            M("pool_hint.held_one", which=which) if one else M("pool_hint.held_many", which=which)
        )
    if missing:
        which = _which(missing)
        one = len(missing) == 1
        parts.append(
            M("pool_hint.missing_one", which=which)
            if one
            else M("pool_hint.missing_many", which=which)
        )
    if not held and not missing and not extra and queue != e_queue:
        parts.append(M("pool_hint.queue_order", queue=_ids(queue), package=_ids(e_queue)))
    if refs != e_refs and not held and not missing:
        parts.append(M("pool_hint.refs", refs=_ids(refs), package=_ids(e_refs)))
    if cached != e_cached:
        parts.append(_cache_difference(cached, e_cached))
    return clauses(parts)


def _cache_difference(cached: list, e_cached: list) -> str:
    mine = {b: label for b, label in cached}
    theirs = {b: label for b, label in e_cached}
    stale = sorted(set(mine) - set(theirs))
    lost = sorted(set(theirs) - set(mine))
    if stale and not lost:
        which = _which(stale)
        if len(stale) == 1:
            return M("pool_hint.stale_one", which=which)
        return M("pool_hint.stale_many", which=which)
    if lost and not stale:
        which = _which(lost)
        text = (
            M("pool_hint.lost_one", which=which)
            if len(lost) == 1
            else M("pool_hint.lost_many", which=which)
        )
        twins = sorted(b for b in mine if mine[b] in {theirs[x] for x in lost})
        if twins:
            which = _which(twins)
            text += (
                M("pool_hint.twins_one", which=which)
                if len(twins) == 1
                else M("pool_hint.twins_many", which=which)
            )
        return text
    return M("pool_hint.cache_pairs", yours=_pairs(cached), package=_pairs(e_cached))


def _pairs(cached: list) -> str:
    return "[" + ", ".join(f"{b}:{label}" for b, label in cached) + "]" if cached else "[]"


def explain_pool(case: Any, got: Any, expected: list) -> str:
    """The shrunk case step by step (with what the package's pool did) up to the first op where
    the student's pool differs, and how it differs."""
    from llmlab.course.build.ch11_pool import BLOCK_SIZE

    num_blocks, ops = case
    if not isinstance(got, list):  # the whole run raised (`Raised` from find_counterexample)
        got = [["raised", getattr(got, "error", "Exception"), getattr(got, "message", str(got))]]
    k = next(
        (i for i, (g, e) in enumerate(zip(got, expected)) if g != e),
        min(len(got), len(expected)) - 1,
    )
    steps = "".join(
        M("pool_hint.step", i=i, op=describe_op(op, e[0]))
        for i, (op, e) in enumerate(zip(ops[:k], expected), start=1)
    )
    here, did = _op_text(ops[k]), _did(ops[k], expected[k][0])
    if did is not None:  # what the package's pool did on this op, beside the op
        here = M("pool_hint.package_did", op=here, did=did)
    return M(
        "pool_hint.on_a_pool",
        num_blocks=num_blocks,
        block_size=BLOCK_SIZE,
        steps=steps,
        n=k + 1,
        here=here,
        difference=_difference(got[k], expected[k]),
    )


def block_pool(answer: Any) -> CheckResult:
    """Your block pool class (a subclass of `llmlab.course.build.ch11_pool.BlockPoolBase` with
    get_new_blocks, touch, free_blocks, cache_full_blocks and find_cached_blocks). Checked on
    POOL_MAX_EXAMPLES drawn sequences of operations against the package's pool (the first
    difference shrunk to the smallest case), then plugged into the engine on SmolLM2, where its
    tokens must equal the package's; the measured hit rate and peak blocks are shown beside the
    package's."""
    ex = "ch11.block_pool"
    refused = refuse_build_answer(
        ex,
        answer,
        ("get_new_blocks", "touch", "free_blocks", "cache_full_blocks", "find_cached_blocks"),
        fits=lambda a: isinstance(a, type),
        hint=M("block_pool.pass_block_pool", answer_type=type(answer).__name__),
    )
    if refused is not None:
        return refused
    stand_in = getattr(answer, "grader_stand_in", False)
    from llmlab.course.build import ch11_pool as pool
    from llmlab.course.build import drive, find_counterexample

    if stand_in:  # the grader: the package's engine run first, before the sandbox's clock starts
        _package_pool_run()
    cex = find_counterexample(
        pool.pool_cases(),
        lambda case: drive(answer, POOL_DRIVER + "observe_pool", case),
        lambda case: pool.observe_pool(pool.REFERENCE_POOL, case),
        max_examples=POOL_MAX_EXAMPLES,
    )
    then = M("block_pool.rules_get_new")
    if cex is not None:
        first = M("block_pool.differs", explained=explain_pool(cex.case, cex.got, cex.expected))
        return not_yet(ex, staged(ex, first, then))
    try:
        got = drive(answer, POOL_DRIVER + "run_engine")
    except Exception as e:  # the student's pool inside the engine
        return not_yet(ex, M("block_pool.pool_agrees_package_2", e_type=type(e).__name__, e=e))
    ref = _package_pool_run()
    wrong = [rid for rid in ref["tokens"] if got["tokens"].get(rid) != ref["tokens"][rid]]
    if wrong:
        rid = wrong[0]
        return not_yet(
            ex,
            M(
                "block_pool.pool_agrees_package",
                rid=rid,
                get=got['tokens'].get(rid),
                tokens=ref['tokens'][rid],
            ),
        )
    # No speed: the pool's work is a sliver of an engine step on SmolLM2, so one run's tokens/s
    # measures the model and the machine's load (identical code read 1.64x, 0.94x, 0.62x)
    n = len(ref["tokens"])
    return passed(
        ex,
        M(
            "block_pool.right_pool_matches",
            pool_max_examples=POOL_MAX_EXAMPLES,
            n=n,
            got=got,
            ref=ref,
        ),
    )
