"""What a chapter's first cell needs, kept out of the reader's way.

- `start()` prints one line: the versions and the CPU the chapter runs with (chapter 00 prints the
  whole environment report, as `python -m llmlab doctor` does).
- `sized(full, quick=...)`: the size of a sweep or a benchmark in a chapter. A reader gets `full`;
  a headless run of the notebook (the notebook tests, the grader, `make run` when asked for it)
  sets `LLMLAB_FAST=1` and gets `quick`, a smaller workload that draws the same figures and runs
  the same checks.

`import llmlab` (which this module needs) must come before torch in a chapter: it chooses how
OpenMP threads wait on this machine, which the OpenMP runtime reads once (`llmlab.openmp`).
"""

from __future__ import annotations

import os
import platform
from typing import TypeVar

QUICK_ENV = "LLMLAB_FAST"
T = TypeVar("T")


def quick_run() -> bool:
    """True when the notebook runs headless with shrunken workloads (`LLMLAB_FAST=1`)."""
    return os.environ.get(QUICK_ENV) == "1"


def sized(full: T, quick: T) -> T:
    """`full` for a reader, `quick` in a headless run (see the module docstring)."""
    return quick if quick_run() else full


def summary() -> str:
    """One line: llmlab, Python and torch versions, this CPU and the threads torch uses."""
    import torch

    import llmlab
    from llmlab.i18n import tr
    from llmlab.utils import cpu_name

    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    threads = torch.get_num_threads()
    where = tr(f"{cpu_name()}, {threads} threads", f"{cpu_name()}，{threads} 个线程")
    where += f" | GPU: {gpu}" if gpu else ""
    return (
        f"llmlab {llmlab.__version__} | Python {platform.python_version()} | "
        f"torch {torch.__version__} | {where}"
    )


def start() -> None:
    """A chapter's first call: print `summary()`. Without a GPU, Triton kernels are set to run
    through its interpreter (before anything imports triton)."""
    import torch

    if not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")
    print(summary())
