"""Chapter 08's new exercises: right answers pass, each wrong one gets its own hint (the
formula only from the second wrong try), and the declared exercises match the module."""

from __future__ import annotations

from llmlab.course.check import ch08, core
from llmlab.course.widgets.batching import batching_results


def test_exercises_table_names_the_module_functions():
    assert set(ch08.EXERCISES) == {
        "source_q3",
        "why_cpu_falls_short",
        "continuous_mean_latency",
        "saturating_max_batch",
        "build_scheduler",
        "why_continuous",
    }
    assert all(callable(getattr(ch08, name)) for name in ch08.EXERCISES)
    assert ch08.EXERCISES["source_q3"].source_question == 3
    assert sum(i.kind == "reasoning" for i in ch08.EXERCISES.values()) >= 2


def test_source_q3_declares_its_numbers_and_stages_its_formula():
    ch08.source_q3(None)
    exp = ch08.questions._q3_expected()
    assert core.expected_values("ch08.source_q3") == [
        exp["step_ms_batch1"],
        exp["step_ms_batch32"],
        exp["throughput_ratio"],
    ]
    wrong = dict(exp, step_ms_batch32=exp["step_ms_batch32"] * 1.5)
    core._WRONG_TRIES.pop("ch08.source_q3", None)
    first, second = ch08.source_q3(wrong), ch08.source_q3(wrong)
    assert not first and "FLOPs" not in first.message
    assert not second and "FLOPs" in second.message


def test_why_cpu_falls_short_accepts_both_defensible_answers():
    assert ch08.why_cpu_falls_short("c") and ch08.why_cpu_falls_short(" E ")
    for letter in set(ch08.CPU_OPTIONS) - ch08.CPU_RIGHT:
        r = ch08.why_cpu_falls_short(letter)
        assert not r and r.message.startswith(ch08.CPU_WHY_WRONG[letter])
    assert "one letter" in ch08.why_cpu_falls_short("z").message
    assert "not answered" in ch08.why_cpu_falls_short(None).message


def test_saturating_max_batch_is_where_continuous_throughput_stops_growing():
    curve = ch08.saturation_curve()
    best = max(curve.values())
    answer = min(b for b, t in curve.items() if t == best)
    assert 1 < answer < ch08.WIDGET_MAX_BATCH
    assert curve[answer - 1] < best
    # beyond it the schedule is the same: no cap binds
    a = batching_results(arrival_rate=ch08.WIDGET_ARRIVAL_RATE, max_batch=answer)["continuous"]
    b = batching_results(arrival_rate=ch08.WIDGET_ARRIVAL_RATE, max_batch=ch08.WIDGET_MAX_BATCH)[
        "continuous"
    ]
    assert a.step_batch == b.step_batch
    assert ch08.saturating_max_batch(answer)
    assert "every request" in ch08.saturating_max_batch(24).message
    core._WRONG_TRIES.pop("ch08.saturating_max_batch", None)  # a fresh student
    first, second = ch08.saturating_max_batch(answer + 3), ch08.saturating_max_batch(answer + 3)
    assert "Once the cap" not in first.message and "Once the cap" in second.message
