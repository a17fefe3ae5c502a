"""What the instructors' table says about each of chapter 11's exercises."""

from __future__ import annotations

from llmlab.course.check.catalog import catalog
from llmlab.course.check.core import (
    ExerciseInfo,
)

M = catalog("ch11")


EXERCISES: dict[str, ExerciseInfo] = {
    "slot_for_position": ExerciseInfo(
        "plug-in",
        mistakes=(
            "logical position as the slot",
            "block id not scaled by the block size",
            "position instead of offset",
            "off-by-one logical block",
        ),
    ),
    "cached_tokens": ExerciseInfo(
        "plug-in",
        mistakes=("partial block counted as a hit", "rounded up", "blocks instead of tokens"),
    ),
    "first_evicted": ExerciseInfo(
        "reasoning",
        mistakes=(
            "oldest allocation evicted first",
            "never-used block taken for a cached one",
            "partial block taken for a cached one",
            "only the never-used blocks counted",
            "the prefix taken as the queue's last block",
        ),
    ),
    "chunked_prefill_steps": ExerciseInfo(
        "reasoning",
        mistakes=(
            "decodes' tokens not taken from the budget",
            "rounded down",
            "whole prompt in one step",
        ),
    ),
    "explorer_cached_free": ExerciseInfo(
        "plug-in",
        mistakes=(
            "freed blocks thought uncached",
            "blocks still held counted as free",
            "partial block counted as cached",
        ),
    ),
    "ratio_reason": ExerciseInfo(
        "reasoning",
        mistakes=(
            "scheduler overhead blamed",
            "memory-bound thought to hurt batching",
            "prefix caching blamed",
            "only one of two reasons",
        ),
    ),
    "block_pool": ExerciseInfo(
        "reasoning",
        mistakes=(
            "freed block put at the head of the free queue",
            "reference count not dropped on free",
            "cached block handed out with its hash kept",
            "a same-prefix block replaces the other in the cache",
            "a hit on a free block left in the free queue",
            "reference counts off",
        ),
    ),
    "source_q5": ExerciseInfo(
        "reasoning",
        mistakes=(
            "copy-on-write for prefix sharing",
            "segmentation for block tables",
            "FIFO for LRU eviction",
        ),
        source_question=5,
    ),
}
