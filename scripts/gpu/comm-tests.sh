#!/usr/bin/env bash
# Step comm-tests: the comm path's gpu-marked tests, each with a log and JUnit XML.
#
#   bash scripts/gpu/device.sh comm-tests            (or: bash scripts/gpu/comm-tests.sh OUT_DIR)
#
# Runs:   tests/test_fused.py (the row kernels compiled by Triton, against torch and float64) and tests/test_comm.py
#         (every backend exact on the GPUs here; the 2-GPU tests skip with a reason on one GPU).
# Needs:  1 or 2 GPUs, pytest, Triton.
# Writes: OUT_DIR/test_fused.{log,xml}, OUT_DIR/test_comm.{log,xml}, OUT_DIR/commands.log.
set -uo pipefail
cd "$(dirname "$0")/../.."
RUNS=${1:?usage: comm-tests.sh OUT_DIR}
mkdir -p "$RUNS"
for t in tests/test_fused.py tests/test_comm.py; do
    start=$SECONDS
    name=$(basename "$t" .py)
    timeout 240 python3 -m pytest -q -rs -m gpu -p no:cacheprovider --junitxml="$RUNS/$name.xml" "$t" > "$RUNS/$name.log" 2>&1
    echo "exit $? ($((SECONDS - start)) s): pytest -q -rs -m gpu $t" | tee -a "$RUNS/commands.log"
    tail -n 6 "$RUNS/$name.log"
done
