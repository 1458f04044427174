#!/usr/bin/env bash
# Step deployment: the PR case inside its whole deployment. memory.deployment_ballast holds the rest of the
# deployment the deployment model predicts (the other layers' weights, DeepEP's buffers, the runtime estimates, the
# KV cache at gpu_memory_utilization 0.92 of the device's total), NVML measures each part, and then each policy's
# workspace must do what the release would: legacy (0.29.0's sizing) runs out of memory, fixed (0.30.0's) fits.
#
#   bash scripts/gpu/device.sh deployment [torch-cutlass]            (or: bash scripts/gpu/deployment.sh OUT_DIR ...)
#
# Runs:   1. harness plan of scenarios/deepseek-v3-dp32-pr55579-deployment.yaml (no release: the table's defaults);
#         2. harness run of it on GPU 0 (D=32 emulated, E=16, T=256; legacy 112 GiB, fixed 3.5 GiB workspace).
# Needs:  1 GPU of 141 GB (H200); the package importable; no Ray, no vLLM, no registry.
# Writes: OUT_DIR/deployment-summary.txt (every ballast part: predicted, allocated, NVML delta, reserved delta,
#         within the allocator's rounding; each policy's outcome; exit 1 when one is off), the run's directory, logs.
set -uo pipefail
cd "$(dirname "$0")/../.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

OUT=${1:?usage: deployment.sh OUT_DIR [torch-cutlass]}
BACKEND=${2:-torch-cutlass}
[[ "$BACKEND" == torch-cutlass ]] || { echo "deployment.sh: backend must be torch-cutlass, got '$BACKEND'" >&2; exit 2; }
SCENARIO=scenarios/deepseek-v3-dp32-pr55579-deployment.yaml
mkdir -p "$OUT"
LOG="$OUT/commands.log"

# shellcheck source=scripts/gpu/lib/logged.sh
source scripts/gpu/lib/logged.sh  # h NAME ARGS...: harness ARGS, its output in $OUT/NAME.log, a line in $LOG

export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
h plan plan "$SCENARIO"
h run run "$SCENARIO" --experts-backend "$BACKEND" --out "$OUT/1xh200-pr55579-deployment"

python3 - "$OUT" > "$OUT/deployment-summary.txt" <<'PY'
import json, sys
from pathlib import Path

GIB = 2**30
out, bad = Path(sys.argv[1]), 0
run = out / "1xh200-pr55579-deployment"
records = sorted((run / "ranks").glob("rank-*.json"))
if not records:
    print("no rank records"); sys.exit(1)
for path in records:
    record = json.loads(path.read_text())
    print(f"{path.stem} ({record['hardware']['device_name']})")
    for part in record.get("ballast", []):
        ok = part["within_rounding"] and part["predicted_bytes"] == part["allocated_bytes"]
        bad += not ok
        print(f"  {part['name']:17} predicted {part['predicted_bytes']:>13} ({part['predicted_bytes'] / GIB:6.2f} GiB) "
              f"allocated {part['allocated_bytes']:>13} NVML {part['measured_delta_bytes']:>13} "
              f"reserved {part['reserved_delta_bytes']} -> {'OK' if ok else 'OFF'}")
    if not record.get("ballast"):
        print("  no ballast recorded"); bad += 1
    outcomes = {p["policy"]: p["status"] for p in record["policies"]}
    for policy, status in outcomes.items():
        print(f"  policy {policy:7} {status}")
    bad += outcomes.get("legacy") != "oom"
    bad += outcomes.get("fixed") != "ok"
print("OK" if bad == 0 else f"FAILED: {bad} part(s) or outcome(s) off")
sys.exit(1 if bad else 0)
PY
rc=$?
cat "$OUT/deployment-summary.txt"
exit $rc
