"""Drivers of chapter 07's build exercise, "the cost of one step": the student's
`step_cost(cfg, batch, dtype_bytes) -> {op: (flops, bytes)}`, run on a case the checker sends.

A case is plain data: (the model config's fields, the batch as (new_tokens, context) pairs,
dtype_bytes). The drivers rebuild the `ModelConfig`, call the student's counter and hand back
plain numbers; the checker compares them with `llmlab.analysis.costs.step_costs` in its own
process.
"""

from __future__ import annotations

import json
from typing import Any, Callable

from llmlab.analysis import roofline
from llmlab.config import ModelConfig


def _config(fields: dict) -> ModelConfig:
    return ModelConfig(**fields)


class StepCostShapeError(ValueError):
    """The counter returned something other than {op: (flops, bytes)}. Its message is the kind of
    problem and its values, as JSON: it reaches the checker as text (from the grader's sandbox
    too), and the checker words it in the language in use (`check.ch07.SHAPE_PROBLEMS`)."""

    def __init__(self, kind: str, **values: str) -> None:
        super().__init__(json.dumps({"kind": kind, **values}))


def _plain_costs(ops: Any) -> dict[str, list[float]]:
    """{op: [flops, bytes]} from what the student's counter returned; StepCostShapeError naming
    what is wrong with it."""
    if not isinstance(ops, dict):
        raise StepCostShapeError("not_a_dict", got=type(ops).__name__)
    out: dict[str, list[float]] = {}
    for op, pair in ops.items():
        try:
            flops, nbytes = pair
            out[str(op)] = [float(flops), float(nbytes)]
        except (TypeError, ValueError):
            raise StepCostShapeError("not_a_pair", op=repr(op), got=repr(pair)) from None
    return out


def observe_step_cost(step_cost: Callable, case: tuple) -> dict[str, list[float]]:
    """The student's counts of one case: {op: [flops, bytes]}."""
    fields, batch, dtype_bytes = case
    return _plain_costs(step_cost(_config(fields), [tuple(p) for p in batch], dtype_bytes))


def predict_engine_steps(
    step_cost: Callable, fields: dict, batches: list, dtype_bytes: float
) -> list[list[float]]:
    """[flops, bytes] of each of the engine's recorded steps, counted by the student's counter
    plugged into `roofline.engine_step` (its `step_cost` injection point)."""
    cfg = _config(fields)
    ops = [
        roofline.engine_step(
            cfg,
            [tuple(p) for p in batch],
            dtype_bytes,
            step_cost=lambda c, b, d: _plain_costs(step_cost(c, b, d)),
        )
        for batch in batches
    ]
    return [[op.flops, op.bytes] for op in ops]
