"""Self-checks of chapter 11 (vLLM arrives): a token's slot through a block table, what a
prefix-cache hit can reuse, which cached block the free queue evicts first, how many steps a
chunked prefill takes beside running decodes, what the block-allocation explorer shows, why our
engine-vs-Hugging-Face ratio is far from the seed's 24x, and the seed's self-check question 5
(which operating-system idea each vLLM design borrows). Also the request trace of the chapter's
memory-waste figure, shared with its test.

Every expected value is computed by running the package (a real `KVCacheManager`, a real
`Scheduler`), never written down by hand."""
from __future__ import annotations

from typing import Any

from llmlab.check.core import (CheckResult, ExerciseInfo, check_choice, check_dict_keys,
                               check_matching, check_number, not_yet, passed, record_expected,
                               report, staged)
from llmlab.utils import cdiv

# ---- the memory-waste trace of the chapter (llmlab.sim.make_trace arguments) -----------------
WASTE_TRACE = dict(num_requests=120, arrival_rate=1.0, mean_output=200, output_spread=0.9,
                   prompt_len=(20, 400), seed=11, max_tokens=400)
WASTE_MAX_MODEL_LEN = 2048       # what a max-length contiguous allocator reserves per request
WASTE_BLOCK_SIZE = 16
WASTE_MAX_BATCH = 32

# ---- exercise 1: a token's slot -----------------------------------------------------------
SLOT_BLOCK_TABLE = (7, 2, 9, 4)
SLOT_BLOCK_SIZE = 16
SLOT_POSITION = 37

# ---- exercise 2: a prefix-cache hit -------------------------------------------------------
HIT_BLOCK_SIZE = 16
HIT_SYSTEM_LEN = 40          # tokens of the system prompt both requests share
HIT_OWN_LEN = 25             # tokens of the second request's own question after it

# ---- exercise 3: the most a block table wastes --------------------------------------------
WASTE_Q_BLOCK_SIZE = 16


def slot_for_position(answer: Any) -> CheckResult:
    """A request's block table is SLOT_BLOCK_TABLE with SLOT_BLOCK_SIZE tokens per block. Into
    which flat KV-cache slot (slot = block_id × block_size + offset) does the token at position
    SLOT_POSITION (0-based) go?"""
    table, bs, pos = SLOT_BLOCK_TABLE, SLOT_BLOCK_SIZE, SLOT_POSITION
    expected = table[pos // bs] * bs + pos % bs
    mistakes = [
        (pos, "that is the token's logical position; the block table maps its logical block to a "
              "physical one elsewhere in the pool."),
        (table[pos // bs] + pos % bs, "the block id counts blocks, not slots: multiply it by the "
                                      "block size before adding the offset."),
        (table[pos // bs] * bs + pos, "the offset inside a block is the position modulo the block size."),
    ]
    if pos // bs + 1 < len(table):
        mistakes.append((table[pos // bs + 1] * bs + pos % bs,
                         "logical block indices start at 0: which block does position // block_size give?"))
    if pos // bs >= 1:
        mistakes.append((table[pos // bs - 1] * bs + pos % bs,
                         "position // block_size is the logical block; recount it."))
    return check_number("ch11.slot_for_position", answer, expected, rel=1e-9, mistakes=mistakes,
                        default_hint="logical block = position // block_size, offset = position % "
                                     "block_size; look the logical block up in the table.")


def _hit_expected() -> int:
    """Run the case on a real KVCacheManager: the first request computes, the second asks."""
    from llmlab.request import Request
    from llmlab.kvcache import KVCacheManager
    from llmlab.sampling import SamplingParams

    mgr = KVCacheManager(num_blocks=32, block_size=HIT_BLOCK_SIZE, enable_caching=True)
    system = list(range(1000, 1000 + HIT_SYSTEM_LEN))
    first = Request("first", system + [1, 2, 3], SamplingParams(), arrival_time=0.0)
    mgr.allocate_slots(first, first.num_tokens)
    first.num_computed_tokens = first.num_tokens
    second = Request("second", system + list(range(2000, 2000 + HIT_OWN_LEN)), SamplingParams(),
                     arrival_time=0.0)
    _, num_cached = mgr.get_computed_blocks(second)
    return num_cached


def cached_tokens(answer: Any) -> CheckResult:
    """Two requests share a HIT_SYSTEM_LEN-token system prompt; then the first has 3 tokens of
    its own, the second HIT_OWN_LEN. The first has been prefilled (block size HIT_BLOCK_SIZE,
    prefix caching on). How many of the second request's tokens come from the prefix cache
    (its `num_cached_tokens`)?"""
    expected = _hit_expected()
    bs = HIT_BLOCK_SIZE
    return check_number("ch11.cached_tokens", answer, expected, rel=1e-9, mistakes=[
        (HIT_SYSTEM_LEN, "only whole blocks are cached and looked up: a block that mixes shared "
                         "and own tokens has a different hash for each request."),
        (cdiv(HIT_SYSTEM_LEN, bs) * bs, "round down, not up: the partly shared block differs."),
        (HIT_SYSTEM_LEN + HIT_OWN_LEN, "only the shared prefix can match a cached block."),
        (HIT_SYSTEM_LEN // bs, "count tokens, not blocks."),
    ], default_hint="how many whole blocks of the second prompt are identical to the first's?")


def max_wasted_slots(answer: Any) -> CheckResult:
    """With WASTE_Q_BLOCK_SIZE tokens per block, at most how many slots of one request's block
    table can hold no token?"""
    bs = WASTE_Q_BLOCK_SIZE
    return check_number("ch11.max_wasted_slots", answer, bs - 1, rel=1e-9, mistakes=[
        (bs, "a block is taken only when a token needs it, so the last block holds at least one."),
        (0.0, "the last block is usually only partly filled."),
        (bs / 2, "that is the average over random lengths; the question asks for the most."),
    ], default_hint="only the last block of a table can be partly empty.")


# ---- the seed's question 5 ------------------------------------------------------------------
Q5_DESIGNS = ("block_table", "prefix_sharing", "block_eviction", "request_scheduling", "preemption")
# more concepts than designs, in no particular order: some are there to be ruled out
Q5_CONCEPTS = ("swapping", "segmentation", "shared_pages", "process_scheduling", "copy_on_write",
               "paging", "fifo_replacement", "lru_replacement", "demand_paging")
# the defensible mappings (several for some designs); docs/instructors.md lists them
Q5_ACCEPTED = {
    "block_table": frozenset({"paging", "demand_paging"}),
    "prefix_sharing": frozenset({"shared_pages"}),
    "block_eviction": frozenset({"lru_replacement"}),
    "request_scheduling": frozenset({"process_scheduling"}),
    "preemption": frozenset({"swapping"}),
}
_Q5_WHY_WRONG = {
    "copy_on_write": "copy-on-write copies a shared page when someone writes to it; in vLLM V1 a "
                     "shared block is full, found by its hash and never written, so nothing is "
                     "ever copied (older vLLM copied blocks for parallel sampling and beam search).",
    "segmentation": "a segment is one variable-size contiguous region: that is the contiguous "
                    "per-request reservation PagedAttention replaced.",
    "fifo_replacement": "FIFO evicts what was loaded first; vLLM evicts the free cached block that "
                        "was freed longest ago, i.e. used least recently.",
}
_Q5_HINTS = {
    "block_table": "a per-request map from logical blocks to physical blocks anywhere in memory: "
                   "which OS structure maps a process's addresses that way?",
    "prefix_sharing": "several requests' tables point at one read-only physical block, counted "
                      "by a reference count: which OS mechanism lets processes map the same "
                      "pages (a shared library, the page cache)?",
    "block_eviction": "a free block that still holds a cached prefix is reused when memory runs "
                      "out, the one unused for longest first: which replacement policy is that?",
    "request_scheduling": "every step the engine picks which ready requests run next on the "
                          "accelerator: which OS job picks the next process for a core?",
    "preemption": "a request loses its memory to others and resumes later: which OS mechanism "
                  "moves a process's pages out to make room?",
}


def seed_q5(answer: Any) -> CheckResult:
    """The seed's question 5. Answer a dict mapping each of Q5_DESIGNS (a vLLM design) to the
    operating-system concept it borrows, one of Q5_CONCEPTS (more concepts than designs; some
    designs have more than one defensible answer, `Q5_ACCEPTED`)."""
    return check_matching("ch11.seed_q5", answer, Q5_ACCEPTED, choices=Q5_CONCEPTS,
                          hints=_Q5_HINTS, why_wrong=_Q5_WHY_WRONG,
                          success="right: much of vLLM is an operating system's memory manager "
                                  "and scheduler applied to KV blocks and requests.")


# ---- eviction: which cached block does the free queue hand out first? ---------------------
EVICT_BLOCK_SIZE = 4
EVICT_NUM_BLOCKS = 20
EVICT_PREFIX = tuple(range(100, 108))        # 8 tokens both requests share
EVICT_A_OWN = tuple(range(200, 206))         # A's own 6 tokens after the prefix
EVICT_B_OWN = tuple(range(300, 305))         # B's own 5 tokens after the prefix


def _evict_run() -> tuple[list[tuple[int, bool]], set[int], set[int]]:
    """Run the eviction case on a real manager: A is prefilled, then B (hitting A's prefix);
    A finishes, then B. Returns the free queue head to tail as (block id, holds a cached
    prefix), the ids of the blocks A or B ever held, and the ids of the shared prefix blocks."""
    from llmlab.kvcache import KVCacheManager
    from llmlab.request import Request
    from llmlab.sampling import SamplingParams

    mgr = KVCacheManager(EVICT_NUM_BLOCKS, EVICT_BLOCK_SIZE, enable_caching=True)
    reqs = [Request(rid, list(EVICT_PREFIX + own), SamplingParams(), arrival_time=0.0)
            for rid, own in (("A", EVICT_A_OWN), ("B", EVICT_B_OWN))]
    used: set[int] = set()
    for req in reqs:
        hits, num_cached = mgr.get_computed_blocks(req)
        mgr.allocate_slots(req, req.num_tokens - num_cached, hits)
        req.num_computed_tokens = req.num_tokens
        used.update(mgr.get_block_ids(req.request_id))
    prefix_ids = set(mgr.get_block_ids("A")[:len(EVICT_PREFIX) // EVICT_BLOCK_SIZE])
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
    from llmlab.check.core import as_number

    first, safe = as_number(answer["first"]), as_number(answer["safe"])
    if first is None or safe is None:
        return report(not_yet(ex, "both values must be numbers (a block id and a count)."))
    if first == expected["first"] and safe == expected["safe"]:
        return report(passed(ex, "right: the never-used blocks go first, then each finished "
                                 "table from its tail, so a shared prefix is evicted last."))
    queue, used, _ = _evict_run()
    never_used = {bid for bid, _ in queue} - used
    cached = dict(queue)
    problems = []
    if first != expected["first"]:
        if first == min(used):
            problems.append("first: that block was allocated first, but the queue orders blocks "
                            "by when they were freed, not when they were allocated.")
        elif first in never_used:
            problems.append("first: that block is handed out early, but it was never used, so it "
                            "holds no cached prefix: nothing is evicted when it goes.")
        elif first in used and not cached.get(int(first), True):
            problems.append("first: that block was only partly filled; only full blocks get a "
                            "hash, so it holds no cached prefix.")
        else:
            problems.append("first: not the first cached block the queue reaches.")
    if safe != expected["safe"]:
        if safe == len(never_used):
            problems.append("safe: you counted the never-used blocks only; A's and B's own "
                            "blocks were freed before the prefix blocks and go before them too.")
        elif safe in (EVICT_NUM_BLOCKS, EVICT_NUM_BLOCKS - 1):
            problems.append("safe: the prefix's blocks are not the last ones in the queue: "
                            "which of them was freed first?")
        else:
            problems.append("safe: recount the queue up to the first prefix block in it.")
    then = ("free() releases a table last block first; a block joins the queue's tail only "
            "when its reference count reaches 0; the pool hands out from the head; only full "
            "blocks carry a hash.")
    return report(not_yet(ex, staged(ex, " ".join(problems), then)))


# ---- chunked prefill: steps for a long prompt beside running decodes -------------------------
CHUNK_PROMPT_LEN = 1020
CHUNK_BUDGET = 256           # max_num_batched_tokens
CHUNK_DECODES = 3            # requests already decoding when the long prompt arrives


def chunked_prefill_steps(answer: Any) -> CheckResult:
    """CHUNK_DECODES requests are decoding when a CHUNK_PROMPT_LEN-token prompt arrives;
    max_num_batched_tokens is CHUNK_BUDGET, chunked prefill on, plenty of KV blocks. In how
    many steps is the prompt prefilled (its first token sampled)?"""
    from llmlab.widgets.blocks import chunked_prefill_schedule

    expected = len(chunked_prefill_schedule(CHUNK_PROMPT_LEN, CHUNK_BUDGET, CHUNK_DECODES))
    per_step = CHUNK_BUDGET - CHUNK_DECODES
    naive = -(-CHUNK_PROMPT_LEN // CHUNK_BUDGET)
    return check_number("ch11.chunked_prefill_steps", answer, expected, rel=1e-9, mistakes=[
        (naive, "you gave the prompt the whole budget; the running decodes are scheduled first "
                "and take their tokens out of every step's budget."),
        (CHUNK_PROMPT_LEN // per_step, "a partial last chunk is still a step: round up."),
        (1, "with chunked prefill a prompt longer than the budget is split over steps."),
    ], default_hint="count the prompt tokens each step leaves room for, then the steps.",
        formula="running requests are served first (one token per decode), the waiting prompt "
                "gets what is left of max_num_batched_tokens; steps = ceil(prompt / that).")


# ---- the block-allocation explorer's task ------------------------------------------------
EXPLORER_STAGE = 4           # 1-based stage label in manager_walkthrough(): "A finishes"


def _explorer_expected() -> int:
    from llmlab.widgets.blocks import manager_walkthrough

    snap = manager_walkthrough(block_size=4, num_blocks=24, prefix_len=8)[EXPLORER_STAGE - 1]
    return sum(1 for b in snap.blocks if b.ref_cnt == 0 and b.cached)


def explorer_cached_free(answer: Any) -> CheckResult:
    """In the block-allocation explorer (manager_walkthrough(block_size=4, num_blocks=24,
    prefix_len=8)), at stage EXPLORER_STAGE: how many blocks are free and still findable in the
    prefix cache?"""
    expected = _explorer_expected()
    return check_number("ch11.explorer_cached_free", answer, expected, rel=1e-9, mistakes=[
        (0, "a finished request's full blocks keep their hash when they go back to the free "
            "queue: look for grey, dotted blocks."),
        (expected + 2, "A's prefix blocks are still held by B (reference count 1): they are not free."),
        (expected + 1, "A's last block was only partly filled: it carries no hash."),
    ], default_hint="move the slider to that stage and count the grey, dotted blocks.")


# ---- why our ratio is not the seed's 24x ---------------------------------------------------
RATIO_OPTIONS = {
    "a": "llmlab's scheduler and block manager take most of each step's time on a CPU.",
    "b": "On this CPU a step's time grows with the batch far sooner than on a GPU (a much lower "
         "ridge point, and matrix code that reaches little of its peak on thin matrices), so a "
         "batch of B requests costs clearly more than one: throughput grows far less than B-fold.",
    "c": "The CPU has less memory bandwidth than a GPU, so decode is more memory-bound here and "
         "batching helps less.",
    "d": "Prefix caching was off in our benchmark.",
    "e": "The 24x also counts memory: paging wastes almost no KV memory, so on a GPU vLLM fits "
         "several times more sequences into a batch than a system that reserves contiguous space "
         "per request; our run gives every system the same batch limit.",
}
RATIO_CORRECT = frozenset({"b", "e"})
_RATIO_HINTS = {
    "a": "the benchmark prints the scheduler's cost per step per request: microseconds, "
         "against a forward pass of tens of milliseconds.",
    "c": "more memory-bound would mean batching helps *more*: a memory-bound step serves a "
         "bigger batch in about the same time.",
    "d": "the benchmark's settings say prefix caching is on; and the prompts share little.",
}


def ratio_reason(answer: Any) -> CheckResult:
    """Why is our measured llmlab / Hugging Face throughput ratio far below the seed's 24x?
    Answer the letters of every reason that holds (RATIO_OPTIONS), e.g. {"x", "y"}."""
    ex = "ch11.ratio_reason"
    if isinstance(answer, (list, tuple, set, frozenset)) and len(answer) == 1 \
            and {str(a).strip().lower() for a in answer} <= RATIO_CORRECT:
        return report(not_yet(ex, "that reason holds, but it is not the only one."))
    if isinstance(answer, str) and answer.strip().lower() in RATIO_CORRECT:
        return report(not_yet(ex, "that reason holds, but it is not the only one: answer a set "
                                  "of letters."))
    return check_choice(ex, answer, set(RATIO_CORRECT), options=sorted(RATIO_OPTIONS),
                        hints=_RATIO_HINTS)


EXERCISES: dict[str, ExerciseInfo] = {
    "slot_for_position": ExerciseInfo(
        "plug-in", mistakes=("logical position as the slot", "block id not scaled by the block size",
                             "position instead of offset", "off-by-one logical block")),
    "cached_tokens": ExerciseInfo(
        "plug-in", mistakes=("partial block counted as a hit", "rounded up", "blocks instead of tokens")),
    "first_evicted": ExerciseInfo(
        "reasoning", mistakes=("oldest allocation evicted first", "never-used block taken for a cached one",
                               "partial block taken for a cached one", "only the never-used blocks counted",
                               "the prefix taken as the queue's last block")),
    "chunked_prefill_steps": ExerciseInfo(
        "reasoning", mistakes=("decodes' tokens not taken from the budget", "rounded down",
                               "whole prompt in one step")),
    "explorer_cached_free": ExerciseInfo(
        "plug-in", mistakes=("freed blocks thought uncached", "blocks still held counted as free",
                             "partial block counted as cached")),
    "ratio_reason": ExerciseInfo(
        "reasoning", mistakes=("scheduler overhead blamed", "memory-bound thought to hurt batching",
                               "prefix caching thought off", "only one of two reasons")),
    "seed_q5": ExerciseInfo(
        "reasoning", mistakes=("copy-on-write for prefix sharing", "segmentation for block tables",
                               "FIFO for LRU eviction"), seed=5),
}
