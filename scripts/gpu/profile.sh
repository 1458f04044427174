#!/usr/bin/env bash
# Step profile: kernel-level profiles of dispatch + combine on one GPU (benchmarks/profile_comm.py).
#
#   bash scripts/gpu/device.sh profile               (or: bash scripts/gpu/profile.sh OUT_DIR); COMM=symm-mem to switch
#
# Runs:   the DP2, skewed and PR cases on one rank, nccl unless COMM says otherwise; 20 profiled rounds each.
# Needs:  1 GPU, Triton; no vLLM.
# Writes: OUT_DIR/<case>.txt (the profile's table) and OUT_DIR/<case>.json (its medians).
set -uo pipefail
cd "$(dirname "$0")/../.."
RUNS=${1:?usage: profile.sh OUT_DIR}
mkdir -p "$RUNS"
for case in qwen3-30b-a3b-dp2 qwen3-30b-a3b-dp8-skewed deepseek-v3-dp32-pr55579; do
    start=$SECONDS
    timeout 200 python3 benchmarks/profile_comm.py "$case" --comm "${COMM:-nccl}" --out "$RUNS/$case.json" \
        > "$RUNS/$case.txt" 2>&1
    echo "exit $? ($((SECONDS - start)) s): python3 benchmarks/profile_comm.py $case --comm ${COMM:-nccl}"
    head -n 30 "$RUNS/$case.txt"
done
