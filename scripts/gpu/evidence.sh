#!/usr/bin/env bash
# The lead's GPU calls for this round, each one self-contained (its ops library travels with it; see device.sh):
#
#   bash scripts/gpu/device.sh evidence kernels-0.30.0   trust (#14) with 0.30.0's kernels, then #17 with 0.30.0
#   bash scripts/gpu/device.sh evidence kernels-0.26.0   #17 with 0.26.0 (one GPU); likewise 0.27.1 and 0.33.0
#   bash scripts/gpu/device.sh evidence kernels-0.33.0   #17 with 0.33.0 (one GPU)
#   bash scripts/gpu/device.sh evidence comm             #18 (torch-cutlass experts, no ops library)
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
*)
    echo "evidence.sh: unknown step $STEP" >&2
    exit 2
    ;;
esac
