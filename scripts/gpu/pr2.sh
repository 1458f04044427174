#!/usr/bin/env bash
# The PR case on 2 ranks after the own symm-mem exchange: `harness run` with both backends, and a short soak.
#   bash scripts/gpu/device.sh pr2
set -uo pipefail
cd "$(dirname "$0")/../.."
RUNS=${1:?runs directory}/pr2
mkdir -p "$RUNS"
for comm in symm-mem nccl; do
    start=$SECONDS
    timeout 150 python3 -m harness run deepseek-v3-dp32-pr55579 --num-ranks 2 --comm "$comm" --policies fixed \
        --out "$RUNS/2xh200-pr55579-$comm" > "$RUNS/2xh200-pr55579-$comm.log" 2>&1
    echo "exit $? ($((SECONDS - start)) s): harness run deepseek-v3-dp32-pr55579 --num-ranks 2 --comm $comm" \
        "--policies fixed" | tee -a "$RUNS/commands.log"
    grep -E "^(OK|FAILED)|^- |harness: " "$RUNS/2xh200-pr55579-$comm.log" | head -n 8
done
start=$SECONDS
timeout 150 python3 benchmarks/soak_comm.py deepseek-v3-dp32-pr55579 --set device=cuda --comm symm-mem --ranks 2 \
    --rounds 20 --out "$RUNS/soak-pr55579.json" > "$RUNS/soak-pr55579.log" 2>&1
echo "exit $? ($((SECONDS - start)) s): python3 benchmarks/soak_comm.py deepseek-v3-dp32-pr55579 --set device=cuda" \
    "--comm symm-mem --ranks 2 --rounds 20" | tee -a "$RUNS/commands.log"
grep -E "^rank|round|error" "$RUNS/soak-pr55579.log" | head -n 12
