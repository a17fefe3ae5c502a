"""`python -m llmlab bench gpu_targets DIR`: a GPU run's figures beside the GPU targets.

`kernels/gpu_check.sh` leaves its reports in one folder (`FILES`): the GPU tests' JUnit XML,
`bench kernels`, and `bench decode_profile` and `bench throughput` for each shape of `SHAPES`.
This reads them and prints one line per target: PASS or FAIL, the figure, the target, and where
the figure comes from. A figure that is missing (its part failed or ran out of time) fails,
saying why. Then the other figures of the run, for the record. Exit status 1 when a target
fails; writes DIR/gpu-targets.json.
"""

from __future__ import annotations

import json
import operator
import xml.etree.ElementTree as ET
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from llmlab.bench import bench_parser, write_report
from llmlab.utils import format_table

SHAPES = ("smollm2-135m", "smollm2-1.7b")
FILES = {
    "tests": "pytest-gpu.xml",
    "kernels": "bench-kernels.json",
    "decode": "decode-profile-{shape}.json",
    "throughput": "throughput-{shape}.json",
}


class Missing(Exception):
    """A figure that the folder does not hold, and why."""


def _json(folder: Path, kind: str, shape: str = "") -> dict:
    path = folder / FILES[kind].format(shape=shape)
    if not path.is_file():
        raise Missing(f"{path.name} is missing (that part failed or ran out of time)")
    return json.loads(path.read_text())


def tests_failed(folder: Path) -> tuple[float, str]:
    """Failures + errors of the GPU tests, from pytest's JUnit XML; missing if none ran."""
    path = folder / FILES["tests"]
    if not path.is_file():
        raise Missing(f"{path.name} is missing (the tests failed to start or ran out of time)")
    root = ET.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else root.findall("testsuite")
    count = {k: sum(int(s.get(k, 0)) for s in suites) for k in ("tests", "failures", "errors")}
    skipped = sum(int(s.get("skipped", 0)) for s in suites)
    if count["tests"] - skipped == 0:
        raise Missing(f"{path.name}: no test ran ({count['tests']} collected, {skipped} skipped)")
    ran = count["tests"] - skipped
    return count["failures"] + count["errors"], f"{ran} ran, {skipped} skipped"


def _decode_runs(folder: Path, shape: str, graphs: bool = True) -> list[dict]:
    return [r for r in _json(folder, "decode", shape)["runs"] if r["enforce_eager"] != graphs]


def decode_b1_ms(shape: str) -> Callable[[Path], tuple[float, str]]:
    """ms per token of a batch-1 decode step (graphs on) of `shape`."""

    def read(folder: Path) -> tuple[float, str]:
        runs = [r for r in _decode_runs(folder, shape) if r["batch"] == 1]
        if not runs:
            raise Missing(f"{FILES['decode'].format(shape=shape)} has no batch-1 run")
        return runs[0]["wall_ms"], f"{runs[0]['attention_backend']}, graphs on"

    return read


def busy_share(shape: str) -> Callable[[Path], tuple[float, str]]:
    """The lowest GPU-busy share of a decode step of `shape` at batch >= 64 (graphs on)."""

    def read(folder: Path) -> tuple[float, str]:
        runs = [r for r in _decode_runs(folder, shape) if r["batch"] >= 64]
        if not runs:
            raise Missing(f"{FILES['decode'].format(shape=shape)} has no run at batch >= 64")
        failed = [r for r in runs if r["busy_fraction"] is None]
        if failed:
            raise Missing(
                f"batch {failed[0]['batch']} has no profile: {failed[0]['profile_error']}"
            )
        low = min(runs, key=lambda r: r["busy_fraction"])
        source = f"batch {low['batch']}, {low['busy_ms']:.3f} of {low['wall_ms']:.3f} ms"
        return low["busy_fraction"], source

    return read


def throughput_ratio(shape: str, peer: str = "hf-static") -> Callable[[Path], tuple[float, str]]:
    """llmlab's tok/s over `peer`'s on the same requests."""

    def read(folder: Path) -> tuple[float, str]:
        systems = _json(folder, "throughput", shape)["systems"]
        if "llmlab" not in systems or peer not in systems:
            raise Missing(f"{FILES['throughput'].format(shape=shape)} lacks llmlab or {peer}")
        ours, theirs = systems["llmlab"]["tok_per_s"], systems[peer]["tok_per_s"]
        return ours / theirs, f"{ours:,.0f} against {theirs:,.0f} tok/s"

    return read


def cuda_copy_share(batch_at_least: int, context: int | None = None):
    """The lowest share of copy bandwidth the "cuda" paged decode reaches in `bench kernels` at
    batch >= `batch_at_least` (and the given context, if any), on the path it chooses itself
    (the rows labelled "cuda", not its forced "cuda one-pass" and "cuda split-512" ones)."""

    def read(folder: Path) -> tuple[float, str]:
        rows = [
            r
            for r in _json(folder, "kernels")["rows"]
            if r["backend"] == "cuda"
            and r["batch"] >= batch_at_least
            and (context is None or r["context"] == context)
        ]
        if not rows:
            raise Missing(f"{FILES['kernels']} has no cuda row of that shape")
        low = min(rows, key=lambda r: r["fraction_of_copy"])
        return low["fraction_of_copy"], f"batch {low['batch']} x {low['context']}"

    return read


@dataclass(frozen=True)
class Target:
    label: str
    unit: str  # "ms/token", "x", "%" (a fraction, printed as a percentage), "failures"
    op: str  # "<=" or ">="
    value: float
    read: Callable[[Path], tuple[float, str]]

    def met(self, figure: float) -> bool:
        return {"<=": operator.le, ">=": operator.ge}[self.op](figure, self.value)

    def show(self, x: float) -> str:
        if self.unit == "%":
            return f"{100 * x:.0f} %"
        if self.unit == "failures":
            return f"{x:.0f}"
        if self.unit == "x":
            return f"{x:.2f}x"
        return f"{x:.2f} {self.unit}"


TARGETS = (
    Target("GPU tests: failures + errors", "failures", "<=", 0, tests_failed),
    Target("batch-1 decode, smollm2-135m shape", "ms/token", "<=", 1.5, decode_b1_ms(SHAPES[0])),
    Target("batch-1 decode, smollm2-1.7b shape", "ms/token", "<=", 2.0, decode_b1_ms(SHAPES[1])),
    Target(
        "256 requests, smollm2-1.7b shape: llmlab / hf-static",
        "x",
        ">=",
        8.0,
        throughput_ratio(SHAPES[1]),
    ),
    Target(
        "GPU busy, decode step at batch >= 64, smollm2-135m", "%", ">=", 0.8, busy_share(SHAPES[0])
    ),
    Target(
        "GPU busy, decode step at batch >= 64, smollm2-1.7b", "%", ">=", 0.8, busy_share(SHAPES[1])
    ),
    Target(
        "cuda paged decode at batch >= 64, of copy bandwidth", "%", ">=", 0.6, cuda_copy_share(64)
    ),
    Target(
        "cuda paged decode at batch 1 x 4,096, of copy bandwidth",
        "%",
        ">=",
        0.25,
        cuda_copy_share(1, 4096),
    ),
)


def judge(folder: Path, targets=TARGETS) -> list[dict]:
    """Each target's figure, verdict and source; a figure not there is a FAIL naming why."""
    out = []
    for t in targets:
        try:
            figure, source = t.read(folder)
        except Missing as e:
            figure, source = None, str(e)
        out.append(
            {
                "label": t.label,
                "figure": figure,
                "shown": "missing" if figure is None else t.show(figure),
                "target": f"{t.op} {t.show(t.value)}",
                "verdict": "PASS" if figure is not None and t.met(figure) else "FAIL",
                "source": source,
            }
        )
    return out


def other_figures(folder: Path) -> list[list]:
    """The run's other figures, a row each: every decode run and every throughput ratio."""
    rows = []
    for shape in SHAPES:
        for graphs in (True, False):
            try:
                runs = _decode_runs(folder, shape, graphs)
            except Missing:
                runs = []
            for r in runs:
                profiled = (
                    f"busy {100 * r['busy_fraction']:.0f} %, {r['kernels_per_step']:.0f} kernels, "
                    f"{r['launches_per_step']:.0f} launches"
                    if r["busy_fraction"] is not None
                    else f"no profile ({r['profile_error']})"
                )
                where = f"decode {shape} batch {r['batch']} graphs {'on' if graphs else 'off'}"
                what = f"{r['wall_ms']:.3f} ms, {profiled}, floor {r['floor_ms']:.3f} ms"
                rows.append([where, what])
        for peer in ("hf-static", "hf-continuous"):
            try:
                ratio, source = throughput_ratio(shape, peer)(folder)
                rows.append([f"throughput {shape}: llmlab / {peer}", f"{ratio:.2f}x ({source})"])
            except Missing:
                pass
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = bench_parser("gpu_targets", __doc__.split("\n\n")[0])
    ap.add_argument("folder", help="where kernels/gpu_check.sh wrote its reports")
    args = ap.parse_args(argv)
    folder = Path(args.folder)
    if not folder.is_dir():
        raise ValueError(f"folder: {folder} is not a directory")
    verdicts = judge(folder)
    print("\n== targets")
    for v in verdicts:
        print(f"{v['verdict']}  {v['label']}: {v['shown']}, target {v['target']} ({v['source']})")
    passed = sum(v["verdict"] == "PASS" for v in verdicts)
    print(f"{passed} of {len(verdicts)} targets met")
    others = other_figures(folder)
    if others:
        print("\n== the other figures of this run")
        print(format_table(others, ["what", "measured"]))
    write_report({"targets": verdicts, "other_figures": others}, folder / "gpu-targets.json")
    return 0 if passed == len(verdicts) else 1
