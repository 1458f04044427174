#!/usr/bin/env bash
# Diagnosis of a failing 2-GPU symm-mem run: the failing op's Python stack (CUDA_LAUNCH_BLOCKING=1), and the same
# run with .gpu/old_symm_mem.py (an earlier harness/rank/comm/symm_mem.py) in a copy of the tree.
set -uo pipefail
cd "$(dirname "$0")/../.."
RUNS=${1:?runs directory}/diag
mkdir -p "$RUNS"
ARGS="run deepseek-v3-dp32-pr55579 --num-ranks 2 --comm symm-mem --policies fixed"
start=$SECONDS
CUDA_LAUNCH_BLOCKING=1 timeout 200 python3 -m harness $ARGS --out "$RUNS/now" > "$RUNS/now.log" 2>&1
echo "exit $? ($((SECONDS - start)) s): CUDA_LAUNCH_BLOCKING=1 harness $ARGS"
grep -E "^(OK|FAILED)|File \"/work|Error|error:" "$RUNS/now.log" | grep -v Indexing.cu | head -30
if [ -f .gpu/old_symm_mem.py ]; then
    rm -rf /tmp/old && mkdir /tmp/old && cp -r harness scenarios pyproject.toml /tmp/old/ && cp .gpu/old_symm_mem.py /tmp/old/harness/rank/comm/symm_mem.py
    start=$SECONDS
    SITE="$PWD/.gpu/site"
    (cd /tmp/old && PYTHONPATH="$SITE:/tmp/old" timeout 200 python3 -m harness $ARGS --out "$RUNS/old") > "$RUNS/old.log" 2>&1
    echo "exit $? ($((SECONDS - start)) s): old symm_mem.py: harness $ARGS"
    grep -E "^(OK|FAILED)|File \"/tmp|Error|error:" "$RUNS/old.log" | grep -v Indexing.cu | head -20
fi
