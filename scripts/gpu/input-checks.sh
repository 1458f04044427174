#!/usr/bin/env bash
# Step input-checks: `harness run` checks a scenario against this machine's GPUs (NVML, no torch) before anything
# starts, refuses what they cannot hold in one line, and still runs what they can.
#
#   bash scripts/gpu/device.sh input-checks          (or: bash scripts/gpu/input-checks.sh OUT_DIR)
#
# Runs:   1. the machine as `harness run` sees it: GPUs and their memory from NVML, CPUs, RAM (no torch import);
#         2. --dry-run of the PR case: accepted, device cuda;
#         3. 200 GB of ballast, more than an H200 holds before the first workspace: refused, exit 2, nothing written;
#         4. more ranks than GPUs (--num-ranks 4 on 2 GPUs; 2 ranks under CUDA_VISIBLE_DEVICES=0): refused;
#         5. a small run on one GPU end to end (the run directory claimed, released, the report written): exit 0 or 1.
# Needs:  1 GPU (2 for the ranks-per-GPU checks), nvidia-ml-py; no vLLM.
# Writes: OUT_DIR/commands.log (each command, its exit code and wall time), OUT_DIR/input-checks.txt (the verdicts;
#         exit 1 when one failed), one log and run directory per command.
set -uo pipefail
cd "$(dirname "$0")/../.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

OUT=${1:?usage: input-checks.sh OUT_DIR}
mkdir -p "$OUT"
LOG="$OUT/commands.log"
VERDICTS="$OUT/input-checks.txt"
: > "$VERDICTS"

h() {  # h NAME WANT ARGS...: run `harness ARGS`, keep its output, log the command, check the exit code is in WANT
    local name=$1 want=$2 start
    shift 2
    start=$(date +%s.%N)
    python3 -m harness "$@" > "$OUT/$name.log" 2>&1
    local rc=$?
    local wall
    wall=$(python3 -c "print(f'{$(date +%s.%N) - $start:.2f}')")
    echo "exit $rc (${wall} s; CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-all}): harness $*" | tee -a "$LOG"
    local verdict=FAILED
    [[ " $want " == *" $rc "* ]] && verdict=OK
    echo "$verdict $name: exit $rc (want $want) in ${wall} s: $(grep -m1 -E '^harness: error: ' "$OUT/$name.log")" \
        | tee -a "$VERDICTS"
}

python3 -c "from harness.launch.machine import local_machine; print(local_machine())" 2>&1 | tee "$OUT/machine.txt"
nvidia-smi --query-gpu=index,name,memory.total --format=csv >> "$OUT/machine.txt" 2>&1

h dry-run-pr55579 0 run scenarios/deepseek-v3-dp32-pr55579.yaml --dry-run --out "$OUT/dry-run"
grep -q "device cuda" "$OUT/dry-run-pr55579.log" && echo "OK dry-run-pr55579: device cuda" | tee -a "$VERDICTS" \
    || echo "FAILED dry-run-pr55579: not on cuda" | tee -a "$VERDICTS"

cp scenarios/deepseek-v3-dp32-pr55579.yaml "$OUT/ballast-200gb.yaml"  # it has no memory section
printf 'memory:\n  ballast_gb: 200\n' >> "$OUT/ballast-200gb.yaml"
h ballast-200gb 2 run "$OUT/ballast-200gb.yaml" --out "$OUT/ballast-200gb"
[[ ! -e "$OUT/ballast-200gb" ]] && echo "OK ballast-200gb: nothing written" | tee -a "$VERDICTS" \
    || echo "FAILED ballast-200gb: $OUT/ballast-200gb exists" | tee -a "$VERDICTS"

h four-ranks-two-gpus 2 run scenarios/deepseek-v3-dp32-pr55579.yaml --device cuda --num-ranks 4 --out "$OUT/four"
CUDA_VISIBLE_DEVICES=0 h two-ranks-one-visible-gpu 2 run scenarios/deepseek-v3-dp32-pr55579.yaml --device cuda \
    --num-ranks 2 --out "$OUT/two"

CUDA_VISIBLE_DEVICES=0 h smoke-1gpu "0 1" run scenarios/smoke.yaml --device cuda --num-ranks 1 \
    --experts-backend torch-cutlass --out "$OUT/1xh200-smoke-input-checks"
[[ -f "$OUT/1xh200-smoke-input-checks/report.json" && ! -e "$OUT/1xh200-smoke-input-checks/.harness-run" ]] \
    && echo "OK smoke-1gpu: report written, claim released" | tee -a "$VERDICTS" \
    || echo "FAILED smoke-1gpu: no report or the claim is left" | tee -a "$VERDICTS"

! grep -q '^FAILED' "$VERDICTS"
