"""The tables of `python -m llmlab bench llamacpp` (`llmlab.bench.llamacpp`): the machine each
was measured on (CPU model and the matmul instruction sets it reports, threads, versions), one
row per batch (medians over rounds, the paired llmlab / llama.cpp ratios, the greedy tokens both
made alike), and the printed table."""

from __future__ import annotations

import os
import platform
import statistics
from pathlib import Path

import torch

from llmlab.bench import prefix_agreement
from llmlab.utils import format_table

# the instruction sets a CPU matmul kernel may use (/proc/cpuinfo names), printed beside a table
FLAGS = (
    "avx2",
    "fma",
    "avx512f",
    "avx512_bf16",
    "avx512_vnni",
    "avx_vnni",
    "amx_tile",
    "amx_bf16",
    "amx_int8",
    "asimd",
    "sve",
)


def cpu_flags() -> list[str]:
    """The instruction sets a matmul kernel may use that this CPU reports (`FLAGS`, in order),
    from /proc/cpuinfo; [] where there is none (not Linux)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return []
    have = set()
    for line in text.splitlines():
        if line.startswith("flags"):
            have.update(line.split(":", 1)[1].split())
    return [f for f in FLAGS if f in have]


def kernel_isa() -> str:
    """The instruction sets llmlab's C kernels use here (`cpu_matmul.isa`, under a cap set by
    `$LLMLAB_ISA_CAP`, which it names), or why they do not run."""
    from llmlab.ops import cpu_library, cpu_matmul

    try:
        found = " ".join(cpu_matmul.isa()) or "none of AVX-512 / AVX2"
    except RuntimeError as e:
        return f"no C kernels ({e})"
    cap = os.environ.get(cpu_library.ISA_CAP_ENV)
    return found if cap is None else f"{found} ({cpu_library.ISA_CAP_ENV}={cap})"


def machine_info(threads: int) -> dict:
    """The machine a table was measured on: CPU model, its matmul flags, threads, versions."""
    from llmlab.tools.doctor import cpu_name

    return {
        "cpu": cpu_name(),
        "cpu_flags": cpu_flags(),
        "llmlab_isa": kernel_isa(),
        "cores": os.cpu_count(),
        "threads": threads,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
        "gomp_spincount": os.environ.get("GOMP_SPINCOUNT"),
    }


def openmp_line(machine: dict, with_llamacpp: bool) -> str:
    """How the OpenMP threads of both systems waited (one runtime in one process): sleeping makes
    every barrier a wake-up, and llama.cpp's threads meet at each operation of its graph."""
    policy = (machine.get("omp_wait_policy") or "").upper()
    spins = machine.get("gomp_spincount")
    if policy == "PASSIVE":
        line = "OpenMP threads: sleep (OMP_WAIT_POLICY=PASSIVE)"
        if with_llamacpp:
            line += (
                "; llama.cpp waits at every operation and sleeping slows it most (2.2x at batch"
                " 1, bf16, on a 2-core EPYC): compare again with GOMP_SPINCOUNT=10000"
            )
        return line
    if spins is not None:
        return f"OpenMP threads: spin {spins} rounds, then sleep (GOMP_SPINCOUNT={spins})"
    if policy == "ACTIVE":
        return "OpenMP threads: spin (OMP_WAIT_POLICY=ACTIVE)"
    return "OpenMP threads: the runtime's default wait (spin a while, then sleep)"


def results_row(runs: dict, b: int, gen_len: int) -> dict:
    """One batch's row: each system's medians over rounds (and the rounds), and where llama.cpp
    ran, the greedy tokens both share and the paired ratios."""
    row = {}
    for name in runs:
        summaries = [x.summary() for x in runs[name][b]]
        row[name] = {k: statistics.median(s[k] for s in summaries) for k in summaries[0]}
        row[name]["rounds"] = summaries
    if "llama.cpp" in runs:
        ours, theirs = runs["llmlab"][b][0].tokens, runs["llama.cpp"][b][0].tokens
        same = [prefix_agreement(x, y) for x, y in zip(ours, theirs)]
        row["greedy_common_prefix"] = {
            "min": min(same),
            "median": statistics.median(same),
            "identical_sequences": sum(n == gen_len for n in same),
        }
        for key in ("decode_tok_per_s", "total_tok_per_s"):
            # each round's two runs were taken one right after the other: their ratio
            # sees the same machine, so the median is over those paired ratios
            paired = [
                a[key] / b[key] for a, b in zip(row["llmlab"]["rounds"], row["llama.cpp"]["rounds"])
            ]
            row[f"ratio_{key}"] = statistics.median(paired)
            row[f"ratio_{key}_rounds"] = paired
    return row


def print_table(report: dict) -> None:
    m, s, cfg = report["machine"], report["settings"], report["config"]
    flags = " ".join(m.get("cpu_flags", [])) or "-"
    print(
        f"\n{s['precision']}: {m['cpu']} ({flags}), {m['cores']} cores; "
        f"{s['prompt_len']} prompt + {s['gen_len']} "
        f"generated tokens per sequence, greedy, EOS ignored; medians of {s['rounds']} "
        f"alternating rounds; load average {min(m['load_average_1min']):.2f}-"
        f"{max(m['load_average_1min']):.2f}"
    )
    c = cfg["llmlab"]
    print(
        f"llmlab:    attention_backend={c['attention_backend']!r}, {c['dtype']}, "
        f"num_scheduler_steps={c.get('num_scheduler_steps', 1)}, "
        f"{c['threads']} threads, kernels: {m.get('llmlab_isa', '-')}"
    )
    if "llama.cpp" in cfg:
        c = cfg["llama.cpp"]
        print(
            f"llama.cpp: {s.get('gguf', 'F32')} GGUF, {c['kv_cache_dtype']} KV cache, "
            f"{c['threads']} threads, "
            f"llama-cpp-python {c['llama_cpp_python']}"
            + (
                ""
                if c.get("repacked_weights", True)
                else " (repacked CPU weights off: they crashed a probe run on this CPU)"
            )
        )
    both = "llama.cpp" in cfg
    print(openmp_line(m, both))
    headers = ["batch", "llmlab decode tok/s"]
    if both:
        headers += ["llama.cpp", "ratio", "llmlab total tok/s", "llama.cpp", "ratio"]
        headers += ["same greedy"]
    else:
        headers += ["llmlab total tok/s"]
    table = []
    for b, row in report["results"].items():
        ours = row["llmlab"]
        line = [b, f"{ours['decode_tok_per_s']:.1f}"]
        if both:
            theirs = row["llama.cpp"]
            g = row["greedy_common_prefix"]
            line += [
                f"{theirs['decode_tok_per_s']:.1f}",
                f"{row['ratio_decode_tok_per_s']:.2f}x",
                f"{ours['total_tok_per_s']:.1f}",
                f"{theirs['total_tok_per_s']:.1f}",
                f"{row['ratio_total_tok_per_s']:.2f}x",
                f"{g['identical_sequences']}/{b}",
            ]
        else:
            line += [f"{ours['total_tok_per_s']:.1f}"]
        table.append(line)
    print(format_table(table, headers, align="r"))
    if both:
        print(
            "ratio: llmlab / llama.cpp, median of each round's back-to-back pair. same greedy: "
            "sequences whose generated tokens are identical in both systems (float32 sums in "
            "a different order can flip a near-tie)"
        )
