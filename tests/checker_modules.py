"""A chapter's checker modules: `llmlab.course.check.chNN` itself, or, where the chapter's
checkers are a package, each module of it; its exercises with their checkers; and a checker
called without its printed line."""

from __future__ import annotations

import contextlib
import importlib
import io
import pkgutil
from pathlib import Path
from types import ModuleType
from typing import Any, Callable

CHECK_DIR = Path(__file__).resolve().parent.parent / "llmlab" / "course" / "check"


def checker_modules(chapter: str) -> list[ModuleType]:
    """["ch04"] -> [ch04]; ["ch11"] -> [ch11.block_pool, ch11.chunked, ...]."""
    module = importlib.import_module(f"llmlab.course.check.{chapter}")
    if not hasattr(module, "__path__"):
        return [module]
    return [
        importlib.import_module(f"{module.__name__}.{info.name}")
        for info in pkgutil.iter_modules(module.__path__)
    ]


def chapter_exercises(chapter: str) -> list[tuple[str, Callable[..., Any]]]:
    """[("ch04.kv_bytes_per_token", ch04.kv_bytes_per_token), ...]: each exercise `chapter`'s
    `EXERCISES` lists, with its checker."""
    module = importlib.import_module(f"llmlab.course.check.{chapter}")
    return [(f"{chapter}.{name}", getattr(module, name)) for name in module.EXERCISES]


def checker_files(chapter: str) -> list[Path]:
    """The source files of `chapter`'s checkers ("core" and "predict" too)."""
    single = CHECK_DIR / f"{chapter}.py"
    return [single] if single.exists() else sorted((CHECK_DIR / chapter).glob("*.py"))


def quiet(fn, *args, **kwargs):
    """`fn(*args, **kwargs)` with what it prints (a checker's line) left unread."""
    with contextlib.redirect_stdout(io.StringIO()):
        return fn(*args, **kwargs)
