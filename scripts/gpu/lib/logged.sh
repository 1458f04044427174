# Sourced by the steps that keep each command's output beside its runs (deployment, layer, trust).
#
#   h NAME ARGS...   run `harness ARGS` with its output in $OUT/NAME.log, show its verdict lines, and append the
#                    command, its exit code, wall time and CUDA_VISIBLE_DEVICES to $LOG
# Needs OUT (the step's output folder) and LOG set by the step.
h() {
    local start=$SECONDS name=$1
    shift
    python3 -m harness "$@" > "$OUT/$name.log" 2>&1
    local rc=$?
    grep -E "^(OK|FAILED|harness: )" "$OUT/$name.log" | tail -n 5
    echo "exit $rc ($((SECONDS - start)) s; CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-all}): harness $*" | tee -a "$LOG"
}
