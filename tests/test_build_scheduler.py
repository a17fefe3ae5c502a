"""The scheduler's build exercises: chapter 08's continuous-batching step (`MyScheduler.schedule`)
and chapter 11's chunked prefill (`plan_step`). The instructor's solution (read from the
notebook's skeleton cell) passes its checker; planted bugs fail with a shrunk case whose hint names
the broken rule, in English and in Chinese; the engine's `scheduler_cls` injection point is
tested on its own; the grader's sandbox and `python -m llmlab check` reach the same verdicts."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from llmlab import i18n
from llmlab.course.check import ch08, ch11
from llmlab.engine import LLMEngine, Scheduler
from llmlab.model import tiny_model

ROOT = Path(__file__).resolve().parents[1]


def _solution(stem: str, cell_id: str) -> str:
    """The skeleton cell of the notebook with its solution in (markers dropped)."""
    nb = nbformat.read(ROOT / "notebooks" / f"{stem}.ipynb", as_version=4)
    source = next(c.source for c in nb.cells if c.id == cell_id)
    return "\n".join(
        line
        for line in source.splitlines()
        if "BEGIN SOLUTION" not in line and "END SOLUTION" not in line
    )


SCHED_SOLUTION = _solution("08-batching", "b08-skeleton")
PLAN_SOLUTION = _solution("11-vllm-arrives", "b11-skeleton")


def _planted(source: str, *pairs: str) -> str:
    for old, new in zip(pairs[::2], pairs[1::2]):
        assert old in source, old
        source = source.replace(old, new, 1)
    return source


def _waiting_first(source: str) -> str:
    """Waiting requests admitted before the running ones are served (decodes not first)."""
    a = source.index("        for req in list(running):")
    b = source.index("        while not out.preempted")
    c = source.index("        self.record_step(out)")
    running, waiting = source[a:b], source[b:c]
    waiting = "        old = list(running)\n" + waiting.replace(
        "while not out.preempted and ", "while "
    )
    return (
        source[:a]
        + waiting
        + running.replace("for req in list(running):", "for req in old:")
        + source[c:]
    )


SCHED_BUGS = {
    "waiting_first": _waiting_first(SCHED_SOLUTION),
    "oldest_preempted": _planted(
        SCHED_SOLUTION,
        "                self.preempt(running.pop(), out)",  # the code's line, not the docstring's
        "                self.preempt(running.pop(0), out)",
    ),
    "max_num_seqs_ignored": _planted(SCHED_SOLUTION, " and len(running) < self.max_num_seqs:", ":"),
    "budget_not_decreased": _planted(
        SCHED_SOLUTION,
        "            budget -= num_new\n        self.record_step",
        "        self.record_step",
    ),
}
# (English words, Chinese words) the hint must hold: the step and the broken rule
SCHED_HINTS = {
    "waiting_first": (["at step", "running requests come first"], ["第", "运行中的请求优先"]),
    "oldest_preempted": (["at step", "newest running request"], ["第", "最新的运行中请求"]),
    "max_num_seqs_ignored": (["at step 1", "max_num_seqs"], ["第 1 步", "max_num_seqs"]),
    "budget_not_decreased": (
        ["at step 1", "over the token budget"],
        ["第 1 步", "超出了 token 预算"],
    ),
}

PLAN_BUGS = {
    "whole_prompt": _planted(
        PLAN_SOLUTION,
        "        n = min(left, budget)",
        "        n = left if (request_id, left) in waiting else min(left, budget)",
    ),
    "decodes_not_counted": _planted(
        PLAN_SOLUTION,
        "    plan = []\n",
        "    plan, full = [], budget\n",
        "        n = min(left, budget)",
        "        n = min(left, full) if (request_id, left) in waiting else min(left, budget)",
    ),
    "zero_chunk": _planted(PLAN_SOLUTION, "        if budget == 0:\n            break\n", ""),
    "prefill_first": _planted(PLAN_SOLUTION, "running + waiting", "waiting + running"),
}
PLAN_HINTS = {
    "whole_prompt": (["your plan", "cut into a chunk"], ["你的计划", "切成"]),
    "decodes_not_counted": (["your plan", "over the budget"], ["你的计划", "超出了预算"]),
    "zero_chunk": (["your plan", "0 tokens"], ["你的计划", "0 个 token"]),
    "prefill_first": (["your plan", "decodes first"], ["你的计划", "decode 优先"]),
}


def _define(source: str, name: str):
    namespace: dict = {"__name__": "__main__"}
    exec(compile(source, f"<{name}>", "exec"), namespace)
    return namespace[name]


@pytest.fixture
def english():
    i18n.set_language("en")
    yield
    i18n.set_language("en")


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


def test_sched_solution_passes_with_the_measured_line(english):
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


@pytest.mark.parametrize("lang", ["en", "zh"])
@pytest.mark.parametrize("bug", sorted(SCHED_BUGS))
def test_sched_planted_bug_fails_with_a_shrunk_case_naming_the_rule(bug, lang, english):
    i18n.set_language(lang)
    result = ch08.build_scheduler(_define(SCHED_BUGS[bug], "MyScheduler"))
    assert not result.passed
    words = SCHED_HINTS[bug][lang == "zh"]
    assert all(w in result.message for w in words), result.message
    assert ("requests A" if lang == "en" else "请求 A") in result.message  # the shrunk case


def test_sched_unanswered_and_wrong_types_are_not_yet(english):
    assert not ch08.build_scheduler(None)
    assert "Scheduler" in ch08.build_scheduler(42).message


# ---- chapter 11 ------------------------------------------------------------------------------


def test_plan_solution_passes_with_the_chapters_five_steps(english):
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


@pytest.mark.parametrize("lang", ["en", "zh"])
@pytest.mark.parametrize("bug", sorted(PLAN_BUGS))
def test_plan_planted_bug_fails_with_a_shrunk_case_naming_the_rule(bug, lang, english):
    i18n.set_language(lang)
    result = ch11.build_chunked_prefill(_define(PLAN_BUGS[bug], "plan_step"))
    assert not result.passed
    words = PLAN_HINTS[bug][lang == "zh"]
    assert all(w in result.message for w in words), result.message


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
def test_sandbox_passes_the_solutions_and_fails_a_planted_bug(tmp_path, english):
    assert ch08.build_scheduler(_sandboxed(SCHED_SOLUTION, "MyScheduler", tmp_path)).passed
    bad = ch08.build_scheduler(_sandboxed(SCHED_BUGS["oldest_preempted"], "MyScheduler", tmp_path))
    assert not bad.passed and "newest running request" in bad.message
    assert ch11.build_chunked_prefill(_sandboxed(PLAN_SOLUTION, "plan_step", tmp_path)).passed
    bad = ch11.build_chunked_prefill(_sandboxed(PLAN_BUGS["zero_chunk"], "plan_step", tmp_path))
    assert not bad.passed and "0 tokens" in bad.message


@pytest.mark.slow
@pytest.mark.parametrize(
    "chapter, source, code",
    [
        ("ch08", SCHED_SOLUTION, 0),
        ("ch08", SCHED_BUGS["budget_not_decreased"], 1),
        ("ch11", PLAN_SOLUTION, 0),
        ("ch11", PLAN_BUGS["prefill_first"], 1),
    ],
    ids=["ch08-solution", "ch08-bug", "ch11-solution", "ch11-bug"],
)
def test_check_command_exits_0_for_a_solution_and_1_for_a_bug(tmp_path, chapter, source, code):
    path = tmp_path / "answer.py"
    path.write_text(source)
    run = subprocess.run(
        [sys.executable, "-m", "llmlab", "check", chapter, str(path)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**__import__("os").environ, "LLMLAB_LANG": "en", "PYTHONPATH": str(ROOT)},
    )
    assert run.returncode == code, run.stdout + run.stderr
    assert ("PASS" if code == 0 else "NOT YET") in run.stdout
