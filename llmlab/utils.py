"""Small helpers every layer may use (this module imports nothing from llmlab, nor torch): the
one text-table formatter (`format_table`) and the one best-of timer (`best_of`) among them."""

from __future__ import annotations

import math
import platform
import time
import unicodedata
from collections.abc import Callable, Iterable, Sequence
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


# ---- the one text table ---------------------------------------------------------------------


def format_table(
    rows: Iterable[Sequence[object]],
    headers: Sequence[object] | None = None,
    *,
    align: str = "lr",
    rule: bool = True,
    sep: str = "  ",
) -> str:
    """`rows` as a plain-text table, columns aligned by screen columns (see `width`), so Chinese
    headers line up too: the package's printed tables all go through here.

    Each cell is printed as `str(cell)` (format numbers before). `headers`: the first line, with
    a line of dashes under it when `rule`. `align`: one letter per column, "l" (left) or "r"
    (right); when shorter than the columns its last letter repeats, so "lr" (the default) puts a
    label column left and every number column right, "r" every column right. Columns are
    separated by `sep`; no line ends in spaces.
    """
    grid = [[str(c) for c in row] for row in rows]
    if headers is not None:
        grid.insert(0, [str(h) for h in headers])
    if not grid:
        return ""
    ncols = len(grid[0])
    bad = next((row for row in grid if len(row) != ncols), None)
    if bad is not None:
        raise ValueError(
            f"every row must have {ncols} cells, as the first has; got {len(bad)}: {bad!r}"
        )
    if not align or set(align) - {"l", "r"}:
        raise ValueError(f"align must be a non-empty string of 'l' and 'r', got {align!r}")
    aligns = [align[min(i, len(align) - 1)] for i in range(ncols)]
    widths = [max(width(row[i]) for row in grid) for i in range(ncols)]
    lines = [
        sep.join(
            ljust(c, w) if a == "l" else rjust(c, w) for c, w, a in zip(row, widths, aligns)
        ).rstrip()
        for row in grid
    ]
    if headers is not None and rule:
        lines.insert(1, sep.join("-" * w for w in widths))
    return "\n".join(lines)


# ---- the one best-of timer -------------------------------------------------------------------


def best_of(
    fn: Callable[[], object],
    repeats: int = 3,
    *,
    budget_s: float | None = None,
    warmup: int = 0,
    sync: Callable[[], object] | None = None,
    clock: Callable[[], float] = time.perf_counter,
) -> float:
    """The fastest of `repeats` wall-clock timings of `fn()`, in seconds (measured).

    The minimum filters out the moments the OS ran something else on our cores: it is the number
    a floor is compared with (what the machine can do, not what it did on average). `warmup`
    untimed calls come first (first touches of memory, allocator growth, compilation). `sync`
    runs after each call and is timed with it (`torch.cuda.synchronize`: GPU work returns before
    it is done). With `budget_s`, no timed call starts once the timed calls so far took that long
    (the first always runs). `clock` is injectable so tests need no real timing.
    """
    check_positive_int("repeats", repeats)
    if not isinstance(warmup, int) or isinstance(warmup, bool) or warmup < 0:
        raise ValueError(f"warmup must be an int >= 0, got {warmup!r}")
    if budget_s is not None and not budget_s >= 0:
        raise ValueError(f"budget_s must be None or a number >= 0, got {budget_s!r}")
    for _ in range(warmup):
        fn()
    if warmup and sync is not None:
        sync()
    best = math.inf
    start = clock()
    for _ in range(repeats):
        t0 = clock()
        fn()
        if sync is not None:
            sync()
        best = min(best, clock() - t0)
        if budget_s is not None and clock() - start > budget_s:
            break
    return best
