"""Chapter 11's build exercise: the block pool, written by the student and run by the engine.

The student completes a subclass of `BlockPoolBase` (the blocks, the free queue and the prefix-cache
map are given; the five methods that carry the idea are theirs): `get_new_blocks` (hand out free
blocks from the head of the free queue, evicting the hash of a cached one), `touch` (a prefix-cache
hit takes a reference, pulling a free block out of the queue), `free_blocks` (drop references; a
block nobody holds joins the tail), `cache_full_blocks` (chained hashes: each block's hash covers its
parent's hash and its own tokens; every block holding a prefix stays findable, duplicates included)
and `find_cached_blocks` (the cached blocks under a hash with these tokens).

Two drivers run the student's class (through `llmlab.course.build.drive`):

- `observe_pool(pool_cls, case)`: a sequence of operations on a pool of a few blocks (requests
  arrive, hitting the cache where they can; their blocks are cached; they finish; lookups), and
  after each one what a pool shows: the free queue head to tail, every block's reference count,
  which blocks the prefix cache holds under which hash. The checker compares it with the
  package's `BlockPool` on the same case (`REFERENCE_POOL`).
- `run_engine(pool_cls, workload)`: the real SmolLM2 through `LLMEngine(..., block_pool_cls=...)`
  on a workload with a shared prefix, two identical prompts arriving in one step and enough
  requests to evict cached blocks: the tokens, the prefix-cache hit rate and the blocks held at
  peak.

The lookup rule. The package's `BlockPool.find_cached_blocks` accepts a candidate only if its
tokens match *and* it was chained from one of the confirmed matches for the previous block that
has not been handed out again since: with that check even a hash function that always collides
costs speed, never correctness. vLLM's `BlockPool.get_cached_block` trusts the hash (SHA-256 by
default), and so does the exercise: a hit is a block under the chained hash whose tokens match.
With Python's hash the two agree except where the package turns down a hit it cannot verify (a
block whose parent was evicted while a duplicate of the parent survived): the content of such a
hit is right, so the engine's tokens agree either way. The reference of the properties is
therefore the package's pool with the exercise's lookup (`REFERENCE_POOL`); the engine's
reference is the package's pool as it is.
"""

from __future__ import annotations

import functools
from typing import Any

from llmlab.kvcache.block_pool import BlockPool

# ---- what the student starts from ------------------------------------------------------------


class BlockPoolBase:
    """A block pool's data, ready for the five methods that use it (the exercise writes them).

    self.blocks: `num_blocks` `KVCacheBlock`s (block_id, ref_cnt, block_hash, token_ids).
    self.free_block_queue: the blocks nobody holds, a `FreeKVCacheBlockQueue` (popleft() from the
    head, append(block) at the tail, remove(block) from anywhere, len()), all blocks at first.
    self.cached_block_hash_to_block: the prefix cache, hash -> {block_id: block} (several blocks
    may hold the same prefix). hash_block_tokens(parent_hash, token_ids): the chained hash.
    """

    # The data, the counts, the chained hash and the reset are the package's pool's own: one
    # definition, so the exercise's pool and the engine's cannot drift apart where the student
    # writes nothing. The five methods that use them are the exercise.
    __init__ = BlockPool.__init__
    num_free_blocks = BlockPool.num_free_blocks
    get_num_free_blocks = BlockPool.get_num_free_blocks
    usage = BlockPool.usage
    hash_block_tokens = BlockPool.hash_block_tokens
    get_cached_block = BlockPool.get_cached_block
    reset_prefix_cache = BlockPool.reset_prefix_cache


class _ExerciseLookup(BlockPool):
    """The package's pool with the exercise's lookup: a hit is a cached block under the hash
    whose tokens match (the parent-chain check left out; see the module's docstring)."""

    def find_cached_blocks(self, block_hash, token_ids, parents=None):
        same = self.cached_block_hash_to_block.get(block_hash, {})
        return [b for b in same.values() if b.token_ids == token_ids]


REFERENCE_POOL = _ExerciseLookup

# ---- the property cases --------------------------------------------------------------------------

BLOCK_SIZE = 2  # tokens per block in the cases
CONTENTS = "pqr"  # a prompt is a few full blocks, each one of these contents
REQUEST_IDS = "ABC"
MIN_BLOCKS, MAX_BLOCKS = 3, 6
MAX_OPS = 9


def block_tokens(content: str) -> tuple[int, ...]:
    """The token ids of a full block of content "p", "q" or "r"."""
    base = 10 * (CONTENTS.index(content) + 1)
    return tuple(base + i for i in range(BLOCK_SIZE))


def pool_cases() -> Any:
    """The hypothesis strategy of cases: (num_blocks, ops). An op is

    ("arrive", rid, contents, partial): request rid arrives with full blocks of these contents
        (and one more token in a partly filled block when `partial`): it looks up its prefix,
        touches the hits and takes new blocks for the rest, if the pool has room; then its step
        computes them and its full blocks go into the prefix cache;
    ("together", rid, rid2, contents): two requests with the same prompt arrive in one step:
        both take their blocks before either is cached (both compute the prompt); then both
        are cached;
    ("free", rid): rid finishes: its blocks are freed, last block first;
    ("lookup", contents): which cached blocks a prompt of these contents would hit.

    An op on a request that is not there (or already there, for an arrival) does nothing.
    """
    from hypothesis import strategies as st

    rid = st.sampled_from(REQUEST_IDS)
    prompt = st.lists(st.sampled_from(CONTENTS), min_size=1, max_size=3).map("".join)
    op = st.one_of(
        st.tuples(st.just("arrive"), rid, prompt, st.booleans()),
        st.tuples(st.just("free"), rid),
        st.tuples(st.just("together"), rid, rid, prompt),
        st.tuples(st.just("lookup"), prompt),
    )
    return st.tuples(
        st.integers(MIN_BLOCKS, MAX_BLOCKS), st.lists(op, min_size=1, max_size=MAX_OPS)
    )


# ---- the property driver ------------------------------------------------------------------------


def _lookup(pool: Any, contents: str) -> tuple[list, list]:
    """(hit blocks, hashes computed) for a prompt of these full blocks, as the manager walks it:
    block by block until the first miss, preferring a block already in use among duplicates."""
    hashes: list = []
    hits: list = []
    parents = None
    for content in contents:
        token_ids = block_tokens(content)
        hashes.append(pool.hash_block_tokens(hashes[-1] if hashes else None, token_ids))
        matches = pool.find_cached_blocks(hashes[-1], token_ids, parents)
        if not isinstance(matches, list):
            raise TypeError(
                f"find_cached_blocks returned {type(matches).__name__}, expected a list of blocks"
            )
        if not matches:
            break
        hits.append(next((b for b in matches if b.ref_cnt > 0), matches[0]))
        parents = matches
    return hits, hashes


def _arrive(pool: Any, requests: dict, rid: str, contents: str, partial: bool) -> Any:
    hits, hashes = _lookup(pool, contents)
    num_new = len(contents) + int(partial) - len(hits)
    free_hits = sum(1 for b in hits if b.ref_cnt == 0)
    if num_new > pool.free_block_queue.num_free_blocks - free_hits:
        return "no room"
    pool.touch(hits)
    new = pool.get_new_blocks(num_new)
    if not isinstance(new, list) or len(new) != num_new:
        raise TypeError(
            f"get_new_blocks({num_new}) returned {new!r:.60}, expected a list of {num_new} blocks"
        )
    table = list(hits) + new
    requests[rid] = {"table": table, "hashes": hashes, "cached": len(hits), "contents": contents}
    return [[b.block_id for b in table], len(hits)]


def _cache(pool: Any, request: dict) -> None:
    contents, start = request["contents"], request["cached"]
    if start < len(contents):
        new_tokens = [block_tokens(c) for c in contents[start:]]
        pool.cache_full_blocks(
            request["table"], request["hashes"], start, len(contents), new_tokens
        )
        request["cached"] = len(contents)


def _apply(pool: Any, requests: dict, op: tuple) -> Any:
    """Run one op; its result (an arrival's [block ids, hits] or "no room", a lookup's hit ids,
    "done" for a finish, or None when the op has nothing to do)."""
    kind = op[0]
    if kind == "arrive":
        _, rid, contents, partial = op
        if rid in requests:
            return None
        table = _arrive(pool, requests, rid, contents, partial)
        if rid in requests:
            _cache(pool, requests[rid])
        return table
    if kind == "together":
        _, rid, rid2, contents = op
        if rid == rid2 or rid in requests or rid2 in requests:
            return None
        tables = [_arrive(pool, requests, r, contents, False) for r in (rid, rid2)]
        for r in (rid, rid2):
            if r in requests:
                _cache(pool, requests[r])
        return tables
    if kind == "lookup":
        return [b.block_id for b in _lookup(pool, op[1])[0]]
    request = requests.get(op[1])
    if request is None:
        return None
    pool.free_blocks(list(reversed(request["table"])))  # "free"
    del requests[op[1]]
    return "done"


def _state(pool: Any, labels: dict) -> tuple:
    """(free queue head to tail, reference counts by block id, the prefix cache as sorted
    (block id, hash label)). Hashes are shown as labels h1, h2, ... in the order they are first
    seen, so two pools whose hashes group the same blocks show the same labels."""
    queue = [b.block_id for b in pool.free_block_queue]
    refs = [b.ref_cnt for b in pool.blocks]
    cached = []
    for block_hash, same in pool.cached_block_hash_to_block.items():
        for block_id in same:
            cached.append((block_id, block_hash))
    cached.sort(key=lambda pair: pair[0])
    shown = []
    for block_id, block_hash in cached:
        label = labels.setdefault(block_hash, f"h{len(labels) + 1}")
        shown.append([block_id, label])
    return [queue, refs, shown]


def observe_pool(pool_cls: Any, case: Any) -> list:
    """Run `case` = (num_blocks, ops) on `pool_cls(num_blocks)`: per op, [result, free queue,
    reference counts, prefix cache] (see `_state`); an op that raises ends the list with
    ["raised", error name, message]."""
    num_blocks, ops = case
    pool = pool_cls(num_blocks)
    requests: dict = {}
    labels: dict = {}
    seen = []
    for op in ops:
        try:
            result = _apply(pool, requests, tuple(op))
            seen.append([result, *_state(pool, labels)])
        except Exception as e:  # the student's pool: what it did on this op is the observation
            seen.append(["raised", type(e).__name__, str(e)[:200]])
            break
    return seen


# ---- the plugged-in driver ------------------------------------------------------------------------

# A shared 8-token prefix (two blocks of 4); two identical prompts in one step (the second hits
# the prefix and computes its own copy of the last prompt block: a duplicate cached block); then
# unrelated prompts that take every block of the small pool, evicting the prefix; then the prefix
# again (computed afresh: a pool that kept an evicted block findable serves other K/V here).
PREFIX = list(range(1000, 1008))
WORKLOAD = {
    "engine": dict(
        block_size=4,
        num_kv_blocks=10,
        max_model_len=32,
        max_num_seqs=4,
        max_num_batched_tokens=64,
        enable_prefix_caching=True,
    ),
    "max_tokens": 4,
    "max_steps": 100,  # a pool whose blocks never come back stalls the engine: stop there
    # (step at which it arrives, request id, prompt token ids)
    "requests": [
        (0, "prefix-a", PREFIX + [11, 12, 13, 14]),
        (1, "same-step-1", PREFIX + [21, 22, 23, 24]),
        (1, "same-step-2", PREFIX + [21, 22, 23, 24]),
        (6, "other-1", list(range(2000, 2013))),
        (6, "other-2", list(range(3000, 3013))),
        (6, "other-3", list(range(4000, 4007))),
        (11, "prefix-b", PREFIX + [21, 22, 23, 24, 25]),
        (11, "prefix-c", PREFIX + [11, 12, 13]),
    ],
}


@functools.lru_cache(maxsize=1)
def _smollm2() -> Any:
    from llmlab.model import load_model

    return load_model("smollm2-135m")[0]


def run_engine(pool_cls: Any, workload: dict | None = None) -> dict:
    """The real SmolLM2 through the engine with `pool_cls` as its block pool, greedy, on
    `workload` (default WORKLOAD): {"tokens": {request id: output token ids}, "hit_rate",
    "peak_blocks" (held after a step, at most), "num_blocks", "steps"}."""
    from llmlab.engine.llm_engine import LLMEngine
    from llmlab.sampling import SamplingParams

    workload = workload or WORKLOAD
    engine = LLMEngine(_smollm2(), None, block_pool_cls=pool_cls, **workload["engine"])
    params = SamplingParams(temperature=0.0, max_tokens=workload["max_tokens"], ignore_eos=True)
    arrivals = sorted(workload["requests"], key=lambda r: r[0])
    kv = engine.kv_cache_manager
    tokens: dict[str, list[int]] = {rid: [] for _, rid, _ in arrivals}
    step, peak, i = 0, 0, 0
    while i < len(arrivals) or engine.has_unfinished_requests():
        if step == workload["max_steps"]:
            raise RuntimeError(
                f"the engine had not finished the workload after {step} steps (the package's "
                f"pool finishes it in a few dozen): do freed blocks come back to the free queue?"
            )
        while i < len(arrivals) and arrivals[i][0] <= step:
            _, rid, prompt = arrivals[i]
            engine.add_request(rid, list(prompt), params)
            i += 1
        for out in engine.step():
            tokens[out.request_id].extend(out.outputs[0].token_ids)
        peak = max(peak, kv.num_blocks - kv.num_free_blocks)
        step += 1
    stats = kv.prefix_cache_stats
    return {
        "tokens": tokens,
        "hit_rate": stats.hit_rate,
        "peak_blocks": peak,
        "num_blocks": kv.num_blocks,
        "steps": step,
    }
