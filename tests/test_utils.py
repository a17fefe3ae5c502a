"""`llmlab.utils`: the one table formatter and the one best-of timer (and the small helpers)."""

from __future__ import annotations

import itertools

import pytest

from llmlab.utils import best_of, format_table, width

# ---- format_table -------------------------------------------------------------------------------


def test_a_label_column_left_and_number_columns_right():
    text = format_table([["llmlab", 12.5, 3], ["hf", 1.25, 100]], ["system", "tok/s", "n"])
    assert text.splitlines() == [
        "system  tok/s    n",
        "------  -----  ---",
        "llmlab   12.5    3",
        "hf       1.25  100",
    ]


def test_align_letters_per_column_the_last_repeating():
    rows = [["a", "b", "c"], ["long", "longer", "longest"]]
    assert format_table(rows, align="r").splitlines() == [
        "   a       b        c",
        "long  longer  longest",
    ]
    assert format_table(rows, align="rl").splitlines() == [
        "   a  b       c",
        "long  longer  longest",
    ]


def test_chinese_cells_take_two_columns_and_still_line_up():
    text = format_table([["块", 1], ["block", 22]], ["名字", "数"], align="lr")
    lines = text.splitlines()
    # every line is as wide on screen as the header line, although their lengths differ
    assert {width(line) for line in lines} == {width(lines[0])}
    assert len(lines[0]) != len(lines[2])
    assert lines[1] == "-----  --"
    assert lines[2] == "块      1"  # 块 is two columns: 3 spaces pad it to 5, then sep and " 1"


def test_no_line_ends_in_spaces_and_rule_and_sep_are_honoured():
    text = format_table(
        [["x", "a"], ["yyyy", "bbbb"]], ["k", "v"], align="l", rule=False, sep=" : "
    )
    assert text.splitlines() == ["k    : v", "x    : a", "yyyy : bbbb"]
    assert not any(line.endswith(" ") for line in text.splitlines())


def test_rows_without_headers_and_no_rows():
    assert format_table([["a", 1]]) == "a  1"
    assert format_table([]) == ""
    assert format_table([], ["a", "b"]) == "a  b\n-  -"


@pytest.mark.parametrize(
    ("rows", "headers", "align", "match"),
    [
        ([["a", 1], ["b"]], None, "lr", "2 cells"),
        ([["a", 1]], ["only"], "lr", "1 cells"),
        ([["a", 1]], None, "lc", "align"),
        ([["a", 1]], None, "", "align"),
    ],
)
def test_bad_tables_are_refused_naming_the_problem(rows, headers, align, match):
    with pytest.raises(ValueError, match=match):
        format_table(rows, headers, align=align)


# ---- best_of ------------------------------------------------------------------------------------


class FakeClock:
    """A clock that `fn` advances by the durations given, one per call."""

    def __init__(self, durations):
        self.now = 0.0
        self.durations = iter(durations)
        self.calls = 0

    def __call__(self) -> float:
        return self.now

    def fn(self) -> None:
        self.calls += 1
        self.now += next(self.durations)


def test_best_of_returns_the_fastest_timed_call():
    clock = FakeClock([0.5, 0.3, 0.9, 0.4])
    assert best_of(clock.fn, repeats=4, clock=clock) == pytest.approx(0.3)
    assert clock.calls == 4


def test_warmup_calls_are_not_timed():
    clock = FakeClock([0.01, 0.5, 0.4])  # the warm-up is the fastest and must not count
    assert best_of(clock.fn, repeats=2, warmup=1, clock=clock) == pytest.approx(0.4)
    assert clock.calls == 3


def test_a_budget_stops_after_the_call_that_spends_it():
    clock = FakeClock(itertools.repeat(0.4))
    assert best_of(clock.fn, repeats=100, budget_s=1.0, clock=clock) == pytest.approx(0.4)
    assert clock.calls == 3  # 0.4, 0.8, 1.2 > 1.0: stop
    one = FakeClock([5.0, 0.1])
    assert best_of(one.fn, repeats=2, budget_s=1.0, clock=one) == 5.0  # the first always runs


def test_sync_runs_after_each_call_inside_the_timing():
    clock = FakeClock([0.2, 0.2, 0.2])
    synced = []

    def sync():
        synced.append(clock.calls)
        clock.now += 0.1  # waiting for the device counts

    assert best_of(clock.fn, repeats=2, warmup=1, sync=sync, clock=clock) == pytest.approx(0.3)
    assert synced == [1, 2, 3]


def test_best_of_times_real_calls():
    assert 0 <= best_of(lambda: sum(range(100)), repeats=2) < 1


@pytest.mark.parametrize(
    "kwargs", [{"repeats": 0}, {"repeats": 1.5}, {"warmup": -1}, {"budget_s": -1.0}]
)
def test_best_of_refuses_bad_arguments(kwargs):
    with pytest.raises(ValueError):
        best_of(lambda: None, **kwargs)
