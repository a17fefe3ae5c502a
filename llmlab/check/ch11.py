"""Self-checks of chapter 11 (vLLM arrives): a token's slot through a block table, what a
prefix-cache hit can reuse, the most a block table can waste, and the seed's self-check
question 5 (which operating-system idea each vLLM design borrows). Also the request trace of
the chapter's memory-waste figure, shared with its test."""
from __future__ import annotations

from typing import Any

from llmlab.check.core import CheckResult, check_matching, check_number
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
