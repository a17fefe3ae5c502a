"""How OpenMP threads wait: chosen per machine by a probe, saved, applied by `import llmlab`
before torch loads; whoever sets the environment decides instead."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from llmlab import openmp

OMP_VARS = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")


@pytest.fixture
def clean_env(monkeypatch, tmp_path):
    monkeypatch.setenv("LLMLAB_CACHE", str(tmp_path))
    for var in OMP_VARS:
        monkeypatch.delenv(var, raising=False)
    return tmp_path


def save(cache, choice, machine=None):
    (cache / "openmp.json").write_text(
        json.dumps(
            {
                "machine": machine or openmp.machine_key(),
                "choice": choice,
                "spincount": 12345,
                "ms_per_burst": {"sleep": [2.0], "spin": [1.0]},
                "date": "2026-12-01 00:00:00",
            }
        )
    )


def test_a_saved_spin_choice_for_this_machine_sets_the_spin_count(clean_env):
    save(clean_env, "spin")
    assert openmp.apply() == "probe"
    assert os.environ["GOMP_SPINCOUNT"] == "12345" and "OMP_WAIT_POLICY" not in os.environ


def test_a_saved_sleep_choice_makes_threads_sleep(clean_env):
    save(clean_env, "sleep")
    assert openmp.apply() == "probe"
    assert os.environ["OMP_WAIT_POLICY"] == "PASSIVE" and "GOMP_SPINCOUNT" not in os.environ


def test_another_machines_probe_or_none_falls_back_to_sleeping(clean_env):
    save(clean_env, "spin", machine="some other CPU; 64 CPUs, 64 usable")
    assert openmp.apply() == "default"
    assert os.environ["OMP_WAIT_POLICY"] == "PASSIVE" and "GOMP_SPINCOUNT" not in os.environ
    (clean_env / "openmp.json").write_text("not json")
    assert openmp.saved() is None


@pytest.mark.parametrize("var, value", [("OMP_WAIT_POLICY", "ACTIVE"), ("GOMP_SPINCOUNT", "7")])
def test_the_environment_decides_over_the_probe(clean_env, monkeypatch, var, value):
    save(clean_env, "spin" if var == "OMP_WAIT_POLICY" else "sleep")
    monkeypatch.setenv(var, value)
    assert openmp.apply() == "environment"
    assert os.environ[var] == value
    assert [v for v in OMP_VARS if v in os.environ] == [var]  # nothing added


@pytest.mark.parametrize(
    "spin, sleep, choice",
    [
        ([1.0, 1.0], [1.2, 1.2], "spin"),  # faster by 17 % in every round
        ([1.0, 1.3], [1.2, 1.2], "sleep"),  # lost one round
        ([1.0, 1.0], [1.04, 1.04], "sleep"),  # won by less than the margin
    ],
)
def test_spinning_is_chosen_only_when_it_wins_every_round_by_the_margin(
    clean_env, monkeypatch, spin, sleep, choice
):
    times = {"spin": iter(spin), "sleep": iter(sleep)}
    order = []

    def fake(which, timeout=120.0):
        order.append(which)
        return next(times[which]) * 1e-3

    monkeypatch.setattr(openmp, "_time_once", fake)
    result = openmp.probe(rounds=2)
    assert result["choice"] == choice
    assert order == ["sleep", "spin", "spin", "sleep"]  # alternated
    assert result["ms_per_burst"] == {"sleep": sleep, "spin": spin}
    assert openmp.saved()["choice"] == choice  # saved for this machine
    with pytest.raises(ValueError, match="rounds"):
        openmp.probe(rounds=0)


def test_serving_keeps_threads_sleeping_whatever_the_probe_chose(clean_env):
    save(clean_env, "spin")
    for argv in (
        ["python", "-m", "llmlab", "serve", "--port", "0"],
        ["python", "-m", "llmlab", "bench", "serve", "--launch"],
    ):
        os.environ.pop("OMP_WAIT_POLICY", None)
        assert openmp.apply(argv) == "serving"
        assert os.environ["OMP_WAIT_POLICY"] == "PASSIVE" and "GOMP_SPINCOUNT" not in os.environ
    for argv in (
        ["python", "-m", "llmlab", "bench", "throughput"],
        ["python", "serve.py", "serve"],
        ["python", "-m", "other", "serve"],
    ):
        assert not openmp.serving(argv)
    os.environ.pop("OMP_WAIT_POLICY")
    assert openmp.apply(["python", "-m", "llmlab", "bench", "throughput"]) == "probe"
    assert os.environ["GOMP_SPINCOUNT"] == "12345"


def test_each_probe_interpreter_gets_one_setting():
    spin, sleep = openmp._env_for("spin"), openmp._env_for("sleep")
    assert spin["GOMP_SPINCOUNT"] == str(openmp.SPINCOUNT) and "OMP_WAIT_POLICY" not in spin
    assert sleep["OMP_WAIT_POLICY"] == "PASSIVE" and "GOMP_SPINCOUNT" not in sleep


def test_import_llmlab_applies_the_saved_choice_before_torch(clean_env):
    save(clean_env, "spin")
    env = {k: v for k, v in os.environ.items() if k not in OMP_VARS}
    # print the setting as torch's import finds it (OpenMP reads it when torch loads it)
    code = "\n".join(
        [
            "import os, sys",
            "class Watch:",
            "    def find_spec(self, name, path=None, target=None):",
            "        if name == 'torch':",
            "            print(os.environ.get('GOMP_SPINCOUNT'), os.environ.get('OMP_WAIT_POLICY'))",
            "            sys.meta_path.remove(self)",
            "sys.meta_path.insert(0, Watch())",
            "import llmlab, llmlab.engine.llm_engine",
            "print(llmlab.openmp.SOURCE)",
        ]
    )
    run = lambda e: subprocess.run(
        [sys.executable, "-c", code], env=e, capture_output=True, text=True, check=True
    ).stdout.split()
    assert run(env) == ["12345", "None", "probe"]
    assert run(dict(env, OMP_WAIT_POLICY="PASSIVE")) == ["None", "PASSIVE", "environment"]


@pytest.mark.slow
def test_the_probe_times_both_settings_on_this_machine(clean_env):
    result = openmp.probe(rounds=1, save=False)
    for which in ("sleep", "spin"):
        (ms,) = result["ms_per_burst"][which]
        assert 0.01 < ms < 200, (which, ms)  # a burst is two small matmuls, not nothing
    assert result["choice"] in ("spin", "sleep") and openmp.saved() is None
