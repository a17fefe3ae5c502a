"""Self-checks of chapter 08 (batching): the source chapter's self-check question 3 (batch 32
gives nearly 32× the throughput at nearly the same step time), why a CPU falls short of it,
continuous against static batching on a small trace, the max batch beyond which the batching
simulator's traffic gains nothing (the widget's task), and why continuous batching wins."""

# The chapter's names are its modules' (a notebook calls `ch08.<name>`): imported to be read here.
# ruff: noqa: F401

from __future__ import annotations

from llmlab.course.check.catalog import catalog
from llmlab.course.check.ch08.questions import (
    CPU_OPTIONS,
    CPU_RIGHT,
    CPU_WHY_WRONG,
    EXERCISES,
    Q3_CONTEXT,
    Q3_HW,
    Q3_KEYS,
    Q3_MODEL,
    TRACE_MAX_BATCH,
    TRACE_OUTPUTS,
    WHY_HINTS,
    WHY_OPTIONS,
    WIDGET_ARRIVAL_RATE,
    WIDGET_MAX_BATCH,
    continuous_mean_latency,
    saturating_max_batch,
    saturation_curve,
    source_q3,
    why_continuous,
    why_cpu_falls_short,
)
from llmlab.course.check.ch08.scheduler_build import (
    BUILD_DRIVERS,
    BUILD_MAX_EXAMPLES,
    BUILDS,
    BUILT_CASES,
    PREEMPT_CASE,
    PREEMPT_WORKLOAD,
    READMIT_CASE,
    build_measurement,
    build_scheduler,
    schedule_cases,
    schedule_hint,
)

M = catalog("ch08")  # the chapter's texts, the catalog its modules read
