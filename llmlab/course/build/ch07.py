"""Drivers of chapter 07's build exercise, "the cost of one step": the student's
`step_cost(cfg, batch, dtype_bytes) -> {op: (flops, bytes)}`, run on a case the checker sends.

A case is plain data: (the model config's fields, the batch as (new_tokens, context) pairs,
dtype_bytes). The drivers rebuild the `ModelConfig`, call the student's counter and hand back
plain numbers; the checker compares them with `llmlab.analysis.costs.step_costs` in its own
process.
"""

from __future__ import annotations

from typing import Any, Callable

from llmlab.analysis import roofline
from llmlab.config import ModelConfig
from llmlab.i18n import tr


def _config(fields: dict) -> ModelConfig:
    return ModelConfig(**fields)


def _plain_costs(ops: Any) -> dict[str, list[float]]:
    """{op: [flops, bytes]} from what the student's counter returned; ValueError naming what
    is wrong with it."""
    if not isinstance(ops, dict):
        raise ValueError(
            tr(
                f"step_cost must return a dict {{op: (flops, bytes)}}, got {type(ops).__name__}",
                f"step_cost 必须返回 dict {{op: (flops, bytes)}}，你返回的是 {type(ops).__name__}",
            )
        )
    out: dict[str, list[float]] = {}
    for op, pair in ops.items():
        try:
            flops, nbytes = pair
            out[str(op)] = [float(flops), float(nbytes)]
        except (TypeError, ValueError):
            raise ValueError(
                tr(
                    f"step_cost's value for {op!r} must be a pair (flops, bytes), got {pair!r}",
                    f"step_cost 给 {op!r} 的值必须是一对 (flops, bytes)，你给的是 {pair!r}",
                )
            ) from None
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
