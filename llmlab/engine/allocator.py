"""Keep freed memory in the process instead of handing it back to the OS after every step.

An engine step allocates and frees tens of megabytes of activations (logits alone are
`[requests, vocab]` floats: 6 MB at 32 requests of SmolLM2). glibc's malloc serves big blocks
with fresh `mmap`s and trims the heap top back to the OS when it is freed, so the next step
page-faults the same memory in again: after a run of transformers' `generate` in the same
process had moved malloc's adaptive thresholds, our engine ran 15 % slower. Fixing the two
thresholds (what inference servers get from jemalloc or tcmalloc) keeps the memory mapped.
The setting is process-wide and harmless to other code; a process's resident memory stays at
its peak instead of shrinking. Only on Linux with glibc; elsewhere it does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 32 << 20  # blocks below 32 MiB (glibc's maximum) come from the heap
TRIM_THRESHOLD = 1 << 30  # give memory back to the OS only past 1 GiB free at the top

_done: bool | None = None


def keep_freed_memory() -> bool:
    """Set malloc's thresholds once per process; True if they are set (glibc), else False."""
    global _done
    if _done is None:
        _done = False
        if sys.platform.startswith("linux"):
            try:
                libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
                mallopt = libc.mallopt
            except (OSError, AttributeError):
                return False
            _done = bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(
                mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD)
            )
    return _done
