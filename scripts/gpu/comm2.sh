#!/usr/bin/env bash
# Issue #18 on 2 x H200 in one call: the row kernels' and the comm path's GPU tests (both backends' exactness on
# two GPUs), then scripts/gpu/comm.sh (harness run and bench of every backend on the PR, DP2 and skewed cases).
#   bash scripts/gpu/device.sh comm2     -> .gpu/runs/comm2/
set -uo pipefail
cd "$(dirname "$0")/../.."
RUNS=${1:?runs directory}/comm2
mkdir -p "$RUNS"
bash scripts/gpu/comm-tests.sh "$RUNS"
bash scripts/gpu/comm.sh "$RUNS"
