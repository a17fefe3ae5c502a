"""`python -m llmlab check chNN FILE` run as a command, in a process of its own, on a module
written from test functions: the exit codes it gives for a solution and for a planted bug (the
planted bugs of every exercise run through the same `cli.main` in tests/test_planted_bugs.py)."""

from __future__ import annotations

import inspect
import os
import subprocess
import sys
from pathlib import Path
from typing import Callable


def exit_codes(
    tmp_path: Path, chapter: str, name: str, solution: Callable, bug: Callable
) -> dict[str, int]:
    """{"solution": code, "bug": code}: each a module holding `import torch`, the solution's
    source (a planted bug may call it), the bug's, and `name` bound to the one under test; the
    command must name the exercise in its output."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "LLMLAB_LANG": "en"}
    codes = {}
    for label, fn in (("solution", solution), ("bug", bug)):
        parts = ["import torch\n", inspect.getsource(solution)]
        if fn is not solution:
            parts.append(inspect.getsource(fn))
        source = "\n\n".join(parts) + f"\n\n{name} = {fn.__name__}\n"
        path = tmp_path / f"{label}.py"
        path.write_text(source, encoding="utf-8")
        run = subprocess.run(
            [sys.executable, "-m", "llmlab", "check", chapter, str(path)],
            capture_output=True,
            text=True,
            env=env,
        )
        assert f"{chapter}." in run.stdout, run.stdout + run.stderr
        codes[label] = run.returncode
    return codes
