#!/usr/bin/env bash
# The comm path's gpu-marked tests (tests/test_fused.py: the row kernels compiled against torch and float64;
# tests/test_comm.py: exactness of every backend on the GPUs here), each with a log and JUnit XML.
#   bash scripts/gpu/comm-tests.sh OUT_DIR      (the fused, comm2 and final steps call it)
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
