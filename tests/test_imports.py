"""The package's layers point one way: a lower layer never imports a higher one.

`Request` sits above both the scheduler and the KV cache manager (as `vllm/v1/request.py`);
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
    "llmlab.ops": ("llmlab.model", "llmlab.model_cpu", "llmlab.engine", "llmlab.weights",
                   "llmlab.kvcache"),
    "llmlab.request": ("llmlab.engine", "llmlab.kvcache", "llmlab.model"),
    "llmlab.sampling": ("llmlab.engine", "llmlab.kvcache", "llmlab.model"),
    "llmlab.model": ("llmlab.engine", "llmlab.model_cpu", "llmlab.ops._checks",
                     "llmlab.ops.cpu_backend", "llmlab.ops.torch_backend", "llmlab.kvcache"),
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
                parent = package.split(".")[:len(package.split(".")) - node.level + 1]
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
        "def f():\n    from ..engine.request import Request\n    return Request\n")
    global PACKAGE
    saved, PACKAGE = PACKAGE, pkg
    try:
        assert back_arrows() == ["llmlab.kvcache.manager imports llmlab.engine.request",
                                 "llmlab.kvcache.manager imports llmlab.engine.request.Request"]
    finally:
        PACKAGE = saved


@pytest.mark.parametrize("module", ["llmlab.model", "llmlab.kvcache", "llmlab.ops"])
def test_layer_modules_exist(module):
    """The rules above name real modules (a renamed module would make them vacuous)."""
    parts = module.split(".")[1:]
    assert (PACKAGE.joinpath(*parts).with_suffix(".py").is_file()
            or PACKAGE.joinpath(*parts, "__init__.py").is_file())
