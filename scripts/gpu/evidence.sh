#!/usr/bin/env bash
# The lead's GPU calls for this round, each one self-contained (its ops library travels with it; see device.sh):
#
#   bash scripts/gpu/device.sh evidence kernels-0.30.0   trust (#14) with 0.30.0's kernels, then #17 with 0.30.0
#   bash scripts/gpu/device.sh evidence kernels-0.26.0   #17 with 0.26.0 (one GPU); likewise 0.27.1 and 0.33.0
#   bash scripts/gpu/device.sh evidence kernels-0.33.0   #17 with 0.33.0 (one GPU)
#   bash scripts/gpu/device.sh evidence comm             #18 (torch-cutlass experts, no ops library)
#   bash scripts/gpu/device.sh evidence one-gpu          on nvidia-h200: #17's GPU tests with 0.30.0's kernels,
#                                                        #18's GPU tests and its one-GPU runs and benches
#
# $1 is the runs directory device.sh gives; every run lands under it and comes back in runs.tgz.
set -uo pipefail
cd "$(dirname "$0")/../.."
RUNS=${1:?runs directory}
STEP=${2:?step}
lib() { echo "$PWD/.gpu/lib/vllm-$1.so"; }
case "$STEP" in
kernels-0.30.0)
    bash scripts/gpu/trust.sh "$RUNS/trust" vllm-ops "$(lib 0.30.0)"
    bash scripts/gpu/kernels.sh "$RUNS/kernels" "0.30.0=$(lib 0.30.0)"
    ;;
kernels-0.26.0 | kernels-0.27.1 | kernels-0.33.0)
    v=${STEP#kernels-}
    CUDA_VISIBLE_DEVICES=0 bash scripts/gpu/kernels.sh "$RUNS/kernels" "$v=$(lib "$v")"
    ;;
comm)
    bash scripts/gpu/comm.sh "$RUNS/comm"
    ;;
comm-short)
    # What fitted the session's last device minutes: the benches that carry issue #18's ratio and sub-stages,
    # most telling first (each bench also checks every slot and the output against the reference).
    mkdir -p "$RUNS/comm"
    for args in "qwen3-30b-a3b-dp8-skewed --comm symm-mem" "qwen3-30b-a3b-dp2 --comm nccl" \
                "qwen3-30b-a3b-dp8-skewed --comm nccl" "deepseek-v3-dp32-pr55579 --num-ranks 2 --comm symm-mem"; do
        name=$(echo "$args" | tr ' ' '_' | tr -d '-')
        start=$SECONDS
        # shellcheck disable=SC2086
        python3 -m harness bench $args --policies fixed --no-cpu-costs --out "$RUNS/comm/$name" \
            > "$RUNS/comm/$name.log" 2>&1
        echo "exit $? ($((SECONDS - start)) s): harness bench $args --policies fixed --no-cpu-costs" | tee -a "$RUNS/comm/commands.log"
        sed -n '/^## Ratios/,/^$/p' "$RUNS/comm/$name/bench.md" 2>/dev/null | head -n 12
        [ -n "${OUT:-}" ] && tar -czf "$OUT/runs.tgz" -C "$RUNS" comm
    done
    ;;
one-gpu)
    # What one H200 can show: #17's gpu-marked tests with 0.30.0's kernels, the gpu-marked comm tests (the 2-GPU
    # ones skip and say so), and #18's cases on one GPU with every backend that works there (P = 1 emulates D).
    mkdir -p "$RUNS/kernels" "$RUNS/comm"
    t() {  # t NAME ARGS...: pytest with a log and JUnit XML under $RUNS
        local name=$1 start=$SECONDS; shift
        timeout 300 python3 -m pytest -q -rs -m gpu -p no:cacheprovider --junitxml="$RUNS/$name.xml" "$@" \
            > "$RUNS/$name.log" 2>&1
        echo "exit $? ($((SECONDS - start)) s): pytest -q -rs -m gpu $*" | tee -a "$RUNS/$(dirname "$name")/commands.log"
        tail -n 8 "$RUNS/$name.log"
    }
    HARNESS_TEST_OPS_LIBRARIES="0.30.0:$(lib 0.30.0)" t kernels/gpu-tests-0.30.0 tests/test_gpu_kernels.py
    t comm/gpu-tests-1xh200 tests/test_comm.py
    for args in "deepseek-v3-dp32-pr55579" "qwen3-30b-a3b-dp2 --num-ranks 1" "qwen3-30b-a3b-dp8-skewed --num-ranks 1"; do
        for comm in symm-mem nccl; do
            for cmd in run bench; do
                name=1xh200-$(echo "$args" | cut -d' ' -f1)-$comm-$cmd
                extra=""; [ "$cmd" = bench ] && extra="--no-cpu-costs"
                start=$SECONDS
                # shellcheck disable=SC2086
                timeout 240 python3 -m harness $cmd $args --comm $comm --policies fixed $extra --out "$RUNS/comm/$name" \
                    > "$RUNS/comm/$name.log" 2>&1
                rc=$?
                echo "exit $rc ($((SECONDS - start)) s): harness $cmd $args --comm $comm --policies fixed $extra" \
                    | tee -a "$RUNS/comm/commands.log"
                grep -E "^(OK|FAILED)|harness: |below" "$RUNS/comm/$name.log" | head -n 3
                sed -n '/^## Ratios/,/^$/p' "$RUNS/comm/$name/bench.md" 2>/dev/null | head -n 8
                [ "$comm" = symm-mem ] && [ "$rc" = 2 ] && break  # refused in one line: the bench says the same
            done
        done
    done
    ;;
*)
    echo "evidence.sh: unknown step $STEP" >&2
    exit 2
    ;;
esac
