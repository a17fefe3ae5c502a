"""The command line: `bench --help` lists every benchmark, an unknown one is refused by name."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent / "llmlab" / "bench"


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "llmlab", *args], capture_output=True, text=True, timeout=120
    )


def test_bench_help_lists_every_benchmark_with_what_it_does():
    out = run("bench", "--help")
    assert out.returncode == 0, out.stderr
    lines = {line.split()[0]: line for line in out.stdout.splitlines()[2:] if line.strip()}
    modules = {
        p.stem
        for p in BENCH.glob("*.py")
        if not p.stem.startswith("_") and "\ndef main(" in p.read_text(encoding="utf-8")
    }
    assert set(lines) == modules and "throughput" in modules
    assert all(len(line.split(None, 1)[1]) > 10 for line in lines.values())


def test_an_unknown_benchmark_is_refused_naming_the_choices():
    out = run("bench", "nope")
    assert out.returncode == 2 and "'nope'" in out.stdout and "throughput" in out.stdout


def test_importing_llmlab_changes_no_warning_filter():
    # torch, numpy and transformers install their own filters on import: import them first
    code = (
        "import warnings, torch, numpy, transformers; before = list(warnings.filters); "
        "import llmlab; from llmlab import LLM, SamplingParams; import llmlab.engine; "
        "print(warnings.filters == before)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "True", out.stderr
