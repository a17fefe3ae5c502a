"""Interactive widgets, one function each; every one calls a plain plotting function too.

The widgets live in topic submodules (`llmlab/widgets/kv.py`, ...). `llmlab.course.widgets.NAME`
finds NAME in whichever submodule defines it, so a notebook writes
`from llmlab.course.widgets import kv_calculator`.
"""

from __future__ import annotations

import importlib
import pkgutil


def __getattr__(name: str):
    if name.startswith("_"):
        raise AttributeError(name)
    for info in pkgutil.iter_modules(__path__):
        module = importlib.import_module(f"{__name__}.{info.name}")
        if hasattr(module, name):
            return getattr(module, name)
    raise AttributeError(f"module {__name__!r} has no widget or plot function {name!r}")
