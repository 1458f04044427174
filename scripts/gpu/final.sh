#!/usr/bin/env bash
# The last 2-GPU check of this round's comm code: the gpu-marked tests, symm-mem eager against CUDA-graph replay
# (benchmarks/graph_comm.py), and the benches of the DP2 (nccl) and skewed (symm-mem) cases.
#   bash scripts/gpu/device.sh final     -> .gpu/runs/final/
set -uo pipefail
cd "$(dirname "$0")/../.."
RUNS=${1:?runs directory}/final
mkdir -p "$RUNS"
log() { echo "exit $1 ($2 s): $3" | tee -a "$RUNS/commands.log"; }
bash scripts/gpu/comm-tests.sh "$RUNS"
for case in qwen3-30b-a3b-dp8-skewed deepseek-v3-dp32-pr55579; do
    start=$SECONDS
    timeout 240 python3 benchmarks/graph_comm.py "$case" --out "$RUNS/graph-$case.json" > "$RUNS/graph-$case.log" 2>&1
    log $? $((SECONDS - start)) "python3 benchmarks/graph_comm.py $case"; tail -n 3 "$RUNS/graph-$case.log" | cut -c1-400
done
for args in "qwen3-30b-a3b-dp2 --comm nccl" "qwen3-30b-a3b-dp8-skewed --comm symm-mem"; do
    name=2xh200-$(echo "$args" | tr ' ' '_' | tr -d '-')
    start=$SECONDS
    # shellcheck disable=SC2086
    timeout 200 python3 -m harness bench $args --policies fixed --no-cpu-costs --out "$RUNS/$name" > "$RUNS/$name.log" 2>&1
    log $? $((SECONDS - start)) "harness bench $args --policies fixed --no-cpu-costs"
    grep -E "^\| fixed \| 2 \|" "$RUNS/$name/bench.md" | head -1
done
