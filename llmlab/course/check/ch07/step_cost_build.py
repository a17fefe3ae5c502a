"""Chapter 07's build exercise, checked: the student's `step_cost` on drawn cases, then plugged into
the engine's steps beside the package's roofline; the chapter's exercises, read from its catalog."""

from __future__ import annotations

import functools
from typing import Any

from llmlab.analysis import roofline
from llmlab.config import ModelConfig
from llmlab.course.build import drive, find_counterexample
from llmlab.course.check.build_guard import refuse_build_answer
from llmlab.course.check.catalog import catalog
from llmlab.course.check.ch07.step_cost_cases import (
    ENGINE_STEPS_DRIVER,
    STEP_CASES,
    STEP_COST_DRIVER,
    _num,
    _package_costs,
    _same,
    _same_costs,
    _shape_problem,
    config_fields,
    step_cases,
    step_cost_hint,
)
from llmlab.course.check.core import (
    CheckResult,
    not_yet,
    passed,
)

M = catalog("ch07")


@functools.lru_cache(maxsize=1)
def engine_steps() -> tuple[ModelConfig, tuple[roofline.EngineStep, ...], int]:
    """SmolLM2-135M's real engine steps (cached per process, one model load per kernel): a
    prompt alone (prefill), then it decoding beside a prompt whose first 32 tokens it had
    cached and a fresh one (mixed), then all three decoding."""
    import torch

    from llmlab.engine.llm import LLM
    from llmlab.model import load_model
    from llmlab.sampling import SamplingParams

    model, _ = load_model("smollm2-135m")
    llm = LLM(model, max_model_len=128)
    first = list(range(1000, 1048))
    steps = roofline.record_engine_steps(
        llm,
        [first, first[:32] + list(range(2000, 2005)), list(range(3000, 3010))],
        SamplingParams(temperature=0, max_tokens=2, ignore_eos=True),
        arrive_at=[0, 1, 1],
    )
    return model.config, tuple(steps), torch.tensor([], dtype=model.dtype).element_size()


def _plugged_in(answer: Any) -> CheckResult:
    """The student's counter on the engine's real steps, through `roofline.engine_step`'s
    `step_cost`: its totals must equal the package's; the measured times are shown beside."""
    ex = "ch07.step_cost"
    cfg, steps, dtype_bytes = engine_steps()
    batches = [[list(p) for p in s.batch] for s in steps]
    try:
        mine = drive(answer, ENGINE_STEPS_DRIVER, config_fields(cfg), batches, dtype_bytes)
    except TimeoutError:
        raise
    except Exception as e:  # the student's code, on a step of the real engine
        problem = _shape_problem(type(e).__name__, str(e))
        if problem is not None:
            return not_yet(ex, M("plugged_in.engine_steps_shape", problem=problem))
        return not_yet(ex, M("plugged_in.engine_s_steps", e_type=type(e).__name__, e=e))
    hw = roofline.quick_roof("cpu")
    ridge = roofline.ridge_point(hw, "fp32")
    lines = [
        M(
            "plugged_in.measured_machine_quick",
            mem_bw=hw.mem_bw / 1000000000.0,
            flops=hw.flops('fp32') / 1000000000.0,
            ridge=ridge,
            name=cfg.name,
            n_steps=len(steps),
        )
    ]
    for i, (step, (flops, nbytes)) in enumerate(zip(steps, mine), 1):
        ref = roofline.engine_step(cfg, step.batch, dtype_bytes)
        shape = " ".join(f"{n}/{c}" for n, c in step.batch)
        if not (_same(flops, ref.flops) and _same(nbytes, ref.bytes)):
            return not_yet(
                ex,
                M(
                    "plugged_in.engine_s_step",
                    i=i,
                    kind=step.kind,
                    shape=shape,
                    flops=_num(flops),
                    nbytes=_num(nbytes),
                    ref_flops=_num(ref.flops),
                    bytes=_num(ref.bytes),
                ),
            )
        yours = roofline.place(roofline.Operation("", flops, nbytes), hw, "fp32")
        pkg = roofline.place(ref, hw, "fp32")
        lines.append(
            M(
                "plugged_in.step_i_kind",
                i=i,
                kind=step.kind,
                shape=shape,
                intensity=yours.op.intensity,
                time_floor=yours.time_floor * 1000.0,
                bound=yours.bound,
                op_intensity=pkg.op.intensity,
                value=pkg.time_floor * 1000.0,
                seconds=step.seconds * 1000.0,
            )
        )
    print("\n".join(lines))
    return passed(ex, M("plugged_in.counter_equals_package", n_steps=len(steps)))


def step_cost(answer: Any) -> CheckResult:
    """Build exercise: the student's `step_cost(cfg, batch, dtype_bytes)` -> {op: (flops, bytes)}
    against `costs.step_costs` on STEP_CASES drawn steps (the smallest disagreement shown), then
    plugged into `roofline.engine_step` on the real engine's steps of SmolLM2, measured."""
    ex = "ch07.step_cost"
    hint = M("step_cost.expected_function_step", answer_type=type(answer).__name__)
    refused = refuse_build_answer(ex, answer, hint=hint)
    if refused is not None:
        return refused
    cex = find_counterexample(
        step_cases(),
        lambda case: drive(answer, STEP_COST_DRIVER, case),
        _package_costs,
        max_examples=STEP_CASES,
        compare=_same_costs,
    )
    if cex is not None:
        return not_yet(ex, step_cost_hint(cex))
    return _plugged_in(answer)


EXERCISES = M.exercises()  # kind, source question, mistakes: the catalog's "exercises"
