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


def in_tree() -> set[str]:
    """Engine modules and packages at the top; every module or package inside a layer folder
    (bench counts as one)."""
    found = set()
    for p in PACKAGE.iterdir():
        name = p.stem if p.suffix == ".py" else p.name
        if (
            name.startswith("_")
            or name in LAYER_FOLDERS
            or (p.is_dir() and not (p / "__init__.py").exists())
        ):
            continue
        found.add(f"llmlab.{name}")
    for folder in LAYER_FOLDERS:
        for p in (PACKAGE / folder).iterdir():
            if p.name.startswith("_") or (p.is_dir() and not (p / "__init__.py").exists()):
                continue
            if p.suffix == ".py" or p.is_dir():
                found.add(f"llmlab.{folder}.{p.stem if p.suffix == '.py' else p.name}")
    return found


def test_the_module_map_names_every_module_and_only_those():
    doc, tree = documented(), in_tree()
    assert tree - doc == set(), f"modules missing from docs/design.md: {sorted(tree - doc)}"
    assert doc - tree == set(), (
        f"docs/design.md names modules that are not there: {sorted(doc - tree)}"
    )
