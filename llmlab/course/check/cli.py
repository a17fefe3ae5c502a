"""`python -m llmlab check chNN [NOTEBOOK_OR_MODULE]`: a chapter's build exercises, run on the
student's code outside Jupyter (in a terminal, an editor, a script or CI of one's own).

Each chapter's checker module lists its build exercises in `BUILDS` (exercise id -> the name the
student's class or function has). The code comes from

- a notebook (`.ipynb`, by default the chapter in the student's edition, `build/student/<lang>/`):
  its *definition cells* run in order, those whose statements are only imports, `def`s, `class`es
  and names bound to literals (the skeleton cells are written that way); nothing else runs, so no
  model is loaded;
- or a Python file (`.py`), run as a module.

Each exercise whose class or function the code defines is checked and prints its line (with the
shrunk case when it fails); one it does not define is named and skipped (a module may hold one
exercise of a chapter that has two). The exit status is 0 when every checked exercise passes, 1
when one does not or none is defined, 2 for a usage error.

Hints come in stages, as in the notebook: the broken rule first, the way to the fix from the
second wrong try, the worked solution from the third (`llmlab.course.check.core`). A run is a
fresh process, so the wrong tries are kept between runs in a small file beside the checked file,
`.llmlab-tries.json` ({file name: {exercise: wrong tries}}); delete it to start over. Nothing is
written beside a file inside the llmlab package or its cache (there the hints do not escalate).
"""

from __future__ import annotations

import ast
import importlib
import json
import linecache
import os
import runpy
import sys
from pathlib import Path
from typing import Any

from llmlab.course.check import core
from llmlab.course.check.catalog import catalog

USAGE = "usage: python -m llmlab check chNN [NOTEBOOK.ipynb | MODULE.py]"
TRIES_FILE = ".llmlab-tries.json"
M = catalog("cli")


def chapter_builds(chapter: str) -> dict[str, str]:
    """{exercise id: answer name} of a chapter ("ch11"); ValueError for an unknown chapter."""
    if not (len(chapter) == 4 and chapter.startswith("ch") and chapter[2:].isdigit()):
        raise ValueError(f"chapter must be chNN (e.g. ch11), got {chapter!r}")
    try:
        module = importlib.import_module(f"llmlab.course.check.{chapter}")
    except ImportError:
        raise ValueError(f"chapter must be one of the course's chapters, got {chapter!r}") from None
    builds = getattr(module, "BUILDS", {})
    if not builds:
        raise ValueError(f"{chapter} has no build exercise")
    return dict(builds)


def default_notebook(chapter: str, root: Path | None = None) -> Path:
    """The chapter's notebook in the student's edition (the language of LLMLAB_LANG), else the
    instructor's in notebooks/."""
    root = root or Path.cwd()
    lang = os.environ.get("LLMLAB_LANG", "en").strip().lower() or "en"
    number = chapter[2:]
    for folder in (root / "build" / "student" / lang, root / "notebooks"):
        found = sorted(folder.glob(f"{number}-*.ipynb"))
        if found:
            return found[0]
    raise ValueError(
        f"no notebook for {chapter} in build/student/{lang}/ or notebooks/; "
        f"give the notebook or module to check"
    )


def _is_literal_constant(node: ast.stmt) -> bool:
    """`NAME = <a literal>` (chapter 15's `PREFIX = '{"age": '`): a definition, nothing runs."""
    if not (isinstance(node, ast.Assign) and all(isinstance(t, ast.Name) for t in node.targets)):
        return False
    try:
        ast.literal_eval(node.value)
    except ValueError:
        return False
    return True


def _is_definition_cell(source: str) -> bool:
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return False
    allowed = (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
    body = [
        node
        for node in tree.body
        if not (isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant))
    ]
    return bool(body) and all(
        isinstance(node, allowed) or _is_literal_constant(node) for node in body
    )


def load_definitions(path: Path) -> dict[str, Any]:
    """The namespace the student's definitions make: a notebook's definition cells run in order,
    or a Python file run as `__main__`."""
    if path.suffix == ".py":
        return runpy.run_path(str(path), run_name="__main__")
    if path.suffix != ".ipynb":
        raise ValueError(f"the code to check must be a .ipynb or .py file, got {path}")
    import nbformat

    nb = nbformat.read(path, as_version=4)
    namespace: dict[str, Any] = {"__name__": "__main__"}  # as in the notebook's kernel
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "code" and _is_definition_cell(cell.source):
            filename = f"<{path.name} cell {i}>"
            # kept where `inspect` reads sources (as IPython keeps a cell's), so that a class or
            # function defined here can travel by its source (to a sandbox, to spawned ranks)
            lines = cell.source.splitlines(keepends=True)
            linecache.cache[filename] = (len(cell.source), None, lines, filename)
            exec(compile(cell.source, filename, "exec"), namespace)
    return namespace


def tries_file(checked: Path) -> Path | None:
    """The file that keeps the wrong tries of the exercises in `checked`: TRIES_FILE beside it,
    or None when `checked` lies inside the llmlab package or its cache (nothing is written
    there)."""
    import llmlab
    from llmlab.paths import cache_dir

    folder = checked.resolve().parent
    for kept_clean in (Path(llmlab.__file__).resolve().parent, cache_dir().resolve()):
        if folder == kept_clean or kept_clean in folder.parents:
            return None
    return folder / TRIES_FILE


def read_tries(store: Path | None, name: str) -> dict[str, int]:
    """{exercise: wrong tries} kept for the file called `name`; {} when there are none (or the
    store cannot be read: the hints then start at their first stage)."""
    try:
        kept = json.loads(store.read_text(encoding="utf-8"))[name] if store else {}
        return {str(ex): int(n) for ex, n in kept.items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return {}


def write_tries(store: Path | None, name: str, tries: dict[str, int]) -> None:
    """Keep `tries` for the file called `name` in `store`, beside the other files' (a store
    that cannot be written is left alone: checking never fails for it)."""
    if store is None:
        return
    try:
        kept = json.loads(store.read_text(encoding="utf-8")) if store.exists() else {}
        kept = kept if isinstance(kept, dict) else {}
    except (OSError, ValueError):
        kept = {}
    kept[name] = dict(sorted(tries.items()))
    try:
        store.write_text(json.dumps(kept, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    except OSError:
        pass


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__ if argv else USAGE)
        return 0 if argv else 2
    chapter = argv[0].lower()
    try:
        builds = chapter_builds(chapter)
        path = Path(argv[1]) if len(argv) > 1 else default_notebook(chapter)
        if not path.is_file():
            raise ValueError(f"no file {path}")
        namespace = load_definitions(path)
    except ValueError as e:
        print(M("usage_error", error=e, usage=USAGE), file=sys.stderr)
        return 2
    print(M("checking", chapter=chapter, path=path))
    module = importlib.import_module(f"llmlab.course.check.{chapter}")
    present = {ex: name for ex, name in builds.items() if name in namespace}
    for exercise, name in builds.items():
        if exercise not in present:
            print(M("not_defined", exercise=exercise, file=path.name, name=name))
    if not present:
        names = ", ".join(builds.values())
        print(M("none_defined", path=path, names=names), file=sys.stderr)
        return 1
    store = tries_file(path)
    tries = read_tries(store, path.name)
    core.carry_wrong_tries(tries)
    all_passed = True
    for exercise, name in present.items():
        checker = getattr(module, exercise.partition(".")[2])
        result = checker(namespace[name])
        all_passed &= bool(result)
        tries[exercise] = core.wrong_tries(exercise)
    write_tries(store, path.name, tries)
    return 0 if all_passed else 1
