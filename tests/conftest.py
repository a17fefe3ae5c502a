"""Shared fixtures: one loaded copy of the real model per test session."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Threads that sleep instead of spinning while they wait: on a busy 2-core machine spinning
# OpenMP threads made the model 20-40x slower.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import pytest
import torch

import llmlab  # noqa: F401  (sets TRITON_INTERPRET and OMP_WAIT_POLICY before torch/triton load)
from llmlab.course import skip_iri_format_checks

skip_iri_format_checks()  # before anything imports nbformat


@pytest.fixture(scope="session")
def real_model():
    """(our LlamaModel, tokenizer) for SmolLM2-135M-Instruct, float32 on CPU."""
    from llmlab.model import load_model

    return load_model("smollm2-135m")


@pytest.fixture(scope="session")
def hf_model():
    """transformers' LlamaForCausalLM on the same converted weights, float32, eval mode."""
    from transformers import LlamaForCausalLM

    from llmlab.model.weights import model_dir

    return LlamaForCausalLM.from_pretrained(model_dir("smollm2-135m"), dtype=torch.float32).eval()


@pytest.fixture(autouse=True)
def _fixed_seed():
    torch.manual_seed(0)


@pytest.fixture(autouse=True)
def _fresh_hint_stages():
    """Each test starts with no wrong tries counted: a checker's staged hints (and the pointer to
    the worked solution after a few tries) depend on how often it was answered wrongly before,
    which must not carry over from whichever test ran earlier on the same worker."""
    from llmlab.course.check import core

    core._WRONG_TRIES.clear()


@pytest.fixture
def first_try(monkeypatch):
    """A checker test starts as a student's first try (no wrong tries counted, so the hint is at
    its first stage), in English; the language is English again after it. A test file turns it
    on for each of its tests with `pytestmark = pytest.mark.usefixtures("first_try")`."""
    from llmlab import i18n
    from llmlab.course.check import core

    monkeypatch.setattr(core, "_WRONG_TRIES", {})
    i18n.set_language("en")
    yield
    i18n.set_language("en")


@pytest.fixture
def bench_report(tmp_path):
    """`bench_report(main, args)`: a benchmark's `main` run in this process on `args` with
    `--json` into a file of `tmp_path`, its exit status checked, its report read back. torch's
    thread count, which a bench's `--threads` sets, is as it was after the test."""
    import json

    threads = torch.get_num_threads()
    path = tmp_path / "bench.json"

    def run(main, args: list[str]) -> dict:
        assert main([*args, "--json", str(path)]) == 0
        return json.loads(path.read_text())

    yield run
    torch.set_num_threads(threads)


@pytest.fixture
def record_driver(monkeypatch):
    """`record_driver(module, name, answer)`: the list that each later call of the build driver
    `module.name` on `answer` (its first argument) appends its return value to; the call itself
    is unchanged. A test reads the run its checker made instead of making the same run again.
    The recorder keeps the driver's name and module: `drive` calls only llmlab.course.build's."""
    import functools

    def record(module, name: str, answer) -> list:
        runs = []
        driver = getattr(module, name)

        @functools.wraps(driver)
        def recording(*args, **kwargs):
            result = driver(*args, **kwargs)
            if args and args[0] is answer:
                runs.append(result)
            return result

        monkeypatch.setattr(module, name, recording)
        return runs

    return record


def pytest_collection_modifyitems(config, items):
    """The longest tests first: notebooks executed headless, the grader's round trips and the
    browser tests take 10-45 s each, and handed out last they left one xdist worker running
    them alone at the end of `make test`. The sort is stable and the same on every worker."""
    slow_first = ("notebook", "browser", "nvcc", "slow", "model")

    def rank(item) -> int:
        return next(
            (i for i, m in enumerate(slow_first) if item.get_closest_marker(m)), len(slow_first)
        )

    items.sort(key=rank)
