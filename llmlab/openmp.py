"""How OpenMP threads wait between parallel regions on this machine, chosen by measurement.

Every matmul, norm and attention call of a step is an OpenMP parallel region; between two of
them the worker threads wait. They can sleep (`OMP_WAIT_POLICY=PASSIVE`: the next region wakes
them through the kernel) or spin a little first (`GOMP_SPINCOUNT=10000`, then sleep). Which is
faster depends on the machine, and by a lot:

- on a 2-core AMD EPYC VM waking a sleeping thread cost ~70 µs, and a step has ~350 regions:
  spinning made the throughput benchmark 1.2× faster (and batch-1 decode 1.47×, before a batch-1
  step became one C call whose threads spin at its own barriers whatever is chosen here);
- on a 2-core Intel Xeon VM the same spin count made the throughput benchmark 21 % slower.

So nothing is assumed: `probe()` runs a short layer-like loop (small matmuls, elementwise
operations, a little Python between them, as an engine step) in fresh interpreters, once
sleeping and once spinning, alternating, and keeps spinning only when it was faster in every
round by more than `MARGIN`. The result is saved per machine in llmlab's cache
(`openmp.json`), and `import llmlab` applies it before torch loads (the OpenMP runtime reads
these settings once, when it is loaded). Whoever sets `OMP_WAIT_POLICY` or `GOMP_SPINCOUNT`
decides instead; without a saved probe the threads sleep (the safe default: spinning threads on
a busy laptop were many times slower). `make lab`/`make bench` run the probe once
(`python -m llmlab openmp --probe`); `python -m llmlab doctor` prints what was chosen and why.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

SPINCOUNT = 10000  # spins before sleeping, when spinning is chosen (GNU OpenMP's unit)
MARGIN = 0.05  # spinning must win every round by more than this fraction
ROUNDS = 2

# the loop each interpreter times: per iteration a layer-like burst of small parallel
# operations (two matmuls of a batch-64 step of a 576-wide model, SiLU, a residual add) with a
# little Python between them; prints seconds per iteration (best of a few repeats)
_PROBE = r"""
import time, torch
torch.manual_seed(0)
x = torch.randn(64, 576); w1 = torch.randn(576, 1536); w2 = torch.randn(1536, 576)
def burst():
    h = torch.nn.functional.silu(x @ w1)
    y = h @ w2
    s = 0
    for i in range(300):      # an engine's bookkeeping between kernels
        s += i
    return y + x
for _ in range(30): burst()
best = float("inf")
for _ in range(5):
    t0 = time.perf_counter()
    for _ in range(60): burst()
    best = min(best, (time.perf_counter() - t0) / 60)
print(best)
"""


def _path() -> Path:
    from llmlab.paths import cache_dir

    return cache_dir() / "openmp.json"


def machine_key() -> str:
    """This machine as the choice depends on it: the CPU's model and the CPUs this process has."""
    from llmlab.utils import cpu_name

    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return f"{cpu_name()}; {os.cpu_count()} CPUs, {usable} usable"


def saved() -> dict | None:
    """The saved probe for this machine (None if there is none, or it was another machine's)."""
    try:
        data = json.loads(_path().read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and data.get("machine") == machine_key() else None


def _env_for(choice: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    if choice == "spin":
        env["GOMP_SPINCOUNT"] = str(SPINCOUNT)
    else:
        env["OMP_WAIT_POLICY"] = "PASSIVE"
    return env


def _time_once(choice: str, timeout: float = 120.0) -> float:
    out = subprocess.run(
        [sys.executable, "-c", _PROBE],
        env=_env_for(choice),
        timeout=timeout,
        capture_output=True,
        text=True,
        check=True,
    )
    return float(out.stdout.split()[-1])


def probe(rounds: int = ROUNDS, save: bool = True) -> dict:
    """Time the layer-like loop sleeping and spinning, alternating, `rounds` times each; choose
    spinning only if it won every round by more than MARGIN. Saved for `import llmlab`."""
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")
    times: dict[str, list[float]] = {"sleep": [], "spin": []}
    for r in range(rounds):
        for choice in ("sleep", "spin") if r % 2 == 0 else ("spin", "sleep"):
            times[choice].append(_time_once(choice))
    wins = all(spin < (1 - MARGIN) * sleep for spin, sleep in zip(times["spin"], times["sleep"]))
    result = {
        "machine": machine_key(),
        "choice": "spin" if wins else "sleep",
        "spincount": SPINCOUNT,
        "margin": MARGIN,
        "ms_per_burst": {k: [round(t * 1e3, 4) for t in v] for k, v in times.items()},
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    if save:
        path = _path()
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(result, indent=1))
    return result


def serving(argv: list[str] | None = None) -> bool:
    """True for `python -m llmlab serve ...` and `python -m llmlab bench serve ...` (see `apply`);
    `argv` is the interpreter's whole command line (default `sys.orig_argv`)."""
    argv = list(getattr(sys, "orig_argv", []) if argv is None else argv)
    for i in range(len(argv) - 2):
        if argv[i] == "-m" and argv[i + 1] == "llmlab":
            rest = argv[i + 2 :]
            return rest[:1] == ["serve"] or rest[:2] == ["bench", "serve"]
    return False


def apply(argv: list[str] | None = None) -> str:
    """Set how OpenMP threads wait in this process (before torch loads); returns where the
    setting came from: "environment", "probe", "serving" or "default".

    A server's step threads share the cores with its event loop (and, on one machine, with
    the benchmark's clients): a spinning thread then waits for a preempted one instead of
    giving the core back. Measured on a 2-core AMD EPYC, the server's step time was the same
    sleeping or spinning (83-90 ms at batch 64) while offline steps fell from ~81 to ~70 ms.
    So `serve` and `bench serve` (whose offline comparison should run as the server runs)
    keep threads sleeping, whatever the probe chose.
    """
    if "OMP_WAIT_POLICY" in os.environ or "GOMP_SPINCOUNT" in os.environ:
        return "environment"
    if serving(argv):
        os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
        return "serving"
    choice = saved()
    if choice is not None and choice.get("choice") == "spin":
        os.environ["GOMP_SPINCOUNT"] = str(choice.get("spincount", SPINCOUNT))
        return "probe"
    os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
    return "probe" if choice is not None else "default"


SOURCE = "not applied"  # set by `import llmlab`


def describe() -> str:
    """One line: the setting in effect and where it came from (doctor and the benchmarks
    print it), in the language in use."""
    from llmlab.i18n import tr

    spin = os.environ.get("GOMP_SPINCOUNT")
    policy = os.environ.get("OMP_WAIT_POLICY")
    setting = (
        tr(f"GOMP_SPINCOUNT={spin} (spin, then sleep)", f"GOMP_SPINCOUNT={spin}（先空转，再休眠）")
        if spin
        else f"OMP_WAIT_POLICY={policy or 'default'}"
    )
    if SOURCE == "probe":
        p = saved() or {}
        ms = p.get("ms_per_burst", {})
        why = tr(
            f"chosen by the probe of {p.get('date', '?')}: sleeping {ms.get('sleep')} ms, "
            f"spinning {ms.get('spin')} ms per burst",
            f"由 {p.get('date', '?')} 那次探测选定：休眠 {ms.get('sleep')} ms，"
            f"空转 {ms.get('spin')} ms（每轮）",
        )
    elif SOURCE == "environment":
        why = tr("set in the environment", "由环境变量设定")
    elif SOURCE == "serving":
        why = tr(
            "serving: step threads share the cores with the event loop and clients",
            "服务模式：step 线程与事件循环和客户端共用 CPU 核",
        )
    else:
        why = tr(
            "no probe saved for this machine (`python -m llmlab openmp --probe`)",
            "本机还没有探测结果（`python -m llmlab openmp --probe`）",
        )
    return setting + tr("; ", "；") + why


def main(argv: list[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(
        prog="python -m llmlab openmp",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument(
        "--probe",
        action="store_true",
        help="measure sleeping against spinning now and save the choice",
    )
    ap.add_argument(
        "--if-missing",
        action="store_true",
        help="with --probe: only when no probe is saved for this machine",
    )
    ap.add_argument("--rounds", type=int, default=ROUNDS)
    args = ap.parse_args(argv)
    if args.probe and not (args.if_missing and saved() is not None):
        r = probe(args.rounds)
        print(
            f"OpenMP probe on {r['machine']}: ms per burst sleeping "
            f"{r['ms_per_burst']['sleep']}, spinning {r['ms_per_burst']['spin']} -> "
            f"threads {'spin ' + str(SPINCOUNT) + ' times, then sleep' if r['choice'] == 'spin' else 'sleep'}"
            f" (saved to {_path()}; applies from the next `import llmlab`)"
        )
    else:
        print(f"OpenMP threads: {describe()}")
    return 0
