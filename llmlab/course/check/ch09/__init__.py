"""Self-checks of chapter 09 (parallelism): what a second data-parallel replica buys at low load,
column- vs row-parallel projections, all-reduces per forward under TP, the pipeline bubble, a
ring all-reduce's time over PCIe, the fastest TP degree for long contexts over PCIe (the
explorer's task), and which kind of parallelism leans on NVLink (the source chapter's learning
goal 3)."""

# The chapter's names are its modules' (a notebook calls `ch09.<name>`): imported to be read here.
# ruff: noqa: F401

from __future__ import annotations

from llmlab.course.check.catalog import catalog
from llmlab.course.check.ch09.questions import (
    ALLREDUCE_MODEL,
    ALLREDUCE_TP,
    BUBBLE_M,
    BUBBLE_P,
    DP_HINTS,
    DP_OPTIONS,
    EXERCISES,
    LONG_BATCH,
    LONG_CONTEXT,
    LONG_LINK,
    LONG_MODEL,
    PROJECTIONS,
    RING_BATCH,
    RING_LINK,
    RING_MODEL,
    RING_TP,
    SPLIT_GPUS_PER_SERVER,
    SPLIT_HEADS,
    SPLIT_KEYS,
    SPLIT_KV_HEADS,
    SPLIT_SERVERS,
    STYLES,
    TP_DEGREES,
    allreduces_per_forward,
    best_tp_long_context,
    bubble_fraction,
    dp_at_low_load,
    parallel_style,
    ring_all_reduce_us,
    split_two_servers,
)
from llmlab.course.check.ch09.tp_layer import tensor_parallel_layer
from llmlab.course.check.ch09.tp_split import (
    BUILDS,
    COLUMN_PARALLEL,
    DRIVERS,
    MAX_EXAMPLES,
    NORMS,
    PACKAGE_SEQUENCE,
    PLUG_MODEL,
    PLUG_PROMPT,
    PLUG_TOKENS,
    PLUG_WORLD,
    ROW_PARALLEL,
    TOLERANCE,
    layer_cases,
)

M = catalog("ch09")  # the chapter's texts, the catalog its modules read
