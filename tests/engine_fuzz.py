"""Driving an engine through random arrivals and aborts (the fuzz tests of speculative decoding
and multi-step scheduling share it)."""

from __future__ import annotations

import random
from collections.abc import Callable

from llmlab.utils import cdiv


def drive(
    engine,
    arrivals: dict[int, list],
    rng: random.Random,
    last_arrival: int,
    after_step: Callable[[], None] = lambda: None,
) -> tuple[dict, set, set]:
    """Step `engine` until every request of `arrivals` ({step: [(id, prompt, params)]}) has
    ended, aborting a random running one now and then; after every step each running request
    holds exactly the blocks of its computed tokens and each waiting one none, and
    `after_step()` runs. Returns ({id: (prompt, params, tokens)}, finished ids, aborted ids);
    the pool is whole at the end."""
    kv = engine.kv_cache_manager
    bs = kv.block_size
    aborted, tokens, finished = set(), {}, set()
    step = 0
    while step <= last_arrival or engine.has_unfinished_requests():
        for rid, prompt, params in arrivals.get(step, []):
            engine.add_request(rid, prompt, params)
            tokens[rid] = (prompt, params, [])
        if step % 7 == 3 and engine.requests and rng.random() < 0.5:
            rid = rng.choice(sorted(engine.requests))
            assert engine.abort_request(rid)
            aborted.add(rid)
        for delta in engine.step():
            tokens[delta.request_id][2].extend(delta.outputs[0].token_ids)
            if delta.finished:
                finished.add(delta.request_id)
        for req in engine.scheduler.running:
            assert len(kv.get_block_ids(req.request_id)) == cdiv(req.num_computed_tokens, bs)
        for req in engine.scheduler.waiting:
            assert kv.get_block_ids(req.request_id) == []
        after_step()
        step += 1
        assert step < 5000, "the engine stopped making progress"
    assert kv.num_free_blocks == kv.num_blocks and not engine.requests
    assert all(b.ref_cnt == 0 for b in kv.block_pool.blocks)
    return tokens, finished, aborted
