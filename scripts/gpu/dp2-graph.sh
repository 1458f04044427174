#!/usr/bin/env bash
# After the own symm-mem exchange (fused.pull_rows): the DP2 case's symm-mem bench (E = 64, which torch's 2d
# kernel could not take), and symm-mem's round eager against a CUDA-graph replay (benchmarks/graph_comm.py).
#   bash scripts/gpu/device.sh dp2-graph
set -uo pipefail
cd "$(dirname "$0")/../.."
RUNS=${1:?runs directory}/dp2-graph
mkdir -p "$RUNS"
run() {  # NAME LIMIT_S COMMAND...
    local name=$1 limit=$2; shift 2
    local start=$SECONDS
    timeout "$limit" "$@" > "$RUNS/$name.log" 2>&1
    echo "exit $? ($((SECONDS - start)) s): $*" | tee -a "$RUNS/commands.log"
    grep -E "^(OK|FAILED)|FAILED:|ratio|harness:|error|Error|^\{" "$RUNS/$name.log" | head -n 12
}
run dp2-symm-mem-bench 200 python3 -m harness bench qwen3-30b-a3b-dp2 --comm symm-mem --policies fixed --no-cpu-costs \
    --out "$RUNS/2xh200-qwen3-dp2-symm-mem-bench"
sed -n '/^## Ratios/,/^$/p;/^| *0 *| *fixed *| *\(dispatch\|combine\|a2a\|vdev\)/p' \
    "$RUNS/2xh200-qwen3-dp2-symm-mem-bench/bench.md" 2>/dev/null | head -n 24
for case in qwen3-30b-a3b-dp8-skewed qwen3-30b-a3b-dp2; do
    run "graph-$case" 150 python3 benchmarks/graph_comm.py "$case" --out "$RUNS/graph-$case.json"
done
