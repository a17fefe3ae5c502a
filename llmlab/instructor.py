"""The instructor's tools: one source, two versions, and a headless grader.

The committed notebooks are the instructor's version. A solution is marked in a code cell
either on its own line(s),

    answer = 13  # SOLUTION

or as a block (markers included):

    # BEGIN SOLUTION
    def my_attention(q, k, v): ...
    answer = my_attention
    # END SOLUTION

`python -m llmlab student SRC DST` writes the student version: a marked line becomes
`answer = None  # YOUR CODE HERE`; a marked block becomes `# YOUR CODE HERE` followed by
`NAME = None` for every name the block binds at its top level, at the block's indentation.
Outputs are cleared, and the exercise ids are stored in the notebook's metadata
(`metadata["llmlab"]["exercises"]`) so the grader knows how many there are even when a
student's notebook stops early.

`python -m llmlab grade PATH.ipynb [--json] [--cell-timeout S]` runs the notebook in a fresh
kernel (LLMLAB_FAST=1, HF_HUB_OFFLINE=1, a time limit per cell, errors do not stop the run),
reads the checkers' lines (`[check ID] PASS: ...` / `[check ID] NOT YET: hint`) from the
outputs and prints one verdict per exercise and a total. The grader itself never imports or
runs the notebook's code; only the kernel does.

An exercise's id is `<checker module>.<checker function>`, e.g. `ch04.kv_bytes_per_token`;
the exercises of a notebook are the calls of `llmlab.check.chNN` functions in its code cells.
"""
from __future__ import annotations

import argparse
import ast
import copy
import json
import os
import re
import sys
import textwrap
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable

from llmlab.check.core import FAIL_WORD, LINE_PREFIX, PASS_WORD

PLACEHOLDER = "# YOUR CODE HERE"
METADATA_KEY = "llmlab"
DEFAULT_CELL_TIMEOUT_S = 300
GRADING_ENV = {"LLMLAB_FAST": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
# unless the caller's environment says otherwise: OpenMP threads sleep instead of spinning
# (spinning slowed the model many times over when several kernels share a few cores)
GRADING_ENV_DEFAULTS = {"OMP_WAIT_POLICY": "PASSIVE"}

_LINE_MARK = re.compile(r"#\s*SOLUTION\s*$")
_BEGIN = re.compile(r"^\s*#\s*BEGIN SOLUTION\s*$")
_END = re.compile(r"^\s*#\s*END SOLUTION\s*$")
CHECK_LINE = re.compile(r"^" + re.escape(LINE_PREFIX) + r"([^\]\s]+)\] (" + re.escape(PASS_WORD)
                        + "|" + re.escape(FAIL_WORD) + r"): ?(.*)$")
_CHECK_MODULE = re.compile(r"ch\d+")
NO_LINE_MESSAGE = "no check line was printed: the notebook stopped or skipped this exercise before its checker ran"


# --------------------------------------------------------------------------- marking

@dataclass(frozen=True)
class Solution:
    """One marked solution of a notebook and what the student version shows instead."""
    cell_index: int        # index in nb.cells
    solution: str          # the instructor's lines, markers included
    placeholder: str       # the lines that replace them in the student version


def bound_names(code: str) -> list[str]:
    """Names that `code` binds at its top level (assignments, def, class, import, for, with),
    in order of first binding; bodies of functions and classes are not entered."""
    tree = ast.parse(textwrap.dedent(code))
    names: list[str] = []

    def add(name: str) -> None:
        if name not in names:
            names.append(name)

    def targets(node: ast.AST) -> None:
        if isinstance(node, ast.Name):
            add(node.id)
        elif isinstance(node, (ast.Tuple, ast.List)):
            for elt in node.elts:
                targets(elt)
        elif isinstance(node, ast.Starred):
            targets(node.value)
        # attributes and subscripts (obj.x = ..., d[k] = ...) bind no new name

    def walrus(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
                continue
            if isinstance(child, ast.NamedExpr) and isinstance(child.target, ast.Name):
                add(child.target.id)
            walrus(child)

    def visit(stmts: Iterable[ast.stmt]) -> None:
        for s in stmts:
            if not isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                walrus(s)
            if isinstance(s, ast.Assign):
                for t in s.targets:
                    targets(t)
            elif isinstance(s, (ast.AnnAssign, ast.AugAssign)):
                targets(s.target)
            elif isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                add(s.name)
            elif isinstance(s, ast.Import):
                for a in s.names:
                    add(a.asname or a.name.split(".")[0])
            elif isinstance(s, ast.ImportFrom):
                for a in s.names:
                    if a.name != "*":
                        add(a.asname or a.name)
            elif isinstance(s, (ast.For, ast.AsyncFor)):
                targets(s.target)
                visit(s.body)
                visit(s.orelse)
            elif isinstance(s, (ast.With, ast.AsyncWith)):
                for item in s.items:
                    if item.optional_vars is not None:
                        targets(item.optional_vars)
                visit(s.body)
            elif isinstance(s, ast.While):
                visit(s.body)
                visit(s.orelse)
            elif isinstance(s, ast.If):
                visit(s.body)
                visit(s.orelse)
            elif isinstance(s, ast.Try) or (hasattr(ast, "TryStar") and isinstance(s, ast.TryStar)):
                visit(s.body)
                for h in s.handlers:
                    if h.name:
                        add(h.name)
                    visit(h.body)
                visit(s.orelse)
                visit(s.finalbody)

    visit(tree.body)
    return names


def _indent_of(line: str) -> str:
    return line[: len(line) - len(line.lstrip())]


def _parses(code: str) -> bool:
    try:
        ast.parse(textwrap.dedent(code))
        return True
    except SyntaxError:
        return False


def _block_placeholder(body: list[str], indent: str, where: str) -> list[str]:
    code = "\n".join(body)
    try:
        names = bound_names(code) if code.strip() else []
    except SyntaxError as e:
        raise ValueError(f"{where}: the solution block does not parse on its own ({e.msg}, line {e.lineno}); "
                         f"mark whole statements") from None
    out = [indent + PLACEHOLDER] + [f"{indent}{n} = None" for n in names]
    if indent and not names:
        out.append(indent + "pass")      # an indented suite needs a statement
    return out


def _line_placeholder(lines: list[str], where: str) -> list[str]:
    indent = _indent_of(lines[0])
    code = "\n".join(_LINE_MARK.sub("", ln).rstrip() for ln in lines)
    try:
        names = bound_names(code)
    except SyntaxError as e:
        raise ValueError(f"{where}: the lines marked '# SOLUTION' do not parse on their own "
                         f"({e.msg}); mark every line of the statement") from None
    if not names:
        return [indent + PLACEHOLDER] + ([indent + "pass"] if indent else [])
    return [f"{indent}{n} = None  {PLACEHOLDER}" for n in names]


def strip_source(source: str, where: str = "cell") -> tuple[str, list[tuple[str, str]]]:
    """The student version of one cell's source, and the (solution, placeholder) pairs.

    Raises ValueError (naming `where`) on a BEGIN without END, an END without BEGIN, nested
    blocks, or marked lines that are not whole statements."""
    lines = source.split("\n")
    out: list[str] = []
    pairs: list[tuple[str, str]] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        if _END.match(line):
            raise ValueError(f"{where}, line {i + 1}: '# END SOLUTION' without a '# BEGIN SOLUTION' before it")
        if _BEGIN.match(line):
            j = i + 1
            while j < len(lines) and not _END.match(lines[j]):
                if _BEGIN.match(lines[j]):
                    raise ValueError(f"{where}, line {j + 1}: '# BEGIN SOLUTION' inside another solution block")
                j += 1
            if j == len(lines):
                raise ValueError(f"{where}, line {i + 1}: '# BEGIN SOLUTION' has no matching '# END SOLUTION'")
            repl = _block_placeholder(lines[i + 1:j], _indent_of(line), f"{where}, line {i + 1}")
            pairs.append(("\n".join(lines[i:j + 1]), "\n".join(repl)))
            out.extend(repl)
            i = j + 1
            continue
        if _LINE_MARK.search(line):
            j = i + 1
            while j < len(lines) and _LINE_MARK.search(lines[j]) and not _BEGIN.match(lines[j]) \
                    and not _END.match(lines[j]):
                j += 1
            # a statement marked on its first line only: take its continuation lines along
            while not _parses("\n".join(_LINE_MARK.sub("", ln) for ln in lines[i:j])) and j < len(lines):
                j += 1
            repl = _line_placeholder(lines[i:j], f"{where}, line {i + 1}")
            pairs.append(("\n".join(lines[i:j]), "\n".join(repl)))
            out.extend(repl)
            i = j
            continue
        out.append(line)
        i += 1
    return "\n".join(out), pairs


def _check_aliases(tree: ast.AST, modules: dict[str, str], functions: dict[str, str],
                   packages: set[str]) -> None:
    """Record how this cell imports llmlab.check (`from llmlab import check`,
    `from llmlab.check import ch04 as c4`, `from llmlab.check.ch04 import kv_bytes`)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "llmlab":
                for a in node.names:
                    if a.name == "check":
                        packages.add(a.asname or "check")
            elif node.module == "llmlab.check":
                for a in node.names:
                    if _CHECK_MODULE.fullmatch(a.name):
                        modules[a.asname or a.name] = a.name
            elif node.module.startswith("llmlab.check.") and _CHECK_MODULE.fullmatch(node.module.split(".")[2]):
                mod = node.module.split(".")[2]
                for a in node.names:
                    if not a.name.startswith("_") and a.name != "*":
                        functions[a.asname or a.name] = f"{mod}.{a.name}"
        elif isinstance(node, ast.Import):
            for a in node.names:
                parts = a.name.split(".")
                if len(parts) == 3 and parts[:2] == ["llmlab", "check"] and a.asname \
                        and _CHECK_MODULE.fullmatch(parts[2]):
                    modules[a.asname] = parts[2]
                elif parts[:2] == ["llmlab", "check"] and len(parts) == 2 and a.asname:
                    packages.add(a.asname)


def _resolve_module(node: ast.AST, modules: dict[str, str], packages: set[str]) -> str | None:
    if isinstance(node, ast.Name):
        if node.id in modules:
            return modules[node.id]
        return node.id if _CHECK_MODULE.fullmatch(node.id) else None
    if isinstance(node, ast.Attribute) and _CHECK_MODULE.fullmatch(node.attr):
        v = node.value
        if isinstance(v, ast.Name) and (v.id in packages or v.id == "check"):
            return node.attr
        if isinstance(v, ast.Attribute) and v.attr == "check" and isinstance(v.value, ast.Name) \
                and v.value.id == "llmlab":
            return node.attr
    return None


def _strip_magics(source: str) -> str:
    return "\n".join("" if ln.lstrip().startswith(("%", "!")) else ln for ln in source.split("\n"))


def exercise_calls(nb: Any) -> list[tuple[str, int]]:
    """(exercise id, cell index) of every call of a `llmlab.check.chNN` function in the code
    cells, first call of each id, in order; found without running anything."""
    modules: dict[str, str] = {}
    functions: dict[str, str] = {}
    packages: set[str] = set()
    calls_found: list[tuple[str, int]] = []
    seen: set[str] = set()

    def add(ex: str, index: int) -> None:
        if ex not in seen:
            seen.add(ex)
            calls_found.append((ex, index))

    for index, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        try:
            tree = ast.parse(_strip_magics(cell.source))
        except SyntaxError:
            # not Python (yet): fall back to the textual pattern `chNN.name(`
            for m in re.finditer(r"(?<![\w])(ch\d+)\.([A-Za-z]\w*)\s*\(", cell.source):
                add(f"{m[1]}.{m[2]}", index)
            continue
        _check_aliases(tree, modules, functions, packages)
        calls = sorted((n for n in ast.walk(tree) if isinstance(n, ast.Call)),
                       key=lambda n: (n.lineno, n.col_offset))
        for call in calls:
            f = call.func
            if isinstance(f, ast.Attribute) and not f.attr.startswith("_"):
                mod = _resolve_module(f.value, modules, packages)
                if mod:
                    add(f"{mod}.{f.attr}", index)
            elif isinstance(f, ast.Name) and f.id in functions:
                add(functions[f.id], index)
    return calls_found


def exercise_ids(nb: Any) -> list[str]:
    """The exercise ids a notebook checks, in order (see `exercise_calls`)."""
    return [ex for ex, _ in exercise_calls(nb)]


def student_notebook(nb: Any, where: str = "notebook") -> tuple[Any, list[Solution]]:
    """The student version of `nb` (a new notebook; `nb` is not changed) and its solutions.

    Outputs and execution counts are cleared; metadata["llmlab"]["exercises"] lists the
    exercise ids of the instructor's version."""
    student = copy.deepcopy(nb)
    solutions: list[Solution] = []
    for index, cell in enumerate(student.cells):
        if cell.cell_type != "code":
            continue
        label = f"{where}, cell {index}"
        new_source, pairs = strip_source(cell.source, label)
        if pairs:
            before_ok = _parses(_strip_magics(cell.source))
            if before_ok and not _parses(_strip_magics(new_source)):
                raise ValueError(f"{label}: the student version of this cell would not parse; "
                                 f"check the solution markers")
        cell.source = new_source
        cell.outputs = []
        cell.execution_count = None
        for key in ("execution", "collapsed", "scrolled"):
            cell.metadata.pop(key, None)
        solutions.extend(Solution(index, s, p) for s, p in pairs)
    meta = dict(student.metadata.get(METADATA_KEY, {}))
    meta["exercises"] = exercise_ids(nb)
    meta["version"] = "student"
    student.metadata[METADATA_KEY] = meta
    return student, solutions


def fill_solutions(student_nb: Any, solutions: list[Solution]) -> Any:
    """What a student who solves everything hands in: each placeholder replaced by its
    solution again (a new notebook)."""
    filled = copy.deepcopy(student_nb)
    for s in solutions:
        cell = filled.cells[s.cell_index]
        if s.placeholder not in cell.source:
            raise ValueError(f"cell {s.cell_index} no longer holds the placeholder {s.placeholder!r}")
        cell.source = cell.source.replace(s.placeholder, s.solution, 1)
    return filled


def _notebook_paths(src: Path) -> list[Path]:
    if src.is_dir():
        return sorted(p for p in src.glob("*.ipynb") if not p.name.startswith("."))
    return [src]


def write_student_versions(src: str | Path, dst: str | Path) -> list[tuple[Path, int, int]]:
    """Write the student version of every notebook in `src` (a notebook or a folder) into the
    folder `dst`; returns (written path, exercises, solutions removed) per notebook."""
    import nbformat

    src, dst = Path(src), Path(dst)
    if not src.exists():
        raise ValueError(f"SRC {str(src)!r} does not exist; give a notebook or a folder of notebooks")
    paths = _notebook_paths(src)
    if not paths:
        raise ValueError(f"SRC {str(src)!r} holds no .ipynb file")
    if dst.exists() and not dst.is_dir():
        raise ValueError(f"DST {str(dst)!r} is a file; give a folder")
    if any(p.parent.resolve() == dst.resolve() for p in paths):
        raise ValueError(f"DST {str(dst)!r} is the folder of the instructor's notebooks; "
                         f"writing there would overwrite the solutions")
    dst.mkdir(parents=True, exist_ok=True)
    written = []
    for p in paths:
        nb = nbformat.read(p, as_version=4)
        student, solutions = student_notebook(nb, where=p.name)
        meta = student.metadata[METADATA_KEY]
        meta["source"] = p.name
        out = dst / p.name
        nbformat.write(student, out)
        written.append((out, len(meta["exercises"]), len(solutions)))
    return written


# --------------------------------------------------------------------------- grading

@dataclass
class ExerciseResult:
    id: str
    passed: bool
    message: str


@dataclass
class GradeReport:
    notebook: str
    exercises: list[ExerciseResult]
    errors: list[dict] = field(default_factory=list)   # {"cell", "index", "ename", "evalue"}
    seconds: float = 0.0

    @property
    def score(self) -> int:
        return sum(e.passed for e in self.exercises)

    @property
    def total(self) -> int:
        return len(self.exercises)

    def to_dict(self) -> dict:
        return {"notebook": self.notebook, "score": self.score, "total": self.total,
                "exercises": [asdict(e) for e in self.exercises], "errors": self.errors,
                "seconds": round(self.seconds, 2)}

    def text(self) -> str:
        lines = [f"{self.notebook}"]
        width = max((len(e.id) for e in self.exercises), default=0)
        for e in self.exercises:
            word = "PASS   " if e.passed else "NOT YET"
            lines.append(f"  {word}  {e.id:<{width}}  {e.message}")
        for err in self.errors:
            lines.append(f"  error in cell {err['cell']}: {err['ename']}: {err['evalue']}")
        lines.append(f"  score: {self.score} of {self.total}  ({self.seconds:.0f} s)")
        return "\n".join(lines)


def check_lines(nb: Any) -> dict[str, tuple[bool, str]]:
    """Exercise id → (passed, message) from the check lines in an executed notebook's outputs;
    when an exercise printed several lines, the last one counts."""
    found: dict[str, tuple[bool, str]] = {}
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        texts: list[str] = []
        stdout = "".join(o.get("text", "") for o in cell.get("outputs", [])
                         if o.get("output_type") == "stream" and o.get("name") == "stdout")
        texts.append(stdout)
        for o in cell.get("outputs", []):
            if o.get("output_type") in ("execute_result", "display_data"):
                plain = o.get("data", {}).get("text/plain", "")
                texts.append("".join(plain) if isinstance(plain, list) else plain)
        for text in texts:
            for line in text.splitlines():
                m = CHECK_LINE.match(line.strip())
                if m:
                    found[m[1]] = (m[2] == PASS_WORD, m[3].strip())
    return found


def expected_exercises(nb: Any, reference: Any = None) -> list[str]:
    """The exercises to grade: those of `reference` (the instructor's notebook) when given;
    else those recorded in the metadata at student-build time, then any the cells call."""
    if reference is not None:
        return exercise_ids(reference)
    recorded = nb.metadata.get(METADATA_KEY, {}).get("exercises", [])
    ids = [x for x in recorded if isinstance(x, str)] if isinstance(recorded, list) else []
    for x in exercise_ids(nb):
        if x not in ids:
            ids.append(x)
    return ids


def _error(nb: Any, index: int | None, ename: str, evalue: str) -> dict:
    if index is None:
        return {"cell": "-", "index": None, "ename": ename, "evalue": evalue}
    return {"cell": _cell_label(nb, index), "index": index, "ename": ename, "evalue": evalue}


def _cell_label(nb: Any, index: int) -> str:
    first = next((ln.strip() for ln in nb.cells[index].source.split("\n") if ln.strip()), "")
    return f"{index}" + (f" ({first[:60]})" if first else "")


def execute_for_grading(nb: Any, cwd: str | Path, cell_timeout: float) -> tuple[list[dict], float]:
    """Run `nb` in place in a fresh python3 kernel started in `cwd` with GRADING_ENV; errors
    and timeouts are recorded per cell and never stop the run. Returns (errors, seconds)."""
    from nbclient import NotebookClient
    from nbclient.exceptions import DeadKernelError

    if cell_timeout <= 0:
        raise ValueError(f"cell_timeout must be > 0 seconds, got {cell_timeout!r}")
    env = {**GRADING_ENV_DEFAULTS, **os.environ, **GRADING_ENV}
    client = NotebookClient(nb, timeout=cell_timeout, kernel_name="python3", allow_errors=True,
                            interrupt_on_timeout=True, record_timing=False,
                            error_on_timeout={"ename": "CellTimeoutError",
                                              "evalue": f"the cell ran longer than {cell_timeout:g} s",
                                              "traceback": []},
                            resources={"metadata": {"path": str(cwd)}})
    for cell in nb.cells:     # outputs handed in are never graded: only what this run prints
        if cell.cell_type == "code":
            cell.outputs = []
            cell.execution_count = None
    errors: list[dict] = []
    t0 = time.perf_counter()
    try:
        with client.setup_kernel(env=env, cwd=str(cwd)):
            for index, cell in enumerate(nb.cells):
                if cell.cell_type != "code" or not cell.source.strip():
                    continue
                c0 = time.perf_counter()
                try:
                    client.execute_cell(cell, index)
                except DeadKernelError as e:
                    errors.append(_error(nb, index, "DeadKernelError",
                                         f"the kernel died ({e}); the cells after it did not run"))
                    break
                except Exception as e:  # nbclient's own failures: record them and go on
                    text = str(e).strip()
                    errors.append(_error(nb, index, type(e).__name__, text.splitlines()[-1] if text else ""))
                    continue
                elapsed = time.perf_counter() - c0
                errs = [o for o in cell.get("outputs", []) if o.get("output_type") == "error"]
                if elapsed >= cell_timeout:
                    errors.append(_error(nb, index, "CellTimeoutError",
                                         f"the cell ran longer than {cell_timeout:g} s and was interrupted"))
                elif errs:
                    errors.append(_error(nb, index, errs[0].get("ename", "Error"),
                                         str(errs[0].get("evalue", ""))[:300]))
    except DeadKernelError as e:
        errors.append(_error(nb, None, "DeadKernelError", str(e)))
    except RuntimeError as e:   # the kernel did not start
        errors.append(_error(nb, None, type(e).__name__, str(e)[:300]))
    return errors, time.perf_counter() - t0


def _missing_message(cell_index: int | None, errors: list[dict]) -> str:
    """Why an exercise printed no line: its own cell's error, else the error that stopped the
    run before it, else the first error."""
    cause = None
    if cell_index is not None:
        cause = next((e for e in errors if e["index"] == cell_index), None)
        if cause is None:
            cause = next((e for e in errors if e["index"] is not None and e["index"] < cell_index
                          and e["ename"] == "DeadKernelError"), None)
    if cause is None:
        cause = next((e for e in errors if e["ename"] == "DeadKernelError"), None) or (errors[0] if errors else None)
    if cause is None:
        return NO_LINE_MESSAGE + " (no cell raised an error: was the checker call removed?)"
    return NO_LINE_MESSAGE + f" (cell {cause['cell']}: {cause['ename']}: {cause['evalue']})"


def grade_notebook(path: str | Path, *, cell_timeout: float = DEFAULT_CELL_TIMEOUT_S,
                   reference: str | Path | None = None, keep: str | Path | None = None) -> GradeReport:
    """Execute the notebook at `path` headless and grade its exercises.

    reference: the instructor's notebook whose exercises are expected (else the ids recorded at
    student-build time plus those the cells call). keep: write the executed copy there."""
    import nbformat

    path = Path(path)
    if not path.is_file():
        raise ValueError(f"path {str(path)!r} is not a notebook file")
    nb = nbformat.read(path, as_version=4)
    ref_nb = nbformat.read(Path(reference), as_version=4) if reference is not None else None
    expected = expected_exercises(nb, ref_nb)
    errors, seconds = execute_for_grading(nb, path.parent.resolve(), cell_timeout)
    if keep is not None:
        Path(keep).parent.mkdir(parents=True, exist_ok=True)
        nbformat.write(nb, keep)
    seen = check_lines(nb)
    if not expected:
        expected = list(seen)
    cells = dict(exercise_calls(nb))
    results = []
    for ex in expected:
        if ex in seen:
            ok, msg = seen[ex]
            results.append(ExerciseResult(ex, ok, msg))
        else:
            results.append(ExerciseResult(ex, False, _missing_message(cells.get(ex), errors)))
    return GradeReport(str(path), results, errors, seconds)


# --------------------------------------------------------------------------- command line

def student_main(argv: list[str]) -> int:
    """`python -m llmlab student SRC DST`: write the student versions."""
    parser = argparse.ArgumentParser(prog="python -m llmlab student",
                                     description="Write the student version of notebooks: solutions "
                                                 "replaced by '# YOUR CODE HERE', outputs cleared.")
    parser.add_argument("src", help="a notebook, or a folder of notebooks (the instructor's version)")
    parser.add_argument("dst", help="the folder to write the student versions into")
    args = parser.parse_args(argv)
    try:
        written = write_student_versions(args.src, args.dst)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    for out, n_ex, n_sol in written:
        warn = "  (warning: exercises but no marked solution)" if n_ex and not n_sol else ""
        print(f"wrote {out}: {n_ex} exercises, {n_sol} solutions removed{warn}")
    return 0


def grade_main(argv: list[str]) -> int:
    """`python -m llmlab grade PATH... [--json] [--cell-timeout S] [--reference P]`."""
    parser = argparse.ArgumentParser(prog="python -m llmlab grade",
                                     description="Execute notebooks headless and grade their exercises.")
    parser.add_argument("paths", nargs="+", help="student notebooks, or folders of them")
    parser.add_argument("--json", action="store_true",
                        help="print one JSON object per notebook (one per line) instead of text")
    parser.add_argument("--cell-timeout", type=float, default=DEFAULT_CELL_TIMEOUT_S, metavar="S",
                        help=f"seconds a cell may run before it is interrupted (default {DEFAULT_CELL_TIMEOUT_S})")
    parser.add_argument("--reference", metavar="P",
                        help="the instructor's notebook, or folder of them (matched by file name), "
                             "whose exercises are expected")
    parser.add_argument("--keep", metavar="DIR", help="write the executed notebooks into DIR")
    args = parser.parse_args(argv)
    if args.cell_timeout <= 0:
        print(f"error: --cell-timeout must be > 0 seconds, got {args.cell_timeout}", file=sys.stderr)
        return 2
    paths: list[Path] = []
    for p in map(Path, args.paths):
        if not p.exists():
            print(f"error: {p} does not exist", file=sys.stderr)
            return 2
        paths.extend(_notebook_paths(p))
    if not paths:
        print("error: no .ipynb file to grade", file=sys.stderr)
        return 2
    for p in paths:
        reference = None
        if args.reference:
            ref = Path(args.reference)
            reference = ref / p.name if ref.is_dir() else ref
            if not reference.is_file():
                print(f"error: no reference notebook {reference} for {p}", file=sys.stderr)
                return 2
        keep = Path(args.keep) / p.name if args.keep else None
        report = grade_notebook(p, cell_timeout=args.cell_timeout, reference=reference, keep=keep)
        if args.json:
            print(json.dumps(report.to_dict(), ensure_ascii=False))
        else:
            print(report.text())
        sys.stdout.flush()
    return 0
