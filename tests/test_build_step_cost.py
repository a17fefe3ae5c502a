"""Chapter 07's build exercise, "the cost of one step": the notebook's solution passes its checker
(drawn steps, the engine's real steps through `roofline.engine_step`, the measured line); an
operation's rule comes from the second try; odd return values are named; the injection point and
the recorder are tested on their own; the grader's sandbox gives the same verdicts. The planted
bugs and their hints: tests/test_planted_bugs.py."""

from __future__ import annotations

import contextlib
import io
import runpy
from pathlib import Path

import pytest
from planted import ch07 as ch07_planted

from llmlab import i18n
from llmlab.analysis import costs, roofline
from llmlab.config import get_config, tiny_config
from llmlab.course.build import drive
from llmlab.course.check import ch07
from llmlab.course.instructor import answers, recheck

STEP_COST = ch07_planted.EXERCISES[0]  # the planted bugs: tests/planted/ch07.py
SOLUTION = STEP_COST.solution


def _planted(name: str) -> str:
    return STEP_COST.bug(name).source


def _function(source: str, tmp_path: Path, name: str = "answer"):
    """`step_cost` defined in `__main__` from a file (so that its source can be read and sent
    to the grader's sandbox, as a notebook's is)."""
    path = tmp_path / f"{name}.py"
    path.write_text(source, encoding="utf-8")
    return runpy.run_path(str(path), run_name="__main__")["step_cost"]


def _check(fn):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        result = ch07.step_cost(fn)
    return result, out.getvalue()


pytestmark = pytest.mark.usefixtures("first_try")  # each test: a first try, in English


# --------------------------------------------------------------------------- the package's counter


def test_solution_equals_the_package_counter_on_hand_picked_steps(tmp_path):
    fn = _function(SOLUTION, tmp_path)
    for name in ("smollm2-135m", "llama-3-70b", "qwen2.5-7b"):
        cfg = get_config(name)
        for batch in ([(1, 1)], [(1, 4096)] * 8, [(512, 512), (1, 100), (30, 230)]):
            assert {k: tuple(map(float, v)) for k, v in fn(cfg, batch, 2).items()} == (
                costs.step_costs(cfg, batch, 2)
            )


# --------------------------------------------------------------------------- hints in stages


def test_the_rule_of_the_operation_comes_from_the_second_try(tmp_path):
    fn = _function(_planted("lm_head_every_token"), tmp_path)
    first, _ = _check(fn)
    second, _ = _check(fn)
    rule = ch07.M.template(ch07.STEP_OP_HINTS["lm_head"])
    assert rule not in first.message and rule in second.message


def test_an_unanswered_or_raising_counter_is_not_yet(tmp_path):
    assert not _check(None)[0].passed
    assert "function" in _check(3)[0].message
    raising = _function(
        "def step_cost(cfg, batch, dtype_bytes):\n    raise KeyError('qkv')\n", tmp_path
    )
    result, _ = _check(raising)
    assert not result.passed and "raised KeyError" in result.message
    missing = _function(SOLUTION.replace('    ops["o_proj"]', '    # ops["o_proj"]'), tmp_path, "m")
    result, _ = _check(missing)
    assert (
        not result.passed
        and "o_proj" in result.message
        and "returned the operations" in result.message
    )


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_a_return_value_of_the_wrong_shape_is_named_in_the_language_in_use(tmp_path, lang):
    i18n.set_language(lang)
    listed = _function("def step_cost(cfg, batch, dtype_bytes):\n    return [1, 2]\n", tmp_path)
    result, _ = _check(listed)
    words = "must return a dict {op: (flops, bytes)}, got list" if lang == "en" else "必须返回 dict"
    assert not result.passed and words in result.message, result.message
    assert "StepCostShapeError" not in result.message and "kind" not in result.message
    single = _function(
        "def step_cost(cfg, batch, dtype_bytes):\n    return {'qkv_proj': 5}\n", tmp_path, "s"
    )
    result, _ = _check(single)
    words = (
        "value for 'qkv_proj' must be a pair" if lang == "en" else "给 'qkv_proj' 的值必须是一对"
    )
    assert not result.passed and words in result.message, result.message


# --------------------------------------------------------------------------- the injection point


def test_engine_step_uses_the_counter_it_is_given():
    calls = []

    def counting(cfg, batch, dtype_bytes):
        calls.append((cfg.name, list(batch), dtype_bytes))
        return costs.step_costs(cfg, batch, dtype_bytes)

    cfg = get_config("llama-3-8b")
    batch = [(1, 1024)] * 4 + [(256, 256)]
    op = roofline.engine_step(cfg, batch, 2, step_cost=counting)
    assert calls == [("llama-3-8b", batch, 2)]
    assert op.flops == sum(f for f, _ in costs.step_costs(cfg, batch, 2).values())
    assert op.details["ops"] == costs.step_costs(cfg, batch, 2)
    doubled = roofline.engine_step(
        cfg, batch, 2, step_cost=lambda c, b, d: {"all": (2 * op.flops, op.bytes)}
    )
    assert doubled.intensity == 2 * op.intensity
    with pytest.raises(ValueError, match="step_cost must return"):
        roofline.engine_step(cfg, batch, 2, step_cost=lambda c, b, d: None)


def test_record_engine_steps_keeps_each_steps_shape_on_a_tiny_model():
    import torch

    from llmlab.engine.llm import LLM
    from llmlab.model import LlamaModel
    from llmlab.sampling import SamplingParams

    torch.manual_seed(0)
    llm = LLM(LlamaModel(tiny_config()).eval(), max_model_len=64, attention_backend="torch")
    first = list(range(3, 39))  # 36 tokens: two full blocks of 16 to share
    steps = roofline.record_engine_steps(
        llm,
        [first, first[:32] + [50, 51, 52], [60, 61]],
        SamplingParams(temperature=0, max_tokens=2, ignore_eos=True),
        arrive_at=[0, 1, 1],
    )
    assert [s.batch for s in steps] == [((36, 36),), ((1, 37), (3, 35), (2, 2)), ((1, 36), (1, 3))]
    assert [s.kind for s in steps] == ["prefill", "mixed", "decode"]
    assert [s.sampled for s in steps] == [1, 3, 2] and all(s.seconds > 0 for s in steps)
    with pytest.raises(ValueError, match="arrive_at"):
        roofline.record_engine_steps(llm, [first], SamplingParams(max_tokens=1), arrive_at=[0, 1])


# --------------------------------------------------------------------------- plugged in, measured


@pytest.mark.slow
@pytest.mark.model
def test_solution_passes_predicts_the_engines_steps_and_prints_the_measured_line(tmp_path):
    fn = _function(SOLUTION, tmp_path)
    result, printed = _check(fn)
    assert result.passed, result.message
    cfg, steps, dtype_bytes = ch07.engine_steps()
    assert [s.kind for s in steps] == ["prefill", "mixed", "decode"]
    plugged = drive(
        fn,
        ch07.ENGINE_STEPS_DRIVER,
        ch07.config_fields(cfg),
        [[list(p) for p in s.batch] for s in steps],
        dtype_bytes,
    )
    package = [roofline.engine_step(cfg, s.batch, dtype_bytes) for s in steps]
    assert plugged == [[op.flops, op.bytes] for op in package]  # equal, not close
    assert "measured on this machine" in printed
    for i, (step, op) in enumerate(zip(steps, package), 1):
        line = next(ln for ln in printed.splitlines() if ln.strip().startswith(f"step {i} "))
        assert line.count(f"{op.intensity:.1f} FLOP/B") == 2 and "measured" in line, line
        assert step.kind in line


@pytest.mark.slow
@pytest.mark.model
def test_grader_sandbox_passes_the_solution_and_fails_a_planted_bug(tmp_path):
    verdicts = {}
    for name, source in (("solution", SOLUTION), ("bug", _planted("kv_with_query_heads"))):
        spec = answers.encode(_function(source, tmp_path, name))["__function__"]
        stand_in = recheck.SandboxedFunction(spec, timeout_s=60)
        try:
            verdicts[name] = _check(stand_in)[0]
        finally:
            stand_in.close()
    assert verdicts["solution"].passed, verdicts["solution"].message
    assert not verdicts["bug"].passed and "num_key_value_heads" in verdicts["bug"].message
