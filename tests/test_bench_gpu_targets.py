"""The summary of a GPU run (`bench gpu_targets`, the last step of `kernels/gpu_check.sh`)
judges each figure against its target, on reports written here by hand, and on the report the
GPU decode profile itself writes (its machinery run on the CPU)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import torch

from llmlab.bench import decode_profile, gpu_steps, gpu_targets

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "kernels" / "gpu_check.sh"
# every figure exactly at its target: all pass
AT_TARGET = {
    "failures": 0,
    "b1_ms": {"smollm2-135m": 1.5, "smollm2-1.7b": 2.0},
    "busy": 0.8,
    "ratio": 8.0,
    "cuda_64": (0.6, 0.75),  # batch 64 x 4,096 and 256 x 2,048
    "cuda_1": 0.25,
}


def _decode_run(batch: int, eager: bool, wall_ms: float, busy: float) -> dict:
    return {
        "batch": batch,
        "enforce_eager": eager,
        "attention_backend": "triton",
        "wall_ms": wall_ms,
        "busy_ms": busy * wall_ms,
        "busy_fraction": busy,
        "kernels_per_step": 300,
        "launches_per_step": 3,
        "floor_ms": 0.1,
    }


def write_run(folder: Path, skip: str = "", **changes) -> Path:
    """The reports of a GPU run, each figure as `AT_TARGET` unless changed; `skip` names a
    file left out."""
    f = {**AT_TARGET, **changes}
    files = gpu_targets.FILES
    (folder / files["tests"]).write_text(
        f'<testsuites><testsuite name="pytest" tests="{f.get("tests", 40)}" errors="0" '
        f'failures="{f["failures"]}" skipped="{f.get("skipped", 2)}"/></testsuites>'
    )
    for shape in gpu_targets.SHAPES:
        runs = [
            _decode_run(1, False, f["b1_ms"][shape], 0.5),
            _decode_run(1, True, 30.0, 0.1),  # graphs off: slower, never the target's figure
            _decode_run(64, False, 5.0, f["busy"]),
            _decode_run(64, True, 40.0, 0.1),
        ]
        path = folder / files["decode"].format(shape=shape)
        path.write_text(json.dumps({"runs": runs}))
        systems = {"hf-static": {"tok_per_s": 1000.0}, "hf-continuous": {"tok_per_s": 900.0}}
        systems["llmlab"] = {"tok_per_s": 1000.0 * f["ratio"]}
        path = folder / files["throughput"].format(shape=shape)
        path.write_text(json.dumps({"systems": systems}))
    rows = [
        {"backend": "cuda", "batch": 1, "context": 4096, "fraction_of_copy": f["cuda_1"]},
        {"backend": "cuda", "batch": 16, "context": 2048, "fraction_of_copy": 0.01},  # not asked
        {"backend": "cuda", "batch": 64, "context": 4096, "fraction_of_copy": f["cuda_64"][0]},
        {"backend": "cuda", "batch": 256, "context": 2048, "fraction_of_copy": f["cuda_64"][1]},
        {"backend": "triton", "batch": 64, "context": 4096, "fraction_of_copy": 0.02},
        # the cuda kernel forced onto one path: not the engine's choice, not judged
        {"backend": "cuda one-pass", "batch": 64, "context": 4096, "fraction_of_copy": 0.03},
    ]
    (folder / files["kernels"]).write_text(json.dumps({"rows": rows}))
    if skip:
        (folder / skip).unlink()
    return folder


def verdicts(folder: Path) -> dict[str, str]:
    return {v["label"]: v["verdict"] for v in gpu_targets.judge(folder)}


def test_figures_at_their_targets_pass(tmp_path):
    assert set(verdicts(write_run(tmp_path)).values()) == {"PASS"}
    assert len(gpu_targets.TARGETS) == 8


@pytest.mark.parametrize(
    "change, failing",
    [
        ({"failures": 1}, "GPU tests"),
        ({"b1_ms": {"smollm2-135m": 1.51, "smollm2-1.7b": 2.0}}, "batch-1 decode, smollm2-135m"),
        ({"b1_ms": {"smollm2-135m": 1.5, "smollm2-1.7b": 2.01}}, "batch-1 decode, smollm2-1.7b"),
        ({"ratio": 7.99}, "llmlab / hf-static"),
        ({"busy": 0.79}, "GPU busy"),
        ({"cuda_64": (0.75, 0.59)}, "cuda paged decode at batch >= 64"),
        ({"cuda_1": 0.24}, "cuda paged decode at batch 1"),
    ],
)
def test_a_figure_past_its_target_fails_that_target_alone(tmp_path, change, failing):
    failed = [k for k, v in verdicts(write_run(tmp_path, **change)).items() if v == "FAIL"]
    assert failed and all(failing in label for label in failed), failed
    if failing != "GPU busy":  # one busy target per shape: both see the changed share
        assert len(failed) == 1


def test_a_missing_figure_fails_saying_why(tmp_path):
    write_run(tmp_path, skip=gpu_targets.FILES["kernels"])
    judged = {v["label"]: v for v in gpu_targets.judge(tmp_path)}
    for label, v in judged.items():
        if "cuda paged decode" in label:
            assert v["verdict"] == "FAIL" and v["figure"] is None
            assert "bench-kernels.json is missing" in v["source"]
        else:
            assert v["verdict"] == "PASS", label


def test_tests_that_all_skipped_are_no_pass(tmp_path):
    write_run(tmp_path, tests=5, skipped=5)
    v = gpu_targets.judge(tmp_path)[0]
    assert v["verdict"] == "FAIL" and "no test ran" in v["source"]


def test_the_script_names_the_files_the_summary_reads():
    text = SCRIPT.read_text()
    for name in gpu_targets.FILES.values():
        assert name.replace("{shape}", "$shape") in text, name
    for shape in gpu_targets.SHAPES:
        assert shape in text
    assert "pip install" not in text  # it installs nothing


def test_the_script_summarises_a_folder_within_its_budget(tmp_path):
    """`--skip-gpu` runs nothing but the summary: its exit status is the verdict, and the
    parts' budgets add up to at most 9 minutes."""
    write_run(tmp_path)
    env = {"OUT": str(tmp_path), "PATH": "/usr/bin:/bin", "HOME": str(Path.home())}
    done = subprocess.run(
        ["bash", str(SCRIPT), "--skip-gpu"], capture_output=True, text=True, env=env, timeout=120
    )
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert "8 of 8 targets met" in out and out.count("PASS  ") == 8
    for part in ("build", "tests", "kernels", "decode-smollm2-1.7b", "throughput-smollm2-1.7b"):
        assert f"== {part} (budget" in out, part
    spent = int(out.split("budgets: ")[1].split(" s")[0])
    assert spent <= 540 - 30  # the summary's own limit after the parts
    write_run(tmp_path, ratio=2.0)
    failed = subprocess.run(["bash", str(SCRIPT), "--skip-gpu"], capture_output=True, env=env)
    assert failed.returncode == 1


def test_the_gpu_profile_writes_what_the_summary_reads(tmp_path, monkeypatch):
    """The GPU profile's whole command on the CPU (tiny random model, no kernels to count):
    its report gives the summary the batch-1 time and the busy share at batch 64."""
    from llmlab.analysis import hardware

    monkeypatch.setattr(hardware, "measure_bandwidth", lambda *a, **k: 1e11)  # not under test
    path = tmp_path / gpu_targets.FILES["decode"].format(shape="smollm2-135m")
    args = ["--shape", "tiny", "--batch", "1,64", "--prompt-len", "16", "--gen-len", "4"]
    args = decode_profile._parse(args + ["--profile-steps", "2", "--json", str(path)])
    args.device, args.rounds = torch.device("cpu"), 1  # what _settle refuses on a CPU
    decode_profile._settle_gpu(args)
    assert gpu_steps.gpu_main(args) == 0
    runs = json.loads(path.read_text())["runs"]
    assert [(r["batch"], r["enforce_eager"]) for r in runs] == [
        (1, False),
        (1, True),
        (64, False),
        (64, True),
    ]
    b1_ms, _ = gpu_targets.decode_b1_ms("smollm2-135m")(tmp_path)
    assert b1_ms == runs[0]["wall_ms"] > 0
    busy, source = gpu_targets.busy_share("smollm2-135m")(tmp_path)
    assert busy == 0 and source.startswith("batch 64")  # no GPU kernel on a CPU


def test_the_command_exits_1_on_a_failed_target(tmp_path, capsys):
    write_run(tmp_path, busy=0.5)
    assert gpu_targets.main([str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert "FAIL  GPU busy, decode step at batch >= 64, smollm2-135m: 50 %, target >= 80 %" in out
    assert "6 of 8 targets met" in out
    assert json.loads((tmp_path / "gpu-targets.json").read_text())["targets"][0]["verdict"] == (
        "PASS"
    )
    with pytest.raises(ValueError, match="folder"):
        gpu_targets.main([str(tmp_path / "nowhere")])


def test_a_decode_run_without_its_profile_fails_the_busy_target_saying_why(tmp_path):
    write_run(tmp_path)
    path = tmp_path / gpu_targets.FILES["decode"].format(shape="smollm2-1.7b")
    report = json.loads(path.read_text())
    report["runs"][2].update(busy_fraction=None, profile_error="RuntimeError: no CUPTI")
    path.write_text(json.dumps(report))
    judged = {v["label"]: v for v in gpu_targets.judge(tmp_path)}
    busy = judged["GPU busy, decode step at batch >= 64, smollm2-1.7b"]
    assert busy["verdict"] == "FAIL" and "no CUPTI" in busy["source"]
    assert [v["verdict"] for v in judged.values()].count("FAIL") == 1
