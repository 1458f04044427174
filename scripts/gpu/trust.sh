#!/usr/bin/env bash
# Step trust: every policy measured from the same warmed state, and lower-bound's live set confirmed by NVML.
#
#   bash scripts/gpu/device.sh trust torch-cutlass                        (or: bash scripts/gpu/trust.sh OUT_DIR ...)
#   bash scripts/gpu/device.sh trust vllm-ops .gpu/lib/vllm-0.30.0.so
#
# Runs:   1. the PR case (scenarios/deepseek-v3-dp32-pr55579.yaml) on 2 ranks with the experts backend given: the
#            records show each policy's baseline (equal within the allocator rounding they state) and legacy's peak
#            delta = its workspace + what every policy adds on top (scripts/gpu/trust_summary.py checks both);
#         2. scenarios/live-set-below-fixed.yaml on 1 GPU (N/2 < K < N): lower-bound's NVML workspace delta equals
#            its live set (1.5 GiB), below fixed's 1.75 GiB.
# Needs:  2 GPUs; the package importable; no Ray; for vllm-ops the ops library file.
# Writes: each run's directory (records and report), OUT_DIR/trust-summary.txt (the verdicts; exit 1 when one
#         fails), OUT_DIR/commands.log.
set -uo pipefail
cd "$(dirname "$0")/../.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

OUT=${1:?usage: trust.sh OUT_DIR torch-cutlass|vllm-ops [OPS_LIBRARY]}
BACKEND=${2:?usage: trust.sh OUT_DIR torch-cutlass|vllm-ops [OPS_LIBRARY]}
OPS=${3:-}
BACKEND_ARGS=(--experts-backend "$BACKEND")
case "$BACKEND" in
torch-cutlass) ;;
vllm-ops)
    [[ -f "$OPS" ]] || { echo "trust.sh: vllm-ops needs the ops library file as \$3, got '${OPS}'" >&2; exit 2; }
    BACKEND_ARGS+=(--vllm-ops-library "$OPS") ;;
*) echo "trust.sh: backend must be torch-cutlass or vllm-ops, got '$BACKEND'" >&2; exit 2 ;;
esac
mkdir -p "$OUT"
LOG="$OUT/commands.log"

# shellcheck source=scripts/gpu/lib/logged.sh
source scripts/gpu/lib/logged.sh  # h NAME ARGS...: harness ARGS, its output in $OUT/NAME.log, a line in $LOG

PR="$OUT/2xh200-pr55579-$BACKEND-trust"
LIVE="$OUT/1xh200-live-set-below-fixed-$BACKEND"
nvidia-smi --query-gpu=index,name,memory.used,memory.total --format=csv > "$OUT/nvidia-smi-before.csv" 2>&1
h pr55579 run scenarios/deepseek-v3-dp32-pr55579.yaml --num-ranks 2 "${BACKEND_ARGS[@]}" --out "$PR"
CUDA_VISIBLE_DEVICES=0 h live-set run scenarios/live-set-below-fixed.yaml "${BACKEND_ARGS[@]}" --out "$LIVE"
python3 scripts/gpu/trust_summary.py "$PR" "$LIVE" | tee "$OUT/trust-summary.txt"
