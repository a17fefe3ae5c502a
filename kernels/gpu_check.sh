#!/usr/bin/env bash
# One prepared run for a machine with a CUDA GPU: build the CUDA backend, run the GPU kernel
# tests and the kernel benchmark. Paste what it prints into docs/gpu-results.md with the date.
#   bash kernels/gpu_check.sh            (from the repository root, after `make setup`)
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
export HF_HUB_OFFLINE=1 TRITON_INTERPRET=0
$PY -m pip install --quiet ninja || true
echo "== card";  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
$PY -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__)"
echo "== build the CUDA backend"
time $PY -c "from llmlab.ops import cuda_backend; cuda_backend.load_extension(verbose=False); print('built')"
echo "== GPU kernel tests (torch, triton compiled, cuda on CUDA tensors)"
$PY -m pytest -q -m gpu tests/test_ops.py -p no:cacheprovider
echo "== kernel benchmark"
$PY -m llmlab bench kernels
echo "== build/bench-kernels.json"; cat build/bench-kernels.json
