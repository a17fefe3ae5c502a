"""Where llmlab keeps what it makes on this machine: the converted model, compiled kernels."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """llmlab's cache: `$LLMLAB_CACHE`, default `~/.cache/llmlab`."""
    return Path(os.environ.get("LLMLAB_CACHE", Path.home() / ".cache" / "llmlab"))
