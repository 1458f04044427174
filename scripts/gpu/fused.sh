#!/usr/bin/env bash
# The comm path's row kernels on one GPU: their tests (compiled Triton against torch and float64), the gpu-marked
# comm tests, and the kernel-level profile of dispatch + combine (benchmarks/profile_comm.py).
#   bash scripts/gpu/device.sh fused     -> .gpu/runs/fused/
set -uo pipefail
cd "$(dirname "$0")/../.."
RUNS=${1:?runs directory}/fused
mkdir -p "$RUNS"
bash scripts/gpu/comm-tests.sh "$RUNS"
bash scripts/gpu/profile.sh "$RUNS"
for args in "qwen3-30b-a3b-dp2 --num-ranks 1" "deepseek-v3-dp32-pr55579"; do
    name=1xh200-$(echo "$args" | cut -d' ' -f1)-nccl-bench
    start=$SECONDS
    # shellcheck disable=SC2086
    timeout 200 python3 -m harness bench $args --comm nccl --policies fixed --no-cpu-costs --out "$RUNS/$name" \
        > "$RUNS/$name.log" 2>&1
    echo "exit $? ($((SECONDS - start)) s): harness bench $args --comm nccl --policies fixed --no-cpu-costs" | tee -a "$RUNS/commands.log"
    grep -E "^\| 0 \| fixed \| (dispatch|combine|a2a)" "$RUNS/$name/bench.md" | cut -c1-70
    sed -n '/^## Ratios/,/^$/p' "$RUNS/$name/bench.md" | sed -n 5p
done
