"""Self-check exercises, one module per chapter: `from llmlab.course import check; check.ch04.kv_bytes(...)`."""

from __future__ import annotations

import importlib

from llmlab.course.check.core import CheckResult


def __getattr__(name: str):
    if name.startswith("ch"):
        try:
            return importlib.import_module(f"{__name__}.{name}")
        except ModuleNotFoundError:
            pass
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["CheckResult"]
