"""Chapter 11's questions: a token's slot, a prefix-cache hit, the waste of a block table, the
source chapter's question 5, eviction order, chunked-prefill steps, the block-allocation
explorer, and why our ratio to Hugging Face is not 24x; also the memory-waste figure's trace, and
the chapter's exercises, read from its catalog."""

from __future__ import annotations

from typing import Any

from llmlab.course.check.catalog import catalog
from llmlab.course.check.core import (
    CheckResult,
    check_choice,
    check_dict_keys,
    not_yet,
    passed,
    record_expected,
    staged,
)
from llmlab.course.check.question import Expected, matching, numeric
from llmlab.utils import cdiv

M = catalog("ch11")
EXERCISES = M.exercises()  # kind, source question, mistakes: the catalog's "exercises"


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

# ---- a token's slot ----------------------------------------------------------------------
SLOT_BLOCK_TABLE = (7, 2, 9, 4)
SLOT_BLOCK_SIZE = 16
SLOT_POSITION = 37

# ---- a prefix-cache hit ------------------------------------------------------------------
HIT_BLOCK_SIZE = 16
HIT_SYSTEM_LEN = 40  # tokens of the system prompt both requests share
HIT_OWN_LEN = 25  # tokens of the second request's own question after it


@numeric(rel=1e-9)
def slot_for_position() -> Expected:
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
    return Expected(expected, mistakes)


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


@numeric(rel=1e-9)
def cached_tokens() -> Expected:
    """Two requests share a HIT_SYSTEM_LEN-token system prompt; then the first has 3 tokens of
    its own, the second HIT_OWN_LEN. The first has been prefilled (block size HIT_BLOCK_SIZE,
    prefix caching on). How many of the second request's tokens come from the prefix cache
    (its `num_cached_tokens`)?"""
    expected = _hit_expected()
    bs = HIT_BLOCK_SIZE
    return Expected(
        expected,
        mistakes=[
            (HIT_SYSTEM_LEN, M("cached_tokens.only_whole_blocks")),
            (cdiv(HIT_SYSTEM_LEN, bs) * bs, M("cached_tokens.round_down_up")),
            (HIT_SYSTEM_LEN + HIT_OWN_LEN, M("cached_tokens.only_shared_prefix")),
            (HIT_SYSTEM_LEN // bs, M("cached_tokens.count_tokens_blocks")),
        ],
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
_Q5_WHY_WRONG = M.texts("q5_why_wrong", ("copy_on_write", "segmentation", "fifo_replacement"))
_Q5_HINTS = M.texts(
    "q5_hints",
    ("block_table", "prefix_sharing", "block_eviction", "request_scheduling", "preemption"),
)


@matching(Q5_CONCEPTS, _Q5_HINTS, _Q5_WHY_WRONG)
def source_q5() -> dict:
    """The source chapter's question 5. Answer a dict mapping each of Q5_DESIGNS (a vLLM design)
    to the operating-system concept it borrows, one of Q5_CONCEPTS (more concepts than designs;
    some designs have more than one defensible answer, `Q5_ACCEPTED`)."""
    return Q5_ACCEPTED


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
        return not_yet(ex, M("first_evicted.both_values_must"))
    if first == expected["first"] and safe == expected["safe"]:
        return passed(ex, M("first_evicted.right_never_used"))
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
    return not_yet(ex, staged(ex, " ".join(problems), then))


# ---- chunked prefill: steps for a long prompt beside running decodes -------------------------
CHUNK_PROMPT_LEN = 1020
CHUNK_BUDGET = 256  # max_num_batched_tokens
CHUNK_DECODES = 3  # requests already decoding when the long prompt arrives


@numeric(rel=1e-9)
def chunked_prefill_steps() -> Expected:
    """CHUNK_DECODES requests are decoding when a CHUNK_PROMPT_LEN-token prompt arrives;
    max_num_batched_tokens is CHUNK_BUDGET, chunked prefill on, plenty of KV blocks. In how
    many steps is the prompt prefilled (its first token sampled)?"""
    from llmlab.analysis.blocks import chunked_prefill_schedule

    expected = len(chunked_prefill_schedule(CHUNK_PROMPT_LEN, CHUNK_BUDGET, CHUNK_DECODES))
    per_step = CHUNK_BUDGET - CHUNK_DECODES
    naive = -(-CHUNK_PROMPT_LEN // CHUNK_BUDGET)
    return Expected(
        expected,
        mistakes=[
            (naive, M("chunked_prefill_steps.gave_prompt_whole")),
            (CHUNK_PROMPT_LEN // per_step, M("chunked_prefill_steps.partial_last_chunk")),
            (1, M("chunked_prefill_steps.chunked_prefill_prompt")),
        ],
    )


# ---- the block-allocation explorer's task ------------------------------------------------
EXPLORER_STAGE = 4  # 1-based stage label in manager_walkthrough(): "A finishes"


def _explorer_expected() -> int:
    from llmlab.analysis.blocks import manager_walkthrough

    snap = manager_walkthrough(block_size=4, num_blocks=24, prefix_len=8)[EXPLORER_STAGE - 1]
    return sum(1 for b in snap.blocks if b.ref_cnt == 0 and b.cached)


@numeric(rel=1e-9)
def explorer_cached_free() -> Expected:
    """In the block-allocation explorer (manager_walkthrough(block_size=4, num_blocks=24,
    prefix_len=8)), at stage EXPLORER_STAGE: how many blocks are free and still findable in the
    prefix cache?"""
    expected = _explorer_expected()
    return Expected(
        expected,
        mistakes=[
            (0, M("explorer_cached_free.finished_request_s")),
            (expected + 2, M("explorer_cached_free.s_prefix_blocks")),
            (expected + 1, M("explorer_cached_free.s_last_block")),
        ],
    )


# ---- why our ratio is not the source chapter's 24x -----------------------------------------------
# the options, shown in the language in use; the letters are what the student answers with
RATIO_OPTIONS = M.texts("ratio_options", ("a", "b", "c", "d", "e"))
RATIO_CORRECT = frozenset({"b", "e"})
_RATIO_HINTS = M.texts("ratio_hints", ("a", "c", "d"))


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
        return not_yet(ex, M("ratio_reason.reason_holds_only"))
    if isinstance(answer, str) and answer.strip().lower() in RATIO_CORRECT:
        return not_yet(ex, M("ratio_reason.reason_holds_only_2"))
    return check_choice(
        ex,
        answer,
        set(RATIO_CORRECT),
        options=sorted(RATIO_OPTIONS),
        hints=_RATIO_HINTS,
    )
