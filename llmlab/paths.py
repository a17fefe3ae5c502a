"""Where llmlab finds what it ships (`DATA_DIR`: hardware presets, model shapes, texts, prompts)
and where it keeps what it makes on this machine (`cache_dir()`: the converted model, compiled
kernels)."""

from __future__ import annotations

import os
from pathlib import Path

DATA_DIR = Path(__file__).resolve().parents[1] / "data"


def cache_dir() -> Path:
    """llmlab's cache: `$LLMLAB_CACHE`, default `~/.cache/llmlab`."""
    return Path(os.environ.get("LLMLAB_CACHE", Path.home() / ".cache" / "llmlab"))
