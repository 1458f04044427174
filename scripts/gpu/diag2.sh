#!/usr/bin/env bash
# The 2-GPU symm-mem PR-case bench again; if it fails, once more with CUDA_LAUNCH_BLOCKING=1 for the op's stack.
set -uo pipefail
cd "$(dirname "$0")/../.."
RUNS=${1:?runs directory}/diag2
mkdir -p "$RUNS"
ARGS="bench deepseek-v3-dp32-pr55579 --num-ranks 2 --comm symm-mem --policies fixed --no-cpu-costs"
for blocking in 0 1; do
    start=$SECONDS
    CUDA_LAUNCH_BLOCKING=$blocking timeout 200 python3 -m harness $ARGS --out "$RUNS/b$blocking" > "$RUNS/b$blocking.log" 2>&1
    rc=$?
    echo "exit $rc ($((SECONDS - start)) s): CUDA_LAUNCH_BLOCKING=$blocking harness $ARGS"
    grep -E "^(OK|FAILED)|File \"/work|Error|error:|dispatch \+ combine" "$RUNS/b$blocking.log" | grep -v Indexing.cu | head -30
    grep -E "^\| 0 \| fixed \| (dispatch|combine|a2a|vdev)" "$RUNS/b$blocking/bench.md" 2>/dev/null | cut -c1-70
    [ "$rc" -le 1 ] && break
done
