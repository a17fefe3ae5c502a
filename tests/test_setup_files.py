"""The set-up files agree with each other: pyproject, environment.yml, Makefile, README, CI."""
from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _names(reqs: list[str]) -> dict[str, str]:
    out = {}
    for r in reqs:
        r = r.split(";")[0].strip()
        m = re.match(r"([A-Za-z0-9_.\-]+)\s*(.*)", r)
        out[m.group(1).lower()] = m.group(2).replace(" ", "")
    return out


def test_environment_yml_mirrors_pyproject():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = project["dependencies"] + [d for extra in project["optional-dependencies"].values() for d in extra]
    env_text = (ROOT / "environment.yml").read_text()
    pip_section = env_text.split("- pip:", 1)[1]
    conda_pip = _names([m.group(1) for m in re.finditer(r"^\s+- ([A-Za-z].*)$", pip_section, re.M)])
    assert _names(wanted) == conda_pip, "environment.yml's pip list must equal pyproject's dependencies + extras"


def test_version_pins_are_lower_bounds_the_gpu_stack_meets():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    pins = _names(project["dependencies"])
    gpu_stack = {"torch": (2, 11), "triton": (3, 6), "transformers": (5, 0)}
    for name, have in gpu_stack.items():
        spec = pins[name]
        assert spec.startswith(">="), f"{name} must be pinned as a lower bound, got {spec!r}"
        need = tuple(int(x) for x in spec[2:].split(".")[:2])
        assert need <= have, f"{name}{spec} excludes the device machine's {have}"


def test_readme_gives_the_two_commands_and_ci_runs_the_test_one():
    readme = (ROOT / "README.md").read_text()
    assert "make lab" in readme and "make test" in readme
    assert "make test" in (ROOT / ".ci" / "run").read_text()
    makefile = (ROOT / "Makefile").read_text()
    for target in ("lab:", "test:", "run:"):
        assert re.search(rf"^{target}", makefile, re.M), f"Makefile lacks the {target} target"


def test_gitignore_keeps_outputs_out_of_git():
    ignored = (ROOT / ".gitignore").read_text().split()
    for entry in ("build/", ".venv/", "__pycache__/"):
        assert entry in ignored
