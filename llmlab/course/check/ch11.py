"""Self-checks of chapter 11 (vLLM arrives): a token's slot through a block table, what a
prefix-cache hit can reuse, which cached block the free queue evicts first, how many steps a chunked
prefill takes beside running decodes, what the block-allocation explorer shows, why our
engine-vs-Hugging-Face ratio is far from the source chapter's 24x, and the source chapter's
self-check question 5 (which operating-system idea each vLLM design borrows). Also the request trace
of the chapter's memory-waste figure, shared with its test.

Every expected value is computed by running the package (a real `KVCacheManager`, a real
`Scheduler`), never written down by hand."""

from __future__ import annotations

import functools
from typing import Any

from llmlab.course.check.catalog import catalog
from llmlab.course.check.core import (
    NOT_ANSWERED,
    CheckResult,
    ExerciseInfo,
    check_choice,
    check_dict_keys,
    check_matching,
    check_number,
    clauses,
    earlier_names,
    not_yet,
    passed,
    record_expected,
    refuse_package_piece,
    report,
    staged,
)
from llmlab.i18n import Bilingual
from llmlab.utils import cdiv

M = catalog("ch11")

# ---- the memory-waste trace of the chapter (llmlab.analysis.sim.make_trace arguments) -----------------
WASTE_TRACE = dict(
    num_requests=120,
    arrival_rate=1.0,
    mean_output=200,
    output_spread=0.9,
    prompt_len=(20, 400),
    seed=11,
    max_tokens=400,
)
WASTE_MAX_MODEL_LEN = 2048  # what a max-length contiguous allocator reserves per request
WASTE_BLOCK_SIZE = 16
WASTE_MAX_BATCH = 32

# ---- exercise 1: a token's slot -----------------------------------------------------------
SLOT_BLOCK_TABLE = (7, 2, 9, 4)
SLOT_BLOCK_SIZE = 16
SLOT_POSITION = 37

# ---- exercise 2: a prefix-cache hit -------------------------------------------------------
HIT_BLOCK_SIZE = 16
HIT_SYSTEM_LEN = 40  # tokens of the system prompt both requests share
HIT_OWN_LEN = 25  # tokens of the second request's own question after it

# ---- exercise 3: the most a block table wastes --------------------------------------------
WASTE_Q_BLOCK_SIZE = 16


def slot_for_position(answer: Any) -> CheckResult:
    """A request's block table is SLOT_BLOCK_TABLE with SLOT_BLOCK_SIZE tokens per block. Into
    which flat KV-cache slot (slot = block_id × block_size + offset) does the token at position
    SLOT_POSITION (0-based) go?"""
    table, bs, pos = SLOT_BLOCK_TABLE, SLOT_BLOCK_SIZE, SLOT_POSITION
    expected = table[pos // bs] * bs + pos % bs
    mistakes = [
        (pos, M("slot_for_position.token_s_logical")),
        (table[pos // bs] + pos % bs, M("slot_for_position.block_id_counts")),
        (table[pos // bs] * bs + pos, M("slot_for_position.offset_inside_block")),
    ]
    if pos // bs + 1 < len(table):
        mistakes.append(
            (table[pos // bs + 1] * bs + pos % bs, M("slot_for_position.logical_block_indices"))
        )
    if pos // bs >= 1:
        mistakes.append(
            (table[pos // bs - 1] * bs + pos % bs, M("slot_for_position.position_block_size"))
        )
    return check_number(
        "ch11.slot_for_position",
        answer,
        expected,
        rel=1e-9,
        mistakes=mistakes,
        default_hint=M("slot_for_position.default_hint"),
    )


def _hit_expected() -> int:
    """Run the case on a real KVCacheManager: the first request computes, the second asks."""
    from llmlab.core.request import Request
    from llmlab.kvcache import KVCacheManager
    from llmlab.sampling import SamplingParams

    mgr = KVCacheManager(num_blocks=32, block_size=HIT_BLOCK_SIZE, enable_caching=True)
    system = list(range(1000, 1000 + HIT_SYSTEM_LEN))
    first = Request("first", system + [1, 2, 3], SamplingParams(), arrival_time=0.0)
    mgr.allocate_slots(first, first.num_tokens)
    first.num_computed_tokens = first.num_tokens
    second = Request(
        "second", system + list(range(2000, 2000 + HIT_OWN_LEN)), SamplingParams(), arrival_time=0.0
    )
    _, num_cached = mgr.get_computed_blocks(second)
    return num_cached


def cached_tokens(answer: Any) -> CheckResult:
    """Two requests share a HIT_SYSTEM_LEN-token system prompt; then the first has 3 tokens of
    its own, the second HIT_OWN_LEN. The first has been prefilled (block size HIT_BLOCK_SIZE,
    prefix caching on). How many of the second request's tokens come from the prefix cache
    (its `num_cached_tokens`)?"""
    expected = _hit_expected()
    bs = HIT_BLOCK_SIZE
    return check_number(
        "ch11.cached_tokens",
        answer,
        expected,
        rel=1e-9,
        mistakes=[
            (HIT_SYSTEM_LEN, M("cached_tokens.only_whole_blocks")),
            (cdiv(HIT_SYSTEM_LEN, bs) * bs, M("cached_tokens.round_down_up")),
            (HIT_SYSTEM_LEN + HIT_OWN_LEN, M("cached_tokens.only_shared_prefix")),
            (HIT_SYSTEM_LEN // bs, M("cached_tokens.count_tokens_blocks")),
        ],
        default_hint=M("cached_tokens.default_hint"),
    )


def max_wasted_slots(answer: Any) -> CheckResult:
    """With WASTE_Q_BLOCK_SIZE tokens per block, at most how many slots of one request's block
    table can hold no token?"""
    bs = WASTE_Q_BLOCK_SIZE
    return check_number(
        "ch11.max_wasted_slots",
        answer,
        bs - 1,
        rel=1e-9,
        mistakes=[
            (bs, M("max_wasted_slots.block_taken_only")),
            (0.0, M("max_wasted_slots.last_block_usually")),
            (bs / 2, M("max_wasted_slots.average_over_random")),
        ],
        default_hint=M("max_wasted_slots.default_hint"),
    )


# ---- the source chapter's question 5 -------------------------------------------------------------
Q5_DESIGNS = M.choices(
    "q5_design",
    ("block_table", "prefix_sharing", "block_eviction", "request_scheduling", "preemption"),
)
# more concepts than designs, in no particular order: some are there to be ruled out
Q5_CONCEPTS = M.choices(
    "q5_concept",
    (
        "swapping",
        "segmentation",
        "shared_pages",
        "process_scheduling",
        "copy_on_write",
        "paging",
        "fifo_replacement",
        "lru_replacement",
        "demand_paging",
    ),
)
# the defensible mappings (several for some designs); docs/instructors.md lists them
Q5_ACCEPTED = {
    "block_table": frozenset({"paging", "demand_paging"}),
    "prefix_sharing": frozenset({"shared_pages"}),
    "block_eviction": frozenset({"lru_replacement"}),
    "request_scheduling": frozenset({"process_scheduling"}),
    # vLLM V1 frees a preempted request's blocks and recomputes its KV when it runs again
    # (preemptive scheduling; the cache re-made on demand); older vLLM could also swap it out
    "preemption": frozenset({"swapping", "process_scheduling", "demand_paging"}),
}
_Q5_WHY_WRONG = {  # (English, Chinese)
    "copy_on_write": M.key("q5_why_wrong.copy_on_write"),
    "segmentation": M.key("q5_why_wrong.segmentation"),
    "fifo_replacement": M.key("q5_why_wrong.fifo_replacement"),
}
_Q5_HINTS = {
    "block_table": M.key("q5_hints.block_table"),
    "prefix_sharing": M.key("q5_hints.prefix_sharing"),
    "block_eviction": M.key("q5_hints.block_eviction"),
    "request_scheduling": M.key("q5_hints.request_scheduling"),
    "preemption": M.key("q5_hints.preemption"),
}


def source_q5(answer: Any) -> CheckResult:
    """The source chapter's question 5. Answer a dict mapping each of Q5_DESIGNS (a vLLM design)
    to the operating-system concept it borrows, one of Q5_CONCEPTS (more concepts than designs;
    some designs have more than one defensible answer, `Q5_ACCEPTED`)."""
    return check_matching(
        "ch11.source_q5",
        answer,
        Q5_ACCEPTED,
        choices=Q5_CONCEPTS,
        hints={key: M(pair) for key, pair in _Q5_HINTS.items()},
        why_wrong={key: M(pair) for key, pair in _Q5_WHY_WRONG.items()},
        success=M("source_q5.success"),
    )


# ---- eviction: which cached block does the free queue hand out first? ---------------------
EVICT_BLOCK_SIZE = 4
EVICT_NUM_BLOCKS = 20
EVICT_PREFIX = tuple(range(100, 108))  # 8 tokens both requests share
EVICT_A_OWN = tuple(range(200, 206))  # A's own 6 tokens after the prefix
EVICT_B_OWN = tuple(range(300, 305))  # B's own 5 tokens after the prefix


def _evict_run() -> tuple[list[tuple[int, bool]], set[int], set[int]]:
    """Run the eviction case on a real manager: A is prefilled, then B (hitting A's prefix);
    A finishes, then B. Returns the free queue head to tail as (block id, holds a cached
    prefix), the ids of the blocks A or B ever held, and the ids of the shared prefix blocks."""
    from llmlab.core.request import Request
    from llmlab.kvcache import KVCacheManager
    from llmlab.sampling import SamplingParams

    mgr = KVCacheManager(EVICT_NUM_BLOCKS, EVICT_BLOCK_SIZE, enable_caching=True)
    reqs = [
        Request(rid, list(EVICT_PREFIX + own), SamplingParams(), arrival_time=0.0)
        for rid, own in (("A", EVICT_A_OWN), ("B", EVICT_B_OWN))
    ]
    used: set[int] = set()
    for req in reqs:
        hits, num_cached = mgr.get_computed_blocks(req)
        mgr.allocate_slots(req, req.num_tokens - num_cached, hits)
        req.num_computed_tokens = req.num_tokens
        used.update(mgr.get_block_ids(req.request_id))
    prefix_ids = set(mgr.get_block_ids("A")[: len(EVICT_PREFIX) // EVICT_BLOCK_SIZE])
    for req in reqs:
        mgr.free(req)
    queue = [(b.block_id, b.is_cached) for b in mgr.block_pool.free_block_queue]
    return queue, used, prefix_ids


def _evict_expected() -> dict[str, int]:
    queue, _, prefix_ids = _evict_run()
    first = next(bid for bid, cached in queue if cached)
    safe = next(i for i, (bid, _) in enumerate(queue) if bid in prefix_ids)
    return {"first": first, "safe": safe}


def first_evicted(answer: Any) -> CheckResult:
    """A fresh pool of EVICT_NUM_BLOCKS blocks of EVICT_BLOCK_SIZE tokens, prefix caching on.
    A (EVICT_PREFIX + EVICT_A_OWN) is prefilled, then B (EVICT_PREFIX + EVICT_B_OWN); then A
    finishes, then B. Answer a dict: "first": the id of the first block holding a cached
    prefix that the pool hands out again (evicts); "safe": how many blocks new, unrelated
    requests can take before any block of the shared prefix is evicted."""
    ex = "ch11.first_evicted"
    expected = _evict_expected()
    for value in expected.values():
        record_expected(ex, value)
    missing = check_dict_keys(ex, answer, ("first", "safe"))
    if missing is not None:
        return missing
    from llmlab.course.check.core import as_number

    first, safe = as_number(answer["first"]), as_number(answer["safe"])
    if first is None or safe is None:
        return report(not_yet(ex, M("first_evicted.both_values_must")))
    if first == expected["first"] and safe == expected["safe"]:
        return report(passed(ex, M("first_evicted.right_never_used")))
    queue, used, _ = _evict_run()
    never_used = {bid for bid, _ in queue} - used
    cached = dict(queue)
    problems = []
    if first != expected["first"]:
        if first == min(used):
            problems.append(M("first_evicted.first_block_allocated"))
        elif first in never_used:
            problems.append(M("first_evicted.first_block_handed"))
        elif first in used and not cached.get(int(first), True):
            problems.append(M("first_evicted.first_block_only"))
        else:
            problems.append(M("first_evicted.first_first_cached"))
    if safe != expected["safe"]:
        if safe == len(never_used):
            problems.append(M("first_evicted.safe_counted_never"))
        elif safe in (EVICT_NUM_BLOCKS, EVICT_NUM_BLOCKS - 1):
            problems.append(M("first_evicted.safe_prefix_s"))
        else:
            problems.append(M("first_evicted.safe_recount_queue"))
    then = M("first_evicted.free_releases_table")
    return report(not_yet(ex, staged(ex, " ".join(problems), then)))


# ---- chunked prefill: steps for a long prompt beside running decodes -------------------------
CHUNK_PROMPT_LEN = 1020
CHUNK_BUDGET = 256  # max_num_batched_tokens
CHUNK_DECODES = 3  # requests already decoding when the long prompt arrives


def chunked_prefill_steps(answer: Any) -> CheckResult:
    """CHUNK_DECODES requests are decoding when a CHUNK_PROMPT_LEN-token prompt arrives;
    max_num_batched_tokens is CHUNK_BUDGET, chunked prefill on, plenty of KV blocks. In how
    many steps is the prompt prefilled (its first token sampled)?"""
    from llmlab.analysis.blocks import chunked_prefill_schedule

    expected = len(chunked_prefill_schedule(CHUNK_PROMPT_LEN, CHUNK_BUDGET, CHUNK_DECODES))
    per_step = CHUNK_BUDGET - CHUNK_DECODES
    naive = -(-CHUNK_PROMPT_LEN // CHUNK_BUDGET)
    return check_number(
        "ch11.chunked_prefill_steps",
        answer,
        expected,
        rel=1e-9,
        mistakes=[
            (naive, M("chunked_prefill_steps.gave_prompt_whole")),
            (CHUNK_PROMPT_LEN // per_step, M("chunked_prefill_steps.partial_last_chunk")),
            (1, M("chunked_prefill_steps.chunked_prefill_prompt")),
        ],
        default_hint=M("chunked_prefill_steps.default_hint"),
        formula=M("chunked_prefill_steps.formula"),
    )


# ---- the block-allocation explorer's task ------------------------------------------------
EXPLORER_STAGE = 4  # 1-based stage label in manager_walkthrough(): "A finishes"


def _explorer_expected() -> int:
    from llmlab.analysis.blocks import manager_walkthrough

    snap = manager_walkthrough(block_size=4, num_blocks=24, prefix_len=8)[EXPLORER_STAGE - 1]
    return sum(1 for b in snap.blocks if b.ref_cnt == 0 and b.cached)


def explorer_cached_free(answer: Any) -> CheckResult:
    """In the block-allocation explorer (manager_walkthrough(block_size=4, num_blocks=24,
    prefix_len=8)), at stage EXPLORER_STAGE: how many blocks are free and still findable in the
    prefix cache?"""
    expected = _explorer_expected()
    return check_number(
        "ch11.explorer_cached_free",
        answer,
        expected,
        rel=1e-9,
        mistakes=[
            (0, M("explorer_cached_free.finished_request_s")),
            (expected + 2, M("explorer_cached_free.s_prefix_blocks")),
            (expected + 1, M("explorer_cached_free.s_last_block")),
        ],
        default_hint=M("explorer_cached_free.default_hint"),
    )


# ---- why our ratio is not the source chapter's 24x -----------------------------------------------
RATIO_OPTIONS_EN = {
    "a": "With fewer requests, llmlab's scheduler and block manager take most of each step's time.",
    "b": "hf-sequential's tokens per second do not depend on how many requests wait, llmlab's do: "
    "with 12 requests at most 12 sequences share a step (fewer as they finish), so each read "
    "of the weights is spread over fewer tokens than with 64.",
    "c": "A CPU is memory-bound at small batches, so batching 12 requests helps less than "
    "batching 64.",
    "d": "Prefix caching finds fewer shared prefixes among 12 requests than among 64.",
    "e": "The fast workload's outputs are short (8 to 32 tokens, against 32 to 128), so the "
    "prompts' prefill, where one request alone already fills a matrix of many rows and "
    "batching gains little, is a larger share of the work.",
}
# the options in Chinese, for the notebook to print with tr(text, RATIO_OPTIONS_ZH[letter])
RATIO_OPTIONS_ZH = {
    "a": "请求少的时候，llmlab 调度器和块管理器占去了每一步大部分时间。",
    "b": "hf-sequential 每秒 token 数与排队请求数无关，llmlab 却有关。12 个请求时，一步里最多只有 "
    "12 条序列（完成一条少一条），所以每读一遍权重分摊到的 token 比 64 个请求时少。",
    "c": "CPU 在小 batch 时属于 memory-bound，所以 12 个请求组成 batch，收益不如 64 个。",
    "d": "12 个请求之间能找到的共享前缀比 64 个请求之间少，前缀缓存命中得少。",
    "e": "快速负载输出很短（8 到 32 个 token，完整负载是 32 到 128），所以 prompt 的 prefill 占了更多工作。"
    "而 prefill 时单个请求本身就已是很多行的矩阵，batching 收益很小。",
}
# shown in the language in use; the keys are what the student answers with
RATIO_OPTIONS = Bilingual(RATIO_OPTIONS_EN, RATIO_OPTIONS_ZH)
RATIO_CORRECT = frozenset({"b", "e"})
_RATIO_HINTS = {  # (English, Chinese)
    "a": M.key("ratio_hints.a"),
    "c": M.key("ratio_hints.c"),
    "d": M.key("ratio_hints.d"),
}


def ratio_reason(answer: Any) -> CheckResult:
    """Why does the chapter's 12-request run measure a far smaller llmlab / hf-sequential
    throughput ratio than the full 64-request benchmark on the same CPU? Answer the letters of
    every reason that holds (RATIO_OPTIONS), e.g. {"x", "y"}."""
    ex = "ch11.ratio_reason"
    if (
        isinstance(answer, (list, tuple, set, frozenset))
        and len(answer) == 1
        and {str(a).strip().lower() for a in answer} <= RATIO_CORRECT
    ):
        return report(not_yet(ex, M("ratio_reason.reason_holds_only")))
    if isinstance(answer, str) and answer.strip().lower() in RATIO_CORRECT:
        return report(not_yet(ex, M("ratio_reason.reason_holds_only_2")))
    return check_choice(
        ex,
        answer,
        set(RATIO_CORRECT),
        options=sorted(RATIO_OPTIONS),
        hints={key: M(pair) for key, pair in _RATIO_HINTS.items()},
    )


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
    if answer is None:
        return report(not_yet(ex, NOT_ANSWERED))
    refused = refuse_package_piece(
        ex,
        answer,
        ('get_new_blocks', 'touch', 'free_blocks', 'cache_full_blocks', 'find_cached_blocks'),
    )
    if refused is not None:
        return refused
    stand_in = getattr(answer, "grader_stand_in", False)
    if not stand_in and not isinstance(answer, type):
        return report(
            not_yet(ex, M("block_pool.pass_block_pool", answer_type=type(answer).__name__))
        )
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
        return report(not_yet(ex, staged(ex, first, then)))
    try:
        got = drive(answer, POOL_DRIVER + "run_engine")
    except Exception as e:  # the student's pool inside the engine
        return report(
            not_yet(ex, M("block_pool.pool_agrees_package_2", e_type=type(e).__name__, e=e))
        )
    ref = _package_pool_run()
    wrong = [rid for rid in ref["tokens"] if got["tokens"].get(rid) != ref["tokens"][rid]]
    if wrong:
        rid = wrong[0]
        return report(
            not_yet(
                ex,
                M(
                    "block_pool.pool_agrees_package",
                    rid=rid,
                    get=got['tokens'].get(rid),
                    tokens=ref['tokens'][rid],
                ),
            )
        )
    # No speed: the pool's work is a sliver of an engine step on SmolLM2, so one run's tokens/s
    # measures the model and the machine's load (identical code read 1.64x, 0.94x, 0.62x)
    n = len(ref["tokens"])
    return report(
        passed(
            ex,
            M(
                "block_pool.right_pool_matches",
                pool_max_examples=POOL_MAX_EXAMPLES,
                n=n,
                hit_rate=got['hit_rate'],
                ref_hit_rate=ref['hit_rate'],
                peak_blocks=got['peak_blocks'],
                num_blocks=got['num_blocks'],
                ref_peak_blocks=ref['peak_blocks'],
            ),
        )
    )


EXERCISES: dict[str, ExerciseInfo] = {
    "slot_for_position": ExerciseInfo(
        "plug-in",
        mistakes=(
            "logical position as the slot",
            "block id not scaled by the block size",
            "position instead of offset",
            "off-by-one logical block",
        ),
    ),
    "cached_tokens": ExerciseInfo(
        "plug-in",
        mistakes=("partial block counted as a hit", "rounded up", "blocks instead of tokens"),
    ),
    "first_evicted": ExerciseInfo(
        "reasoning",
        mistakes=(
            "oldest allocation evicted first",
            "never-used block taken for a cached one",
            "partial block taken for a cached one",
            "only the never-used blocks counted",
            "the prefix taken as the queue's last block",
        ),
    ),
    "chunked_prefill_steps": ExerciseInfo(
        "reasoning",
        mistakes=(
            "decodes' tokens not taken from the budget",
            "rounded down",
            "whole prompt in one step",
        ),
    ),
    "explorer_cached_free": ExerciseInfo(
        "plug-in",
        mistakes=(
            "freed blocks thought uncached",
            "blocks still held counted as free",
            "partial block counted as cached",
        ),
    ),
    "ratio_reason": ExerciseInfo(
        "reasoning",
        mistakes=(
            "scheduler overhead blamed",
            "memory-bound thought to hurt batching",
            "prefix caching blamed",
            "only one of two reasons",
        ),
    ),
    "block_pool": ExerciseInfo(
        "reasoning",
        mistakes=(
            "freed block put at the head of the free queue",
            "reference count not dropped on free",
            "cached block handed out with its hash kept",
            "a same-prefix block replaces the other in the cache",
            "a hit on a free block left in the free queue",
            "reference counts off",
        ),
    ),
    "source_q5": ExerciseInfo(
        "reasoning",
        mistakes=(
            "copy-on-write for prefix sharing",
            "segmentation for block tables",
            "FIFO for LRU eviction",
        ),
        source_question=5,
    ),
}


# ---- build exercise: chunked prefill (the student's plan_step) ----------------------------------
BUILDS["ch11.build_chunked_prefill"] = "plan_step"
CHUNK_DRIVERS = "llmlab.course.build.ch11_chunk"
CHUNK_MAX_EXAMPLES = 50
# plugged in: three short requests decode when a prompt of CHUNK_ENGINE_LONG tokens arrives
CHUNK_ENGINE_LONG = 70
CHUNK_ENGINE_WORKLOAD = {
    "first": [list(range(20 + 9 * i, 26 + 9 * i)) for i in range(CHUNK_DECODES)],
    "later": [list(range(100, 100 + CHUNK_ENGINE_LONG))],
    "max_tokens": 6,
    "engine": {
        "block_size": 16,
        "num_kv_blocks": 64,
        "max_model_len": 128,
        "max_num_seqs": 4,
        "max_num_batched_tokens": 16,
    },
}


def plan_cases():
    """Step states: some requests decoding (1 token left each), perhaps one part-way through its
    prompt (the last running one), waiting prompts, and the step's budget."""
    from hypothesis import strategies as st

    @st.composite
    def cases(draw):
        decodes = draw(st.integers(0, 4))
        partial = draw(st.one_of(st.none(), st.integers(2, 40)))
        lefts = [1] * decodes + ([] if partial is None else [partial])
        waiting = draw(st.lists(st.integers(1, 40), max_size=3))
        names = [chr(65 + i) for i in range(len(lefts) + len(waiting))]
        return {
            "running": [[names[i], n] for i, n in enumerate(lefts)],
            "waiting": [[names[len(lefts) + i], n] for i, n in enumerate(waiting)],
            "budget": draw(st.integers(1, 48)),
        }

    return cases()


def _fmt_plan(plan: Any) -> str:
    if plan and plan[0] == "raised":
        return M("fmt_plan.raised_plan_plan", plan_1=plan[1], plan_2=plan[2])
    return "[" + ", ".join(f"{rid}:{n}" for rid, n in plan) + "]"


def _plan_rule(case: dict, got: list, expected: list) -> str:
    """Which rule of chunked prefill the student's plan broke on `case`."""
    budget = case["budget"]
    running = {rid for rid, _ in case["running"]}
    if not got or got[0] == "raised":
        return ""
    counts = [n for _, n in got]
    ids = [rid for rid, _ in got]
    if any(n > budget for n in counts):
        return M("plan_rule.prompt_longer_what")
    if sum(counts) > budget:
        return M("plan_rule.over_budget_tokens")
    if any(n <= 0 for n in counts):
        return M("plan_rule.chunk_tokens_makes")
    first_waiting = next((i for i, rid in enumerate(ids) if rid not in running), len(ids))
    skipped = [rid for rid, _ in expected if rid in running and rid not in ids]
    if any(rid in running for rid in ids[first_waiting:]) or (first_waiting < len(ids) and skipped):
        return M("plan_rule.decodes_first_every")
    return M("plan_rule.order_each_request")


def _describe_plan_case(case: dict) -> str:
    running = ", ".join(f"{rid}:{n}" for rid, n in case["running"]) or "-"
    waiting = ", ".join(f"{rid}:{n}" for rid, n in case["waiting"]) or "-"
    return M(
        "describe_plan_case.running_running_tokens",
        running=running,
        waiting=waiting,
        budget=case['budget'],
    )


def build_chunked_prefill(answer: Any) -> CheckResult:
    """Chapter 11's build exercise: `answer` is the student's `plan_step(running, waiting,
    budget)` (see `llmlab.course.build.ch11_chunk`). Checked (1) against the package's
    `Scheduler` on step states drawn by hypothesis (the smallest disagreeing one in the hint),
    (2) on the chapter's prediction (CHUNK_PROMPT_LEN tokens beside CHUNK_DECODES decodes under
    CHUNK_BUDGET), (3) plugged into the engine: the same tokens and steps as the package's
    `enable_chunked_prefill=True`."""
    from llmlab.analysis.blocks import chunked_prefill_schedule
    from llmlab.course.build import drive, find_counterexample
    from llmlab.course.build.ch11_chunk import package_plan, run_engine
    from llmlab.course.check.core import NOT_ANSWERED

    ex = "ch11.build_chunked_prefill"
    if answer is None:
        return report(not_yet(ex, NOT_ANSWERED))
    refused = refuse_package_piece(ex, answer)
    if refused is not None:
        return refused
    if not callable(answer):
        return report(
            not_yet(
                ex,
                M(
                    "build_chunked_prefill.expected_function_plan",
                    answer_type=type(answer).__name__,
                ),
            )
        )
    cex = find_counterexample(
        plan_cases(),
        lambda case: drive(answer, f"{CHUNK_DRIVERS}:observe_plans", [case])[0],
        package_plan,
        max_examples=CHUNK_MAX_EXAMPLES,
    )
    if cex is not None:
        got = cex.got
        if not isinstance(got, list):  # the sandbox itself failed (a Raised)
            got = ["raised", getattr(got, "error", "Error"), getattr(got, "message", str(got))]
        return report(
            not_yet(
                ex,
                M(
                    "build_chunked_prefill.describe_plan_case",
                    describe_plan_case=_describe_plan_case(cex.case),
                    got=_fmt_plan(got),
                    expected=_fmt_plan(cex.expected),
                    plan_rule=_plan_rule(cex.case, got, cex.expected),
                ),
            )
        )
    expected_steps = len(chunked_prefill_schedule(CHUNK_PROMPT_LEN, CHUNK_BUDGET, CHUNK_DECODES))
    try:
        mine = drive(
            answer,
            f"{CHUNK_DRIVERS}:prefill_steps",
            CHUNK_PROMPT_LEN,
            CHUNK_BUDGET,
            CHUNK_DECODES,
        )
        engine = drive(answer, f"{CHUNK_DRIVERS}:run_engine", CHUNK_ENGINE_WORKLOAD)
    except Exception as e:  # the student's function inside the scheduler
        return report(
            not_yet(
                ex, M("build_chunked_prefill.inside_scheduler_plan", e_type=type(e).__name__, e=e)
            )
        )
    ref = run_engine(None, CHUNK_ENGINE_WORKLOAD)
    if mine["steps"] != expected_steps:
        return report(
            not_yet(
                ex,
                M(
                    "build_chunked_prefill.plan_prefills_chunk_2",
                    chunk_prompt_len=CHUNK_PROMPT_LEN,
                    chunk_decodes=CHUNK_DECODES,
                    steps=mine['steps'],
                    chunk_budget=CHUNK_BUDGET,
                ),
            )
        )
    if engine["tokens"] != ref["tokens"] or engine["steps"] != ref["steps"]:
        if engine["tokens"] == ref["tokens"]:
            key = M.key("build_chunked_prefill.engine_tokens_equal")
        else:
            key = M.key("build_chunked_prefill.engine_tokens_differ")
        return report(not_yet(ex, M(key, steps=engine["steps"], package_steps=ref["steps"])))
    chunks = ", ".join(map(str, mine["prefill"]))
    return report(
        passed(
            ex,
            M(
                "build_chunked_prefill.plan_prefills_chunk",
                chunk_prompt_len=CHUNK_PROMPT_LEN,
                chunk_decodes=CHUNK_DECODES,
                steps=mine['steps'],
                chunk_budget=CHUNK_BUDGET,
                chunks=chunks,
                expected_steps=expected_steps,
                engine_steps=engine['steps'],
                ref_steps=ref['steps'],
            ),
        )
    )


EXERCISES["build_chunked_prefill"] = ExerciseInfo(
    "reasoning",
    mistakes=(
        "prompt scheduled whole beyond the budget",
        "chunk not counting the decodes already in the step",
        "chunk of 0 tokens",
        "prefill chunk before the decodes",
        "a request given other than min(tokens left, budget left)",
    ),
)


# notebooks handed out before the source chapter's questions were renamed call seed_q5
__getattr__ = earlier_names(globals(), {"seed_q5": "source_q5"})
