"""KV caches: the contiguous cache of chapter 04 and the paged block manager of chapter 11."""

from llmlab.kvcache.block_pool import BlockPool, FreeKVCacheBlockQueue, KVCacheBlock
from llmlab.kvcache.contiguous import ContiguousKVCache
from llmlab.kvcache.manager import KVCacheManager, PrefixCacheStats

__all__ = [
    "BlockPool",
    "ContiguousKVCache",
    "FreeKVCacheBlockQueue",
    "KVCacheBlock",
    "KVCacheManager",
    "PrefixCacheStats",
]
