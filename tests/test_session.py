"""llmlab.course.session: a chapter's first line, and the workload size a headless run shrinks."""

from __future__ import annotations

from llmlab.course import session


def test_sized_gives_the_full_workload_to_a_reader_and_the_quick_one_to_a_headless_run(monkeypatch):
    monkeypatch.delenv(session.QUICK_ENV, raising=False)
    assert not session.quick_run() and session.sized([1, 2, 4], quick=[1]) == [1, 2, 4]
    monkeypatch.setenv(session.QUICK_ENV, "1")
    assert session.quick_run() and session.sized([1, 2, 4], quick=[1]) == [1]
    monkeypatch.setenv(session.QUICK_ENV, "0")
    assert session.sized(24, quick=6) == 24


def test_start_prints_one_line_without_paths(capsys):
    import torch

    session.start()
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and out.startswith("llmlab ")
    assert torch.__version__ in out and "/" not in out.replace(torch.__version__, "")
