"""The CPU table of `python -m llmlab bench decode_profile` (`llmlab.bench.decode_profile`): a
batch-1 step's parts with their share and floor, and the fused C layers split by phase."""

from __future__ import annotations

from llmlab.utils import format_table

PARTS = (
    "schedule",
    "inputs",
    "embed + rope",
    "layers",
    "final norm",
    "lm_head",
    "sampling",
    "rest",
)


def print_table(report: dict) -> None:
    m, p, floors, omp = report["machine"], report["profile"], report["floors_ms"], report["omp"]
    ms = p["ms_per_step"]
    print(
        f"\nbatch-1 decode step, {report['settings']['model']}, attention_backend="
        f"{p['attention_backend']!r}, {p.get('precision', 'float32')}, {m['cpu']}, "
        f"{m['threads']} threads, median of "
        f"{p['decode_steps']} steps (fastest of {len(report['rounds_total_ms'])} rounds: "
        + ", ".join(
            f"{t:.1f} ms at {bw / 1e9:.1f} GB/s"
            for t, bw in zip(report["rounds_total_ms"], report["rounds_read_bandwidth"])
        )
        + "); read bandwidth beside that round "
        f"{m['read_bandwidth'] / 1e9:.1f} GB/s"
    )
    rows = [
        [
            part,
            f"{ms[part]:.2f}",
            f"{ms[part] / ms['total']:.0%}",
            "" if floors.get(part) is None else f"{floors[part]:.2f}",
        ]
        for part in PARTS
    ]
    rows.append(["total", f"{ms['total']:.2f}", "", f"{sum(floors.values()):.2f}"])
    print(format_table(rows, ["part", "ms/step", "share", "floor ms"]))
    print(f"total: {1e3 / ms['total']:.1f} tok/s (floor {1e3 / sum(floors.values()):.1f})")
    under = [part for part, floor in floors.items() if ms[part] < floor]
    if under:
        print(
            f"note: {', '.join(under)} ran faster than the read bandwidth measured beside the "
            "round allows: the machine's bandwidth changed within the round; run it again"
        )
    print_layer_phases(p)
    regions = 2  # the fused layers' region and the lm_head's
    print(
        f"OpenMP: an empty region costs {omp['all_threads_us']:.1f} µs on {m['threads']} "
        f"threads, {omp['one_thread_us']:.1f} µs on one: waking the threads "
        f"{omp['wake_us_per_region']:.1f} µs x {regions} regions = "
        f"{omp['wake_us_per_region'] * regions / 1e3:.2f} ms/step "
        f"(OMP_WAIT_POLICY={m['omp_wait_policy']}, GOMP_SPINCOUNT={m['gomp_spincount']})"
    )


def print_layer_phases(profile: dict) -> None:
    """The "layers" part split by phase of the fused C layers (summed over the layers), and what
    is left outside the C call (Python and ctypes around it)."""
    phases = profile.get("layer_phases_ms")
    if not phases or sum(phases.values()) <= 0:
        return
    layers = profile["ms_per_step"]["layers"]
    n = profile["num_layers"]
    rows = [
        [name, f"{v:.2f}", f"{1e3 * v / n:.1f}", f"{v / layers:.0%}"] for name, v in phases.items()
    ]
    outside = layers - sum(phases.values())
    rows.append(
        [
            "outside the C call",
            f"{outside:.2f}",
            f"{1e3 * outside / n:.1f}",
            f"{outside / layers:.0%}",
        ]
    )
    print(f"layers, split by phase of the fused C layers (sum over {n} layers):")
    print(format_table(rows, ["phase", "ms/step", "µs/layer", "of layers"]))
