"""Small helpers every layer may use (this module imports nothing from llmlab, nor torch)."""

from __future__ import annotations

import platform
import unicodedata
from pathlib import Path


def cpu_name() -> str:
    """The CPU's model name (from /proc/cpuinfo, else `platform.processor()`)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def cdiv(a: int, b: int) -> int:
    """ceil(a / b) for ints, b > 0: e.g. how many blocks of b tokens hold a tokens."""
    return -(-a // b)


def check_positive_int(name: str, value: object, allow_none: bool = False) -> None:
    """Raise ValueError naming `name` unless `value` is an int >= 1 (or None, if allowed)."""
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(
            f"{name} must be an int >= 1{' or None' if allow_none else ''}, got {value!r}"
        )


# ---- text padded by screen columns (a Chinese character takes two) ----------------------


def width(text: str) -> int:
    """Columns `text` takes on screen: a Chinese character (East Asian wide or full-width) takes
    two, so that tables with Chinese headers still line up (English text: its length)."""
    return sum(2 if unicodedata.east_asian_width(ch) in "WF" else 1 for ch in text)


def ljust(text: str, columns: int) -> str:
    """`text` padded with spaces on the right to `columns` screen columns (see `width`)."""
    return text + " " * (columns - width(text))


def rjust(text: str, columns: int) -> str:
    """`text` padded with spaces on the left to `columns` screen columns (see `width`)."""
    return " " * (columns - width(text)) + text
