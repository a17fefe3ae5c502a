"""The source chapter (the Chinese text the course follows), for the tests that check the
sentences quoted from it: it lives beside the repository, at `../shared/seed/`, or where
`LLMLAB_SEED_DIR` points; a clone without it skips those tests, saying so."""

from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SEED_DIR = Path(os.environ.get("LLMLAB_SEED_DIR", ROOT.parent / "shared" / "seed"))
WHERE = f"the source chapter is not at {SEED_DIR} (set LLMLAB_SEED_DIR); the quotes are checked where it is"


def source_chapter_text() -> str | None:
    """The source chapter's text (all its files, in order), or None where it is not."""
    files = sorted(SEED_DIR.glob("*.txt")) if SEED_DIR.is_dir() else []
    return "".join(p.read_text(encoding="utf-8") for p in files) or None
