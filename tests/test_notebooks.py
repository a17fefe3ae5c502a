"""Every notebook runs top to bottom headless, in a fresh kernel, within its time budget.

New notebooks in notebooks/ are picked up automatically. Executed copies and HTML go to
build/notebooks/ so a failure can be read there.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from llmlab.notebook_runner import execute_notebook

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
BUDGET_S = 180          # the issues' "under 3 minutes with LLMLAB_FAST=1" on a 2-core machine


def test_notebooks_exist():
    assert NOTEBOOKS, "notebooks/ holds no .ipynb"


def _cell_seconds(cell) -> float:
    from datetime import datetime

    timing = cell.get("metadata", {}).get("execution", {})
    start, end = timing.get("iopub.execute_input"), timing.get("shell.execute_reply")
    if not (start and end):
        return 0.0
    parse = lambda s: datetime.fromisoformat(s.replace("Z", "+00:00"))  # noqa: E731
    return (parse(end) - parse(start)).total_seconds()


@pytest.mark.notebook
@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs_headless(path):
    env = {"LLMLAB_FAST": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    nb, seconds = execute_notebook(path, ROOT / "build" / "notebooks", cell_timeout=BUDGET_S, env=env)
    # The budget is the kernel's own time (execute_input → execute_reply of every cell, as nbclient
    # records it): nbclient has been seen to wait out a full cell timeout after a widget cell the
    # kernel had long finished, which is the harness's time, not the notebook's.
    kernel_s = sum(_cell_seconds(c) for c in nb.cells if c.cell_type == "code")
    print(f"{path.name}: {kernel_s:.1f} s in the kernel, {seconds:.1f} s wall")
    assert kernel_s < BUDGET_S, f"{path.name} took {kernel_s:.0f} s; the budget is {BUDGET_S} s with LLMLAB_FAST=1"
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
              if o.get("output_type") == "error"]
    assert not errors
    figures = sum(1 for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
                  if "image/png" in o.get("data", {}) or "image/svg+xml" in o.get("data", {}))
    if path.stem != "00-setup-and-map":
        assert figures >= 1, f"{path.name} shows no figure for its default values"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_is_committed_without_outputs(path):
    import nbformat

    nb = nbformat.read(path, as_version=4)
    dirty = [i for i, c in enumerate(nb.cells) if c.cell_type == "code" and (c.outputs or c.execution_count)]
    assert not dirty, f"{path.name}: cells {dirty} carry outputs; clear them before committing"
