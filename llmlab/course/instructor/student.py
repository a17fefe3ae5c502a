"""The student version of a notebook: one source, solutions marked, stripped for the students.

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
Outputs are cleared. Next to the student versions it writes the manifest
(`llmlab-exercises.json`): the exercises of each notebook, as the instructor's version calls
them, for `python -m llmlab grade --source`. The grader never reads the exercises from a
handed-in notebook.
"""

from __future__ import annotations

import argparse
import ast
import copy
import re
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

from llmlab.course.instructor.exercises import (
    MANIFEST_NAME,
    Exercise,
    _strip_magics,
    exercises,
    write_manifest,
)

PLACEHOLDER = "# YOUR CODE HERE"
METADATA_KEY = "llmlab"

_LINE_MARK = re.compile(r"#\s*SOLUTION\s*$")
_BEGIN = re.compile(r"^\s*#\s*BEGIN SOLUTION\s*$")
_END = re.compile(r"^\s*#\s*END SOLUTION\s*$")


# --------------------------------------------------------------------------- marking

_PREDICTION = re.compile(r"\s*\w+\s*=[^\n]*#\s*SOLUTION\s*")


def is_prediction(source: str) -> bool:
    """A cell that only records the student's guess before a measurement
    (`my_prediction = 10  # SOLUTION`): ungraded, and what it holds is one reasonable guess."""
    return _PREDICTION.fullmatch(source) is not None


@dataclass(frozen=True)
class Solution:
    """One marked solution of a notebook and what the student version shows instead."""

    cell_index: int  # index in nb.cells
    solution: str  # the instructor's lines, markers included
    placeholder: str  # the lines that replace them in the student version


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
        raise ValueError(
            f"{where}: the solution block does not parse on its own ({e.msg}, line {e.lineno}); "
            f"mark whole statements"
        ) from None
    out = [indent + PLACEHOLDER] + [f"{indent}{n} = None" for n in names]
    if indent and not names:
        out.append(indent + "pass")  # an indented suite needs a statement
    return out


def _line_placeholder(lines: list[str], where: str) -> list[str]:
    indent = _indent_of(lines[0])
    code = "\n".join(_LINE_MARK.sub("", ln).rstrip() for ln in lines)
    try:
        names = bound_names(code)
    except SyntaxError as e:
        raise ValueError(
            f"{where}: the lines marked '# SOLUTION' do not parse on their own "
            f"({e.msg}); mark every line of the statement"
        ) from None
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
            raise ValueError(
                f"{where}, line {i + 1}: '# END SOLUTION' without a '# BEGIN SOLUTION' before it"
            )
        if _BEGIN.match(line):
            j = i + 1
            while j < len(lines) and not _END.match(lines[j]):
                if _BEGIN.match(lines[j]):
                    raise ValueError(
                        f"{where}, line {j + 1}: '# BEGIN SOLUTION' inside another solution block"
                    )
                j += 1
            if j == len(lines):
                raise ValueError(
                    f"{where}, line {i + 1}: '# BEGIN SOLUTION' has no matching '# END SOLUTION'"
                )
            repl = _block_placeholder(lines[i + 1 : j], _indent_of(line), f"{where}, line {i + 1}")
            pairs.append(("\n".join(lines[i : j + 1]), "\n".join(repl)))
            out.extend(repl)
            i = j + 1
            continue
        if _LINE_MARK.search(line):
            j = i + 1
            while (
                j < len(lines)
                and _LINE_MARK.search(lines[j])
                and not _BEGIN.match(lines[j])
                and not _END.match(lines[j])
            ):
                j += 1
            # a statement marked on its first line only: take its continuation lines along
            while not _parses("\n".join(_LINE_MARK.sub("", ln) for ln in lines[i:j])) and j < len(
                lines
            ):
                j += 1
            repl = _line_placeholder(lines[i:j], f"{where}, line {i + 1}")
            pairs.append(("\n".join(lines[i:j]), "\n".join(repl)))
            out.extend(repl)
            i = j
            continue
        out.append(line)
        i += 1
    return "\n".join(out), pairs


def student_notebook(nb: Any, where: str = "notebook") -> tuple[Any, list[Solution]]:
    """The student version of `nb` (a new notebook; `nb` is not changed) and its solutions.

    Outputs and execution counts are cleared; metadata["llmlab"]["version"] says "student"."""
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
                raise ValueError(
                    f"{label}: the student version of this cell would not parse; "
                    f"check the solution markers"
                )
        cell.source = new_source
        cell.outputs = []
        cell.execution_count = None
        for key in ("execution", "collapsed", "scrolled"):
            cell.metadata.pop(key, None)
        solutions.extend(Solution(index, s, p) for s, p in pairs)
    meta = dict(student.metadata.get(METADATA_KEY, {}))
    meta.pop("exercises", None)  # the grader takes them from the instructor's source
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
            raise ValueError(
                f"cell {s.cell_index} no longer holds the placeholder {s.placeholder!r}"
            )
        cell.source = cell.source.replace(s.placeholder, s.solution, 1)
    return filled


def _notebook_paths(src: Path) -> list[Path]:
    if src.is_dir():
        return sorted(p for p in src.glob("*.ipynb") if not p.name.startswith("."))
    return [src]


def write_student_versions(src: str | Path, dst: str | Path) -> list[tuple[Path, int, int]]:
    """Write the student version of every notebook in `src` (a notebook or a folder) into the
    folder `dst`, and their exercises into its manifest (`MANIFEST_NAME`, entries of other
    notebooks kept); returns (written path, exercises, solutions removed) per notebook."""
    import nbformat

    src, dst = Path(src), Path(dst)
    if not src.exists():
        raise ValueError(
            f"SRC {str(src)!r} does not exist; give a notebook or a folder of notebooks"
        )
    paths = _notebook_paths(src)
    if not paths:
        raise ValueError(f"SRC {str(src)!r} holds no .ipynb file")
    if dst.exists() and not dst.is_dir():
        raise ValueError(f"DST {str(dst)!r} is a file; give a folder")
    if any(p.parent.resolve() == dst.resolve() for p in paths):
        raise ValueError(
            f"DST {str(dst)!r} is the folder of the instructor's notebooks; "
            f"writing there would overwrite the solutions"
        )
    dst.mkdir(parents=True, exist_ok=True)
    written = []
    manifest: dict[str, list[Exercise]] = {}
    for p in paths:
        nb = nbformat.read(p, as_version=4)
        student, solutions = student_notebook(nb, where=p.name)
        student.metadata[METADATA_KEY]["source"] = p.name
        out = dst / p.name
        nbformat.write(student, out)
        manifest[p.name] = exercises(nb)
        written.append((out, len(manifest[p.name]), len(solutions)))
    write_manifest(dst, manifest)
    return written


# --------------------------------------------------------------------------- command line


def student_main(argv: list[str]) -> int:
    """`python -m llmlab student SRC DST`: write the student versions."""
    parser = argparse.ArgumentParser(
        prog="python -m llmlab student",
        description="Write the student version of notebooks: solutions "
        "replaced by '# YOUR CODE HERE', outputs cleared.",
    )
    parser.add_argument(
        "src", help="a notebook, or a folder of notebooks (the instructor's version)"
    )
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
    print(
        f"wrote {Path(args.dst) / MANIFEST_NAME}: the exercises to grade against "
        f"(python -m llmlab grade NOTEBOOK --source {Path(args.dst) / MANIFEST_NAME})"
    )
    return 0
