"""A course of one notebook in a test's tmp_path, laid out as the course's tools read it
(`notebooks/NAME.ipynb`)."""

from __future__ import annotations

from pathlib import Path

import nbformat


def write_course(tmp_path: Path, name: str, nb: nbformat.NotebookNode) -> Path:
    """Write `nb` as tmp_path/notebooks/`name` and return the notebooks folder."""
    nbs = tmp_path / "notebooks"
    nbs.mkdir()
    nbformat.write(nb, nbs / name)
    return nbs
