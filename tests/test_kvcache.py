"""Tests of the paged KV cache bookkeeping: the free queue, the block pool and the manager.

Unit tests pin single behaviours; the hypothesis state machines at the end drive random
admit / step / decode / preempt / finish sequences over requests with shared prefixes and check
every invariant after every operation, also with hash functions forced to collide.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from llmlab.core.request import Request
from llmlab.kvcache.block_pool import BlockPool, FreeKVCacheBlockQueue, KVCacheBlock
from llmlab.kvcache.manager import KVCacheManager
from llmlab.sampling import SamplingParams


def make_request(request_id: str, token_ids: list[int]) -> Request:
    return Request(request_id, list(token_ids), SamplingParams(), arrival_time=0.0)


def queue_ids(queue: FreeKVCacheBlockQueue) -> list[int]:
    return [b.block_id for b in queue]


def snapshot(mgr: KVCacheManager) -> tuple:
    """Everything a failed allocation must leave untouched."""
    pool = mgr.block_pool
    return (
        [
            (
                b.ref_cnt,
                b.block_hash,
                b.token_ids,
                b.parent.block_id if b.parent else None,
                b.parent_generation,
                b.generation,
            )
            for b in pool.blocks
        ],
        queue_ids(pool.free_block_queue),
        {h: sorted(d) for h, d in pool.cached_block_hash_to_block.items()},
        {r: [b.block_id for b in t] for r, t in mgr.req_to_blocks.items()},
        dict(mgr.num_cached_block),
        {r: list(h) for r, h in mgr.req_to_block_hashes.items()},
    )


def admit(mgr: KVCacheManager, req: Request, num_new_tokens: int | None = None):
    """What the scheduler does for a waiting request; the step then computes the tokens."""
    computed, num_cached = mgr.get_computed_blocks(req)
    if num_new_tokens is None:
        num_new_tokens = req.num_tokens - num_cached
    new_blocks = mgr.allocate_slots(req, num_new_tokens, computed)
    if new_blocks is not None:
        req.num_computed_tokens = num_cached + num_new_tokens
    return computed, num_cached, new_blocks


def decode_one(mgr: KVCacheManager, req: Request, token: int):
    """Sample one token and reserve its slot, as one decode step does."""
    req.append_output_token(token)
    new_blocks = mgr.allocate_slots(req, 1)
    if new_blocks is not None:
        req.num_computed_tokens += 1
    return new_blocks


# ---- the free queue ------------------------------------------------------------------------


def test_free_queue_pops_least_recently_freed_first():
    blocks = [KVCacheBlock(i) for i in range(5)]
    queue = FreeKVCacheBlockQueue(blocks)
    taken = [queue.popleft() for _ in range(5)]
    assert [b.block_id for b in taken] == [0, 1, 2, 3, 4]
    for i in (3, 0, 4):
        queue.append(blocks[i])
    assert queue.popleft() is blocks[3]
    assert queue.popleft() is blocks[0]
    assert len(queue) == 1


def test_remove_from_middle():
    blocks = [KVCacheBlock(i) for i in range(5)]
    queue = FreeKVCacheBlockQueue(blocks)
    queue.remove(blocks[2])
    assert queue_ids(queue) == [0, 1, 3, 4]
    assert len(queue) == 4
    assert blocks[2] not in queue and blocks[1] in queue
    assert blocks[2].prev_free_block is None and blocks[2].next_free_block is None
    queue.remove(blocks[0])  # the head
    queue.remove(blocks[4])  # the tail
    assert queue_ids(queue) == [1, 3]
    queue.append(blocks[2])
    assert queue_ids(queue) == [1, 3, 2]


def test_free_queue_rejects_misuse():
    blocks = [KVCacheBlock(i) for i in range(2)]
    queue = FreeKVCacheBlockQueue(blocks)
    with pytest.raises(ValueError, match="already in the free queue"):
        queue.append(blocks[0])
    queue.popleft()
    with pytest.raises(ValueError, match="not in the free queue"):
        queue.remove(blocks[0])
    queue.popleft()
    with pytest.raises(ValueError, match="empty"):
        queue.popleft()
    with pytest.raises(ValueError, match="n must be in"):
        queue.popleft_n(1)


@settings(max_examples=300, deadline=None)
@given(num_blocks=st.integers(1, 8), data=st.data())
def test_free_queue_matches_a_plain_list(num_blocks, data):
    """Random pops, removes and appends agree with a Python list doing the same thing."""
    ops = data.draw(
        st.lists(
            st.tuples(st.sampled_from(["pop", "remove", "append"]), st.integers(0, num_blocks - 1)),
            max_size=60,
        )
    )
    blocks = [KVCacheBlock(i) for i in range(num_blocks)]
    queue = FreeKVCacheBlockQueue(blocks)
    model = list(range(num_blocks))
    for op, i in ops:
        if op == "pop":
            if model:
                assert queue.popleft().block_id == model.pop(0)
        elif op == "remove":
            if i in model:
                queue.remove(blocks[i])
                model.remove(i)
        elif i not in model:
            queue.append(blocks[i])
            model.append(i)
        assert queue_ids(queue) == model
        assert len(queue) == len(model)
        assert all((b in queue) == (b.block_id in model) for b in blocks)
        back, node = [], queue._tail.prev_free_block  # backward links agree too
        while node is not queue._head:
            back.append(node.block_id)
            node = node.prev_free_block
        assert back[::-1] == model


# ---- the block pool ------------------------------------------------------------------------


def test_get_new_blocks_evicts_cached_blocks_and_drops_their_hash():
    pool = BlockPool(2)
    a, b = pool.get_new_blocks(2)
    hashes: list[int] = []
    pool.cache_full_blocks([a, b], hashes, 0, 2, [(1, 2), (3, 4)])
    assert a.block_hash == hashes[0] and b.block_hash == hashes[1]
    assert hashes[1] == pool.hash_block_tokens(hashes[0], (3, 4))
    pool.free_blocks([b, a])
    assert pool.get_cached_block(hashes[0], (1, 2)) is a  # free but still cached
    (c,) = pool.get_new_blocks(1)
    assert c is b, "the block freed first is handed out first"
    assert b.block_hash is None and b.token_ids is None
    assert hashes[1] not in pool.cached_block_hash_to_block
    assert a.block_hash == hashes[0]


def test_touch_takes_a_free_cached_block_out_of_the_queue():
    pool = BlockPool(3)
    blocks = pool.get_new_blocks(3)
    pool.free_blocks(blocks)
    pool.touch([blocks[1]])
    assert blocks[1].ref_cnt == 1
    assert queue_ids(pool.free_block_queue) == [0, 2]
    pool.touch([blocks[1]])  # a second holder: no queue change
    assert blocks[1].ref_cnt == 2 and pool.num_free_blocks == 2


def test_free_blocks_queue_in_given_order_and_reject_double_free():
    pool = BlockPool(4)
    blocks = pool.get_new_blocks(4)
    pool.touch([blocks[0]])  # held twice: stays in use after one free
    pool.free_blocks([blocks[3], blocks[0], blocks[1]])
    assert queue_ids(pool.free_block_queue) == [3, 1]
    assert blocks[0].ref_cnt == 1
    with pytest.raises(ValueError, match="double free"):
        pool.free_blocks([blocks[3]])


def test_get_new_blocks_refuses_more_than_free():
    pool = BlockPool(2)
    with pytest.raises(ValueError, match="num_blocks must be in"):
        pool.get_new_blocks(3)
    assert pool.num_free_blocks == 2


def test_reused_parent_invalidates_cached_child():
    """A child block stays in the map after its parent is handed out again; it must not hit,
    even when the parent is re-cached for a prefix that makes the hashes match."""
    pool = BlockPool(2, hash_fn=lambda x: 0)  # every hash collides
    parent, child = pool.get_new_blocks(2)
    hashes: list[int] = []
    pool.cache_full_blocks([parent, child], hashes, 0, 2, [(1, 1), (2, 2)])
    pool.free_blocks([parent, child])  # parent is evicted first
    (reused,) = pool.get_new_blocks(1)
    assert reused is parent
    pool.cache_full_blocks([reused], [], 0, 1, [(9, 9)])
    level0 = pool.find_cached_blocks(0, (9, 9), None)
    assert level0 == [reused]
    assert pool.find_cached_blocks(0, (2, 2), level0) == [], (
        "child's K/V were computed after (1, 1), not (9, 9)"
    )


def test_reset_prefix_cache_refused_while_blocks_in_use():
    pool = BlockPool(2)
    blocks = pool.get_new_blocks(2)
    pool.cache_full_blocks(blocks, [], 0, 2, [(1,), (2,)])
    assert pool.reset_prefix_cache() is False
    assert len(pool.cached_block_hash_to_block) == 2
    pool.free_blocks(blocks)
    assert pool.reset_prefix_cache() is True
    assert pool.cached_block_hash_to_block == {}
    assert all(b.block_hash is None for b in pool.blocks)


@pytest.mark.parametrize(
    "kwargs, name",
    [
        (dict(num_blocks=0), "num_blocks"),
        (dict(num_blocks=2.0), "num_blocks"),
        (dict(num_blocks=4, block_size=0), "block_size"),
        (dict(num_blocks=4, block_size=True), "block_size"),
        (dict(num_blocks=4, enable_caching="yes"), "enable_caching"),
        (dict(num_blocks=4, hash_fn=3), "hash_fn"),
    ],
)
def test_constructor_rejects_bad_arguments(kwargs, name):
    with pytest.raises(ValueError, match=name):
        KVCacheManager(**kwargs)


# ---- the manager ---------------------------------------------------------------------------


def test_prefix_hit_is_block_aligned():
    mgr = KVCacheManager(num_blocks=10, block_size=4)
    a = make_request("a", list(range(10)))  # blocks [0-3] [4-7] [8, 9]
    admit(mgr, a)
    b = make_request("b", list(range(7)) + [99, 100, 101, 102])  # shares 7 tokens with a
    blocks, num_cached = mgr.get_computed_blocks(b)
    assert num_cached == 4, "only the first full block matches; 3 more shared tokens do not count"
    assert [blk.block_id for blk in blocks] == mgr.get_block_ids("a")[:1]


def test_hit_leaves_the_last_token_to_compute():
    mgr = KVCacheManager(num_blocks=10, block_size=4)
    a = make_request("a", list(range(8)))
    admit(mgr, a)
    same = make_request("same", list(range(8)))
    blocks, num_cached = mgr.get_computed_blocks(same)
    assert num_cached == 4, "two full blocks are cached but the 8th token must be computed"
    longer = make_request("longer", list(range(9)))
    assert mgr.get_computed_blocks(longer)[1] == 8


def test_get_computed_blocks_does_not_change_ref_counts():
    mgr = KVCacheManager(num_blocks=6, block_size=2)
    a = make_request("a", [1, 2, 3, 4, 5])
    admit(mgr, a)
    mgr.free(a)
    before = snapshot(mgr)
    blocks, num_cached = mgr.get_computed_blocks(make_request("b", [1, 2, 3, 4, 5]))
    assert num_cached == 4
    assert snapshot(mgr)[:5] == before[:5]  # only the memo of b's hashes may be new
    assert all(blk.ref_cnt == 0 for blk in blocks)


def test_allocate_with_hits_takes_references_and_leaves_the_free_queue():
    mgr = KVCacheManager(num_blocks=6, block_size=2)
    a = make_request("a", [1, 2, 3, 4, 5])
    admit(mgr, a)
    mgr.free(a)
    b = make_request("b", [1, 2, 3, 4, 6, 7])
    computed, num_cached, new_blocks = admit(mgr, b)
    assert num_cached == 4 and len(new_blocks) == 1
    assert mgr.get_block_ids("b")[:2] == [blk.block_id for blk in computed]
    assert all(blk.ref_cnt == 1 and blk not in mgr.block_pool.free_block_queue for blk in computed)
    assert mgr.num_free_blocks == 6 - 3
    assert b.num_computed_tokens == 6


def test_free_puts_tail_blocks_first_in_eviction_order():
    mgr = KVCacheManager(num_blocks=4, block_size=2)
    a = make_request("a", [1, 2, 3, 4, 5, 6, 7])
    admit(mgr, a)
    ids = mgr.get_block_ids("a")
    mgr.free(a)
    assert queue_ids(mgr.block_pool.free_block_queue) == ids[::-1]
    # evicting one block takes a's last block; a's first two blocks still hit
    b = make_request("b", [9])
    admit(mgr, b)
    assert mgr.get_block_ids("b") == [ids[-1]]
    again = make_request("again", [1, 2, 3, 4, 5, 6, 7])
    assert mgr.get_computed_blocks(again)[1] == 6


def test_failed_allocation_changes_nothing():
    mgr = KVCacheManager(num_blocks=4, block_size=2)
    a = make_request("a", [1, 2, 3, 4, 5])
    admit(mgr, a)  # 3 blocks
    mgr.free(a)  # all free, 2 full blocks cached
    admit(mgr, make_request("x", [7, 7]))  # takes the one never-used block
    b = make_request("b", [1, 2, 3, 4, 5, 6, 7])  # hits 2 cached blocks, needs 2 more
    computed, num_cached = mgr.get_computed_blocks(b)
    assert num_cached == 4
    before = snapshot(mgr)
    assert mgr.allocate_slots(b, b.num_tokens - num_cached, computed) is None
    assert snapshot(mgr) == before
    assert mgr.allocate_slots(make_request("c", list(range(9))), 9) is None
    assert snapshot(mgr) == before


def test_hit_blocks_in_the_free_queue_are_not_counted_twice():
    """3 blocks, all free; 2 of them are the hit. 2 new blocks do not fit even though 3 > 2."""
    mgr = KVCacheManager(num_blocks=3, block_size=2)
    a = make_request("a", [1, 2, 3, 4])
    admit(mgr, a)
    mgr.free(a)
    b = make_request("b", [1, 2, 3, 4, 5, 6, 7])
    computed, num_cached = mgr.get_computed_blocks(b)
    assert num_cached == 4 and mgr.num_free_blocks == 3
    assert mgr.allocate_slots(b, 3, computed) is None
    assert all(blk.ref_cnt == 0 for blk in computed)


def test_allocate_slots_rejects_hits_for_a_request_that_holds_blocks():
    mgr = KVCacheManager(num_blocks=8, block_size=2)
    admit(mgr, make_request("a", [1, 2, 3]))
    b = make_request("b", [1, 2, 3, 4])
    computed, _ = mgr.get_computed_blocks(b)
    b.num_computed_tokens = 2  # wrong order: set after allocate_slots
    with pytest.raises(ValueError, match="num_computed_tokens"):
        mgr.allocate_slots(b, 2, computed)
    with pytest.raises(ValueError, match="num_new_tokens"):
        mgr.allocate_slots(b, -1)


def test_hash_collision_never_gives_wrong_hit():
    """With every hash equal, lookups must still match whole prefixes exactly."""
    mgr = KVCacheManager(num_blocks=12, block_size=2, hash_fn=lambda x: 0)
    a = make_request("a", [1, 1, 5, 5, 0])  # blocks X=(1,1) T=(5,5)
    b = make_request("b", [2, 2, 5, 5, 0])  # blocks Y=(2,2) T=(5,5): same T, other prefix
    admit(mgr, a)
    admit(mgr, b)
    c = make_request("c", [2, 2, 5, 5, 1])
    blocks, num_cached = mgr.get_computed_blocks(c)
    assert num_cached == 4
    assert [blk.block_id for blk in blocks] == mgr.get_block_ids("b")[:2]
    d = make_request("d", [3, 3, 5, 5, 1])  # no cached block starts with (3, 3)
    assert mgr.get_computed_blocks(d) == ([], 0)
    e = make_request("e", [5, 5, 1])  # T as a first block was never cached
    assert mgr.get_computed_blocks(e) == ([], 0)


def test_decode_allocates_a_new_block_only_at_a_block_boundary():
    mgr = KVCacheManager(num_blocks=8, block_size=4)
    req = make_request("r", [1, 2, 3])
    admit(mgr, req)
    grew = [len(decode_one(mgr, req, 10 + i)) for i in range(6)]
    # tokens 4..9: the 5th token (index 4) starts block 2, the 9th would start block 3
    assert grew == [0, 1, 0, 0, 0, 1]
    assert len(mgr.get_block_ids("r")) == mgr.num_blocks_needed(req.num_tokens) == 3
    assert mgr.num_cached_block["r"] == 2
    first_two = [mgr.block_pool.blocks[i] for i in mgr.get_block_ids("r")[:2]]
    assert [blk.token_ids for blk in first_two] == [(1, 2, 3, 10), (11, 12, 13, 14)]


def test_chunked_prefill_caches_only_computed_full_blocks():
    mgr = KVCacheManager(num_blocks=8, block_size=4)
    req = make_request("r", list(range(11)))
    admit(mgr, req, num_new_tokens=6)  # chunk 1: tokens 0..5
    blocks = [mgr.block_pool.blocks[i] for i in mgr.get_block_ids("r")]
    assert len(blocks) == 2
    assert blocks[0].block_hash is not None and blocks[1].block_hash is None
    assert mgr.allocate_slots(req, 5) is not None  # chunk 2: tokens 6..10
    req.num_computed_tokens += 5
    blocks = [mgr.block_pool.blocks[i] for i in mgr.get_block_ids("r")]
    assert [blk.block_hash is not None for blk in blocks] == [True, True, False]


def test_slots_beyond_known_tokens_are_allocated_but_not_cached():
    mgr = KVCacheManager(num_blocks=8, block_size=4)
    req = make_request("r", [1, 2])
    assert len(mgr.allocate_slots(req, 8)) == 2  # room for 6 tokens not yet sampled
    assert all(mgr.block_pool.blocks[i].block_hash is None for i in mgr.get_block_ids("r"))


def test_resumed_request_hits_its_own_blocks_after_preemption():
    mgr = KVCacheManager(num_blocks=8, block_size=2)
    req = make_request("r", [1, 2, 3])
    admit(mgr, req)
    for t in (4, 5, 6):
        decode_one(mgr, req, t)
    table = mgr.get_block_ids("r")
    mgr.free(req)  # preempted
    req.num_computed_tokens = 0
    computed, num_cached, _ = admit(mgr, req)
    assert num_cached == 4, "6 tokens: 3 full blocks, the last token recomputed"
    assert [blk.block_id for blk in computed] == table[:2]


def test_prefix_cache_stats_count_tokens():
    mgr = KVCacheManager(num_blocks=8, block_size=2)
    admit(mgr, make_request("a", [1, 2, 3, 4, 5]))
    admit(mgr, make_request("b", [1, 2, 3, 9]))
    stats = mgr.prefix_cache_stats
    assert (stats.requests, stats.queries, stats.hits) == (2, 9, 2)
    assert stats.hit_rate == pytest.approx(2 / 9)


def test_usage_and_free_blocks_follow_allocation():
    mgr = KVCacheManager(num_blocks=4, block_size=2)
    assert mgr.usage == 0.0 and mgr.num_free_blocks == 4
    req = make_request("r", [1, 2, 3])
    admit(mgr, req)
    assert mgr.usage == pytest.approx(0.5) and mgr.num_free_blocks == 2
    assert mgr.reset_prefix_cache() is False
    mgr.free(req)
    assert mgr.usage == 0.0 and mgr.reset_prefix_cache() is True
    assert mgr.get_computed_blocks(make_request("s", [1, 2, 3]))[1] == 0


def test_caching_disabled_never_hits():
    mgr = KVCacheManager(num_blocks=8, block_size=2, enable_caching=False)
    admit(mgr, make_request("a", [1, 2, 3, 4, 5]))
    assert mgr.get_computed_blocks(make_request("b", [1, 2, 3, 4, 5])) == ([], 0)
    assert mgr.block_pool.cached_block_hash_to_block == {}


# ---- property tests: random scheduler-like sequences ---------------------------------------

TOKENS = st.integers(0, 2)  # a tiny vocabulary: equal blocks at different places are common

# The operations a random sequence is made of; repeats weight the common ones.
OPS = [
    "add",
    "schedule",
    "step",
    "schedule",
    "step",
    "step",
    "add",
    "preempt",
    "finish",
    "reset",
    "free_all",
]

HASH_FNS = {
    "builtin": None,
    "always_collides": lambda x: 0,
    "two_buckets": lambda x: hash(x) & 1,
}


class SchedulerSim:
    """Requests with shared prefixes driven through admit / step / preempt / finish the way
    the engine's scheduler does it, checking the manager against a model of its own.

    The model records, for every block, which request wrote it at which table index, so a
    prefix-cache hit can be checked against the tokens the block really holds.
    """

    MAX_LIVE = 6  # requests waiting or running at once

    def __init__(self, data, hash_fn) -> None:
        self.data = data
        num_blocks = data.draw(st.integers(3, 16), label="num_blocks")
        block_size = data.draw(st.sampled_from([1, 2, 3, 4]), label="block_size")
        self.prefixes = data.draw(
            st.lists(st.lists(TOKENS, min_size=1, max_size=12), min_size=1, max_size=3),
            label="prefixes",
        )
        self.mgr = KVCacheManager(num_blocks, block_size, hash_fn=hash_fn)
        self.requests: dict[str, Request] = {}
        self.waiting: list[str] = []
        self.running: list[str] = []
        self.tables: dict[str, list[int]] = {}
        self.written_by: dict[int, tuple[Request, int]] = {}
        self.counter = 0
        self.num_hits = 0

    def draw(self, strategy):
        return self.data.draw(strategy)

    # -- helpers --

    def _record_new_blocks(self, rid: str, new_blocks) -> None:
        req, table = self.requests[rid], self.tables.setdefault(rid, [])
        for blk in new_blocks:
            self.written_by[blk.block_id] = (req, len(table))
            table.append(blk.block_id)

    def _free(self, rid: str) -> None:
        self.mgr.free(self.requests[rid])
        self.tables.pop(rid, None)
        self.requests[rid].num_computed_tokens = 0

    def _allocate(self, rid, num_new, computed):
        """allocate_slots, checked: it fails exactly when the blocks are short, a failure
        changes nothing, and a success takes exactly the blocks it needs."""
        mgr, req = self.mgr, self.requests[rid]
        held = len(self.tables.get(rid, ())) + len(computed)
        covered = req.num_computed_tokens + len(computed) * mgr.block_size + num_new
        needed = max(0, -(-covered // mgr.block_size) - held)
        free_hits = sum(1 for b in computed if b.ref_cnt == 0)  # hits sitting in the queue
        free_before = mgr.num_free_blocks
        before = snapshot(mgr)
        new_blocks = mgr.allocate_slots(req, num_new, computed)
        if new_blocks is None:
            assert needed > free_before - free_hits, (
                f"refused {needed} blocks with {free_before - free_hits} free"
            )
            assert snapshot(mgr) == before, "a failed allocation changed state"
        else:
            assert len(new_blocks) == needed
            assert mgr.num_free_blocks == free_before - needed - free_hits
        return new_blocks

    # -- operations --

    def add(self) -> None:
        if len(self.waiting) + len(self.running) >= self.MAX_LIVE:
            return
        prefix = self.draw(st.sampled_from(self.prefixes))
        cut = self.draw(st.integers(0, len(prefix)))
        tokens = prefix[:cut] + self.draw(st.lists(TOKENS, max_size=8)) or [0]
        rid = f"r{self.counter}"
        self.counter += 1
        self.requests[rid] = make_request(rid, tokens)
        self.waiting.append(rid)

    def schedule(self) -> None:
        """Admit the oldest waiting request with its prefix-cache hit."""
        if not self.waiting:
            return
        rid = self.waiting[0]
        req, mgr, bs = self.requests[rid], self.mgr, self.mgr.block_size
        computed, num_cached = mgr.get_computed_blocks(req)
        # hits: a block-aligned prefix, never the last token, holding exactly these tokens
        assert num_cached == len(computed) * bs <= req.num_tokens - 1
        tokens = req.all_token_ids
        for i, blk in enumerate(computed):
            assert blk.token_ids == tuple(tokens[i * bs : (i + 1) * bs])
            writer, index = self.written_by[blk.block_id]
            assert index == i and writer.all_token_ids[: (i + 1) * bs] == tokens[: (i + 1) * bs], (
                f"block {blk.block_id} holds another prefix: a wrong hit"
            )
        assert len({blk.block_id for blk in computed}) == len(computed)
        self.num_hits += bool(computed)
        num_new = min(self.draw(st.integers(1, 12)), req.num_tokens - num_cached)
        new_blocks = self._allocate(rid, num_new, computed)
        if new_blocks is None:
            return
        self.tables[rid] = [blk.block_id for blk in computed]
        self._record_new_blocks(rid, new_blocks)
        req.num_computed_tokens = num_cached + num_new
        self.waiting.remove(rid)
        self.running.append(rid)

    def step(self) -> None:
        """Every running request gets a prefill chunk if its prompt is not done, else one
        sampled token; a request that cannot get its blocks is preempted."""
        for rid in list(self.running):
            req = self.requests[rid]
            if req.num_computed_tokens < req.num_tokens:
                num_new = min(
                    self.draw(st.integers(1, 12)), req.num_tokens - req.num_computed_tokens
                )
            else:
                req.append_output_token(self.draw(TOKENS))
                num_new = 1
            new_blocks = self._allocate(rid, num_new, [])
            if new_blocks is None:
                self._free(rid)
                self.running.remove(rid)
                self.waiting.append(rid)
                continue
            self._record_new_blocks(rid, new_blocks)
            req.num_computed_tokens += num_new

    def preempt(self) -> None:
        if self.running:
            rid = self.draw(st.sampled_from(self.running))
            self._free(rid)
            self.running.remove(rid)
            self.waiting.append(rid)

    def finish(self) -> None:
        if self.running or self.waiting:
            rid = self.draw(st.sampled_from(self.running + self.waiting))
            self._free(rid)
            (self.running if rid in self.running else self.waiting).remove(rid)

    def reset(self) -> None:
        in_use = any(b.ref_cnt for b in self.mgr.block_pool.blocks)
        assert self.mgr.reset_prefix_cache() is (not in_use)
        if not in_use:
            assert self.mgr.block_pool.cached_block_hash_to_block == {}

    def free_all(self) -> None:
        """Free every request: then every block must be free."""
        for rid in self.running + self.waiting:
            self._free(rid)
        self.waiting += self.running
        self.running = []
        pool = self.mgr.block_pool
        assert self.mgr.num_free_blocks == pool.num_blocks
        assert all(b.ref_cnt == 0 for b in pool.blocks)
        assert self.mgr.usage == 0.0

    # -- invariants, checked after every operation --

    def check_invariants(self) -> None:
        mgr, pool = self.mgr, self.mgr.block_pool
        queue = queue_ids(pool.free_block_queue)
        assert len(queue) == len(set(queue)) == pool.num_free_blocks, "duplicate in free queue"
        holders = [0] * pool.num_blocks
        assert set(mgr.req_to_blocks) == set(self.tables)
        for rid, table in mgr.req_to_blocks.items():
            ids = [b.block_id for b in table]
            assert ids == self.tables[rid], "block table differs from the model"
            assert len(set(ids)) == len(ids)
            for i in ids:
                holders[i] += 1
        for blk in pool.blocks:
            assert blk.ref_cnt >= 0
            assert blk.ref_cnt == holders[blk.block_id], f"block {blk.block_id} ref_cnt"
            assert (blk in pool.free_block_queue) == (blk.ref_cnt == 0)
        in_use = sum(1 for b in pool.blocks if b.ref_cnt > 0)
        assert pool.num_free_blocks + in_use == pool.num_blocks
        assert mgr.usage == pytest.approx(in_use / pool.num_blocks)
        assert set(queue) == {b.block_id for b in pool.blocks if b.ref_cnt == 0}
        # the hash map holds exactly the cached blocks, each under its own hash
        in_map = set()
        for h, blocks in pool.cached_block_hash_to_block.items():
            assert blocks, "empty hash entry left behind"
            for bid, blk in blocks.items():
                assert blk.block_id == bid and blk.block_hash == h
                assert len(blk.token_ids) == mgr.block_size
                in_map.add(bid)
        assert in_map == {b.block_id for b in pool.blocks if b.block_hash is not None}


@pytest.mark.parametrize("hash_name", list(HASH_FNS))
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_random_scheduler_sequences_keep_every_invariant(hash_name, data):
    sim = SchedulerSim(data, HASH_FNS[hash_name])
    for _ in range(3):
        sim.add()
    ops = data.draw(st.lists(st.sampled_from(OPS), min_size=30, max_size=80), label="ops")
    for op in ops:
        getattr(sim, op)()
        sim.check_invariants()
    event("some prefix hit" if sim.num_hits else "no prefix hit")
    sim.free_all()
    sim.check_invariants()
