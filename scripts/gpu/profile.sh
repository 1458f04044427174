#!/usr/bin/env bash
# Kernel-level profiles of dispatch + combine on one GPU (benchmarks/profile_comm.py), for the comm cases of #18.
#   bash scripts/gpu/device.sh profile     -> .gpu/runs/profile/<case>.{txt,json}
set -uo pipefail
cd "$(dirname "$0")/../.."
RUNS=${1:?runs directory}
mkdir -p "$RUNS/profile"
for case in qwen3-30b-a3b-dp2 qwen3-30b-a3b-dp8-skewed deepseek-v3-dp32-pr55579; do
    start=$SECONDS
    timeout 200 python3 benchmarks/profile_comm.py "$case" --comm "${COMM:-nccl}" --out "$RUNS/profile/$case.json" \
        > "$RUNS/profile/$case.txt" 2>&1
    echo "exit $? ($((SECONDS - start)) s): python3 benchmarks/profile_comm.py $case --comm ${COMM:-nccl}"
    head -n 30 "$RUNS/profile/$case.txt"
done
