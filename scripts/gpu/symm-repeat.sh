#!/usr/bin/env bash
# The 2-GPU symm-mem exactness tests of tests/test_comm.py, repeated (an intermittent fault needs several passes).
#   bash scripts/gpu/device.sh symm-repeat [ROUNDS]
set -uo pipefail
cd "$(dirname "$0")/../.."
RUNS=${1:?runs directory}/symm-repeat
mkdir -p "$RUNS"
for i in $(seq 1 "${2:-3}"); do
    start=$SECONDS
    timeout 120 python3 -m pytest -q -m gpu -k "gpu_comm_is_exact and symm" -p no:cacheprovider tests/test_comm.py \
        > "$RUNS/round-$i.log" 2>&1
    echo "round $i: exit $? ($((SECONDS - start)) s): $(tail -n 1 "$RUNS/round-$i.log")" | tee -a "$RUNS/commands.log"
done
