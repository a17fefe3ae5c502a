"""The block pool: fixed-size KV cache blocks, their reference counts, the free queue and the
prefix-cache map. A simplified mirror of vLLM V1's `vllm/v1/core/block_pool.py`.

Every block holds the K/V of `block_size` consecutive tokens of some sequence. A block is
either in use (`ref_cnt > 0`: one or more block tables hold it) or free (`ref_cnt == 0`: it
sits in the free queue). A free block may still be *cached*: its content is known (hash, token
ids) so a later request with the same prefix can take it back out of the free queue instead of
recomputing it ("touch"). Only when a free block is handed out for new content is its cache
entry dropped ("eviction"). The free queue hands out the least recently freed block first, so
the cached blocks that were used longest ago are evicted first (LRU).

Prefix hashes are chained: block i's hash covers block i-1's hash and block i's own tokens, so
equal hashes mean (barring collisions) equal *prefixes*, not just equal blocks. A hash only
finds candidates; a hit is confirmed by comparing the block's stored token ids and checking that
the block it was chained from (its parent) is itself a confirmed hit for the previous block and
has not been handed out again since. So even a hash function that always collides can cost
speed, never correctness.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Iterator
from dataclasses import dataclass, field

from llmlab.config.engine import EngineConfig
from llmlab.utils import check_positive_int

BlockHash = int
"""A block's chained prefix hash: `hash_fn((parent_block_hash, token_ids))`."""


@dataclass(eq=False, slots=True)
class KVCacheBlock:
    """One physical block of the paged KV cache (metadata only; the tensors live elsewhere).

    Blocks compare and hash by identity: two blocks are never "equal" just because their
    fields are.
    """

    block_id: int
    ref_cnt: int = 0  # number of block tables holding this block
    block_hash: BlockHash | None = None  # set while the block is in the prefix cache
    token_ids: tuple[int, ...] | None = None  # this block's own tokens, set with the hash
    # The block this one was chained from when it was cached (None for a sequence's first
    # block) and that parent's `generation` at the time. If the parent has been handed out
    # again since, this block's content no longer follows from any findable prefix.
    parent: KVCacheBlock | None = field(default=None, repr=False)
    parent_generation: int = -1
    generation: int = 0  # times this block has been handed out
    # Links of the doubly linked free queue; both None while the block is not in it.
    prev_free_block: KVCacheBlock | None = field(default=None, repr=False)
    next_free_block: KVCacheBlock | None = field(default=None, repr=False)

    @property
    def is_cached(self) -> bool:
        """True while the block is in the prefix cache (findable by its hash)."""
        return self.block_hash is not None


class FreeKVCacheBlockQueue:
    """A doubly linked list of free blocks in the order they were freed.

    `popleft()` gives the least recently freed block; `remove()` takes a block out of the middle
    in O(1) (a prefix-cache hit on a free block); `append()` puts a newly freed block at the
    tail. The links live in the blocks themselves, so no node objects are allocated. Two
    sentinel blocks (ids -1) sit at the ends so no operation needs a special case.
    """

    def __init__(self, blocks: list[KVCacheBlock]) -> None:
        self._head = KVCacheBlock(-1)  # sentinel before the first free block
        self._tail = KVCacheBlock(-1)  # sentinel after the last free block
        self._head.next_free_block = self._tail
        self._tail.prev_free_block = self._head
        self.num_free_blocks = 0
        self.append_n(blocks)

    def __len__(self) -> int:
        return self.num_free_blocks

    def __iter__(self) -> Iterator[KVCacheBlock]:
        """Free blocks from the head (next to be handed out) to the tail."""
        block = self._head.next_free_block
        while block is not self._tail:
            assert block is not None
            yield block
            block = block.next_free_block

    def __contains__(self, block: object) -> bool:
        """O(1): a block is in the queue exactly when its links are set."""
        return isinstance(block, KVCacheBlock) and block.prev_free_block is not None

    def popleft(self) -> KVCacheBlock:
        """Take the least recently freed block."""
        block = self._head.next_free_block
        if block is self._tail or block is None:
            raise ValueError("popleft() from an empty free queue: no free blocks left")
        self._unlink(block)
        return block

    def popleft_n(self, n: int) -> list[KVCacheBlock]:
        """Take the `n` least recently freed blocks, oldest first."""
        if not 0 <= n <= self.num_free_blocks:
            raise ValueError(f"n must be in [0, num_free_blocks={self.num_free_blocks}], got {n}")
        return [self.popleft() for _ in range(n)]

    def remove(self, block: KVCacheBlock) -> None:
        """Take `block` out of the queue wherever it is (O(1))."""
        if block.prev_free_block is None or block.next_free_block is None:
            raise ValueError(f"block {block.block_id} is not in the free queue")
        self._unlink(block)

    def append(self, block: KVCacheBlock) -> None:
        """Put `block` at the tail: it becomes the last to be handed out."""
        if block.prev_free_block is not None or block.next_free_block is not None:
            raise ValueError(f"block {block.block_id} is already in the free queue")
        last = self._tail.prev_free_block
        assert last is not None
        last.next_free_block = block
        block.prev_free_block = last
        block.next_free_block = self._tail
        self._tail.prev_free_block = block
        self.num_free_blocks += 1

    def append_n(self, blocks: Iterable[KVCacheBlock]) -> None:
        """Append each block in order."""
        for block in blocks:
            self.append(block)

    def get_all_free_blocks(self) -> list[KVCacheBlock]:
        """Every free block, head to tail (for tests and plots)."""
        return list(self)

    def _unlink(self, block: KVCacheBlock) -> None:
        prev, nxt = block.prev_free_block, block.next_free_block
        assert prev is not None and nxt is not None
        prev.next_free_block = nxt
        nxt.prev_free_block = prev
        block.prev_free_block = block.next_free_block = None
        self.num_free_blocks -= 1


class BlockPool:
    """All the KV cache blocks: who holds them, which are free, and which are cached.

    `hash_fn` maps `(parent_block_hash, token_ids_tuple)` to an int. The default is Python's
    built-in `hash` (fast; deterministic within a process for ints and tuples). vLLM defaults
    to SHA-256 because a collision there could serve one user another user's K/V; here a
    collision only costs a token comparison, because every hit is verified.
    """

    def __init__(
        self,
        num_blocks: int,
        enable_caching: bool = EngineConfig.enable_prefix_caching,
        hash_fn: Callable[[object], int] | None = None,
    ) -> None:
        check_positive_int("num_blocks", num_blocks)
        if not isinstance(enable_caching, bool):
            raise ValueError(f"enable_caching must be True or False, got {enable_caching!r}")
        if hash_fn is not None and not callable(hash_fn):
            raise ValueError(f"hash_fn must be None or a callable, got {hash_fn!r}")
        self.num_blocks = num_blocks
        self.enable_caching = enable_caching
        self.hash_fn: Callable[[object], int] = hash_fn if hash_fn is not None else hash
        self.blocks = [KVCacheBlock(i) for i in range(num_blocks)]
        self.free_block_queue = FreeKVCacheBlockQueue(self.blocks)
        # hash -> {block_id: block}. Several blocks may share a hash: duplicates of the same
        # content (two requests computed it at the same time) or, rarely, a collision.
        self.cached_block_hash_to_block: dict[BlockHash, dict[int, KVCacheBlock]] = {}

    # ---- counts -------------------------------------------------------------------------

    @property
    def num_free_blocks(self) -> int:
        """Blocks with ref_cnt 0, cached or not (a cached free block can be evicted)."""
        return self.free_block_queue.num_free_blocks

    def get_num_free_blocks(self) -> int:
        """Same as `num_free_blocks` (vLLM's method name)."""
        return self.free_block_queue.num_free_blocks

    @property
    def usage(self) -> float:
        """Fraction of blocks in use (ref_cnt > 0), from 0.0 to 1.0."""
        return 1.0 - self.free_block_queue.num_free_blocks / self.num_blocks

    # ---- hashing and lookup ---------------------------------------------------------------

    def hash_block_tokens(
        self, parent_block_hash: BlockHash | None, token_ids: tuple[int, ...]
    ) -> BlockHash:
        """The chained hash of one full block given its parent's hash (None for the first)."""
        return self.hash_fn((parent_block_hash, token_ids))

    def find_cached_blocks(
        self,
        block_hash: BlockHash,
        token_ids: tuple[int, ...],
        parents: Collection[KVCacheBlock] | None,
    ) -> list[KVCacheBlock]:
        """Every cached block that certainly holds the same prefix as the caller's block.

        `parents`: the confirmed matches for the previous block of the same sequence, or None
        when asking about a sequence's first block. A candidate found by `block_hash` counts
        only if its stored tokens equal `token_ids` and it was chained from one of `parents`
        that has not been handed out again since (or, for a first block, from no parent).
        """
        candidates = self.cached_block_hash_to_block.get(block_hash)
        if not candidates:
            return []
        matches = []
        for block in candidates.values():
            if block.token_ids != token_ids:
                continue
            parent = block.parent
            if parents is None:
                if parent is not None:
                    continue
            elif (
                parent is None
                or parent.generation != block.parent_generation
                or parent not in parents
            ):
                continue
            matches.append(block)
        return matches

    def get_cached_block(
        self,
        block_hash: BlockHash,
        token_ids: tuple[int, ...],
        parents: Collection[KVCacheBlock] | None = None,
    ) -> KVCacheBlock | None:
        """One verified cached block for this prefix, or None (see `find_cached_blocks`)."""
        matches = self.find_cached_blocks(block_hash, token_ids, parents)
        return matches[0] if matches else None

    # ---- allocation -----------------------------------------------------------------------

    def get_new_blocks(self, num_blocks: int) -> list[KVCacheBlock]:
        """Hand out `num_blocks` free blocks (ref_cnt becomes 1), evicting any cache entries.

        The least recently freed blocks go first. Raises ValueError when there are not enough.
        """
        if not 0 <= num_blocks <= self.free_block_queue.num_free_blocks:
            raise ValueError(
                f"num_blocks must be in [0, num_free_blocks="
                f"{self.free_block_queue.num_free_blocks}], got {num_blocks}"
            )
        blocks = self.free_block_queue.popleft_n(num_blocks)
        for block in blocks:
            assert block.ref_cnt == 0, f"block {block.block_id} in the free queue is in use"
            if block.block_hash is not None:
                self._evict_cached_block(block)
            block.generation += 1  # its content is about to be overwritten
            block.ref_cnt = 1
        return blocks

    def touch(self, blocks: Iterable[KVCacheBlock]) -> None:
        """Take a reference on cache-hit blocks; a free one leaves the free queue (O(1))."""
        for block in blocks:
            if block.ref_cnt == 0:
                self.free_block_queue.remove(block)
            block.ref_cnt += 1

    def free_blocks(self, ordered_blocks: Iterable[KVCacheBlock]) -> None:
        """Drop one reference on each block; those reaching 0 join the free queue's tail in
        the given order (so the first given will be the first evicted)."""
        for block in ordered_blocks:
            if block.ref_cnt <= 0:
                raise ValueError(
                    f"block {block.block_id} freed with ref_cnt={block.ref_cnt} (double free?)"
                )
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                self.free_block_queue.append(block)

    # ---- caching --------------------------------------------------------------------------

    def cache_full_blocks(
        self,
        blocks: list[KVCacheBlock],
        block_hashes: list[BlockHash],
        num_cached_blocks: int,
        num_full_blocks: int,
        new_block_token_ids: list[tuple[int, ...]],
    ) -> None:
        """Put a sequence's newly full blocks `blocks[num_cached_blocks:num_full_blocks]` in the
        prefix cache.

        blocks: the sequence's block table. block_hashes: the sequence's chained hashes, at
        least `num_cached_blocks` long; missing ones are computed and appended in place.
        new_block_token_ids: the token ids of each newly full block, in order. A block that is
        already cached (a prefix-cache hit) is left as it is.
        """
        if not self.enable_caching:
            return
        if not 0 <= num_cached_blocks <= num_full_blocks <= len(blocks):
            raise ValueError(
                f"need 0 <= num_cached_blocks={num_cached_blocks} <= "
                f"num_full_blocks={num_full_blocks} <= len(blocks)={len(blocks)}"
            )
        if len(block_hashes) < num_cached_blocks:
            raise ValueError(
                f"block_hashes has {len(block_hashes)} entries, fewer than "
                f"num_cached_blocks={num_cached_blocks}"
            )
        if len(new_block_token_ids) != num_full_blocks - num_cached_blocks:
            raise ValueError(
                f"new_block_token_ids has {len(new_block_token_ids)} blocks, "
                f"expected {num_full_blocks - num_cached_blocks}"
            )
        for i, token_ids in enumerate(new_block_token_ids):
            j = num_cached_blocks + i
            if j == len(block_hashes):
                parent_hash = block_hashes[j - 1] if j > 0 else None
                block_hashes.append(self.hash_block_tokens(parent_hash, token_ids))
            block = blocks[j]
            if block.block_hash is not None:
                continue
            block.block_hash = block_hashes[j]
            block.token_ids = token_ids
            if j > 0:
                parent = blocks[j - 1]
                block.parent = parent
                block.parent_generation = parent.generation
            self.cached_block_hash_to_block.setdefault(block.block_hash, {})[block.block_id] = block

    def _evict_cached_block(self, block: KVCacheBlock) -> None:
        assert block.block_hash is not None
        same_hash = self.cached_block_hash_to_block.get(block.block_hash)
        if same_hash is not None:
            same_hash.pop(block.block_id, None)
            if not same_hash:
                del self.cached_block_hash_to_block[block.block_hash]
        block.block_hash = None
        block.token_ids = None
        block.parent = None
        block.parent_generation = -1

    def reset_prefix_cache(self) -> bool:
        """Forget every cached block. Refused (returns False) while any block is in use."""
        if self.free_block_queue.num_free_blocks != self.num_blocks:
            return False
        self.cached_block_hash_to_block.clear()
        for block in self.blocks:
            if block.block_hash is not None:
                block.block_hash = None
                block.token_ids = None
                block.parent = None
                block.parent_generation = -1
        return True
