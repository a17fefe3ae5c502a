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

    from llmlab.weights import model_dir

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


def pytest_collection_modifyitems(config, items):
    """With pytest-xdist (`make test` runs `-n 2 --dist loadgroup`), every test that runs a
    notebook kernel or drives JupyterLab goes to one worker, one after another: two kernels side
    by side with the rest of the suite on a 2-core machine starve each other past a cell's time
    limit (seen with three workers: a browser test's Run All passed its 200 s). The rest of the
    suite spreads over the workers beside them."""
    for item in items:
        if item.get_closest_marker("notebook") or item.get_closest_marker("browser"):
            item.add_marker(pytest.mark.xdist_group("kernels"))
