"""The scheduler's build exercises: chapter 08's continuous-batching step (`MyScheduler.schedule`)
and chapter 11's chunked prefill (`plan_step`). The instructor's solution passes with its measured
line and is token-identical in the engine; the cases built to preempt do preempt; the engine's
`scheduler_cls` injection point is tested on its own; the grader's sandbox reaches the same
verdicts. The planted bugs and their hints: tests/test_planted_bugs.py."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from planted import ch08 as ch08_planted
from planted import ch11 as ch11_planted

from llmlab.course.check import ch08, ch11
from llmlab.engine import LLMEngine, Scheduler
from llmlab.model import tiny_model

SCHED = ch08_planted.EXERCISES[0]
PLAN = next(ex for ex in ch11_planted.EXERCISES if ex.id == "ch11.build_chunked_prefill")
SCHED_SOLUTION, PLAN_SOLUTION = SCHED.solution, PLAN.solution


def _define(source: str, name: str):
    namespace: dict = {"__name__": "__main__"}
    exec(compile(source, f"<{name}>", "exec"), namespace)
    return namespace[name]


# ---- the injection point ---------------------------------------------------------------------


class CountingScheduler(Scheduler):
    calls = 0

    def schedule(self):
        type(self).calls += 1
        return super().schedule()


def _engine(**kwargs) -> LLMEngine:
    return LLMEngine(
        tiny_model(seed=3), None, attention_backend="torch", max_model_len=64, **kwargs
    )


def test_engine_builds_and_steps_the_scheduler_class_it_is_given():
    from llmlab import SamplingParams

    CountingScheduler.calls = 0
    engine = _engine(scheduler_cls=CountingScheduler, max_num_seqs=2)
    assert type(engine.scheduler) is CountingScheduler
    engine.add_request("a", [5, 6, 7], SamplingParams(temperature=0.0, max_tokens=3))
    while engine.has_unfinished_requests():
        engine.step()
    assert CountingScheduler.calls >= 3 and engine.stats()["steps"] == CountingScheduler.calls
    assert type(_engine().scheduler) is Scheduler  # the default


def test_a_class_with_the_interface_is_accepted_and_anything_else_names_scheduler_cls():
    class Duck:
        def __init__(self, kv, **kwargs):
            self.inner = Scheduler(kv, **kwargs)

        def __getattr__(self, name):
            return getattr(self.inner, name)

        def add_request(self, r):
            self.inner.add_request(r)

        def schedule(self):
            return self.inner.schedule()

        def update_from_output(self, *a):
            return self.inner.update_from_output(*a)

        def finish_request(self, *a):
            return self.inner.finish_request(*a)

        def has_unfinished_requests(self):
            return self.inner.has_unfinished_requests()

    assert isinstance(_engine(scheduler_cls=Duck).scheduler, Duck)
    for bad in (
        Scheduler(None, max_num_seqs=1, max_num_batched_tokens=1, max_model_len=1),
        int,
        "x",
    ):
        with pytest.raises(ValueError, match="scheduler_cls"):
            _engine(scheduler_cls=bad)
    with pytest.raises(ValueError, match="scheduler_cls.*speculative_config"):
        _engine(
            scheduler_cls=CountingScheduler,
            speculative_config={"method": "ngram", "num_speculative_tokens": 2},
        )


# ---- chapter 08 ------------------------------------------------------------------------------


def test_sched_solution_passes_with_the_measured_line(first_try):
    result = ch08.build_scheduler(_define(SCHED_SOLUTION, "MyScheduler"))
    assert result.passed, result.message
    assert "same tokens as the package's scheduler" in result.message
    m = re.search(
        r"takes (\d+) steps continuous, (\d+) static.*the package's (\d+) and (\d+)", result.message
    )
    assert m and m[1] == m[3] and m[2] == m[4] and int(m[1]) < int(m[2]), result.message


def test_sched_solution_is_token_identical_in_the_engine_under_preemption():
    from llmlab.course.build.ch08 import run_engine

    mine = run_engine(_define(SCHED_SOLUTION, "MyScheduler"), ch08.PREEMPT_WORKLOAD)
    ref = run_engine(Scheduler, ch08.PREEMPT_WORKLOAD)
    assert ref["preemptions"] > 0 and ref["finished"]
    assert mine["tokens"] == ref["tokens"] and mine["steps"] == ref["steps"]


def test_the_cases_built_to_preempt_do_preempt_and_are_tried_first():
    from llmlab.course.build.ch08 import observe_schedule

    for case in ch08.BUILT_CASES:
        steps = observe_schedule(Scheduler, case)
        assert any(step.get("preempted") for step in steps), case
    # at READMIT_CASE's preempting step the package's scheduler leaves room it does not use:
    # budget and a free block, which only the rule "no admission after a preemption" leaves idle
    step = next(s for s in observe_schedule(Scheduler, ch08.READMIT_CASE) if s["preempted"])
    budget_used = sum(n for _, n in step["scheduled"])
    assert budget_used < ch08.READMIT_CASE["budget"] and step["preempted"] == ["B"]


def test_sched_unanswered_and_wrong_types_are_not_yet(first_try):
    assert not ch08.build_scheduler(None)
    assert "Scheduler" in ch08.build_scheduler(42).message


# ---- chapter 11 ------------------------------------------------------------------------------


def test_plan_solution_passes_with_the_chapters_five_steps(first_try):
    result = ch11.build_chunked_prefill(_define(PLAN_SOLUTION, "plan_step"))
    assert result.passed, result.message
    assert "in 5 steps" in result.message and "the chapter predicted 5" in result.message
    m = re.search(r"in (\d+) steps to its (\d+)", result.message)
    assert m and m[1] == m[2]


def test_plan_solution_is_token_identical_to_enable_chunked_prefill():
    from llmlab.course.build.ch11_chunk import run_engine

    mine = run_engine(_define(PLAN_SOLUTION, "plan_step"), ch11.CHUNK_ENGINE_WORKLOAD)
    ref = run_engine(None, ch11.CHUNK_ENGINE_WORKLOAD)
    assert ref["finished"] and mine["tokens"] == ref["tokens"] and mine["steps"] == ref["steps"]


def test_a_build_exercise_counts_as_coding_in_the_reading_time():
    from llmlab.course.instructor.reading_time import exercise_kind

    assert exercise_kind("ch08.build_scheduler", "answer = MyScheduler\n") == "coding"
    assert exercise_kind("ch11.build_chunked_prefill", "answer = plan_step\n") == "coding"
    assert exercise_kind("ch08.source_q3", "answer = {}\n") == "plug-in"


# ---- the grader's sandbox and the command line -----------------------------------------------


def _sandboxed(source: str, name: str, tmp_path: Path):
    import runpy

    from llmlab.course.instructor import answers, recheck

    path = tmp_path / f"{name}_{abs(hash(source))}.py"
    path.write_text(source)
    value = runpy.run_path(str(path), run_name="__main__")[name]
    return recheck.SandboxedFunction(answers.encode(value)["__function__"], timeout_s=60)


@pytest.mark.slow
def test_sandbox_passes_the_solutions_and_fails_a_planted_bug(tmp_path, first_try):
    assert ch08.build_scheduler(_sandboxed(SCHED_SOLUTION, "MyScheduler", tmp_path)).passed
    bad = ch08.build_scheduler(
        _sandboxed(SCHED.bug("oldest_preempted").source, "MyScheduler", tmp_path)
    )
    assert not bad.passed and "newest running request" in bad.message
    assert ch11.build_chunked_prefill(_sandboxed(PLAN_SOLUTION, "plan_step", tmp_path)).passed
    bad = ch11.build_chunked_prefill(
        _sandboxed(PLAN.bug("zero_chunk").source, "plan_step", tmp_path)
    )
    assert not bad.passed and "0 tokens" in bad.message
