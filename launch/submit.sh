#!/usr/bin/env bash
# Submit `harness run` to an existing Ray cluster as a job; the same command a user runs locally.
#
#   launch/submit.sh [--address http://HEAD:8265] [--submission-id ID] [--no-wait] [SCENARIO] [harness run options]
#
# Examples:
#   launch/submit.sh --address http://10.0.0.1:8265 scenarios/deepseek-v3-dp32-pr55579.yaml --out /data/results/pr55579
#   RAY_API_SERVER_ADDRESS=http://10.0.0.1:8265 launch/submit.sh scenarios/smoke.yaml --out /tmp/smoke
#
# Runs, from the repository root:
#   ray job submit --address ADDR --working-dir . --runtime-env launch/runtime_env.yaml -- \
#       python -m harness run SCENARIO --launcher ray [options]
# Inside the job Ray sets RAY_ADDRESS, so `harness run` joins this cluster and places one actor per rank.
# The address defaults to $RAY_API_SERVER_ADDRESS, else http://127.0.0.1:8265. Clusters with token
# authentication (Ray 2.60 turns it on for a head that has ~/.ray/auth_token) need the same token here:
# RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token. When one of them is there and RAY_AUTH_MODE is unset,
# this script sets RAY_AUTH_MODE=token, as `ray start` does on a head; RAY_AUTH_MODE=disabled opts out.
set -euo pipefail

usage() { sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }

address="${RAY_API_SERVER_ADDRESS:-http://127.0.0.1:8265}"
submit_args=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --address) [[ $# -ge 2 ]] || usage; address="$2"; shift 2 ;;
    --address=*) address="${1#--address=}"; shift ;;
    --submission-id) [[ $# -ge 2 ]] || usage; submit_args+=(--submission-id "$2"); shift 2 ;;
    --no-wait) submit_args+=(--no-wait); shift ;;
    -h|--help) usage ;;
    *) break ;;
  esac
done
# No SCENARIO: `harness run` picks its default from the cluster's GPUs (the PR case with GPUs, smoke without).

if [[ -z "${RAY_AUTH_MODE:-}" ]] &&
   [[ -n "${RAY_AUTH_TOKEN:-}" || -n "${RAY_AUTH_TOKEN_PATH:-}" || -s "${HOME}/.ray/auth_token" ]]; then
  export RAY_AUTH_MODE=token  # without it the client sends no token: "401 ... Missing authentication token"
fi

repo_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo_dir"
python_bin="${HARNESS_JOB_PYTHON:-python}"  # the interpreter on the cluster's nodes that has torch and ray

# --launcher ray is explicit although RAY_ADDRESS would select it: a scenario saying launcher: local must not
# start processes beside the job driver instead of placing ranks on the cluster.
exec ray job submit --address "$address" --working-dir . --runtime-env launch/runtime_env.yaml \
  "${submit_args[@]}" -- "$python_bin" -m harness run "$@" --launcher ray
