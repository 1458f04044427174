#!/usr/bin/env bash
# Step layer: the layer components `harness run` allocates (expert weights, the batched dispatch output) against
# the layer model's prediction, measured by NVML and the caching allocator, plus each policy's workspace (contract
# against its NVML delta).
#
#   bash scripts/gpu/device.sh layer [torch-cutlass]                      (or: bash scripts/gpu/layer.sh OUT_DIR ...)
#   bash scripts/gpu/device.sh layer vllm-ops .gpu/lib/vllm-0.30.0.so
#
# Runs:   1. scenarios/vllm-57894-eplb-deepep-ll.yaml (K=5120, 28 local experts of 384 + 64, D=16 emulated, T=2048);
#         2. scenarios/deepseek-v3-dp32-pr55579.yaml (D=32 emulated, E=16, T=256; legacy 112 GiB, fixed 3.5).
# Needs:  1 GPU; the package importable; no Ray, no vLLM (but the ops library for vllm-ops), no registry.
# Writes: OUT_DIR/layer-summary.txt (every component: predicted, allocated, NVML delta, reserved delta, within the
#         allocator's rounding; every policy's workspace; exit 1 when one is off), each run's directory and log.
set -uo pipefail
cd "$(dirname "$0")/../.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

OUT=${1:?usage: layer.sh OUT_DIR [torch-cutlass|vllm-ops [OPS_LIBRARY]]}
BACKEND=${2:-torch-cutlass}
OPS=${3:-}
BACKEND_ARGS=(--experts-backend "$BACKEND")
case "$BACKEND" in
torch-cutlass) ;;
vllm-ops)
    [[ -f "$OPS" ]] || { echo "layer.sh: vllm-ops needs the ops library file as \$3, got '${OPS}'" >&2; exit 2; }
    BACKEND_ARGS+=(--vllm-ops-library "$OPS") ;;
*) echo "layer.sh: backend must be torch-cutlass or vllm-ops, got '$BACKEND'" >&2; exit 2 ;;
esac
mkdir -p "$OUT"
LOG="$OUT/commands.log"

# shellcheck source=scripts/gpu/lib/logged.sh
source scripts/gpu/lib/logged.sh  # h NAME ARGS...: harness ARGS, its output in $OUT/NAME.log, a line in $LOG

export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
h 57894 run scenarios/vllm-57894-eplb-deepep-ll.yaml "${BACKEND_ARGS[@]}" --out "$OUT/1xh200-57894-layer"
h 55579 run scenarios/deepseek-v3-dp32-pr55579.yaml "${BACKEND_ARGS[@]}" --out "$OUT/1xh200-pr55579-layer"

python3 - "$OUT" > "$OUT/layer-summary.txt" <<'PY'
import json, sys
from pathlib import Path

GIB = 2**30
out, bad = Path(sys.argv[1]), 0
for run in ("1xh200-57894-layer", "1xh200-pr55579-layer"):
    records = sorted((out / run / "ranks").glob("rank-*.json"))
    if not records:
        print(f"{run}: no rank records"); bad += 1; continue
    for path in records:
        record = json.loads(path.read_text())
        print(f"{run} {path.stem} ({record['hardware']['device_name']})")
        for c in record.get("components", []):
            ok = c["within_rounding"] and c["predicted_bytes"] == c["allocated_bytes"]
            bad += not ok
            print(f"  {c['name']:15} predicted {c['predicted_bytes']:>13} allocated {c['allocated_bytes']:>13} "
                  f"step {c['step_allocated_bytes']:>13} NVML {c['measured_delta_bytes']:>13} "
                  f"reserved {c['reserved_delta_bytes']} -> {'OK' if ok else 'OFF'}")
        if not record.get("components"):
            print("  no components recorded"); bad += 1
        for p in record["policies"]:
            contract, memory = p["contract"]["total_bytes"], p.get("memory") or {}
            delta = memory.get("workspace_delta_bytes")
            print(f"  workspace {p['policy']:11} contract {contract:>13} ({contract / GIB:.2f} GiB) NVML "
                  f"{delta} reserved {memory.get('workspace_reserved_bytes')} status {p['status']}")
print("OK" if bad == 0 else f"FAILED: {bad} component(s) off")
sys.exit(1 if bad else 0)
PY
rc=$?
cat "$OUT/layer-summary.txt"
exit $rc
