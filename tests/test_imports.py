"""The package's layers point one way: a lower layer never imports a higher one.

`Request` sits above both the scheduler and the KV cache manager (as `vllm/v1/request.py`), and
so does `EngineConfig` (`llmlab.engine_config`), whose defaults they take;
the ops know nothing of the model, the engine or model loading; the readable model uses no
private op module and no fast path. Imports inside functions count too.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "llmlab"

# module prefix -> prefixes it must not import
FORBIDDEN = {
    "llmlab.kvcache": ("llmlab.engine", "llmlab.model", "llmlab.model_cpu", "llmlab.weights"),
    "llmlab.ops": (
        "llmlab.model",
        "llmlab.model_cpu",
        "llmlab.engine",
        "llmlab.weights",
        "llmlab.kvcache",
    ),
    # the engine's settings: the scheduler and the KV cache manager take their defaults from it
    "llmlab.engine_config": ("llmlab.engine", "llmlab.kvcache", "llmlab.model", "llmlab.request"),
    "llmlab.request": ("llmlab.engine", "llmlab.kvcache", "llmlab.model"),
    "llmlab.sampling": ("llmlab.engine", "llmlab.kvcache", "llmlab.model"),
    "llmlab.model": (
        "llmlab.engine",
        "llmlab.model_cpu",
        "llmlab.ops._checks",
        "llmlab.ops.cpu_backend",
        "llmlab.ops.torch_backend",
        "llmlab.kvcache",
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
        "def f():\n    from ..engine.request import Request\n    return Request\n"
    )
    global PACKAGE
    saved, PACKAGE = PACKAGE, pkg
    try:
        assert back_arrows() == [
            "llmlab.kvcache.manager imports llmlab.engine.request",
            "llmlab.kvcache.manager imports llmlab.engine.request.Request",
        ]
    finally:
        PACKAGE = saved


@pytest.mark.parametrize(
    "module", ["llmlab.model", "llmlab.kvcache", "llmlab.ops", "llmlab.engine_config"]
)
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


def _resolve(name: str) -> str:
    """An import of a module's earlier name (`llmlab.costs`) counts where the module lives."""
    import llmlab

    target = llmlab._MovedModules._target(name)
    return target or name


def layer_violations() -> list[str]:
    bad = []
    for path in sorted(PACKAGE.rglob("*.py")):
        module = _module_name(path)
        mine = layer_of(module)
        if module == "llmlab":  # the package's front door names every layer lazily
            continue
        for name in sorted(imports_of(path)):
            name = _resolve(name)
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
            name = _resolve(name)
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
    for folder in ("engine", "analysis", "course/check", "course/widgets"):
        (pkg / folder).mkdir(parents=True)
    (pkg / "engine" / "scheduler.py").write_text("from llmlab.analysis import costs\n")
    (pkg / "analysis" / "sim.py").write_text("def f():\n    from llmlab.check import ch08\n")
    (pkg / "course" / "check" / "ch08.py").write_text("from ..widgets.batching import f\n")
    (pkg / "course" / "widgets" / "batching.py").write_text(
        "from llmlab.course.check import ch08\n"
    )
    global PACKAGE
    saved, PACKAGE = PACKAGE, pkg
    try:
        found = layer_violations()
        assert "llmlab.engine.scheduler (engine) imports llmlab.analysis.costs (analysis)" in found
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
    assert out[1] == "True llmlab.sampling", out
