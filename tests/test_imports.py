"""The package's layers point one way: a lower layer never imports a higher one, no two folders
import each other, and no file imports one that imports it back.

The engine layer, bottom up: `ops` (kernels), `config`, then `kvcache`, `sampling`, `model` and
`spec_decode` (its proposers), then `core` (requests and the scheduler), `worker` (the model
runner), `engine` (the loop and `LLM`), `serve`. The readable model uses no private op module and
no fast path. Imports inside functions (and under `TYPE_CHECKING`) count too.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "llmlab"

ENGINE_ORDER = (
    "ops",
    "config",
    "kvcache",
    "sampling",
    "model",
    "spec_decode",
    "core",
    "worker",
    "engine",
    "serve",
)
# the folders of one rank, which may not import each other either
SIDE_BY_SIDE = {"kvcache", "sampling", "model"}


def _engine_forbidden() -> dict[str, tuple[str, ...]]:
    """folder -> the folders above it (or beside it) that it must not import."""
    rules = {}
    for i, folder in enumerate(ENGINE_ORDER):
        above = set(ENGINE_ORDER[i + 1 :])
        if folder in SIDE_BY_SIDE:
            above |= SIDE_BY_SIDE - {folder}
        rules[f"llmlab.{folder}"] = tuple(sorted(f"llmlab.{f}" for f in above))
    return rules


# module prefix -> prefixes it must not import
FORBIDDEN = {
    **_engine_forbidden(),
    "llmlab.model.llama": (
        "llmlab.model.cpu",
        "llmlab.model.gpu",
        "llmlab.ops._checks",
        "llmlab.ops.cpu_backend",
        "llmlab.ops.torch_backend",
    ),
}


def _module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(path: Path) -> set[str]:
    """Every module `path` imports, anywhere in the file, as absolute names."""
    module = _module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parent + ([base] if base else []))
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return found


def _matches(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def back_arrows() -> list[str]:
    bad = []
    for path in sorted(PACKAGE.rglob("*.py")):
        module = _module_name(path)
        for layer, forbidden in FORBIDDEN.items():
            if not _matches(module, layer):
                continue
            for name in sorted(imports_of(path)):
                if any(_matches(name, f) for f in forbidden):
                    bad.append(f"{module} imports {name}")
    return bad


def test_no_module_imports_a_layer_above_it():
    assert back_arrows() == []


def test_the_check_finds_a_back_arrow(tmp_path):
    """The parser sees imports inside functions and relative ones (a planted back-arrow)."""
    pkg = tmp_path / "llmlab"
    (pkg / "kvcache").mkdir(parents=True)
    (pkg / "kvcache" / "manager.py").write_text(
        "def f():\n    from ..core.request import Request\n    return Request\n"
    )
    global PACKAGE
    saved, PACKAGE = PACKAGE, pkg
    try:
        assert back_arrows() == [
            "llmlab.kvcache.manager imports llmlab.core.request",
            "llmlab.kvcache.manager imports llmlab.core.request.Request",
        ]
    finally:
        PACKAGE = saved


@pytest.mark.parametrize("module", sorted(FORBIDDEN))
def test_layer_modules_exist(module):
    """The rules above name real modules (a renamed module would make them vacuous)."""
    parts = module.split(".")[1:]
    assert (
        PACKAGE.joinpath(*parts).with_suffix(".py").is_file()
        or PACKAGE.joinpath(*parts, "__init__.py").is_file()
    )


# ---- the folders: engine <- analysis <- tools <- course <- the command line ---------------------

# Each module's layer. The engine is everything not listed (llmlab/*.py and its engine folders).
LAYERS = ("engine", "analysis", "tools", "course", "cli")
FOLDERS = {
    "llmlab.analysis": "analysis",
    "llmlab.bench": "tools",
    "llmlab.tools": "tools",
    "llmlab.course": "course",
    "llmlab.__main__": "cli",
    # DESIGN.md's `from llmlab.metrics import summarize`: the analysis layer's, at the top
    "llmlab.metrics": "analysis",
}
# inside the course: checkers never import widgets or figures; figures never import widgets
COURSE_FORBIDDEN = {
    "llmlab.course.check": ("llmlab.course.widgets", "llmlab.course.figures"),
    "llmlab.course.figures": ("llmlab.course.widgets",),
}


def layer_of(module: str) -> str | None:
    if module != "llmlab" and not module.startswith("llmlab."):
        return None
    for prefix, layer in FOLDERS.items():
        if _matches(module, prefix):
            return layer
    return "engine"


def layer_violations() -> list[str]:
    bad = []
    for path in sorted(PACKAGE.rglob("*.py")):
        module = _module_name(path)
        mine = layer_of(module)
        if module == "llmlab":  # the package's front door names every layer lazily
            continue
        for name in sorted(imports_of(path)):
            theirs = layer_of(name)
            if theirs is not None and LAYERS.index(theirs) > LAYERS.index(mine):
                bad.append(f"{module} ({mine}) imports {name} ({theirs})")
            for inside, forbidden in COURSE_FORBIDDEN.items():
                if _matches(module, inside) and any(_matches(name, f) for f in forbidden):
                    bad.append(f"{module} imports {name}")
    return bad


def folder_cycles() -> list[tuple[str, str]]:
    """Pairs of folders (llmlab/<folder> or llmlab/<layer>/<folder>) importing each other."""

    def folder(module: str) -> str:
        parts = module.split(".")
        depth = 3 if len(parts) > 2 and parts[1] in ("analysis", "course", "tools") else 2
        return ".".join(parts[:depth])

    edges = set()
    for path in sorted(PACKAGE.rglob("*.py")):
        module = _module_name(path)
        if module in ("llmlab", "llmlab.course", "llmlab.analysis", "llmlab.tools"):
            continue
        for name in imports_of(path):
            if name.startswith("llmlab.") and folder(name) != folder(module):
                edges.add((folder(module), folder(name)))
    return sorted((a, b) for a, b in edges if (b, a) in edges and a < b)


def test_imports_between_layers_point_one_way():
    """The engine never imports analysis or the course, analysis never the course or tools,
    tools never the course; checkers compute through analysis, never widgets or figures."""
    assert layer_violations() == []


def test_no_two_folders_import_each_other():
    assert folder_cycles() == []


def test_the_layer_check_catches_a_planted_arrow(tmp_path):
    pkg = tmp_path / "llmlab"
    for folder in ("core", "analysis", "course/check", "course/widgets"):
        (pkg / folder).mkdir(parents=True)
    (pkg / "core" / "scheduler.py").write_text("from llmlab.analysis import costs\n")
    (pkg / "analysis" / "sim.py").write_text("def f():\n    from llmlab.course.check import ch08\n")
    (pkg / "course" / "check" / "ch08.py").write_text("from ..widgets.batching import f\n")
    (pkg / "course" / "widgets" / "batching.py").write_text(
        "from llmlab.course.check import ch08\n"
    )
    global PACKAGE
    saved, PACKAGE = PACKAGE, pkg
    try:
        found = layer_violations()
        assert "llmlab.core.scheduler (engine) imports llmlab.analysis.costs (analysis)" in found
        assert "llmlab.analysis.sim (analysis) imports llmlab.course.check.ch08 (course)" in found
        assert "llmlab.course.check.ch08 imports llmlab.course.widgets.batching" in found
        assert folder_cycles() == [("llmlab.course.check", "llmlab.course.widgets")]
    finally:
        PACKAGE = saved


def test_the_grader_and_notebook_readers_start_without_torch_or_grammars():
    """`import llmlab` and the grader's own modules load neither torch (only the kernel and the
    checker process need it) nor jsonschema's IRI grammars (nbformat's schemas use none): each
    costs every graded notebook a second or more."""
    import subprocess
    import sys

    code = (
        "import sys, llmlab\n"
        "from llmlab.course import skip_iri_format_checks\n"
        "skip_iri_format_checks()\n"
        "import llmlab.course.instructor.grading, nbformat\n"
        "nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell('1')])\n"
        "nbformat.validate(nb)\n"
        "print(sorted(m for m in ('torch', 'rfc3987_syntax', 'lark') if sys.modules.get(m)))\n"
        "from llmlab import SamplingParams\n"
        "print('torch' in sys.modules, SamplingParams.__module__)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.split("\n")
    assert out[0] == "[]", out
    assert out[1] == "True llmlab.sampling.params", out


def import_graph() -> dict[str, set[str]]:
    """module -> the package's modules it imports (`from pkg import name` counts as the module
    `pkg.name` when there is one, else as `pkg`)."""
    files = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph = {}
    for module, path in files.items():
        names = imports_of(path)
        deps = set()
        for name in names:
            if name in files and any(n.startswith(name + ".") and n in files for n in names):
                continue  # `from pkg import submodule`: the submodule is the dependency
            while name and name not in files:
                name = name.rpartition(".")[0]
            if name and name != module:
                deps.add(name)
        graph[module] = deps
    return graph


def file_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The sets of two or more modules that reach each other through their imports (Tarjan's
    strongly connected components)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    import sys

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 10_000))
    try:
        for v in sorted(graph):
            if v not in index:
                visit(v)
    finally:
        sys.setrecursionlimit(limit)
    return sorted(found)


def test_no_file_imports_one_that_imports_it_back():
    """Checked on files, not only folders: two modules in one folder (the engine loop and a
    second step of its own, once) may not lean on each other either."""
    assert file_cycles(import_graph()) == []


def test_the_file_cycle_check_finds_a_loop_of_three():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert file_cycles(graph) == [["a", "b", "c"]]
    assert file_cycles({"a": {"b"}, "b": set()}) == []
