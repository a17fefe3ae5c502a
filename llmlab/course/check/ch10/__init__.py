"""Self-checks of chapter 10 (serving metrics): TPOT of one request, mean TPOT when a request has
a single token, TTLT from TTFT and TPOT, goodput under an SLO, what burstiness does to arrivals
(the arrival explorer's task), the largest batch an H100 can run under a TPOT target (the serving
explorer's task), cost per million tokens, the source chapter's self-check question 4 (which
metric matters for chat, batch jobs, code completion), and the build exercise: the metrics
computed from a raw trace by the student's own function (`metrics_from_trace`)."""

# The chapter's names are its modules' (a notebook calls `ch10.<name>`): imported to be read here.
# ruff: noqa: F401

from __future__ import annotations

from llmlab.course.check.catalog import catalog
from llmlab.course.check.ch10.metrics_build import (
    PROBE,
    RECORD_ARRIVALS,
    RECORD_PROMPTS,
    RECORD_TOKENS,
    metrics_from_trace,
)
from llmlab.course.check.ch10.questions import (
    BURSTINESS_MISSED,
    BURSTINESS_STATEMENTS,
    BURSTINESS_TRUE,
    BURSTINESS_WHY_WRONG,
    COST_PRICE_PER_HOUR,
    COST_SELL_PER_MILLION,
    EXERCISES,
    GOODPUT_DURATION,
    GOODPUT_SLO,
    GOODPUT_TIMELINES,
    MEAN_TIMELINES,
    Q4_ACCEPT,
    Q4_HINTS,
    Q4_KEYS,
    Q4_METRICS,
    Q4_WHY_WRONG,
    SLO_CONTEXT,
    SLO_DTYPE_BYTES,
    SLO_HARDWARE,
    SLO_MODEL,
    SLO_TPOT,
    TPOT_ARRIVAL,
    TPOT_TOKENS,
    TTLT_N,
    TTLT_TPOT,
    TTLT_TTFT,
    break_even_tokens_per_s,
    burstiness,
    goodput,
    largest_batch_under_slo,
    mean_tpot,
    source_q4,
    tpot,
    ttlt,
)
from llmlab.course.check.ch10.trace_cases import (
    BUILDS,
    DRIVER,
    MAX_EXAMPLES,
    METRIC_NAMES,
    STAT_NAMES,
)

M = catalog("ch10")  # the chapter's texts, the catalog its modules read
