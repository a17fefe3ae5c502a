"""Self-checks of chapter 11 (vLLM arrives): a token's slot through a block table, what a
prefix-cache hit can reuse, which cached block the free queue evicts first, how many steps a chunked
prefill takes beside running decodes, what the block-allocation explorer shows, why our
engine-vs-Hugging-Face ratio is far from the source chapter's 24x, and the source chapter's
self-check question 5 (which operating-system idea each vLLM design borrows). Also the request trace
of the chapter's memory-waste figure, shared with its test.

Every expected value is computed by running the package (a real `KVCacheManager`, a real
`Scheduler`), never written down by hand."""

# The chapter's names are its modules' (a notebook calls `ch11.<name>`): imported to be read here.
# ruff: noqa: F401

from __future__ import annotations

from llmlab.course.check.catalog import catalog
from llmlab.course.check.ch11.block_pool import (
    BUILDS,
    POOL_DRIVER,
    POOL_MAX_EXAMPLES,
    block_pool,
    describe_op,
    explain_pool,
)
from llmlab.course.check.ch11.chunked import (
    CHUNK_DRIVERS,
    CHUNK_ENGINE_LONG,
    CHUNK_ENGINE_WORKLOAD,
    CHUNK_MAX_EXAMPLES,
    build_chunked_prefill,
    plan_cases,
)
from llmlab.course.check.ch11.questions import (
    CHUNK_BUDGET,
    CHUNK_DECODES,
    CHUNK_PROMPT_LEN,
    EVICT_A_OWN,
    EVICT_B_OWN,
    EVICT_BLOCK_SIZE,
    EVICT_NUM_BLOCKS,
    EVICT_PREFIX,
    EXERCISES,
    EXPLORER_STAGE,
    HIT_BLOCK_SIZE,
    HIT_OWN_LEN,
    HIT_SYSTEM_LEN,
    Q5_ACCEPTED,
    Q5_CONCEPTS,
    Q5_DESIGNS,
    RATIO_CORRECT,
    RATIO_OPTIONS,
    SLOT_BLOCK_SIZE,
    SLOT_BLOCK_TABLE,
    SLOT_POSITION,
    WASTE_BLOCK_SIZE,
    WASTE_MAX_BATCH,
    WASTE_MAX_MODEL_LEN,
    WASTE_TRACE,
    cached_tokens,
    chunked_prefill_steps,
    explorer_cached_free,
    first_evicted,
    ratio_reason,
    slot_for_position,
    source_q5,
)

M = catalog("ch11")  # the chapter's texts, the catalog its modules read
