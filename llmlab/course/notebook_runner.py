"""Execute notebooks headless: `python -m llmlab run NOTEBOOKS OUT` (what `make run` calls).

Each notebook runs in a fresh kernel started in the notebook's own folder; the executed copy
and an HTML rendering are written to OUT. A chapter of the student edition (with its
`solutions/` folder beside it) gets each worked solution in the HTML right under its exercise,
folded away (`llmlab.course.instructor.editions.fold_solutions`); the executed copy holds none. Used by
the tests as well, with `LLMLAB_FAST=1`.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from llmlab.course.instructor.reading_time import (
    HOW_MEASURED,
    ROOT,
    RUN_TIMES,
    read_run_times,
)


def execute_notebook(
    path: str | Path,
    out_dir: str | Path | None = None,
    *,
    cell_timeout: int = 600,
    kernel_name: str = "python3",
    env: dict[str, str] | None = None,
):
    """Run every cell of `path`; returns (executed notebook, seconds). Raises on a cell error."""
    import nbformat
    from nbclient import NotebookClient

    from llmlab.course.instructor.kernel_run import ipc_kernel_manager

    path = Path(path)
    nb = nbformat.read(path, as_version=4)
    env = {"LLMLAB_HEADLESS": "1", **(env or {})}  # no browser: figures outside widgets
    old_env = {k: os.environ.get(k) for k in env}
    os.environ.update(env or {})
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    sockets = tempfile.TemporaryDirectory(prefix="llmlab-kernel-")
    try:
        client = NotebookClient(
            nb,
            km=ipc_kernel_manager(kernel_name, sockets.name),
            timeout=cell_timeout,
            kernel_name=kernel_name,
            resources={"metadata": {"path": str(path.parent.resolve())}},
        )
        t0 = time.perf_counter()
        try:
            client.execute(cleanup_kc=True)  # a kernel manager of our own: shut it down here
        finally:
            seconds = time.perf_counter() - t0
            if out_dir is not None:
                from llmlab.course.instructor.editions import solutions_for

                write_outputs(nb, path.stem, Path(out_dir), solutions=solutions_for(path))
    finally:
        sockets.cleanup()
        for k, v in old_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return nb, seconds


def write_outputs(nb, stem: str, out_dir: Path, solutions=None) -> None:
    """The executed notebook and its HTML into `out_dir`; with `solutions` (a solutions notebook
    of the student edition) the HTML folds each worked solution under its exercise."""
    import nbformat

    from llmlab.course.instructor.editions import fold_solutions
    from llmlab.course.offline_html import to_html
    from llmlab.i18n import speaking

    out_dir.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, out_dir / f"{stem}.ipynb")
    if solutions is not None:
        with speaking(nb.metadata.get("llmlab", {}).get("lang", "en")):
            nb = fold_solutions(nb, solutions)
    html = to_html(nb)
    (out_dir / f"{stem}.html").write_text(html, encoding="utf-8")


def measure_run_times(path: str | Path, cell_timeout: int = 1800) -> dict:
    """Run chapter `path` headless with the reader's workloads and return its record for
    `data/run_times.json`: each code cell's kernel time, the machine and its load."""
    import datetime
    import platform

    import torch

    from llmlab.utils import cpu_name

    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    # the executed copy (and its HTML) stays in build/run-times/, the evidence of what ran
    out = ROOT / "build" / "run-times"
    nb, total = execute_notebook(path, out, cell_timeout=cell_timeout, env={"LLMLAB_FAST": "0"})
    seconds = {
        c.get("id"): round(cell_seconds(c), 2)
        for c in nb.cells
        if c.cell_type == "code" and c.source.strip()
    }
    return {
        "seconds": seconds,
        "total_seconds": round(total, 1),
        "machine": f"{cpu_name()}, {torch.get_num_threads()} threads",
        "python": platform.python_version(),
        "torch": torch.__version__,
        "load_average_before": None if load is None else round(load, 2),
        "date": datetime.date.today().isoformat(),
    }


def cell_seconds(cell: Any) -> float:
    """A cell's kernel time, as nbclient records it (execute_input to execute_reply)."""
    from datetime import datetime

    timing = cell.get("metadata", {}).get("execution", {})
    start, end = timing.get("iopub.execute_input"), timing.get("shell.execute_reply")
    if not (start and end):
        return 0.0
    parse = lambda s: datetime.fromisoformat(s.replace("Z", "+00:00"))  # noqa: E731
    return (parse(end) - parse(start)).total_seconds()


def record_run_times(paths: list[Path], out: Path = RUN_TIMES) -> None:
    """Measure each chapter and write its record into `out` (other chapters kept)."""
    data = read_run_times(out)
    data.setdefault("about", HOW_MEASURED)
    for path in paths:
        data.setdefault("chapters", {})[Path(path).stem] = measure_run_times(path)
        data["chapters"] = dict(sorted(data["chapters"].items()))
        out.write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")


def main(argv: list[str]) -> int:
    if argv[:1] == ["--measure"] and len(argv) > 1:
        record_run_times([Path(a) for a in argv[1:]])
        print(f"recorded the run times of {len(argv) - 1} chapter(s) in {RUN_TIMES}")
        return 0
    if len(argv) != 2:
        print(
            "usage: python -m llmlab run NOTEBOOK_OR_FOLDER OUT_FOLDER\n"
            "       python -m llmlab run --measure NOTEBOOK...   (chapters' run times into "
            "data/run_times.json)"
        )
        return 2
    src, out = Path(argv[0]), Path(argv[1])
    paths = sorted(src.glob("*.ipynb")) if src.is_dir() else [src]
    failed = 0
    for p in paths:
        try:
            _, seconds = execute_notebook(p, out)
            print(f"ok    {p.name:32s} {seconds:6.1f} s -> {out / (p.stem + '.html')}")
        except Exception as e:  # report every notebook, then fail
            failed += 1
            print(f"FAIL  {p.name:32s} {type(e).__name__}: {str(e)[-2000:]}", file=sys.stderr)
    return 1 if failed else 0
