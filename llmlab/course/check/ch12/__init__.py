"""Self-checks of chapter 12 (glossary and review): the generation loop of the source chapter's
question 1 drawn step by step with what each step does to the KV cache, glossary terms matched
across English and Chinese, the problem each vLLM technique answers, and serving symptoms traced to
their cause. The source chapter's five questions are checked by the chapters that teach them;
`SEED_QUESTIONS` says which checker covers which question, and chapter 12 calls them all.
`LEARNING_GOALS` lists, for each of the source chapter's four learning goals, the exercises across
the series that show it.

Where the KV cache is written and read, everywhere in this chapter: in the attention step of
every layer, as in `llmlab.model.Attention.forward` (and vLLM's attention backends): this step's
K and V are written into the cache (`reshape_and_cache`), then attention reads every cached K and
V. The projections only compute k and v; nothing else touches the cache."""

# The chapter's names are its modules' (a notebook calls `ch12.<name>`): imported to be read here.
# ruff: noqa: F401

from __future__ import annotations

from llmlab.course.check.catalog import catalog
from llmlab.course.check.ch12.fresh_cases import (
    Q2_DTYPE_BYTES,
    Q2_MODEL,
    Q2_TOKENS,
    Q3_BATCH,
    Q3_CONTEXT,
    Q3_GPU,
    Q3_KEYS,
    Q3_MODEL,
    Q4_CONTEXT,
    Q4_DEPLOYMENTS,
    Q4_GPU,
    Q4_MODEL,
    Q4_PRODUCTS,
    Q4_TPOT_TARGET_S,
    Q5_ACCEPTED,
    Q5_MECHANISMS,
    kv_gb_fresh_case,
    q3_fresh_case,
    q4_floors,
    q4_fresh_case,
    q5_fresh_case,
)
from llmlab.course.check.ch12.loop import (
    CACHE_MARKS,
    DECODE_STARTS_AT,
    LOOP_STEP_CHOICES,
    LOOP_STEPS,
    LOOP_WITH_CACHE,
    generation_loop_steps,
)
from llmlab.course.check.ch12.matching import (
    CAUSES,
    FIXES,
    GLOSSARY_CHOICES,
    GLOSSARY_QUIZ,
    LEARNING_GOALS,
    PROBLEMS,
    SYMPTOMS,
    glossary_match,
    symptoms,
    vllm_fixes,
)
from llmlab.course.check.ch12.questions import (
    EXERCISES,
    SEED_QUESTIONS,
)
from llmlab.course.check.ch12.vllm_reading import (
    BOTH_DO,
    VLLM_FEATURE_CHOICES,
    VLLM_ONLY,
    vllm_feature,
)

M = catalog("ch12")  # the chapter's texts, the catalog its modules read
