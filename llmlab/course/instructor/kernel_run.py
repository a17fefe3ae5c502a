"""The grader's run of a notebook: a fresh kernel, every code cell in order, each cell's error or
timeout recorded and the run going on, until the notebook ends or the kernel is lost.

`grading` calls `execute_for_grading` with the set-up cell that records the answers; the course's
own notebook runs (`llmlab.course.notebook_runner`) start their kernels the same way
(`ipc_kernel_manager`).
"""

from __future__ import annotations

import os
import site
import tempfile
import time
from pathlib import Path
from typing import Any

from llmlab.course.instructor.recheck import package_root
from llmlab.i18n import LANG_ENV, language, tr

PROBE_TIMEOUT_S = 10  # after a cell timed out: how long the kernel has to answer again
GRADING_ENV = {
    "LLMLAB_FAST": "1",
    "HF_HUB_OFFLINE": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "LLMLAB_HEADLESS": "1",
}
# unless the caller's environment says otherwise: OpenMP threads sleep instead of spinning
# (spinning slowed the model many times over when several kernels share a few cores)
GRADING_ENV_DEFAULTS = {"OMP_WAIT_POLICY": "PASSIVE"}
# the end of an error's evalue when the run stopped there (read back by grading._ended_run)
DID_NOT_RUN = ("the cells after it did not run", "之后各单元格都没有运行")


def grading_env() -> dict[str, str]:
    """The environment of the kernel and of the checker process: the caller's, with
    GRADING_ENV on top, and the llmlab the grader runs first on PYTHONPATH when it is not an
    installed copy (a source checkout), so that the kernel records with the same code."""
    env = {**GRADING_ENV_DEFAULTS, **os.environ, **GRADING_ENV}
    if language() != "en":  # chosen with set_language: the kernel and the checkers speak it too
        env[LANG_ENV] = language()
    root = str(package_root())
    installed = set(site.getsitepackages()) | {site.getusersitepackages()}
    if root not in installed:
        env["PYTHONPATH"] = os.pathsep.join(
            [root] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])
        )
    return env


def cell_error(nb: Any, index: int | None, ename: str, evalue: str) -> dict:
    if index is None:
        return {"cell": "-", "index": None, "ename": ename, "evalue": evalue}
    return {"cell": _cell_label(nb, index), "index": index, "ename": ename, "evalue": evalue}


def _cell_label(nb: Any, index: int) -> str:
    first = next((ln.strip() for ln in nb.cells[index].source.split("\n") if ln.strip()), "")
    return f"{index}" + (f" ({first[:60]})" if first else "")


def _run_extra_cell(client: Any, nb: Any, source: str, timeout: float) -> tuple[Any, float]:
    """Run a cell of the grader's own (not part of the notebook, not in the kernel's history):
    returns (the cell with its outputs, seconds). nbclient stores a cell it ran back into the
    notebook at its index, so the cell sits at the end of `nb` while it runs."""
    from nbformat.v4 import new_code_cell

    cell = new_code_cell(source)
    nb.cells.append(cell)
    saved = client.timeout, client.iopub_timeout
    # after a timeout nbclient also waits up to iopub_timeout for the cell's last output
    client.timeout, client.iopub_timeout = timeout, min(client.iopub_timeout, timeout)
    t0 = time.perf_counter()
    try:
        client.execute_cell(cell, len(nb.cells) - 1, store_history=False)
    finally:
        client.timeout, client.iopub_timeout = saved
        nb.cells.pop()
    return cell, time.perf_counter() - t0


def ipc_kernel_manager(kernel_name: str, folder: str | Path):
    """A kernel manager whose kernel talks over local sockets (IPC) in `folder`, a private
    folder of the caller's, not over TCP: nothing listens on a port, and the kernel has no reason
    to warn about unencrypted traffic. An async manager, as nbclient makes its own: nbclient
    polls the kernel's channels in an event loop, and a blocking client's wait for output never
    ends after a cell that outlives its time limit."""
    from jupyter_client.manager import AsyncKernelManager

    return AsyncKernelManager(kernel_name=kernel_name, transport="ipc", ip=str(Path(folder) / "k"))


def _check_cell_timeout(cell_timeout: float) -> None:
    if cell_timeout <= 0:
        raise ValueError(
            tr(
                f"cell_timeout must be > 0 seconds, got {cell_timeout!r}",
                f"cell_timeout 必须 > 0 秒，你给了 {cell_timeout!r}",
            )
        )


def _grading_client(nb: Any, cwd: str | Path, cell_timeout: float, sockets: str) -> Any:
    """An nbclient client for `nb` that records errors and timeouts instead of stopping."""
    from nbclient import NotebookClient

    return NotebookClient(
        nb,
        km=ipc_kernel_manager("python3", sockets),
        timeout=cell_timeout,
        kernel_name="python3",
        allow_errors=True,
        interrupt_on_timeout=True,
        record_timing=True,
        # killed with its process group at the end: nothing it started outlives the run
        shutdown_kernel="immediate",
        error_on_timeout={
            "ename": "CellTimeoutError",
            "evalue": tr(
                f"the cell ran longer than {cell_timeout:g} s",
                f"单元格运行超过了 {cell_timeout:g} s",
            ),
            "traceback": [],
        },
        resources={"metadata": {"path": str(cwd)}},
    )


def _clear_outputs(nb: Any) -> None:
    """Outputs handed in are never kept: only what this run prints."""
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs = []
            cell.execution_count = None


def _first_error(cell: Any) -> dict | None:
    return next((o for o in cell.get("outputs", []) if o.get("output_type") == "error"), None)


def _run_setup(client: Any, nb: Any, setup: str, cell_timeout: float) -> list[dict]:
    """Run the grader's set-up cell; its error, if it raised."""
    cell, _ = _run_extra_cell(client, nb, setup, cell_timeout)
    err = _first_error(cell)
    if err is None:
        return []
    why = f"{err.get('ename')}: {str(err.get('evalue', ''))[:300]}"
    return [
        cell_error(
            nb,
            None,
            "GraderSetupError",
            tr(
                f"the grader could not set up answer recording in the kernel: {why}",
                f"评分器没能在 kernel 里设置好答案记录：{why}",
            ),
        )
    ]


def _timeout_error(client: Any, nb: Any, index: int, cell_timeout: float) -> tuple[dict, bool]:
    """(the error of a cell that ran out of time, whether the run ends there): it ends when the
    kernel does not answer a probe cell within PROBE_TIMEOUT_S of the interrupt."""
    if _run_extra_cell(client, nb, "pass", PROBE_TIMEOUT_S)[1] >= PROBE_TIMEOUT_S:
        why = tr(
            f"the cell ran longer than {cell_timeout:g} s and the kernel did "
            f"not stop when interrupted; {DID_NOT_RUN[0]}",
            f"单元格运行超过了 {cell_timeout:g} s，中断后 kernel 也没有停下，{DID_NOT_RUN[1]}",
        )
        return cell_error(nb, index, "CellTimeoutError", why), True
    why = tr(
        f"the cell ran longer than {cell_timeout:g} s and was interrupted",
        f"单元格运行超过了 {cell_timeout:g} s，已被中断",
    )
    return cell_error(nb, index, "CellTimeoutError", why), False


def _run_cell(client: Any, nb: Any, index: int, cell_timeout: float) -> tuple[dict | None, bool]:
    """Run the code cell at `index`: (its error or None, whether the run ends there)."""
    from nbclient.exceptions import DeadKernelError

    cell = nb.cells[index]
    c0 = time.perf_counter()
    try:
        client.execute_cell(cell, index)
    except DeadKernelError as e:
        why = tr(
            f"the kernel died ({e}); {DID_NOT_RUN[0]}",
            f"kernel 崩溃了（{e}），{DID_NOT_RUN[1]}",
        )
        return cell_error(nb, index, "DeadKernelError", why), True
    except Exception as e:  # nbclient's own failures: record them and go on
        text = str(e).strip()
        return cell_error(nb, index, type(e).__name__, text.splitlines()[-1] if text else ""), False
    if time.perf_counter() - c0 >= cell_timeout:
        return _timeout_error(client, nb, index, cell_timeout)
    err = _first_error(cell)
    if err is None:
        return None, False
    return cell_error(nb, index, err.get("ename", "Error"), str(err.get("evalue", ""))[:300]), False


def _run_cells(client: Any, nb: Any, cell_timeout: float) -> list[dict]:
    """Run every non-empty code cell in order; the errors, up to the one that ends the run."""
    errors = []
    for index, cell in enumerate(list(nb.cells)):
        if cell.cell_type != "code" or not cell.source.strip():
            continue
        error, ends = _run_cell(client, nb, index, cell_timeout)
        if error is not None:
            errors.append(error)
        if ends:
            break
    return errors


def execute_for_grading(
    nb: Any,
    cwd: str | Path,
    cell_timeout: float,
    *,
    env: dict[str, str] | None = None,
    setup: str | None = None,
) -> tuple[list[dict], float]:
    """Run `nb` in place in a fresh python3 kernel started in `cwd` (environment `env`, by
    default `grading_env()`), after the cell `setup` when given (its outputs are not kept).
    Errors and timeouts are recorded per cell and never stop the run; a kernel that dies, or
    that does not stop when a timed-out cell is interrupted, ends it. Returns (errors, seconds)."""
    from nbclient.exceptions import DeadKernelError

    _check_cell_timeout(cell_timeout)
    env = grading_env() if env is None else env
    sockets = tempfile.TemporaryDirectory(prefix="llmlab-kernel-", ignore_cleanup_errors=True)
    client = _grading_client(nb, cwd, cell_timeout, sockets.name)
    _clear_outputs(nb)
    errors: list[dict] = []
    t0 = time.perf_counter()
    try:
        with client.setup_kernel(env=env, cwd=str(cwd), cleanup_kc=True):
            if setup is not None:
                errors += _run_setup(client, nb, setup, cell_timeout)
            errors += _run_cells(client, nb, cell_timeout)
    except DeadKernelError as e:
        errors.append(cell_error(nb, None, "DeadKernelError", str(e)))
    except RuntimeError as e:  # the kernel did not start
        errors.append(cell_error(nb, None, type(e).__name__, str(e)[:300]))
    finally:
        sockets.cleanup()
    return errors, time.perf_counter() - t0
