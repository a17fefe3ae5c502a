"""Which exercises a notebook has: the calls of `llmlab.check.chNN` functions in its code cells.

An exercise's id is `<checker module>.<checker function>`, e.g. `ch04.kv_bytes_per_token`; the
exercises of a notebook are found in its source without running anything.
"""
from __future__ import annotations

import ast
import re
from typing import Any

_CHECK_MODULE = re.compile(r"ch\d+")


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

