"""Which exercises a notebook has: the calls of `llmlab.course.check.chNN` functions in its code cells.

An exercise's id is `<checker module>.<checker function>`, e.g. `ch04.kv_bytes_per_token`; the
exercises of a notebook are found in its source without running anything. The grader takes them
from the instructor's source, never from the notebook it grades: either the instructor's
notebook itself, or the manifest `python -m llmlab student` writes next to the student versions
(`llmlab-exercises.json`, one entry per notebook).

Each exercise also records the shape of the instructor's call (how many positional arguments,
which keywords), so that the grader passes a checker exactly the arguments the exercise passes.
"""

from __future__ import annotations

import ast
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

_CHECK_MODULE = re.compile(r"ch\d+")
EXERCISE_ID = re.compile(r"(ch\d+)\.([A-Za-z]\w*)")
MANIFEST_NAME = "llmlab-exercises.json"


@dataclass(frozen=True)
class Exercise:
    """One exercise as the instructor's source calls its checker."""

    id: str  # "ch04.kv_bytes_per_token"
    positional: int = 1  # positional arguments the call passes, the answer first
    keywords: tuple[str, ...] = ()  # keyword arguments it passes

    @property
    def module(self) -> str:
        return self.id.split(".")[0]

    @property
    def function(self) -> str:
        return self.id.split(".")[1]

    def to_dict(self) -> dict:
        return {"id": self.id, "positional": self.positional, "keywords": list(self.keywords)}

    @classmethod
    def from_dict(cls, d: Any, where: str = "exercise") -> "Exercise":
        """The exercise a manifest entry describes; ValueError naming `where` when it is malformed."""
        if (
            not isinstance(d, dict)
            or not isinstance(d.get("id"), str)
            or not EXERCISE_ID.fullmatch(d["id"])
        ):
            raise ValueError(f"{where}: expected {{\"id\": \"chNN.name\", ...}}, got {d!r}")
        positional, keywords = d.get("positional", 1), d.get("keywords", [])
        if not isinstance(positional, int) or isinstance(positional, bool) or positional < 0:
            raise ValueError(f"{where}: 'positional' must be an int >= 0, got {positional!r}")
        if not isinstance(keywords, list) or not all(
            isinstance(k, str) and k.isidentifier() for k in keywords
        ):
            raise ValueError(f"{where}: 'keywords' must be a list of names, got {keywords!r}")
        return cls(d["id"], positional, tuple(keywords))


CHECK_PACKAGE = "llmlab.course.check"


def _check_aliases(
    tree: ast.AST, modules: dict[str, str], functions: dict[str, str], packages: set[str]
) -> None:
    """Record how this cell imports the checkers (`from llmlab.course import check`,
    `from llmlab.course.check import ch04 as c4`, `from llmlab.course.check.ch04 import kv_bytes`, ...)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "llmlab.course":
                for a in node.names:
                    if a.name == "check":
                        packages.add(a.asname or "check")
            elif node.module == CHECK_PACKAGE:
                for a in node.names:
                    if _CHECK_MODULE.fullmatch(a.name):
                        modules[a.asname or a.name] = a.name
            else:
                pkg = CHECK_PACKAGE
                mod = node.module[len(pkg) + 1 :] if node.module.startswith(pkg + ".") else ""
                if _CHECK_MODULE.fullmatch(mod):
                    for a in node.names:
                        if not a.name.startswith("_") and a.name != "*":
                            functions[a.asname or a.name] = f"{mod}.{a.name}"
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name == CHECK_PACKAGE and a.asname:
                    packages.add(a.asname)
                    continue
                pkg, _, mod = a.name.rpartition(".")
                if pkg == CHECK_PACKAGE and a.asname and _CHECK_MODULE.fullmatch(mod):
                    modules[a.asname] = mod


def _is_llmlab_check(node: ast.AST) -> bool:
    """`llmlab.course.check` or `llmlab.course.check` as an expression."""
    if not (isinstance(node, ast.Attribute) and node.attr == "check"):
        return False
    v = node.value
    if isinstance(v, ast.Attribute) and v.attr == "course":
        v = v.value
    return isinstance(v, ast.Name) and v.id == "llmlab"


def _resolve_module(node: ast.AST, modules: dict[str, str], packages: set[str]) -> str | None:
    if isinstance(node, ast.Name):
        if node.id in modules:
            return modules[node.id]
        return node.id if _CHECK_MODULE.fullmatch(node.id) else None
    if isinstance(node, ast.Attribute) and _CHECK_MODULE.fullmatch(node.attr):
        v = node.value
        if isinstance(v, ast.Name) and (v.id in packages or v.id == "check"):
            return node.attr
        if _is_llmlab_check(v):
            return node.attr
    return None


def _strip_magics(source: str) -> str:
    return "\n".join("" if ln.lstrip().startswith(("%", "!")) else ln for ln in source.split("\n"))


def _checker_calls(nb: Any) -> Iterator[tuple[str, int, ast.Call | None]]:
    """(exercise id, cell index, call) of every call of a `llmlab.course.check.chNN` function in the
    code cells, in order; the call is None where a cell does not parse and a pattern found it."""
    modules: dict[str, str] = {}
    functions: dict[str, str] = {}
    packages: set[str] = set()
    for index, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        try:
            tree = ast.parse(_strip_magics(cell.source))
        except SyntaxError:
            # not Python (yet): fall back to the textual pattern `chNN.name(`
            for m in re.finditer(r"(?<![\w])(ch\d+)\.([A-Za-z]\w*)\s*\(", cell.source):
                yield f"{m[1]}.{m[2]}", index, None
            continue
        _check_aliases(tree, modules, functions, packages)
        calls = sorted(
            (n for n in ast.walk(tree) if isinstance(n, ast.Call)),
            key=lambda n: (n.lineno, n.col_offset),
        )
        for call in calls:
            f = call.func
            if isinstance(f, ast.Attribute) and not f.attr.startswith("_"):
                mod = _resolve_module(f.value, modules, packages)
                if mod:
                    yield f"{mod}.{f.attr}", index, call
            elif isinstance(f, ast.Name) and f.id in functions:
                yield functions[f.id], index, call


def exercise_calls(nb: Any) -> list[tuple[str, int]]:
    """(exercise id, cell index) of every call of a `llmlab.course.check.chNN` function in the code
    cells, first call of each id, in order; found without running anything."""
    found: dict[str, int] = {}
    for ex, index, _ in _checker_calls(nb):
        found.setdefault(ex, index)
    return list(found.items())


def exercise_ids(nb: Any) -> list[str]:
    """The exercise ids a notebook checks, in order (see `exercise_calls`)."""
    return [ex for ex, _ in exercise_calls(nb)]


def exercises(nb: Any) -> list[Exercise]:
    """The exercises of a notebook with the shape of each one's first checker call."""
    found: dict[str, Exercise] = {}
    for ex, _, call in _checker_calls(nb):
        if ex in found:
            continue
        if call is None:
            found[ex] = Exercise(ex)
        else:
            found[ex] = Exercise(
                ex,
                sum(not isinstance(a, ast.Starred) for a in call.args),
                tuple(k.arg for k in call.keywords if k.arg is not None),
            )
    return list(found.values())


# --------------------------------------------------------------------------- the manifest


def read_manifest(path: str | Path) -> dict[str, list[Exercise]]:
    """Notebook file name → its exercises, from a manifest; ValueError naming `path` when the
    file is not one."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ValueError(f"manifest {str(path)!r} cannot be read as JSON: {e}") from None
    notebooks = data.get("notebooks") if isinstance(data, dict) else None
    if not isinstance(notebooks, dict):
        raise ValueError(
            f"manifest {str(path)!r}: expected {{\"notebooks\": {{NAME: [exercise, ...]}}}}"
        )
    out: dict[str, list[Exercise]] = {}
    for name, entries in notebooks.items():
        if not isinstance(entries, list):
            raise ValueError(f"manifest {str(path)!r}, {name}: expected a list of exercises")
        out[name] = [Exercise.from_dict(e, f"manifest {str(path)!r}, {name}") for e in entries]
    return out


def write_manifest(folder: str | Path, notebooks: dict[str, list[Exercise]]) -> Path:
    """Add (or replace) the entries of `notebooks` in the manifest of `folder`; returns its path."""
    path = Path(folder) / MANIFEST_NAME
    merged = read_manifest(path) if path.exists() else {}
    merged.update(notebooks)
    blocks = []  # one line per exercise, so that a diff of two builds reads
    for name, exs in sorted(merged.items()):
        lines = ",\n".join(f"   {json.dumps(e.to_dict())}" for e in exs)
        blocks.append(
            f"  {json.dumps(name)}: [\n{lines}\n  ]" if exs else f"  {json.dumps(name)}: []"
        )
    path.write_text('{"notebooks": {\n' + ",\n".join(blocks) + "\n}}\n", encoding="utf-8")
    return path


def exercises_for(notebook_name: str, source: str | Path) -> list[Exercise]:
    """The exercises a handed-in notebook called `notebook_name` is graded on, from `source`:
    the instructor's notebook, a manifest, or a folder holding a manifest (else the instructor's
    notebook of that name)."""
    import nbformat

    source = Path(source)
    if source.is_dir():
        if (source / MANIFEST_NAME).is_file():
            source = source / MANIFEST_NAME
        elif (source / notebook_name).is_file():
            source = source / notebook_name
        else:
            raise ValueError(
                f"source folder {str(source)!r} holds neither {MANIFEST_NAME} nor {notebook_name}"
            )
    if not source.is_file():
        raise ValueError(
            f"source {str(source)!r} does not exist; give the instructor's notebook, "
            f"a folder of them, or the {MANIFEST_NAME} that `student` wrote"
        )
    if source.suffix == ".json":
        manifest = read_manifest(source)
        if notebook_name not in manifest:
            raise ValueError(
                f"manifest {str(source)!r} has no entry for {notebook_name!r} "
                f"(it lists {sorted(manifest)})"
            )
        return manifest[notebook_name]
    return exercises(nbformat.read(source, as_version=4))
