"""Self-checks of chapter 07 (roofline): the ridge point, the intensity of a batched decode
GEMV and of GQA decode attention, which roof a decode step sits under, the batch at which it
leaves the memory roof (the roofline explorer's task), and why context moves that batch.

Build exercise `step_cost`: the student counts the FLOPs and bytes of every operation of one
engine step; checked against `llmlab.analysis.costs.step_costs` on steps drawn with hypothesis,
then plugged into `roofline.engine_step` on the real engine's steps of SmolLM2 (measured)."""

# The chapter's names are its modules' (a notebook calls `ch07.<name>`): imported to be read here.
# ruff: noqa: F401

from __future__ import annotations

from llmlab.course.check.catalog import catalog
from llmlab.course.check.ch07.questions import (
    BOUND_BATCH,
    BOUND_CONTEXT,
    CROSSOVER_OPTIONS,
    CROSSOVER_WHY_WRONG,
    GEMV_BATCH,
    TASK_CONTEXT,
    TASK_HARDWARE,
    TASK_MODEL,
    attention_intensity,
    compute_bound_batch,
    decode_bound,
    decode_gemv_intensity,
    ridge_point,
    why_crossover_grows,
)
from llmlab.course.check.ch07.step_cost_build import EXERCISES, engine_steps, step_cost
from llmlab.course.check.ch07.step_cost_cases import (
    BUILDS,
    CONFIG_FIELDS,
    ENGINE_STEPS_DRIVER,
    LINEAR_OPS,
    SHAPE_PROBLEMS,
    SHOWN_OPS,
    STEP_CASES,
    STEP_COST_DRIVER,
    STEP_COST_MISTAKES,
    STEP_OP_HINTS,
    config_fields,
    describe_step,
    step_cases,
    step_cost_hint,
)

M = catalog("ch07")  # the chapter's texts, the catalog its modules read
