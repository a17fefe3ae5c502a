#!/usr/bin/env bash
# The one prepared run on a machine with a CUDA GPU, torch, Triton, transformers and nvcc, and
# no network and no model files. It installs nothing. In at most 9 minutes: the card and the
# versions, the CUDA extension built, the GPU-marked tests, `bench kernels`, `bench
# decode_profile` (batch 1 and 64, CUDA graphs on and off) and `bench throughput` (256 requests,
# transformers' static and continuous batching beside llmlab) for the 135M and 1.7B shapes with
# random weights; then every figure beside its target, a PASS/FAIL line each
# (`python -m llmlab bench gpu_targets`). Record them in docs/gpu-results.md with the date and
# the card.
#
#   bash kernels/gpu_check.sh              reports under $OUT when set, else build/gpu-check/
#   bash kernels/gpu_check.sh --skip-gpu   runs nothing but the summary of what that folder
#                                          holds (the parts are listed with their budgets)
#
# Each part has a budget in seconds and must end by the sum of the budgets so far, counted from
# the start: time a part leaves unused goes to the parts after it, and the whole run ends within
# TOTAL_BUDGET. A part over its time is stopped and says so; its figures then read "missing".
# A part's whole output is in DIR/NAME.log; its last lines are printed here.
set -uo pipefail
cd "$(dirname "$0")/.."
DIR=${OUT:-build/gpu-check}
mkdir -p "$DIR"
if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TRITON_INTERPRET=0 PYTHONUNBUFFERED=1
SKIP_GPU=0
[ "${1:-}" = "--skip-gpu" ] && SKIP_GPU=1
SHAPES="smollm2-135m smollm2-1.7b"
TOTAL_BUDGET=540
START=$(date +%s)
SPENT=0
: > "$DIR/times.txt"

# part NAME BUDGET COMMAND...: COMMAND under `timeout`, until START + the budgets so far
part() {
    local name=$1 budget=$2
    shift 2
    SPENT=$((SPENT + budget))
    local limit=$((START + SPENT - $(date +%s)))
    echo "== $name (budget $budget s; $limit s left for it)"
    if [ "$SKIP_GPU" = 1 ]; then
        echo "   skipped (--skip-gpu): $*"
        return 0
    fi
    if [ "$limit" -lt 5 ]; then
        echo "   skipped: no time left" | tee -a "$DIR/times.txt"
        return 0
    fi
    local t0 rc
    t0=$(date +%s)
    timeout -k 5 "$limit" "$@" > "$DIR/$name.log" 2>&1
    rc=$?
    tail -n 20 "$DIR/$name.log" | sed 's/^/   /'
    [ "$rc" = 124 ] && echo "   STOPPED: over its time ($limit s)"
    echo "$name: $(($(date +%s) - t0)) s, exit status $rc" | tee -a "$DIR/times.txt"
}

echo "== card and versions (python: $PY, reports: $DIR)"
if [ "$SKIP_GPU" = 0 ]; then
    timeout 20 nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
    timeout 60 "$PY" -c "import torch, triton, transformers; print('torch', torch.__version__, \
'CUDA', torch.version.cuda, 'Triton', triton.__version__, 'transformers', \
transformers.__version__, 'GPU:', torch.cuda.is_available() and torch.cuda.get_device_name())" \
        || { echo "$PY cannot import torch, triton and transformers: nothing to run"; exit 2; }
    command -v nvcc > /dev/null && nvcc --version | tail -n 1 || echo "nvcc: not found"
    timeout 60 "$PY" -c "from torch.utils.cpp_extension import verify_ninja_availability as v; v()" \
        && echo "ninja: found" || echo "ninja: missing (torch builds the CUDA extension with it)"
fi
SPENT=15

part build 90 "$PY" -c "from llmlab.ops import cuda_backend; \
cuda_backend.load_extension(verbose=True); print('built')"
# every test file that marks a test `gpu`
GPU_TESTS=$(grep -l "pytest.mark.gpu" tests/test_*.py | tr '\n' ' ')
# shellcheck disable=SC2086
part tests 140 "$PY" -m pytest -q -m gpu -p no:cacheprovider --junitxml="$DIR/pytest-gpu.xml" $GPU_TESTS
part kernels 50 "$PY" -m llmlab bench kernels --out "$DIR/bench-kernels.json"
for shape in $SHAPES; do
    budget=45
    [ "$shape" = smollm2-1.7b ] && budget=55
    part "decode-$shape" $budget "$PY" -m llmlab bench decode_profile --device cuda \
        --shape "$shape" --batch 1,64 --json "$DIR/decode-profile-$shape.json"
done
for shape in $SHAPES; do
    budget=40
    [ "$shape" = smollm2-1.7b ] && budget=75
    part "throughput-$shape" $budget "$PY" -m llmlab bench throughput --device cuda \
        --shape "$shape" --workload large --json "$DIR/throughput-$shape.json"
done

echo "== summary"
timeout 30 "$PY" -m llmlab bench gpu_targets "$DIR"
status=$?
echo "gpu_check: $(($(date +%s) - START)) s in all (budgets: $SPENT s of $TOTAL_BUDGET)"
[ "$SPENT" -le "$TOTAL_BUDGET" ] || echo "gpu_check: the budgets add up to more than $TOTAL_BUDGET s"
exit $status
