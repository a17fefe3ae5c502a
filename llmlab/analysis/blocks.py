"""The paged KV pool as data: snapshots of a `KVCacheManager`'s blocks (owners, ref counts,
cached prefixes), a scripted walk through allocation, sharing and eviction, a recorded engine
run, chunked prefill's schedule, the waste a run leaves. Chapter 11's widgets draw these; its
checkers grade with them."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from llmlab.i18n import tr
from llmlab.kvcache.manager import KVCacheManager


@dataclass(frozen=True)
class BlockView:
    """One physical block at the moment of the snapshot."""

    block_id: int
    ref_cnt: int
    owners: tuple[str, ...]  # request ids whose block table holds this block
    filled: int | None  # tokens stored in it (None when unknown)
    cached: bool  # findable in the prefix cache (has a hash)

    @property
    def shared(self) -> bool:
        return self.ref_cnt > 1


@dataclass(frozen=True)
class BlockSnapshot:
    """The block tables of live requests and the state of every physical block."""

    num_blocks: int
    block_size: int
    tables: dict[str, tuple[int, ...]]  # request id -> physical block ids, logical order
    num_stored: dict[str, int]  # request id -> tokens whose K/V are stored
    num_cached: dict[str, int]  # request id -> prefix-cache hit (tokens)
    blocks: tuple[BlockView, ...]  # indexed by block id
    label: str = ""
    free_queue: tuple[int, ...] = field(default=())  # free block ids, next to be handed out first

    @property
    def held_blocks(self) -> list[int]:
        """Ids of blocks some request holds (ref_cnt > 0)."""
        return [b.block_id for b in self.blocks if b.ref_cnt > 0]

    @property
    def shared_blocks(self) -> list[int]:
        """Ids of blocks held by more than one request (shared prefix)."""
        return [b.block_id for b in self.blocks if b.ref_cnt > 1]

    @property
    def tokens_stored(self) -> int:
        """Tokens stored, summed over requests (a shared block counts once per holder)."""
        return sum(self.num_stored.values())

    @property
    def logical_slots(self) -> int:
        """Token slots in the requests' block tables, summed over requests."""
        return sum(len(t) for t in self.tables.values()) * self.block_size

    @property
    def physical_slots(self) -> int:
        """Token slots of the distinct blocks in use (a shared block counts once)."""
        return len(self.held_blocks) * self.block_size

    @property
    def paged_waste(self) -> float:
        """Fraction of the requests' block slots that hold no token (0.0 with no blocks)."""
        return 1 - self.tokens_stored / self.logical_slots if self.logical_slots else 0.0


def snapshot(
    manager: KVCacheManager, requests: Iterable[Any] | None = None, label: str = ""
) -> BlockSnapshot:
    """Copy the manager's block tables and pool state.

    requests: the live `Request` objects (their `num_computed_tokens` says how many tokens each
    stores, `num_cached_tokens` its prefix hit). Without them, fills are unknown and every
    table slot counts as stored.
    """
    if not isinstance(manager, KVCacheManager):
        raise ValueError(
            tr(
                f"manager must be a KVCacheManager, got {type(manager).__name__}",
                f"manager 必须是 KVCacheManager，你给了 {type(manager).__name__}",
            )
        )
    bs = manager.block_size
    reqs = {r.request_id: r for r in (requests or ())}
    tables = {
        rid: tuple(b.block_id for b in blocks)
        for rid, blocks in manager.req_to_blocks.items()
        if blocks
    }
    num_stored: dict[str, int] = {}
    num_cached: dict[str, int] = {}
    for rid, table in tables.items():
        r = reqs.get(rid)
        num_stored[rid] = (
            min(r.num_computed_tokens, len(table) * bs) if r is not None else len(table) * bs
        )
        num_cached[rid] = (getattr(r, "num_cached_tokens", None) or 0) if r is not None else 0
    owners: dict[int, list[str]] = {}
    filled: dict[int, int] = {}
    for rid, table in tables.items():
        for i, bid in enumerate(table):
            owners.setdefault(bid, []).append(rid)
            n = max(0, min(bs, num_stored[rid] - i * bs))
            filled[bid] = max(filled.get(bid, 0), n)
    known = requests is not None
    views = tuple(
        BlockView(
            b.block_id,
            b.ref_cnt,
            tuple(owners.get(b.block_id, ())),
            filled.get(b.block_id, 0) if known else None,
            b.block_hash is not None,
        )
        for b in manager.block_pool.blocks
    )
    free = tuple(b.block_id for b in manager.block_pool.free_block_queue)
    return BlockSnapshot(manager.num_blocks, bs, tables, num_stored, num_cached, views, label, free)


def manager_walkthrough(
    block_size: int = 4, num_blocks: int = 24, prefix_len: int = 8
) -> list[BlockSnapshot]:
    """A small story on a real `KVCacheManager`, one snapshot per stage.

    A arrives (a shared prefix of `prefix_len` tokens plus its own); B arrives with the same
    prefix and gets its full blocks from the prefix cache; both decode a few tokens; A finishes
    and its blocks go back to the free queue, the full ones still cached; C arrives with the
    prefix and takes them back without recomputing.
    """
    if not isinstance(block_size, int) or block_size < 1:
        raise ValueError(
            tr(
                f"block_size must be an int >= 1, got {block_size!r}",
                f"block_size 必须是不小于 1 的整数，你给了 {block_size!r}",
            )
        )
    if not isinstance(prefix_len, int) or prefix_len < block_size:
        raise ValueError(
            tr(
                f"prefix_len must be an int >= block_size={block_size}, got {prefix_len!r}",
                f"prefix_len 必须是不小于 block_size={block_size} 的整数，你给了 {prefix_len!r}",
            )
        )
    mgr = KVCacheManager(num_blocks, block_size, enable_caching=True)
    prefix = list(range(100, 100 + prefix_len))
    live: dict[str, Any] = {}
    snaps: list[BlockSnapshot] = []
    _admit(mgr, live, "A", prefix + [1, 2, 3])
    snaps.append(snapshot(mgr, live.values(), tr("1. A arrives", "1. A 到达")))
    _admit(mgr, live, "B", prefix + [7, 8, 9, 10, 11])
    snaps.append(
        snapshot(mgr, live.values(), tr("2. B shares A's prefix blocks", "2. B 共用 A 的前缀块"))
    )
    _decode(mgr, live, block_size)
    snaps.append(
        snapshot(
            mgr,
            live.values(),
            tr(f"3. both decode {block_size} tokens", f"3. 两者各 decode {block_size} 个 token"),
        )
    )
    mgr.free(live.pop("A"))
    snaps.append(snapshot(mgr, live.values(), tr("4. A finishes", "4. A 结束")))
    _admit(mgr, live, "C", prefix + [42])
    snaps.append(
        snapshot(mgr, live.values(), tr("5. C hits the prefix cache", "5. C 命中前缀缓存"))
    )
    return snaps


def _admit(mgr: KVCacheManager, live: dict[str, Any], rid: str, tokens: list[int]) -> None:
    """Request `rid` of `tokens` prefilled whole: its prefix-cache hits, then slots for the rest."""
    from llmlab.core.request import Request
    from llmlab.sampling import SamplingParams

    req = Request(rid, tokens, SamplingParams(max_tokens=64), arrival_time=0.0)
    hits, num_cached = mgr.get_computed_blocks(req)
    if mgr.allocate_slots(req, req.num_tokens - num_cached, hits) is None:
        raise _too_small(mgr)
    req.num_cached_tokens = num_cached
    req.num_computed_tokens = req.num_tokens
    live[rid] = req


def _decode(mgr: KVCacheManager, live: dict[str, Any], steps: int) -> None:
    """`steps` decode steps of every live request, one token and its slot each."""
    for s in range(steps):
        for req in live.values():
            req.append_output_token(500 + s)
            if mgr.allocate_slots(req, 1) is None:
                raise _too_small(mgr)
            req.num_computed_tokens += 1


def _too_small(mgr: KVCacheManager) -> ValueError:
    num_blocks = mgr.num_blocks
    return ValueError(
        tr(
            f"num_blocks={num_blocks} is too small for this walk-through",
            f"num_blocks={num_blocks} 太小，这个演示放不下",
        )
    )


def record_engine(
    engine: Any, max_steps: int | None = None, tokens: dict[str, list[int]] | None = None
) -> list[BlockSnapshot]:
    """Step a real `LLMEngine` until it has no unfinished requests (or `max_steps` steps),
    snapshotting its KV cache manager after every step.

    tokens: if given, each step's new output tokens are appended to `tokens[request_id]`.
    """
    if max_steps is not None and (not isinstance(max_steps, int) or max_steps < 1):
        raise ValueError(
            tr(
                f"max_steps must be None or an int >= 1, got {max_steps!r}",
                f"max_steps 必须是 None 或不小于 1 的整数，你给了 {max_steps!r}",
            )
        )
    snaps = []
    step = 0
    while engine.has_unfinished_requests() and (max_steps is None or step < max_steps):
        for out in engine.step():
            if tokens is not None:
                tokens.setdefault(out.request_id, []).extend(out.outputs[0].token_ids)
        step += 1
        snaps.append(
            snapshot(
                engine.kv_cache_manager,
                engine.scheduler.running,
                tr(f"step {step}", f"第 {step} 步"),
            )
        )
    return snaps


def chunked_prefill_schedule(prompt_len: int, budget: int, decodes: int) -> list[dict[str, int]]:
    """Step a real `Scheduler` (no model: outputs are fake tokens) until a `prompt_len`-token
    prompt, arriving while `decodes` requests decode, has been prefilled under
    `max_num_batched_tokens=budget`. Returns per step the prefill and decode tokens scheduled."""
    from llmlab.core.request import Request
    from llmlab.core.scheduler import Scheduler
    from llmlab.sampling import SamplingParams

    for name, value in (("prompt_len", prompt_len), ("budget", budget)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(
                tr(
                    f"{name} must be an int >= 1, got {value!r}",
                    f"{name} 必须是不小于 1 的整数，你给了 {value!r}",
                )
            )
    if not isinstance(decodes, int) or not 0 <= decodes < budget:
        raise ValueError(
            tr(
                f"decodes must be an int in [0, budget={budget}), got {decodes!r}",
                f"decodes 必须是 [0, budget={budget}) 内的整数，你给了 {decodes!r}",
            )
        )
    kv = KVCacheManager(num_blocks=(prompt_len + 64 * (decodes + 1)) // 16 + 8, block_size=16)
    sched = Scheduler(
        kv, max_num_seqs=decodes + 1, max_num_batched_tokens=budget, max_model_len=prompt_len + 64
    )
    params = SamplingParams(max_tokens=48, ignore_eos=True)
    for i in range(decodes):  # short prompts, prefilled in one step
        sched.add_request(Request(f"decode{i}", [11 + i] * 8, params, arrival_time=0.0))
    out = sched.schedule()
    sched.update_from_output(out, [1] * decodes, now=0.0)
    long = Request("long", list(range(3, 3 + prompt_len)), params, arrival_time=0.0)
    sched.add_request(long)
    rows = []
    while long.num_output_tokens == 0:
        out = sched.schedule()
        rows.append(split_tokens(out))
        done = sum(
            1
            for r, n, c in zip(out.requests, out.num_new_tokens, out.num_computed_tokens)
            if c + n >= r.num_tokens
        )
        sched.update_from_output(out, [1] * done, now=0.0)
    return rows


def split_tokens(out: Any) -> dict[str, int]:
    """A SchedulerOutput's tokens split into prefill (prompt) tokens and decode tokens."""
    prefill = sum(
        min(n, max(0, r.num_prompt_tokens - c))
        for r, n, c in zip(out.requests, out.num_new_tokens, out.num_computed_tokens)
    )
    return {"prefill": prefill, "decode": out.total_num_scheduled_tokens - prefill}


def waste_from_snapshots(snaps: Sequence[BlockSnapshot], max_model_len: int) -> Any:
    """Measured KV waste of a recording, as a `llmlab.analysis.sim.WasteResult`: per snapshot, tokens
    stored, slots a max-length contiguous reservation would hold (max_model_len per live
    request) and slots the block tables hold. Snapshots with no live request are skipped."""
    from llmlab.analysis.sim import WasteResult

    if not isinstance(max_model_len, int) or max_model_len < 1:
        raise ValueError(
            tr(
                f"max_model_len must be an int >= 1, got {max_model_len!r}",
                f"max_model_len 必须是不小于 1 的整数，你给了 {max_model_len!r}",
            )
        )
    live = [s for s in snaps if s.tables]
    if not live:
        raise ValueError(
            tr("snaps holds no snapshot with a live request", "snaps 里没有一个快照带活跃请求")
        )
    bs = live[0].block_size
    return WasteResult(
        bs,
        max_model_len,
        "max_len",
        used=[s.tokens_stored for s in live],
        contiguous=[len(s.tables) * max_model_len for s in live],
        paged=[s.logical_slots for s in live],
    )
