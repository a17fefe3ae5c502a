"""docs/design.md's module map is true: it names every module of the package, each in its
layer's table, and nothing that is not in the tree."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "llmlab"
LAYER_FOLDERS = ("analysis", "course", "tools")


def documented() -> set[str]:
    text = (ROOT / "docs" / "design.md").read_text(encoding="utf-8")
    section = text[text.index("## The package, in three layers") : text.index("## The model")]
    return set(re.findall(r"^\| `(llmlab(?:\.\w+)+)` \|", section, re.M))


# engine folders whose every module has a row (the others: one row for the folder)
DETAILED = ("config", "core", "engine", "model", "worker")


def _modules_in(folder: Path, prefix: str) -> set[str]:
    return {
        f"{prefix}.{p.stem if p.suffix == '.py' else p.name}"
        for p in folder.iterdir()
        if not p.name.startswith("_")
        and (p.suffix == ".py" or (p.is_dir() and (p / "__init__.py").exists()))
    }


def in_tree() -> set[str]:
    """Engine modules and folders at the top, every module of the detailed engine folders, and
    every module or package inside a layer folder (bench counts as one)."""
    found = {
        name for name in _modules_in(PACKAGE, "llmlab") if name.split(".")[1] not in LAYER_FOLDERS
    }
    for folder in DETAILED:
        found |= _modules_in(PACKAGE / folder, f"llmlab.{folder}")
    for folder in LAYER_FOLDERS:
        found |= _modules_in(PACKAGE / folder, f"llmlab.{folder}")
    return found


def exists(module: str) -> bool:
    path = PACKAGE.parent.joinpath(*module.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def test_the_module_map_names_every_module_and_only_those():
    doc, tree = documented(), in_tree()
    assert tree - doc == set(), f"modules missing from docs/design.md: {sorted(tree - doc)}"
    gone = sorted(m for m in doc - tree if not exists(m))
    assert gone == [], f"docs/design.md names modules that are not there: {gone}"
