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
  requests to evict cached blocks: the tokens, the prefix-cache hit rate, the blocks held at peak
  and the throughput.

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
import time
from typing import Any

from llmlab.kvcache.block_pool import BlockHash, BlockPool, FreeKVCacheBlockQueue, KVCacheBlock
from llmlab.utils import check_positive_int

# ---- what the student starts from ------------------------------------------------------------


class BlockPoolBase:
    """A block pool's data, ready for the five methods that use it (the exercise writes them).

    self.blocks: `num_blocks` `KVCacheBlock`s (block_id, ref_cnt, block_hash, token_ids).
    self.free_block_queue: the blocks nobody holds, a `FreeKVCacheBlockQueue` (popleft() from the
    head, append(block) at the tail, remove(block) from anywhere, len()), all blocks at first.
    self.cached_block_hash_to_block: the prefix cache, hash -> {block_id: block} (several blocks
    may hold the same prefix). hash_block_tokens(parent_hash, token_ids): the chained hash.
    """

    def __init__(self, num_blocks: int, enable_caching: bool = True, hash_fn: Any = None) -> None:
        check_positive_int("num_blocks", num_blocks)
        self.num_blocks = num_blocks
        self.enable_caching = enable_caching
        self.hash_fn = hash_fn if hash_fn is not None else hash
        self.blocks = [KVCacheBlock(i) for i in range(num_blocks)]
        self.free_block_queue = FreeKVCacheBlockQueue(self.blocks)
        self.cached_block_hash_to_block: dict[BlockHash, dict[int, KVCacheBlock]] = {}

    @property
    def num_free_blocks(self) -> int:
        """Blocks nobody holds (cached or not)."""
        return self.free_block_queue.num_free_blocks

    def get_num_free_blocks(self) -> int:
        return self.free_block_queue.num_free_blocks

    @property
    def usage(self) -> float:
        """Fraction of blocks held, 0.0 to 1.0."""
        return 1.0 - self.free_block_queue.num_free_blocks / self.num_blocks

    def hash_block_tokens(self, parent_block_hash: BlockHash | None, token_ids: tuple) -> BlockHash:
        """The chained hash of a full block: its parent's hash (None for a first block) and its
        own tokens."""
        return self.hash_fn((parent_block_hash, token_ids))

    def get_cached_block(self, block_hash: BlockHash, token_ids: tuple, parents: Any = None):
        """One cached block for this prefix, or None."""
        matches = self.find_cached_blocks(block_hash, token_ids, parents)
        return matches[0] if matches else None

    def reset_prefix_cache(self) -> bool:
        """Forget every cached block; refused (False) while any block is held."""
        if self.free_block_queue.num_free_blocks != self.num_blocks:
            return False
        self.cached_block_hash_to_block.clear()
        for block in self.blocks:
            block.block_hash = block.token_ids = None
        return True


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
    "peak_blocks" (held after a step, at most), "num_blocks", "seconds", "tokens_per_s",
    "steps"}."""
    from llmlab.engine.llm_engine import LLMEngine
    from llmlab.sampling import SamplingParams

    workload = workload or WORKLOAD
    engine = LLMEngine(_smollm2(), None, block_pool_cls=pool_cls, **workload["engine"])
    params = SamplingParams(temperature=0.0, max_tokens=workload["max_tokens"], ignore_eos=True)
    arrivals = sorted(workload["requests"], key=lambda r: r[0])
    kv = engine.kv_cache_manager
    tokens: dict[str, list[int]] = {rid: [] for _, rid, _ in arrivals}
    step, peak, i = 0, 0, 0
    t0 = time.perf_counter()
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
    seconds = time.perf_counter() - t0
    stats = kv.prefix_cache_stats
    total = sum(len(t) for t in tokens.values())
    return {
        "tokens": tokens,
        "hit_rate": stats.hit_rate,
        "peak_blocks": peak,
        "num_blocks": kv.num_blocks,
        "seconds": seconds,
        "tokens_per_s": total / seconds if seconds > 0 else 0.0,
        "steps": step,
    }


# ---- the hint: the shrunk case, step by step, and the first difference -------------------------


def _ids(ids: list) -> str:
    return "[" + ", ".join(str(i) for i in ids) + "]"


def _blocks_of(contents: str) -> str:
    return " ".join(contents)


def _which(ids: list) -> str:
    """ "block 2" or "blocks 1 and 2"."""
    ids = [str(i) for i in ids]
    if len(ids) == 1:
        return f"block {ids[0]}"
    return "blocks " + ", ".join(ids[:-1]) + f" and {ids[-1]}"


def _given(result: Any) -> tuple[str, str]:
    """(en, zh) of what an arrival got: its block table and how many blocks were hits."""
    if result == "no room":
        return "no room: it waits", "没有空位，先等着"
    ids, hits = result
    en = f"blocks {_ids(ids)}" + (f" ({hits} from the prefix cache)" if hits else "")
    zh = f"分到块 {_ids(ids)}" + (f"（其中 {hits} 块来自前缀缓存）" if hits else "")
    return en, zh


def describe_op(op: Any, result: Any = None) -> tuple[str, str]:
    """(en, zh) of one op, with what the package's pool did (`result`) when given."""
    kind = op[0]
    if kind == "arrive":
        _, rid, contents, partial = op
        en = f"{rid} arrives with blocks {_blocks_of(contents)}" + (" + 1 token" if partial else "")
        zh = f"{rid} 到达，带着块 {_blocks_of(contents)}" + ("，外加 1 个 token" if partial else "")
        if isinstance(result, list) or result == "no room":
            more = _given(result)
            en, zh = f"{en} → {more[0]}", f"{zh}，{more[1]}"
        return en, zh
    if kind == "together":
        _, rid, rid2, contents = op
        en = (
            f"{rid} and {rid2} arrive in one step, both with blocks {_blocks_of(contents)} "
            f"(each computes them before either is cached)"
        )
        zh = (
            f"{rid} 和 {rid2} 在同一步到达，都带着块 {_blocks_of(contents)}"
            f"（两者都在对方的块进入缓存之前把它们算了一遍）"
        )
        if isinstance(result, list):
            parts = [(r, _given(g)) for r, g in zip((rid, rid2), result)]
            en += " → " + ", ".join(f"{r}: {g[0]}" for r, g in parts)
            zh += "：" + "，".join(f"{r} {g[1]}" for r, g in parts)
        return en, zh
    if kind == "lookup":
        en, zh = f"a lookup of blocks {_blocks_of(op[1])}", f"查找块 {_blocks_of(op[1])}"
        if isinstance(result, list):
            en += f" → hits blocks {_ids(result)}"
            zh += f"，命中块 {_ids(result)}"
        return en, zh
    return f"{op[1]} finishes", f"{op[1]} 结束"


def _difference(got: list, expected: list) -> tuple[str, str]:
    """(en, zh): how the student's pool's observation after one op differs from the package's."""
    if got and got[0] == "raised":
        return (
            f"your pool raised {got[1]}: {got[2]}",
            f"你的块池抛出了 {got[1]}：{got[2]}",
        )
    result, queue, refs, cached = got
    e_result, e_queue, e_refs, e_cached = expected
    en: list[str] = []
    zh: list[str] = []
    if result != e_result:
        en.append(
            f"it went differently: in your pool {_result_text(result)[0]}; in the package's "
            f"{_result_text(e_result)[0]}"
        )
        zh.append(
            f"结果不同：你的块池里{_result_text(result)[1]}；包里的块池里{_result_text(e_result)[1]}"
        )
    extra = [b for b in queue if b not in e_queue]
    missing = [b for b in e_queue if b not in queue]
    held = [b for b in extra if b < len(e_refs) and e_refs[b] > 0]
    if held:
        en.append(
            f"your pool put {_which(held)} in the free queue while a request still holds "
            f"{'it' if len(held) == 1 else 'them'}; the package's pool keeps a block out until "
            f"its last holder frees it"
        )
        zh.append(
            f"你的块池把块 {_ids(held)} 放进了空闲块队列，可还有请求持有它们；"
            f"包里的块池要等最后一个持有者释放后才把块放回去"
        )
    if missing:
        en.append(
            f"your pool left {_which(missing)} out of the free queue though no request holds "
            f"{'it' if len(missing) == 1 else 'them'} any more (the package's pool put "
            f"{'it' if len(missing) == 1 else 'them'} back at the tail)"
        )
        zh.append(
            f"已经没有请求持有块 {_ids(missing)}，你的块池却没把它放回空闲块队列"
            f"（包里的块池把它放回了队尾）"
        )
    if not held and not missing and not extra and queue != e_queue:
        en.append(
            f"your free queue (head first, the head is handed out next) is {_ids(queue)}; the "
            f"package's is {_ids(e_queue)}"
        )
        zh.append(
            f"你的空闲块队列（从队头起，队头的块下一个被分出去）是 {_ids(queue)}；包里的是 {_ids(e_queue)}"
        )
    if refs != e_refs and not held and not missing:
        en.append(f"reference counts by block id: yours {_ids(refs)}, the package's {_ids(e_refs)}")
        zh.append(f"按块号排列的引用计数：你的是 {_ids(refs)}，包里的是 {_ids(e_refs)}")
    if cached != e_cached:
        e_text, z_text = _cache_difference(cached, e_cached)
        en.append(e_text)
        zh.append(z_text)
    return "; ".join(en), "；".join(zh)


def _result_text(result: Any) -> tuple[str, str]:
    if result is None:
        return "nothing happened", "什么也没发生"
    if result == "no room":
        return "there was no room", "没有空位"
    if isinstance(result, list) and len(result) == 2 and isinstance(result[1], int):
        ids, hits = result
        return (
            f"it got blocks {_ids(ids)} ({hits} from the prefix cache)",
            f"它分到块 {_ids(ids)}（其中 {hits} 块来自前缀缓存）",
        )
    if isinstance(result, list) and all(isinstance(r, int) for r in result):
        return f"the lookup hit blocks {_ids(result)}", f"查找命中了块 {_ids(result)}"
    return f"the result was {result}", f"结果是 {result}"


def _cache_difference(cached: list, e_cached: list) -> tuple[str, str]:
    mine = {b: label for b, label in cached}
    theirs = {b: label for b, label in e_cached}
    stale = sorted(set(mine) - set(theirs))
    lost = sorted(set(theirs) - set(mine))
    if stale and not lost:
        return (
            f"{_which(stale)} {'is' if len(stale) == 1 else 'are'} still in your prefix cache "
            f"under the old hash, though the package's pool evicted "
            f"{'it' if len(stale) == 1 else 'them'} when it handed "
            f"{'it' if len(stale) == 1 else 'them'} out for new content (a hit there would "
            f"serve another prefix's K/V)",
            f"块 {_ids(stale)} 还以旧的块哈希留在你的前缀缓存里；包里的块池在把它分出去装新内容时"
            f"就把它淘汰了（再命中它，拿到的就是别的前缀的 K/V）",
        )
    if lost and not stale:
        twins = sorted(b for b in mine if mine[b] in {theirs[x] for x in lost})
        en = (
            f"{_which(lost)} {'is' if len(lost) == 1 else 'are'} missing from your prefix "
            f"cache; the package's pool keeps {'it' if len(lost) == 1 else 'them'} findable"
        )
        zh = f"你的前缀缓存里少了块 {_ids(lost)}；包里的块池让它仍然能被找到"
        if twins:
            en += (
                f" beside {_which(twins)}, which {'holds' if len(twins) == 1 else 'hold'} the "
                f"same prefix (every block that holds a prefix stays in the cache, duplicates "
                f"included)"
            )
            zh += f"，和存着同一个前缀的块 {_ids(twins)} 并存（存着某个前缀的块都要留在缓存里，重复的也一样）"
        return en, zh
    return (
        f"your prefix cache holds (block, hash) {_pairs(cached)}; the package's holds "
        f"{_pairs(e_cached)} (hashes shown as labels: blocks with the same label share a hash)",
        f"你的前缀缓存里是（块，块哈希）{_pairs(cached)}；包里的是 {_pairs(e_cached)}"
        f"（块哈希写成标签：标签相同的块，块哈希也相同）",
    )


def _pairs(cached: list) -> str:
    return "[" + ", ".join(f"{b}:{label}" for b, label in cached) + "]" if cached else "[]"


def explain(case: Any, got: Any, expected: list) -> tuple[str, str]:
    """(en, zh): the shrunk case step by step (with what the package's pool did) up to the first
    op where the student's pool differs, and how it differs."""
    num_blocks, ops = case
    if not isinstance(got, list):  # the whole run raised (`Raised` from find_counterexample)
        got = [["raised", getattr(got, "error", "Exception"), getattr(got, "message", str(got))]]
    k = next(
        (i for i, (g, e) in enumerate(zip(got, expected)) if g != e),
        min(len(got), len(expected)) - 1,
    )
    steps = [describe_op(op, e[0]) for op, e in zip(ops[:k], expected)]
    here = describe_op(ops[k])
    full = describe_op(ops[k], expected[k][0])
    if full != here:  # what the package's pool did on this op, beside the op
        tail_en, tail_zh = full[0][len(here[0]) + 3 :], full[1][len(here[1]) + 1 :]
        here = (f"{here[0]} (the package's pool: {tail_en})", f"{here[1]}（包里的块池：{tail_zh}）")
    diff = _difference(got[k], expected[k])
    en = (
        f"on a pool of {num_blocks} blocks ({BLOCK_SIZE} tokens each; blocks p, q, r hold "
        f"different tokens): "
        + "".join(f"{i}. {s[0]}; " for i, s in enumerate(steps, start=1))
        + f"{k + 1}. {here[0]}: here {diff[0]}."
    )
    zh = (
        f"在一个有 {num_blocks} 个块的块池上（每块 {BLOCK_SIZE} 个 token；块 p、q、r 装的 token 各不相同）："
        + "".join(f"{i}. {s[1]}；" for i, s in enumerate(steps, start=1))
        + f"{k + 1}. {here[1]}：到这一步，{diff[1]}。"
    )
    return en, zh
