"""The KV cache manager: each request's block table on top of the block pool, and the prefix
cache seen per request. A simplified mirror of vLLM V1's `vllm/v1/core/kv_cache_manager.py`.

The scheduler uses it like this:

    # a waiting request (new, or preempted and now resumed)
    computed_blocks, num_cached_tokens = mgr.get_computed_blocks(req)
    new_blocks = mgr.allocate_slots(req, num_new_tokens, computed_blocks)
    if new_blocks is None: ...        # not enough blocks: nothing changed, try later
    req.num_computed_tokens = num_cached_tokens   # then the step computes num_new_tokens more

    # a running request (next prefill chunk, or one decode token)
    new_blocks = mgr.allocate_slots(req, num_new_tokens)

    mgr.free(req)                     # finished, aborted or preempted
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from llmlab.config.engine import EngineConfig
from llmlab.kvcache.block_pool import BlockHash, BlockPool, KVCacheBlock
from llmlab.utils import cdiv, check_positive_int


class Request(Protocol):
    """What the manager reads of a request (the engine's is `llmlab.core.request.Request`; the KV
    cache sits below it, so it names the fields instead of importing the class)."""

    request_id: str
    prompt_token_ids: list[int]
    output_token_ids: list[int]
    num_computed_tokens: int

    @property
    def num_tokens(self) -> int: ...


@dataclass
class PrefixCacheStats:
    """Prefix-cache lookups since the manager was made, counted in tokens."""

    requests: int = 0  # calls of get_computed_blocks with caching on
    queries: int = 0  # tokens looked up (each request's num_tokens)
    hits: int = 0  # tokens found in the cache

    @property
    def hit_rate(self) -> float:
        """Fraction of looked-up tokens that were hits (0.0 before any lookup)."""
        return self.hits / self.queries if self.queries else 0.0


class KVCacheManager:
    """Block tables for requests, with prefix caching.

    num_blocks: blocks in the pool. block_size: tokens per block. enable_caching: reuse full
    blocks across requests with the same prefix. hash_fn: the block hash (see `BlockPool`);
    tests pass a colliding one. The defaults are `EngineConfig`'s (`block_size`,
    `enable_prefix_caching`). block_pool: None for the package's `BlockPool`, or another pool
    with its interface (chapter 11's build exercise plugs the student's in here): a class, made
    as `block_pool(num_blocks, enable_caching=enable_caching, hash_fn=hash_fn)`, or an instance
    of `num_blocks` blocks, used as it is (then `hash_fn` must be None: the pool has its own).
    """

    def __init__(
        self,
        num_blocks: int,
        block_size: int = EngineConfig.block_size,
        enable_caching: bool = EngineConfig.enable_prefix_caching,
        hash_fn: Callable[[object], int] | None = None,
        block_pool: type | BlockPool | None = None,
    ) -> None:
        check_positive_int("block_size", block_size)
        self.block_pool = make_block_pool(block_pool, num_blocks, enable_caching, hash_fn)
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_caching = enable_caching
        self.req_to_blocks: dict[str, list[KVCacheBlock]] = {}
        # The chained hashes of each request's full blocks, computed once as they are needed.
        self.req_to_block_hashes: dict[str, list[BlockHash]] = {}
        # How many leading blocks of each request's table are already in the prefix cache.
        self.num_cached_block: dict[str, int] = {}
        self.prefix_cache_stats = PrefixCacheStats()

    # ---- counts -------------------------------------------------------------------------

    @property
    def num_free_blocks(self) -> int:
        """Blocks not held by any request (including cached blocks that may be evicted)."""
        return self.block_pool.free_block_queue.num_free_blocks

    @property
    def usage(self) -> float:
        """Fraction of blocks held by requests, from 0.0 to 1.0."""
        return self.block_pool.usage

    def num_blocks_needed(self, num_tokens: int) -> int:
        """Blocks that hold `num_tokens` tokens (ceil division)."""
        return cdiv(num_tokens, self.block_size)

    def get_block_ids(self, request_id: str) -> list[int]:
        """The request's block table as block ids (empty when it holds none)."""
        return [block.block_id for block in self.req_to_blocks.get(request_id, ())]

    # ---- prefix cache ---------------------------------------------------------------------

    def get_computed_blocks(self, request: Request) -> tuple[list[KVCacheBlock], int]:
        """The longest prefix of the request's full blocks already in the cache.

        Returns (blocks, num_cached_tokens) with num_cached_tokens = len(blocks) * block_size,
        at most num_tokens - 1: the last token is always computed, because its logits are
        needed to sample the next one. Reference counts are not touched; `allocate_slots`
        takes the references.
        """
        if not self.enable_caching:
            return [], 0
        block_size = self.block_size
        num_tokens = request.num_tokens
        max_hit_blocks = (num_tokens - 1) // block_size
        hashes = self.req_to_block_hashes.setdefault(request.request_id, [])
        pool = self.block_pool
        hits: list[KVCacheBlock] = []
        parents: list[KVCacheBlock] | None = None
        for i in range(max_hit_blocks):
            token_ids = _token_slice(request, i * block_size, (i + 1) * block_size)
            if i == len(hashes):
                hashes.append(pool.hash_block_tokens(hashes[i - 1] if i else None, token_ids))
            matches = pool.find_cached_blocks(hashes[i], token_ids, parents)
            if not matches:
                break
            # Among duplicates prefer a block already in use: touching it frees nothing up.
            hits.append(next((b for b in matches if b.ref_cnt > 0), matches[0]))
            parents = matches
        num_cached_tokens = len(hits) * block_size
        stats = self.prefix_cache_stats
        stats.requests += 1
        stats.queries += num_tokens
        stats.hits += num_cached_tokens
        return hits, num_cached_tokens

    # ---- allocation -----------------------------------------------------------------------

    def allocate_slots(
        self,
        request: Request,
        num_new_tokens: int,
        new_computed_blocks: list[KVCacheBlock] | None = None,
    ) -> list[KVCacheBlock] | None:
        """Grow the request's block table so it covers its computed tokens, the prefix-cache
        hit `new_computed_blocks` and `num_new_tokens` more tokens.

        Returns the newly allocated blocks (possibly empty), or None when there are not enough
        free blocks, in which case nothing at all has changed. Full blocks whose tokens are
        known are added to the prefix cache.
        """
        if num_new_tokens < 0:
            raise ValueError(f"num_new_tokens must be >= 0, got {num_new_tokens}")
        request_id = request.request_id
        table = self.req_to_blocks.get(request_id)
        block_size = self.block_size
        pool = self.block_pool

        if not new_computed_blocks:
            # Fast path (every running request, every step): O(1) unless a block fills up;
            # no hashing, no copies of the token list.
            num_total = request.num_computed_tokens + num_new_tokens
            if table is not None and num_total <= len(table) * block_size:
                new_blocks = []  # decode inside the last block: the usual case
            else:
                num_new_blocks = cdiv(num_total, block_size) - (len(table) if table else 0)
                if num_new_blocks > pool.free_block_queue.num_free_blocks:
                    return None
                new_blocks = pool.get_new_blocks(num_new_blocks) if num_new_blocks > 0 else []
                if table is None:
                    self.req_to_blocks[request_id] = table = new_blocks[:]
                else:
                    table.extend(new_blocks)
            # A block can only have become full if num_total reaches past the cached blocks.
            if self.enable_caching and num_total // block_size > self.num_cached_block.get(
                request_id, 0
            ):
                num_full = min(num_total, request.num_tokens) // block_size
                if num_full > self.num_cached_block.get(request_id, 0):
                    self._cache_full_blocks(request, table, num_full)
            return new_blocks

        # A waiting request with prefix-cache hits.
        if request.num_computed_tokens != 0 or table:
            raise ValueError(
                "new_computed_blocks is only for a request that holds no blocks and has "
                f"num_computed_tokens == 0 (got num_computed_tokens="
                f"{request.num_computed_tokens}, {len(table or ())} blocks held); set "
                "num_computed_tokens to the hit length after allocate_slots succeeds"
            )
        num_hit_blocks = len(new_computed_blocks)
        num_total = num_hit_blocks * block_size + num_new_tokens
        num_new_blocks = max(0, cdiv(num_total, block_size) - num_hit_blocks)
        # Hit blocks with ref_cnt 0 sit in the free queue: touching them takes them out, so
        # they cannot also be counted as free blocks for the new ones.
        num_free_hits = sum(1 for b in new_computed_blocks if b.ref_cnt == 0)
        if num_new_blocks > pool.free_block_queue.num_free_blocks - num_free_hits:
            return None
        pool.touch(new_computed_blocks)
        new_blocks = pool.get_new_blocks(num_new_blocks)
        table = list(new_computed_blocks)
        table.extend(new_blocks)
        self.req_to_blocks[request_id] = table
        if self.enable_caching:
            self.num_cached_block[request_id] = num_hit_blocks  # hit blocks are cached
            num_full = min(num_total, request.num_tokens) // block_size
            if num_full > num_hit_blocks:
                self._cache_full_blocks(request, table, num_full)
        return new_blocks

    def _cache_full_blocks(
        self, request: Request, table: list[KVCacheBlock], num_full: int
    ) -> None:
        request_id = request.request_id
        start = self.num_cached_block.get(request_id, 0)
        bs = self.block_size
        token_ids = [_token_slice(request, j * bs, (j + 1) * bs) for j in range(start, num_full)]
        hashes = self.req_to_block_hashes.setdefault(request_id, [])
        self.block_pool.cache_full_blocks(table, hashes, start, num_full, token_ids)
        self.num_cached_block[request_id] = num_full

    # ---- freeing --------------------------------------------------------------------------

    def free(self, request: Request) -> None:
        """Release the request's blocks, last block first: a request's tail blocks are the
        least likely to be shared, so they become the first to be evicted."""
        request_id = request.request_id
        blocks = self.req_to_blocks.pop(request_id, None)
        if blocks:
            self.block_pool.free_blocks(reversed(blocks))
        self.num_cached_block.pop(request_id, None)
        self.req_to_block_hashes.pop(request_id, None)

    def free_blocks_beyond(self, request: Request, num_tokens: int) -> int:
        """Release the blocks of the request's table past those that hold its first
        `num_tokens` tokens (speculative decoding: slots of rejected draft tokens). Returns how
        many were released. They hold no known tokens, so none of them is in the prefix cache."""
        table = self.req_to_blocks.get(request.request_id)
        keep = cdiv(num_tokens, self.block_size)
        if not table or len(table) <= keep:
            return 0
        tail = table[keep:]
        del table[keep:]
        self.block_pool.free_blocks(reversed(tail))
        return len(tail)

    def reset_prefix_cache(self) -> bool:
        """Forget all cached blocks; refused (False) while any request holds blocks."""
        return self.block_pool.reset_prefix_cache()


# What the manager (and the engine's views of the pool) use of a block pool besides its
# `blocks` list and its `free_block_queue` (which counts `num_free_blocks`).
BLOCK_POOL_METHODS = (
    "hash_block_tokens",
    "find_cached_blocks",
    "get_new_blocks",
    "touch",
    "free_blocks",
    "cache_full_blocks",
    "reset_prefix_cache",
)


def make_block_pool(
    block_pool: type | BlockPool | None,
    num_blocks: int,
    enable_caching: bool = True,
    hash_fn: Callable[[object], int] | None = None,
) -> BlockPool:
    """The pool a `KVCacheManager` runs on (see its `block_pool` argument), checked to have the
    interface the manager calls; ValueError naming `block_pool` otherwise."""
    if block_pool is None:
        return BlockPool(num_blocks, enable_caching=enable_caching, hash_fn=hash_fn)
    expected = (
        "block_pool must be None, or a block pool class or instance with the interface of "
        "llmlab.kvcache.BlockPool (methods " + ", ".join(BLOCK_POOL_METHODS) + "; a `blocks` "
        "list, a `free_block_queue` and `usage`)"
    )
    if isinstance(block_pool, type):
        missing = [m for m in BLOCK_POOL_METHODS if not callable(getattr(block_pool, m, None))]
        if missing:
            raise ValueError(f"{expected}; the class {block_pool.__name__} has no {missing}")
        pool = block_pool(num_blocks, enable_caching=enable_caching, hash_fn=hash_fn)
    elif hash_fn is not None:
        raise ValueError(
            "block_pool is an instance, which hashes with its own hash_fn: pass hash_fn=None, "
            "or pass the pool's class to have it made with this hash_fn"
        )
    else:
        pool = block_pool
    missing = [m for m in BLOCK_POOL_METHODS if not callable(getattr(pool, m, None))]
    missing += [a for a in ("blocks", "free_block_queue", "usage") if not hasattr(pool, a)]
    if missing:
        raise ValueError(f"{expected}; got {type(pool).__name__}, which has no {missing}")
    blocks = pool.blocks
    if not isinstance(blocks, list) or len(blocks) != num_blocks:
        got = len(blocks) if isinstance(blocks, list) else type(blocks).__name__
        raise ValueError(
            f"block_pool must hold num_blocks={num_blocks} blocks in its `blocks` list, got {got}"
        )
    if not hasattr(pool.free_block_queue, "num_free_blocks"):
        raise ValueError(f"{expected}; its free_block_queue has no num_free_blocks")
    return pool


def _token_slice(request: Request, start: int, end: int) -> tuple[int, ...]:
    """tokens[start:end] of the request without building the whole prompt + output list."""
    prompt = request.prompt_token_ids
    num_prompt = len(prompt)
    if end <= num_prompt:
        return tuple(prompt[start:end])
    output = request.output_token_ids
    if start >= num_prompt:
        return tuple(output[start - num_prompt : end - num_prompt])
    return tuple(prompt[start:]) + tuple(output[: end - num_prompt])
