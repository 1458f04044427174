#!/usr/bin/env bash
# Step deployment: the PR case inside its whole deployment. memory.deployment_ballast holds the rest of the
# deployment the deployment model predicts (the other layers' weights, DeepEP's buffers, the runtime estimates), and
# after each policy's workspace the KV cache vLLM sizes from what is left of gpu_memory_utilization 0.92 of the
# device's total; NVML measures each part, and each policy must do what the release would: with 16 local experts
# legacy (0.29.0's sizing) runs out of memory and fixed (0.30.0's) starts; with 8 both start, legacy with fewer KV
# tokens (330944 against 1159872: `harness plan --vllm-version 0.29.0 --vllm-version 0.30.0 --gpu H200-141GB`).
#
#   bash scripts/gpu/device.sh deployment [torch-cutlass]            (or: bash scripts/gpu/deployment.sh OUT_DIR ...)
#
# Runs:   1. harness plan of scenarios/deepseek-v3-dp32-pr55579-deployment.yaml and -e8.yaml (no release: the
#            table's defaults);
#         2. harness run of each on GPU 0 (D=32 emulated, T=256; E=16: legacy 112 GiB, fixed 3.5 GiB workspace; E=8:
#            56 GiB and 1.75 GiB).
# Needs:  1 GPU of 141 GB (H200); the package importable; no Ray, no vLLM, no registry.
# Writes: OUT_DIR/deployment-summary.txt (every ballast part and each policy's KV cache: predicted, allocated, NVML
#         delta, reserved delta, within the allocator's rounding; each policy's outcome and KV tokens against the
#         deployment model's; exit 1 when one is off), the runs' directories, logs.
set -uo pipefail
cd "$(dirname "$0")/../.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

OUT=${1:?usage: deployment.sh OUT_DIR [torch-cutlass]}
BACKEND=${2:-torch-cutlass}
[[ "$BACKEND" == torch-cutlass ]] || { echo "deployment.sh: backend must be torch-cutlass, got '$BACKEND'" >&2; exit 2; }
mkdir -p "$OUT"
LOG="$OUT/commands.log"

# shellcheck source=scripts/gpu/lib/logged.sh
source scripts/gpu/lib/logged.sh  # h NAME ARGS...: harness ARGS, its output in $OUT/NAME.log, a line in $LOG

export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
h plan plan scenarios/deepseek-v3-dp32-pr55579-deployment.yaml
h run run scenarios/deepseek-v3-dp32-pr55579-deployment.yaml --experts-backend "$BACKEND" \
    --out "$OUT/1xh200-pr55579-deployment"
h plan-e8 plan scenarios/deepseek-v3-dp32-pr55579-deployment-e8.yaml
h run-e8 run scenarios/deepseek-v3-dp32-pr55579-deployment-e8.yaml --experts-backend "$BACKEND" \
    --out "$OUT/1xh200-pr55579-deployment-e8"

python3 - "$OUT" > "$OUT/deployment-summary.txt" <<'PY'
import json, sys
from pathlib import Path

from harness.scenario.schema import parse_scenario
from harness.sizing.deployment_ballast import policy_kv_cache

GIB = 2**30
out, bad = Path(sys.argv[1]), 0
# run directory -> each policy's expected status; E=8: legacy starts with fewer KV tokens than fixed
EXPECTED = {"1xh200-pr55579-deployment": {"legacy": "oom", "fixed": "ok"},
            "1xh200-pr55579-deployment-e8": {"legacy": "ok", "fixed": "ok"}}


def part_line(part):
    ok = part["within_rounding"] and part["predicted_bytes"] == part["allocated_bytes"]
    return ok, (f"  {part['name']:17} predicted {part['predicted_bytes']:>13} ({part['predicted_bytes'] / GIB:6.2f} GiB) "
                f"allocated {part['allocated_bytes']:>13} NVML {part['measured_delta_bytes']:>13} "
                f"reserved {part['reserved_delta_bytes']} -> {'OK' if ok else 'OFF'}")


for name, expected in EXPECTED.items():
    records = sorted((out / name / "ranks").glob("rank-*.json"))
    if not records:
        print(f"{name}: no rank records"); bad += 1; continue
    for path in records:
        record = json.loads(path.read_text())
        print(f"{name} {path.stem} ({record['hardware']['device_name']})")
        for part in record.get("ballast", []):
            ok, line = part_line(part)
            bad += not ok
            print(line)
        if not record.get("ballast"):
            print("  no ballast recorded"); bad += 1
        scenario = parse_scenario(record["scenario"])
        total = record["hardware"]["device_total_bytes"]
        tokens = {}
        for policy in record["policies"]:
            kv = policy.get("deployment_kv") or {}
            model = policy_kv_cache(scenario, total, policy["policy"], policy["contract"]["total_bytes"])
            tokens[policy["policy"]] = kv.get("kv_tokens")
            agree = kv.get("kv_tokens") == model.tokens and kv.get("outcome") == model.outcome
            bad += not agree or policy["status"] != expected.get(policy["policy"])
            print(f"  policy {policy['policy']:7} {policy['status']:5} (expected {expected.get(policy['policy'])}); "
                  f"KV cache {kv.get('kv_tokens')} tokens, the model's {model.tokens} ({model.outcome}) -> "
                  f"{'OK' if agree else 'OFF'}")
            if kv.get("component"):
                ok, line = part_line(kv["component"])
                bad += not ok
                print("  " + line)
        if name.endswith("-e8"):
            bad += not (tokens.get("legacy") or 0) < (tokens.get("fixed") or 0)
print("OK" if bad == 0 else f"FAILED: {bad} part(s) or outcome(s) off")
sys.exit(1 if bad else 0)
PY
rc=$?
cat "$OUT/deployment-summary.txt"
exit $rc
