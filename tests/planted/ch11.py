"""Chapter 11's two build exercises: the block pool (`MyBlockPool`) and the chunked-prefill
plan of one step (`plan_step`)."""

import pytest

from planted import Exercise, bug, notebook_definitions

POOL = notebook_definitions("11-vllm-arrives", "MyBlockPool")
PLAN = notebook_definitions("11-vllm-arrives", "plan_step")
HINT = "ch11:pool_hint."


def _one_or_many(what: str) -> tuple[str, str]:
    return (f"{HINT}{what}_one", f"{HINT}{what}_many")


EXERCISES = [
    Exercise(
        "ch11.block_pool",
        "MyBlockPool",
        POOL,
        (
            # a freed block goes to the head: the most recently freed is handed out first
            bug(
                "freed_to_the_head",
                POOL,
                HINT + "queue_order",
                "                self.free_block_queue.append(block)\n",
                "                rest = list(self.free_block_queue)\n"
                "                for other in rest:\n"
                "                    self.free_block_queue.remove(other)\n"
                "                self.free_block_queue.append_n([block] + rest)\n",
            ),
            # the reference count is never dropped: blocks never come back
            bug(
                "no_decrement",
                POOL,
                _one_or_many("missing"),
                "            block.ref_cnt -= 1\n",
                "",
            ),
            # a cached free block handed out keeps its hash: a stale hit
            bug(
                "hash_kept_on_reuse",
                POOL,
                _one_or_many("stale"),
                "            if block.block_hash is not None:",
                "            if False:",
            ),
            # one block per hash: a same-step duplicate replaces the first
            bug(
                "duplicate_replaces",
                POOL,
                _one_or_many("lost"),
                ".setdefault(block.block_hash, {})[block.block_id] = block",
                "[block.block_hash] = {block.block_id: block}",
                "                del same[block.block_id]",
                "                same.pop(block.block_id, None)",
            ),
            # a hit on a free block takes a reference but leaves it in the free queue
            bug(
                "hit_stays_in_the_queue",
                POOL,
                _one_or_many("held"),
                "            if block.ref_cnt == 0:\n                self.free_block_queue.remove",
                "            if False:\n                self.free_block_queue.remove",
            ),
            # freed in the order given reversed: the request's first block is evicted last
            bug(
                "freed_in_reverse",
                POOL,
                HINT + "queue_order",
                "        for block in ordered_blocks:",
                "        for block in reversed(ordered_blocks):",
            ),
        ),
        solution_marks=(pytest.mark.slow, pytest.mark.model),  # it goes on to SmolLM2
    ),
    Exercise(
        "ch11.build_chunked_prefill",
        "plan_step",
        PLAN,
        (
            bug(
                "whole_prompt",
                PLAN,
                "ch11:plan_rule.prompt_longer_what",
                "        n = min(left, budget)",
                "        n = left if (request_id, left) in waiting else min(left, budget)",
            ),
            bug(
                "decodes_not_counted",
                PLAN,
                "ch11:plan_rule.over_budget_tokens",
                "    plan = []\n",
                "    plan, full = [], budget\n",
                "        n = min(left, budget)",
                "        n = min(left, full) if (request_id, left) in waiting else min(left, budget)",
            ),
            bug(
                "zero_chunk",
                PLAN,
                "ch11:plan_rule.chunk_tokens_makes",
                "        if budget == 0:\n            break\n",
                "",
            ),
            bug(
                "prefill_first",
                PLAN,
                "ch11:plan_rule.decodes_first_every",
                "running + waiting",
                "waiting + running",
            ),
            bug(
                "chunk_one_short",
                PLAN,
                "ch11:plan_rule.order_each_request",
                "        n = min(left, budget)",
                "        n = min(left - 1, budget) if left > 1 else 1",
            ),
            bug(
                "newest_running_first",
                PLAN,
                "ch11:plan_rule.order_each_request",
                "running + waiting",
                "running[::-1] + waiting",
            ),
        ),
    ),
]
