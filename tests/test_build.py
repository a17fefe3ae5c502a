"""The build exercises' framework: the smallest disagreeing case is found, a class the notebook
defines reaches the grader's sandbox intact, only the package's drivers run there, and
`python -m llmlab check` runs only a notebook's definition cells."""

from __future__ import annotations

import json
import linecache
import time
from pathlib import Path

import nbformat
import pytest
from hypothesis import strategies as st
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook
from planted import ch14 as planted_ch14

from llmlab.course.build import Raised, drive, find_counterexample, resolve_driver
from llmlab.course.check import cli
from llmlab.course.instructor.answers import AnswerFormatError, build_function, encode


def test_a_disagreement_is_shrunk_to_the_smallest_case():
    # dropping duplicates is wrong only when a value repeats: the smallest such list is [0, 0]
    cex = find_counterexample(
        st.lists(st.integers(0, 9)), lambda xs: sorted(set(xs)), sorted, max_examples=80
    )
    assert cex is not None
    assert cex.case == [0, 0]
    assert (cex.got, cex.expected) == ([0], [0, 0])


def test_agreement_gives_no_counterexample_and_the_run_is_reproducible():
    seen: list[list[list[int]]] = [[], []]
    for run in seen:
        cex = find_counterexample(
            st.lists(st.integers(0, 9), max_size=5),
            lambda xs, run=run: run.append(list(xs)) or sorted(xs),
            sorted,
            max_examples=20,
        )
        assert cex is None
    assert seen[0] == seen[1] and len(seen[0]) >= 10


def test_an_exception_is_what_the_piece_did_and_a_timeout_stops_at_once():
    def fragile(xs):
        if len(xs) > 2:
            raise IndexError("list too long")
        return sorted(xs)

    cex = find_counterexample(st.lists(st.integers(0, 3)), fragile, sorted)
    assert cex is not None and len(cex.case) == 3
    assert cex.got == Raised("IndexError", "list too long")

    calls = []

    def slow(xs):
        calls.append(xs)
        raise TimeoutError("your function ran longer than 1 s in all")

    cex = find_counterexample(st.lists(st.integers(0, 3)), slow, sorted, max_examples=50)
    assert cex is not None and cex.got.error == "TimeoutError"
    assert len(calls) == 1  # nothing more is sent to a dead stand-in


def test_a_bug_in_the_reference_is_not_blamed_on_the_student():
    with pytest.raises(ZeroDivisionError):
        find_counterexample(st.integers(0, 3), lambda x: x, lambda x: 1 // 0, max_examples=5)


CELL = '''
import collections

class Base:
    def hello(self):
        return "base"

class Pool(Base):
    """Blocks handed out from the head of a queue."""
    FIRST = 0

    def __init__(self, n):
        self.free = collections.deque(range(self.FIRST, n))

    def take(self):
        return self.free.popleft() + OFFSET

    def hello(self):
        return super().hello() + " and pool"
'''


def _define_in_a_cell(source: str, filename: str) -> dict:
    """What IPython does with a cell: its text kept in linecache, its code run in __main__."""
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    ns = {"__name__": "__main__", "OFFSET": 10}
    exec(compile(source, filename, "exec"), ns)
    return ns


def test_a_class_defined_in_a_cell_travels_by_its_source_with_what_it_uses():
    ns = _define_in_a_cell(CELL, "/tmp/ipykernel_0/cell-17.py")
    spec = encode(ns["Pool"])["__function__"]
    assert spec["name"] == "Pool" and spec["source"].startswith("class Pool(Base):")
    assert {"Base", "OFFSET", "collections"} <= set(spec["globals"])
    Pool = build_function(spec)  # in a fresh namespace, as the sandbox does
    pool = Pool(3)
    assert [pool.take(), pool.take()] == [10, 11]
    assert pool.hello() == "base and pool"  # super() works: the class statement ran whole


def test_a_class_whose_source_cannot_be_found_is_refused_with_a_reason():
    Bare = type("Bare", (), {"__module__": "__main__"})
    with pytest.raises(AnswerFormatError, match="class Bare"):
        encode(Bare)


@pytest.mark.parametrize(
    "name",
    [
        "os:system",
        "llmlab.course.check.core:passed",
        "llmlab.course.build.core",
        "llmlab.course.build.core:DRIVER_PREFIX",
        "llmlab.course.buildx:anything",
        "llmlab.course.build.core:importlib",  # a module reached through a driver module
    ],
)
def test_only_the_package_s_drivers_can_be_named(name):
    with pytest.raises(ValueError, match="driver"):
        resolve_driver(name)


def test_drive_calls_the_driver_here_or_asks_the_stand_in():
    class StandIn:
        grader_stand_in = True

        def drive(self, driver, *args, **kwargs):
            return ("sandbox", driver, args, kwargs)

    assert drive(StandIn(), "llmlab.course.build.x:y", 1, k=2) == (
        "sandbox",
        "llmlab.course.build.x:y",
        (1,),
        {"k": 2},
    )
    with pytest.raises(ValueError, match="driver"):
        drive(sorted, "builtins:print", [1])


def test_check_runs_only_a_notebook_s_definition_cells(tmp_path):
    marker = tmp_path / "ran"
    nb = new_notebook(
        cells=[
            new_markdown_cell("# a chapter"),
            new_code_cell("import math\n\ndef double(x):\n    return 2 * x"),
            new_code_cell(f"open({str(marker)!r}, 'w').write('x')"),  # a compute cell: skipped
            new_code_cell('"""a docstring"""\nclass Box:\n    SIZE = double(2)'),
            new_code_cell("answer = double(1)  # an exercise cell: skipped"),
            new_code_cell("def broken(:\n    pass"),  # does not parse: skipped, not fatal
            new_code_cell("PREFIX = '{\"age\": '\n\ndef grown(t):\n    return PREFIX + t"),
        ]
    )
    path = tmp_path / "11-x.ipynb"
    nbformat.write(nb, path)
    ns = cli.load_definitions(path)
    assert ns["double"](3) == 6 and ns["Box"].SIZE == 4 and ns["double"].__module__ == "__main__"
    assert "answer" not in ns and not marker.exists()
    assert ns["grown"]("4") == '{"age": 4'  # a name bound to a literal is a definition too


def test_check_refuses_a_chapter_it_does_not_know(capsys):
    assert cli.main(["ch99"]) == 2
    assert "chapter must be one of" in capsys.readouterr().err
    assert cli.main(["chapter11"]) == 2
    assert "chNN" in capsys.readouterr().err
    assert cli.main([]) == 2


def test_the_search_is_bounded():
    t0 = time.perf_counter()
    cex = find_counterexample(
        st.lists(st.integers(0, 100), max_size=50),
        lambda xs: sorted(xs)[:-1] if len(xs) > 40 else sorted(xs),
        sorted,
        max_examples=30,
    )
    assert time.perf_counter() - t0 < 30
    assert cex is None or len(cex.case) == 41


def test_the_package_s_own_piece_is_not_an_answer():
    """A build exercise compares the student's piece with the package's: the package's own (or a
    subclass that leaves the method to it) would pass trivially, here and through the grader."""
    from llmlab.analysis import costs
    from llmlab.core.scheduler import Scheduler
    from llmlab.course.check import ch07, ch08

    assert not ch07.step_cost(costs.step_costs).passed
    assert "package" in ch07.step_cost(costs.step_costs).message

    Lazy = type("MyScheduler", (Scheduler,), {"__module__": "__main__"})
    verdict = ch08.build_scheduler(Lazy)
    assert not verdict.passed and "schedule" in verdict.message

    class StandIn:  # what the grader's recheck hands a checker for a package function
        grader_stand_in = True
        spec = {"module": "llmlab.analysis.costs", "qualname": "step_costs"}
        __name__ = "step_costs"

    assert "package" in ch07.step_cost(StandIn()).message

    class LazyStandIn:  # a notebook class whose source never writes schedule
        grader_stand_in = True
        spec = {"name": "MyScheduler", "source": "class MyScheduler(Scheduler):\n    pass\n"}
        __name__ = "MyScheduler"

    assert "schedule" in ch08.build_scheduler(LazyStandIn()).message
    from llmlab.course.check.build_guard import refuse_package_piece

    def mine(cfg, batch, dtype_bytes):
        return {}

    assert refuse_package_piece("ch07.step_cost", mine) is None


def _package_pieces() -> dict[str, object]:
    """Each write-a-function exercise's checker and the package's own version of the function
    (what the student's is compared with)."""
    from llmlab.course.check import ch01, ch03, ch13, ch14, ch15, ch16
    from llmlab.model.quantization import quantize_int8
    from llmlab.sampling.rejection_sampler import rejection_sample
    from llmlab.tokenizer import _merge

    return {
        "ch01.merge_function": (ch01.merge_function, _merge),
        "ch03.top_p_function": (ch03.top_p_function, ch03._nucleus),
        "ch13.quantize_per_channel": (ch13.quantize_per_channel, quantize_int8),
        "ch14.verify_drafts": (ch14.verify_drafts, rejection_sample),
        "ch15.allowed_tokens": (ch15.allowed_tokens, ch15.reference_allowed),
        "ch16.merge_partitions": (ch16.merge_partitions, ch16.merge),
    }


@pytest.mark.parametrize(
    "exercise",
    [
        "ch01.merge_function",
        "ch03.top_p_function",
        "ch13.quantize_per_channel",
        "ch14.verify_drafts",
        pytest.param("ch15.allowed_tokens", marks=pytest.mark.model),  # the real tokenizer
        "ch16.merge_partitions",
    ],
)
def test_a_function_exercise_opens_like_every_build_exercise(exercise, first_try):
    """Unanswered, the package's own function, not a function, a function that raises: each is
    "not yet" with its own hint, never a crash (the shared opening, `check.build_guard`)."""
    from llmlab.course.check.core import NOT_ANSWERED

    check, package_piece = _package_pieces()[exercise]
    assert check(None).message == NOT_ANSWERED
    assert "package" in check(package_piece).message
    assert "function" in check(7).message
    assert "raised ZeroDivisionError" in check(lambda *args: 1 / 0).message


def test_check_skips_an_exercise_the_file_does_not_define(tmp_path, capsys, monkeypatch):
    """Chapter 11 has two build exercises; a module with only one is checked on that one."""
    from llmlab.course.check import ch11

    seen = []
    monkeypatch.setattr(ch11, "build_chunked_prefill", lambda a: seen.append(a) or True)
    monkeypatch.setattr(ch11, "block_pool", lambda a: seen.append(a) or False)
    mod = tmp_path / "plan.py"
    mod.write_text("def plan_step(running, waiting, budget):\n    return []\n")
    assert cli.main(["ch11", str(mod)]) == 0
    assert len(seen) == 1 and callable(seen[0])
    assert "defines no MyBlockPool, not checked" in capsys.readouterr().out
    empty = tmp_path / "empty.py"
    empty.write_text("x = 1\n")
    assert cli.main(["ch11", str(empty)]) == 1


# --------------------------------------------------------------------------- tries kept between runs


def _run_fresh(args: list[str], capsys, monkeypatch) -> tuple[int, str]:
    """`python -m llmlab check` as a new process sees it: no wrong try counted in memory."""
    from llmlab.course.check import core

    monkeypatch.setattr(core, "_WRONG_TRIES", {})
    code = cli.main(args)
    return code, capsys.readouterr().out


# a verify step that never emits the bonus token: one of chapter 14's planted bugs
NO_BONUS = planted_ch14.EXERCISES[0].bug("no_bonus_token").source


def test_check_keeps_the_wrong_tries_beside_the_file_and_escalates_its_hints(
    tmp_path, capsys, monkeypatch
):
    """Each run is a fresh process; the tries kept beside the file give the notebook's stages:
    the rule, then the rule with the way to the fix, then the worked solution's place."""
    from llmlab.i18n import set_language

    set_language("en")
    path = tmp_path / "answer.py"
    path.write_text(NO_BONUS, encoding="utf-8")
    outs = [_run_fresh(["ch14", str(path)], capsys, monkeypatch) for _ in range(3)]
    assert [code for code, _ in outs] == [1, 1, 1]
    first, second, third = (out for _, out in outs)
    assert "no run emitted k + 1" in first and "Leviathan" not in first
    assert "Leviathan" in second and "solutions/14-solutions.ipynb" not in second
    assert "solutions/14-solutions.ipynb" in third
    kept = json.loads((tmp_path / cli.TRIES_FILE).read_text(encoding="utf-8"))
    assert kept == {"answer.py": {"ch14.verify_drafts": 3}}
    other = tmp_path / "other.py"  # another file in the folder starts at the first stage
    other.write_text(NO_BONUS, encoding="utf-8")
    assert "Leviathan" not in _run_fresh(["ch14", str(other)], capsys, monkeypatch)[1]
    kept = json.loads((tmp_path / cli.TRIES_FILE).read_text(encoding="utf-8"))
    assert kept["answer.py"] == {"ch14.verify_drafts": 3}
    assert kept["other.py"] == {"ch14.verify_drafts": 1}


def test_tries_are_never_kept_in_the_package_or_its_cache_and_a_bad_store_starts_over(
    tmp_path, monkeypatch
):
    import llmlab

    package = Path(llmlab.__file__).resolve().parent
    assert cli.tries_file(package / "course" / "x.py") is None
    monkeypatch.setenv("LLMLAB_CACHE", str(tmp_path / "cache"))
    assert cli.tries_file(tmp_path / "cache" / "models" / "x.py") is None
    store = cli.tries_file(tmp_path / "x.py")
    assert store == tmp_path / cli.TRIES_FILE
    store.write_text("not json", encoding="utf-8")
    assert cli.read_tries(store, "x.py") == {}
    cli.write_tries(store, "x.py", {"ch14.verify_drafts": 2})
    assert cli.read_tries(store, "x.py") == {"ch14.verify_drafts": 2}
    assert cli.read_tries(None, "x.py") == {}


# --------------------------------------------------------------------------- timing two pieces


def test_alternating_rounds_call_identical_code_the_same_and_tell_a_slower_one():
    from llmlab.course.build import alternating_rounds

    calls = []

    def timed(name, rounds):
        it = iter(rounds)
        return lambda: calls.append(name) or next(it)

    noisy = [1.0, 1.6, 1.1, 3.0, 1.2]  # a busy machine: one round of each slowed a lot
    same = alternating_rounds(timed("mine", noisy), timed("package", [1.1, 1.0, 2.5, 1.3, 1.2]))
    assert calls == ["mine", "package"] * 5  # alternating, so load falls on both alike
    assert same.same and (same.mine, same.package) == (1.0, 1.0)
    slower = alternating_rounds(
        timed("mine", [2.0, 2.1, 2.4, 2.0, 2.2]), timed("package", [1.0, 1.1, 1.2, 3.0, 1.0])
    )
    assert not slower.same and slower.ratio == pytest.approx(2.0)


def test_every_build_exercise_is_defined_by_its_notebooks_definition_cells():
    """`python -m llmlab check chNN` on a chapter's notebook finds the class or function of each
    of its build exercises (chapter 15's skeleton cell binds a constant beside its functions)."""
    import importlib

    root = Path(__file__).resolve().parents[1]
    for path in sorted((root / "notebooks").glob("[0-9][0-9]-*.ipynb")):
        checks = importlib.import_module(f"llmlab.course.check.ch{path.name[:2]}")
        names = set(getattr(checks, "BUILDS", {}).values())
        if names:
            assert names <= set(cli.load_definitions(path)), (path.name, names)
