"""The grader's own checker process: verdicts from the checkers' return values on recorded
answers, cut to the instructor's call; function answers run in a sandbox that can hand back
only return values, within a time limit."""

from __future__ import annotations

import os
import sys
import textwrap
import time

import pytest

from llmlab.course.check import ch00, ch02, ch06
from llmlab.course.check.core import NOT_ANSWERED
from llmlab.course.instructor import Exercise
from llmlab.course.instructor.recheck import Recheck, RecheckError, judge


def _rec(*args, **kwargs) -> dict:
    return {"args": list(args), "kwargs": kwargs}


def test_judge_reads_the_verdict_the_checker_returns(capsys):
    right = judge(Exercise("ch00.num_chapters"), ch00.num_chapters, _rec(13), 5)
    assert right == {"passed": True, "message": "correct."}
    v = judge(Exercise("ch00.num_chapters"), ch00.num_chapters, _rec(12), 5)
    assert not v["passed"] and "chapter 00" in v["message"]
    assert (
        judge(Exercise("ch00.num_chapters"), ch00.num_chapters, _rec(None), 5)["message"]
        == NOT_ANSWERED
    )
    assert capsys.readouterr().out == ""  # the checkers' printed lines go nowhere


def test_judge_cuts_the_call_to_the_instructors_shape():
    """A student who passes the checker context of their own (here: a working set of 1 byte,
    which every cache holds) is judged on the instructor's call, which passes none."""
    own = judge(Exercise("ch06.working_set_level"), ch06.working_set_level, _rec("L1", size=1), 5)
    assert own == judge(Exercise("ch06.working_set_level"), ch06.working_set_level, _rec("L1"), 5)
    extra = judge(Exercise("ch00.num_chapters"), ch00.num_chapters, _rec(13, "extra"), 5)
    assert extra["passed"]
    none = judge(Exercise("ch00.num_chapters"), ch00.num_chapters, _rec(), 5)
    assert (
        not none["passed"] and "0 positional argument(s); this exercise passes 1" in none["message"]
    )


@pytest.mark.parametrize(
    "record, fragment",
    [
        ({"error": "cannot record a Timeline"}, "could not be recorded: cannot record a Timeline"),
        ({"args": "13", "kwargs": {}}, "not in the grader's format"),
        ({"args": [{"__eval__": "13"}], "kwargs": {}}, "cannot be read"),
    ],
)
def test_judge_says_why_an_answer_is_not_graded(record, fragment):
    v = judge(Exercise("ch00.num_chapters"), ch00.num_chapters, record, 5)
    assert not v["passed"] and fragment in v["message"]


# --------------------------------------------------------------------------- function answers

ATTENTION = textwrap.dedent("""\
    def my_attention(q, k, v):
        T, d = q.shape
        s = (q @ k.T / d ** 0.5).masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
        return s.softmax(dim=-1) @ v
    """)


def _function(source: str, name: str = "my_attention") -> dict:
    return _rec(
        {
            "__function__": {
                "name": name,
                "source": source,
                "globals": {"torch": {"__module__": "torch"}},
            }
        }
    )


def test_a_function_answer_is_checked_on_the_checkers_inputs():
    v = judge(Exercise("ch02.attention"), ch02.attention, _function(ATTENTION), 60)
    assert v == {"passed": True, "message": "matches PyTorch's scaled_dot_product_attention."}
    no_mask = ATTENTION.replace(
        '.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))', ""
    )
    v = judge(Exercise("ch02.attention"), ch02.attention, _function(no_mask), 60)
    assert not v["passed"] and "causal mask is missing" in v["message"]


def test_a_function_that_prints_a_verdict_and_exits_gets_nothing():
    forged = textwrap.dedent("""\
        def my_attention(q, k, v):
            import os, sys
            print('[check ch02.attention] PASS: correct.')
            sys.__stdout__.write('{"passed": true, "message": "correct."}\\n')
            os._exit(0)
        """)
    v = judge(Exercise("ch02.attention"), ch02.attention, _function(forged), 60)
    assert not v["passed"] and "ended without returning" in v["message"]


def test_a_function_that_hangs_is_stopped_at_the_time_limit():
    hangs = "def my_attention(q, k, v):\n    while True:\n        pass\n"
    t0 = time.monotonic()
    v = judge(Exercise("ch02.attention"), ch02.attention, _function(hangs), 5)
    assert time.monotonic() - t0 < 15
    assert not v["passed"] and "TimeoutError: your function ran longer than 5 s" in v["message"]


PROBE = """\
def probe():
    import os
    fds = sorted(int(fd) for fd in os.listdir("/proc/self/fd"))
    return [os.getpid(), os.getppid(), os.getsid(0), os.getcwd(), fds]
"""

HANG = "def probe():\n    import os, time\n    os.fork()\n    time.sleep(600)\n"


def _gone(pid: int, within_s: float = 10.0) -> bool:
    end = time.monotonic() + within_s
    while time.monotonic() < end:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.02)
    return False


def _group_gone(pgid: int, within_s: float = 10.0) -> bool:
    """No process of group `pgid` runs any more (a zombie that waits for a container's init to
    reap it runs no code)."""
    end = time.monotonic() + within_s
    while time.monotonic() < end:
        running = []
        for entry in os.listdir("/proc"):
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
            if int(fields[2]) == pgid and fields[0] != "Z":
                running.append(entry)
        if not running:
            return True
        time.sleep(0.02)
    return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the fork server is Linux's")
def test_a_forked_sandbox_is_as_alone_as_a_fresh_interpreter(tmp_path):
    """Each sandbox is forked from the fork server, in a session of its own, in a folder of its
    own, holding no file of the grader's but its two pipes; closing it stops it and whatever it
    started; a hung one does not slow the next."""
    from llmlab.course.instructor import recheck

    spec = _function(PROBE, "probe")["args"][0]["__function__"]
    seen = []
    for _ in range(2):
        stand_in = recheck.SandboxedFunction(spec, timeout_s=60)
        pid, parent, session, cwd, fds = stand_in()
        stand_in.close()
        seen.append(pid)
        assert parent == recheck._FORK_SERVER._proc.pid
        assert session == pid  # a session of its own: os.killpg(pid) reaches all it started
        assert os.path.basename(cwd).startswith("llmlab-sandbox-") and not os.path.exists(cwd)
        assert fds[:3] == [0, 1, 2] and len(fds) <= 5, fds  # + the reply's copy, + listdir's
        assert _gone(pid)
    assert seen[0] != seen[1]  # a fresh process each time, never one reused
    hung = recheck.SandboxedFunction(
        _function(HANG, "probe")["args"][0]["__function__"], timeout_s=2
    )
    with pytest.raises(TimeoutError):
        hung()
    pid = hung._proc.pid
    hung.close()
    assert _gone(pid)
    assert _group_gone(pid)  # nor anything it forked
    stand_in = recheck.SandboxedFunction(spec, timeout_s=60)
    t0 = time.monotonic()
    assert stand_in()[0] > 0
    stand_in.close()
    assert time.monotonic() - t0 < 10


# --------------------------------------------------------------------------- the process


def test_the_process_judges_recorded_answers_and_names_missing_checkers(tmp_path):
    exercises = [
        Exercise("ch00.num_chapters"),
        Exercise("ch00.fast_mode"),
        Exercise("ch00.gone"),
        Exercise("ch99.x"),
        Exercise("ch00.module_for_paged_attention"),
    ]
    with Recheck(exercises, env=dict(os.environ), cwd=tmp_path) as recheck:
        got = recheck.verdicts(
            {
                "ch00.num_chapters": _rec(13),
                "ch00.fast_mode": _rec("a"),
                "ch00.gone": _rec(1),
                "ch99.x": _rec(1),
                "ch00.module_for_paged_attention": _rec({"__module__": "llmlab.ops"}),
            },
            timeout_s=120,
            function_timeout_s=10,
        )
    assert got["ch00.num_chapters"] == (True, "correct.")
    assert got["ch00.fast_mode"][0] is False and "figure" in got["ch00.fast_mode"][1]
    assert got["ch00.gone"] == (False, "llmlab.course.check.ch00 has no checker gone")
    assert (
        got["ch99.x"][0] is False
        and "no checker module llmlab.course.check.ch99" in got["ch99.x"][1]
    )
    assert got["ch00.module_for_paged_attention"] == (True, "correct.")  # a module answer, by name


def test_a_process_that_was_killed_gives_no_verdicts(tmp_path):
    with Recheck([Exercise("ch00.num_chapters")], env=dict(os.environ), cwd=tmp_path) as recheck:
        os.killpg(recheck._proc.pid, 9)
        with pytest.raises(RecheckError, match="exited with code -9"):
            recheck.verdicts({"ch00.num_chapters": _rec(13)}, timeout_s=60, function_timeout_s=10)
