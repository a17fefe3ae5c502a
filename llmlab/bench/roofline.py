"""`python -m llmlab bench roofline`: the real model's steps against this machine's measured roof.

Measures this machine's streaming bandwidth (read and copy) and fp32 matmul peak (the faster of
the aten and oneDNN libraries) before and after the steps (the roof takes the larger), then times
SmolLM2-135M's decode step at several batch sizes (each sequence with `--context` cached
tokens, one new token each) and a prefill at a few prompt lengths. Each time is reported as a
multiple of its roofline floor: the memory floor (bytes / bandwidth), the compute floor
(FLOPs / peak) and the larger of the two. Targets: decode at batch 1 within 1.5× of
the memory floor; the best decode batch within 2× of the compute floor. Each target step is
then timed again in rounds, each right after a probe of the roof, and judged on the median of
those paired ratios (`roofline.measure_paired`: a drifting machine makes a ratio of two
measurements taken minutes apart unreliable). A missed target is profiled (torch.profiler,
top operators) so the report says what the time goes to.

Writes build/bench-roofline.json (or --json PATH).
"""

from __future__ import annotations

import argparse
import os
import platform
import textwrap
import time

from llmlab.bench import add_option, bench_parser, write_report
from llmlab.utils import format_table

TARGET_DECODE_B1 = 1.5  # × memory floor
TARGET_BEST_BATCH = 2.0  # × compute floor


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = bench_parser("roofline", __doc__.split("\n\n")[0])
    add_option(p, "--fast", note="fewer repeats and shapes: CI")
    add_option(p, "--json", "build/bench-roofline.json")
    add_option(p, "--model", "smollm2-135m")
    p.add_argument("--context", type=int, default=128, help="cached tokens per sequence for decode")
    add_option(p, "--batches", "1,8,32,128", note="decode")
    p.add_argument(
        "--prompts", default=None, help="prefill prompt lengths (default 64,256,1024; fast 64,256)"
    )
    add_option(p, "--threads", note="default: torch's choice")
    p.add_argument(
        "--profile",
        action="store_true",
        help="profile batch 1 and the best batch even if on target",
    )
    add_option(
        p,
        "--attention",
        note="default: cpu where its C kernels build, else torch",
        choices=("cpu", "torch"),
    )
    return p.parse_args(argv)


def _target(paired, unpaired: float, target: float) -> dict:
    """A target's verdict on the median paired ratio, with the unpaired one beside it."""
    return {
        "value": paired.median,
        "target": target,
        "met": paired.median <= target,
        "unpaired": unpaired,
        "paired": paired.ratios,
        "paired_roofs": paired.roofs,
        "paired_seconds": paired.seconds,
    }


def _profile(fn, rows: int = 8) -> list[dict]:
    """Top operators by self CPU time of one call of `fn` (after a warm-up)."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    events = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
    total = sum(e.self_cpu_time_total for e in events) or 1.0
    return [
        {
            "op": e.key,
            "calls": e.count,
            "self_ms": e.self_cpu_time_total / 1e3,
            "share": e.self_cpu_time_total / total,
        }
        for e in events[:rows]
    ]


def measure_roof() -> dict:
    """This machine's roof before the steps: read and copy bandwidth, fp32 matmul peak, and the
    bandwidth at which a batch-1 linear layer (GEMV) streams its weight; printed as measured."""
    import torch

    from llmlab.analysis import hardware

    print("measuring this machine's bandwidth and matmul peak ...", flush=True)
    roof = {
        "read_before": hardware.measure_bandwidth("cpu", kind="read"),
        "copy_bw": hardware.measure_bandwidth("cpu", kind="copy"),
        "peak_before": hardware.measure_matmul_flops("cpu", "fp32"),
        "gemv_bw": hardware.measure_gemv_bandwidth("cpu"),
        "threads": torch.get_num_threads(),
    }
    roof["name"] = f"{hardware.cpu_name()}, {roof['threads']} threads"
    print(
        f"  {roof['name']}: read {roof['read_before'] / 1e9:.1f} GB/s, copy "
        f"{roof['copy_bw'] / 1e9:.1f} GB/s, fp32 matmul {roof['peak_before'] / 1e9:.1f} GFLOP/s",
        flush=True,
    )
    print(
        f"  batch-1 linear (GEMV) streams its weight at {roof['gemv_bw'] / 1e9:.1f} GB/s "
        f"({roof['gemv_bw'] / roof['read_before']:.0%} of the read bandwidth)",
        flush=True,
    )
    return roof


def load_step_model(name: str, attention: str | None):
    """(the model the steps run, its attention backend): what `LLM()` runs by default, the C
    fast path's prepared weights for "cpu"."""
    from llmlab.bench import default_attention_backend
    from llmlab.model import load_model

    model, _ = load_model(name)
    attention = attention or default_attention_backend(model)
    print(f"{name}, attention backend {attention!r} (what LLM() runs by default)", flush=True)
    if attention == "cpu":
        from llmlab.model.cpu import cpu_model

        model = cpu_model(model)  # the engine's fast path, weights prepared once
    return model, attention


def measure_steps(model, attention: str, args, batches: list[int], prompts: list[int]) -> list:
    """The decode step at each batch size (`args.context` cached tokens each) and the prefill
    at each prompt length, each the fastest of a few repeats within a time budget."""
    from llmlab.analysis import roofline

    repeats = 3 if args.fast else 7
    measurements = []
    for b in batches:
        m = roofline.measure_decode_step(
            model, b, args.context, repeats=repeats, budget_s=20.0, backend=attention
        )
        measurements.append(m)
        print(f"  decode batch {b}: {m.seconds * 1e3:.1f} ms", flush=True)
    for n in prompts:
        m = roofline.measure_prefill(
            model, n, repeats=max(2, repeats // 2), budget_s=20.0, backend=attention
        )
        measurements.append(m)
        print(f"  prefill {n} tokens: {m.seconds * 1e3:.1f} ms", flush=True)
    return measurements


def final_roof(roof: dict):
    """The roof as what this machine showed at its best during the run: a shared or throttled
    machine's bandwidth drifts by tens of percent within minutes, and a roof measured low
    would flatter every ratio (down to a step "faster than its floor"). Adds the after-run
    measurements to `roof`; returns the `Hardware`."""
    from llmlab.analysis import hardware

    roof["read_after"] = hardware.measure_bandwidth("cpu", kind="read")
    roof["peak_after"] = hardware.measure_matmul_flops("cpu", "fp32")
    roof["read_bw"] = max(roof["read_before"], roof["read_after"])
    roof["peak"] = max(roof["peak_before"], roof["peak_after"])
    print(
        f"  measured again after the steps: read {roof['read_after'] / 1e9:.1f} GB/s, fp32 "
        f"matmul {roof['peak_after'] / 1e9:.1f} GFLOP/s; the roof takes the larger of each",
        flush=True,
    )
    return hardware.Hardware(
        name=roof["name"],
        mem_bw=roof["read_bw"],
        peak_flops={"fp32": roof["peak"]},
        mem_size=1.0,
        kind="cpu",
        measured=True,
        extra={"copy_bw": roof["copy_bw"]},
    )


def step_rows(measurements: list, hw) -> list[dict]:
    """Each measured step beside its floors (`Measurement.vs_floor`)."""
    return [
        {
            "kind": m.kind,
            "batch": m.batch,
            "tokens": m.tokens,
            "seconds": m.seconds,
            "flops": m.op.flops,
            "bytes": m.op.bytes,
            "intensity": m.op.intensity,
            "achieved_flops": m.achieved_flops,
            "achieved_bw": m.op.bytes / m.seconds,
            **m.vs_floor(hw, "fp32"),
        }
        for m in measurements
    ]


def print_rows(roof: dict, rows: list[dict]) -> None:
    read_bw, peak = roof["read_bw"], roof["peak"]
    print(
        f"\nroofline of {roof['name']} (measured): bandwidth {read_bw / 1e9:.1f} GB/s, peak "
        f"{peak / 1e9:.1f} GFLOP/s fp32, ridge {peak / read_bw:.2f} FLOP/B"
    )
    table = [
        [
            f"decode B={r['batch']} ctx={r['tokens']}"
            if r["kind"] == "decode"
            else f"prefill n={r['tokens']}",
            f"{r['seconds'] * 1e3:.1f}",
            f"{r['memory_floor'] * 1e3:.1f}",
            f"{r['compute_floor'] * 1e3:.1f}",
            r["bound"],
            f"{r['x_floor']:.2f}",
            f"{r['x_memory_floor']:.2f}",
            f"{r['x_compute_floor']:.2f}",
            f"{r['achieved_bw'] / 1e9:.1f}",
            f"{r['achieved_flops'] / 1e9:.1f}",
        ]
        for r in rows
    ]
    headers = ["shape", "measured ms", "mem floor", "cmp floor", "bound"]
    headers += ["x floor", "x mem", "x cmp", "GB/s", "GFLOP/s"]
    print(format_table(table, headers))


def paired_targets(model, attention: str, args, b1: dict | None, best: dict | None) -> dict:
    """The two targets, each judged on the median of paired rounds: the step timed right after
    a probe of the roof, round after round (`roofline.measure_paired`). The table divides the
    best step by the best roof of the whole run, and on a machine whose bandwidth drifts that
    ratio says as much about the drift."""
    from llmlab.analysis import hardware, roofline

    print("\npairing the target steps with a roof probe of their own moment ...", flush=True)
    targets = {}
    if b1:
        paired = roofline.measure_paired(
            roofline.step_fn(model, "decode", 1, args.context, attention),
            lambda: hardware.measure_bandwidth("cpu", kind="read", repeats=2),
            b1["bytes"],
            rounds=10 if args.fast else 30,
            budget_s=15.0,
        )
        targets["decode_b1_x_memory_floor"] = _target(
            paired, b1["x_memory_floor"], TARGET_DECODE_B1
        )
    if best:
        paired = roofline.measure_paired(
            roofline.step_fn(model, "decode", best["batch"], args.context, attention),
            lambda: hardware.measure_matmul_flops("cpu", "fp32", repeats=2),
            best["flops"],
            rounds=4 if args.fast else 10,
            budget_s=20.0,
        )
        targets["best_batch_x_compute_floor"] = {
            "batch": best["batch"],
            **_target(paired, best["x_compute_floor"], TARGET_BEST_BATCH),
        }
    return targets


def print_targets(targets: dict, b1: dict | None, gemv_bw: float) -> None:
    """Each target's verdict; batch 1 also against the GEMV's own bandwidth (sets
    `b1["gemv_floor"]`)."""
    print()
    for key, t in targets.items():
        extra = f" (batch {t['batch']})" if "batch" in t else ""
        print(
            f"{key}{extra}: {t['value']:.2f} median of {len(t['paired'])} paired rounds "
            f"({min(t['paired']):.2f}-{max(t['paired']):.2f}; best step over best roof of the "
            f"run {t['unpaired']:.2f}), target <= {t['target']}: "
            f"{'MET' if t['met'] else 'MISSED'}"
        )
    if b1:
        gemv_floor = b1["bytes"] / gemv_bw
        b1["gemv_floor"] = gemv_floor
        print(
            f"decode batch 1 against the GEMV's own bandwidth ({gemv_bw / 1e9:.1f} GB/s): floor "
            f"{gemv_floor * 1e3:.1f} ms, measured {b1['seconds'] * 1e3:.1f} ms = {b1['seconds'] / gemv_floor:.2f}x"
        )


def profile_missed(model, attention: str, args, targets: dict, b1, best) -> dict:
    """Top operators of each step that missed its target (or of both with `--profile`)."""
    from llmlab.analysis import roofline

    to_profile = []
    if b1 and (args.profile or not targets["decode_b1_x_memory_floor"]["met"]):
        to_profile.append(("decode", 1))
    if best and (args.profile or not targets["best_batch_x_compute_floor"]["met"]):
        to_profile.append(("decode", best["batch"]))
    profiles = {}
    for kind, n in to_profile:
        top = _profile(roofline.step_fn(model, kind, n, args.context, attention))
        profiles[f"{kind}_b{n}"] = top
        print(f"\nprofile of {kind} batch {n} (self CPU time, top operators):")
        table = format_table(
            [[e["op"], e["calls"], f"{e['self_ms']:.2f}", f"{e['share']:.1%}"] for e in top],
            ["operator", "calls", "self ms", "share"],
        )
        print(textwrap.indent(table, "  "))
    return profiles


def machine_block(roof: dict) -> dict:
    import torch

    from llmlab.analysis import hardware

    return {
        "name": roof["name"],
        "cpu": hardware.cpu_name(),
        "threads": roof["threads"],
        "cores": os.cpu_count(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "load_average": os.getloadavg() if hasattr(os, "getloadavg") else None,
        "read_bw": roof["read_bw"],
        "copy_bw": roof["copy_bw"],
        "fp32_matmul_flops": roof["peak"],
        "read_bw_before_after": [roof["read_before"], roof["read_after"]],
        "fp32_matmul_flops_before_after": [roof["peak_before"], roof["peak_after"]],
        "gemv_bw": roof["gemv_bw"],
    }


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    if args.fast:
        os.environ["LLMLAB_FAST"] = "1"
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    batches = [int(b) for b in args.batches.split(",") if b]
    prompts = [
        int(p) for p in (args.prompts or ("64,256" if args.fast else "64,256,1024")).split(",") if p
    ]
    t0 = time.perf_counter()
    roof = measure_roof()
    model, attention = load_step_model(args.model, args.attention)
    measurements = measure_steps(model, attention, args, batches, prompts)
    rows = step_rows(measurements, final_roof(roof))
    print_rows(roof, rows)
    decode = [r for r in rows if r["kind"] == "decode"]
    b1 = next((r for r in decode if r["batch"] == 1), None)
    best = min(decode, key=lambda r: r["x_compute_floor"]) if decode else None
    targets = paired_targets(model, attention, args, b1, best)
    print_targets(targets, b1, roof["gemv_bw"])
    profiles = profile_missed(model, attention, args, targets, b1, best)
    out = {
        "machine": machine_block(roof),
        "attention_backend": attention,
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
        "gomp_spincount": os.environ.get("GOMP_SPINCOUNT"),
        "model": args.model,
        "context": args.context,
        "rows": rows,
        "targets": targets,
        "profiles": profiles,
        "seconds": time.perf_counter() - t0,
    }
    print(f"\n{out['seconds']:.0f} s in all")
    write_report(out, args.json)
    return 0
