"""Notebooks a test makes: one of code cells alone, and a course of one notebook in a test's
tmp_path, laid out as the course's tools read it (`notebooks/NAME.ipynb`)."""

from __future__ import annotations

from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_notebook


def code_notebook(*sources: str) -> nbformat.NotebookNode:
    """A notebook whose cells are code cells of `sources`, in order."""
    return new_notebook(cells=[new_code_cell(s) for s in sources])


def write_course(tmp_path: Path, name: str, nb: nbformat.NotebookNode) -> Path:
    """Write `nb` as tmp_path/notebooks/`name` and return the notebooks folder."""
    nbs = tmp_path / "notebooks"
    nbs.mkdir()
    nbformat.write(nb, nbs / name)
    return nbs
