#!/usr/bin/env bash
# Issue #18 on 2 x H200 in one call: the row kernels' and the comm path's GPU tests (both backends' exactness on
# two GPUs), then scripts/gpu/comm.sh (harness run and bench of every backend on the PR, DP2 and skewed cases).
#   bash scripts/gpu/device.sh comm2     -> .gpu/runs/comm2/
set -uo pipefail
cd "$(dirname "$0")/../.."
RUNS=${1:?runs directory}/comm2
mkdir -p "$RUNS"
for t in tests/test_fused.py tests/test_comm.py; do
    start=$SECONDS
    name=$(basename "$t" .py)
    timeout 240 python3 -m pytest -q -rs -m gpu -p no:cacheprovider --junitxml="$RUNS/$name.xml" "$t" > "$RUNS/$name.log" 2>&1
    echo "exit $? ($((SECONDS - start)) s): pytest -q -rs -m gpu $t" | tee -a "$RUNS/commands.log"
    tail -n 6 "$RUNS/$name.log"
done
bash scripts/gpu/comm.sh "$RUNS"
