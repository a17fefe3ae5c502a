"""The set-up files agree with each other: pyproject, environment.yml, Makefile, README, CI."""

from __future__ import annotations

import re
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parent.parent


def _names(reqs: list[str]) -> dict[str, str]:
    out = {}
    for r in reqs:
        r = r.split(";")[0].strip()
        m = re.match(r"([A-Za-z0-9_.\-]+)\s*(.*)", r)
        out[m.group(1).lower()] = m.group(2).replace(" ", "")
    return out


# extras a user adds on purpose (they compile for minutes): in no set-up path, environment.yml included
OPT_IN_EXTRAS = {"llamacpp"}


def _conda_pip() -> dict[str, str]:
    pip_section = (ROOT / "environment.yml").read_text().split("- pip:", 1)[1]
    return _names([m.group(1) for m in re.finditer(r"^\s+- ([A-Za-z].*)$", pip_section, re.M)])


def test_environment_yml_mirrors_pyproject():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    wanted = project["dependencies"] + [
        d for name, extra in extras.items() if name not in OPT_IN_EXTRAS for d in extra
    ]
    assert _names(wanted) == _conda_pip(), (
        "environment.yml's pip list must equal pyproject's dependencies + extras (opt-in extras "
        f"{sorted(OPT_IN_EXTRAS)} excepted)"
    )


def test_opt_in_extras_stay_out_of_every_set_up_path():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    makefile = (ROOT / "Makefile").read_text()
    setup_install = re.search(r"^\$\(STAMP\):.*?(?=^\S)", makefile, re.M | re.S).group(0)
    for name in OPT_IN_EXTRAS:
        packages = _names(project["optional-dependencies"][name])
        assert not set(packages) & set(_conda_pip()), f"environment.yml installs the {name} extra"
        assert name not in setup_install, f"make lab/test's set-up installs the {name} extra"
        assert re.search(rf'^{name}:.*\n\t.*(?i:pip).*\[{name}\]', makefile, re.M), (
            f"Makefile lacks a `{name}` target that installs the extra"
        )


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
    for entry in (
        "/build/",
        ".venv/",
        "__pycache__/",
    ):  # the root build/ (llmlab/course/build is code)
        assert entry in ignored
