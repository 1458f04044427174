#!/usr/bin/env bash
# Step records: the GPU runs whose records are committed under results/h200/ and results/bench/.
#
#   bash scripts/gpu/device.sh records one-gpu       (or: bash scripts/gpu/records.sh OUT_DIR one-gpu|local|ray)
#   bash scripts/gpu/device.sh records local
#   bash scripts/gpu/device.sh records ray
#
# Runs:   one-gpu: every one-GPU run the README, the docs and the H200 baselines rest on, with vLLM 0.30.0's ops
#         (VLLM_OPS_LIBRARY, default .gpu/lib/vllm-0.30.0.so) or torch-cutlass, on GPU 0, one after another;
#         local: single-GPU scenarios two at a time (one chain per GPU, CUDA_VISIBLE_DEVICES), then the two-rank
#         scenarios on both GPUs, with torch-cutlass and vLLM 0.26.0's ops; ray: two Ray nodes on this host, one GPU
#         each, through the Ray launcher, and the torch-cutlass benches.
# Needs:  2 GPUs; VLLM_OPS_LIBRARY, vLLM 0.26.0's ops library (its torch pin, 2.11.0, matches the H200 image;
#         default .gpu/lib/vllm-0.26.0.so); the release policies (vllm==0.29.0 / 0.30.0) read HARNESS_CACHE_DIR,
#         filled by `harness plan` on a machine with registry access; ray needs Ray.
# Writes: OUT_DIR/h200/<run>/ and OUT_DIR/bench/<run>/, the same names as under results/, and
#         OUT_DIR/h200/commands.log; copy a run into results/ to commit it.
set -uo pipefail
cd "$(dirname "$0")/../.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
OUT=${1:?usage: records.sh OUT_DIR one-gpu|local|ray}
OPS=${VLLM_OPS_LIBRARY:-$PWD/.gpu/lib/vllm-0.26.0.so}
mkdir -p "$OUT/h200" "$OUT/bench"
LOG="$OUT/h200/commands.log"

h() {  # run `harness ARGS`, log the command and its exit code
    local start=$SECONDS
    local log
    log=$(mktemp)
    python3 -m harness "$@" > "$log" 2>&1
    local rc=$?
    grep -E "^(OK|FAILED|harness: )" "$log" | tail -n 3
    echo "exit $rc ($((SECONDS - start)) s; CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-all}): harness $*" | tee -a "$LOG"
    rm -f "$log"
}

case "${2:-}" in
one-gpu)
    export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
    OPS=${VLLM_OPS_LIBRARY:-$PWD/.gpu/lib/vllm-0.30.0.so}
    K=(--experts-backend vllm-ops --vllm-ops-library "$OPS" --kernels 0.30.0)
    h run deepseek-v3-dp32-pr55579 "${K[@]}" --out "$OUT/h200/1xh200-pr55579-vllm-ops"
    h run deepseek-v3-dp32-pr55579-h100-budget "${K[@]}" --out "$OUT/h200/1xh200-pr55579-h100-budget"
    h run deepseek-v3-dp32-pr55579-ballast "${K[@]}" --out "$OUT/h200/1xh200-pr55579-ballast"
    h run deepseek-v3-dp32-pr55579 --experts-backend torch-cutlass --out "$OUT/h200/1xh200-pr55579-torch-cutlass"
    h run kimi-k2-dp32 "${K[@]}" --out "$OUT/h200/1xh200-kimi-k2-dp32"
    h run qwen3-235b-a22b-dp16 "${K[@]}" --out "$OUT/h200/1xh200-qwen3-235b-a22b-dp16"
    h run deepseek-v3-dp32-default-tokens "${K[@]}" --out "$OUT/h200/1xh200-dp32-default-tokens-vllm-ops"
    h run vllm-57894-eplb-deepep-ll --experts-backend torch-cutlass --out "$OUT/h200/1xh200-vllm-57894"
    h run scenarios/matrix/nightly-releases.yaml "${K[@]}" --out "$OUT/h200/1xh200-matrix-nightly-releases"
    ;;
local)
    {
        export CUDA_VISIBLE_DEVICES=0
        h run deepseek-v3-dp32-pr55579 --experts-backend torch-cutlass --out "$OUT/h200/1xh200-pr55579-torch-cutlass"
        h run deepseek-v3-dp32-pr55579 --experts-backend vllm-ops --vllm-ops-library "$OPS" --out "$OUT/h200/1xh200-pr55579-vllm-ops"
        h run deepseek-v3-dp32-pr55579-h100-budget --experts-backend vllm-ops --vllm-ops-library "$OPS" --out "$OUT/h200/1xh200-pr55579-h100-budget"
        h run deepseek-v3-dp32-pr55579-ballast --experts-backend vllm-ops --vllm-ops-library "$OPS" --out "$OUT/h200/1xh200-pr55579-ballast"
        h bench deepseek-v3-dp32-pr55579 --experts-backend vllm-ops --vllm-ops-library "$OPS" --no-cpu-costs --out "$OUT/bench/1xh200-pr55579-vllm-ops"
        h bench deepseek-v3-dp32-pr55579 --experts-backend torch-cutlass --no-cpu-costs --out "$OUT/bench/1xh200-pr55579-torch-cutlass"
    } &
    {
        export CUDA_VISIBLE_DEVICES=1
        h run deepseek-v3-dp32-default-tokens --experts-backend vllm-ops --vllm-ops-library "$OPS" --out "$OUT/h200/1xh200-dp32-default-tokens-vllm-ops"
        h run deepseek-v3-dp32-default-tokens --experts-backend torch-cutlass --out "$OUT/h200/1xh200-dp32-default-tokens-torch-cutlass"
        h run kimi-k2-dp32 --experts-backend vllm-ops --vllm-ops-library "$OPS" --out "$OUT/h200/1xh200-kimi-k2-dp32"
        h run qwen3-235b-a22b-dp16 --experts-backend vllm-ops --vllm-ops-library "$OPS" --out "$OUT/h200/1xh200-qwen3-235b-a22b-dp16"
        h run scenarios/matrix/nightly-releases.yaml --experts-backend vllm-ops --vllm-ops-library "$OPS" --out "$OUT/h200/1xh200-matrix-nightly-releases"
        h bench deepseek-v3-dp32-default-tokens --experts-backend vllm-ops --vllm-ops-library "$OPS" --no-cpu-costs --out "$OUT/bench/1xh200-dp32-default-tokens-vllm-ops"
    } &
    wait
    h run deepseek-v3-dp32-pr55579 --num-ranks 2 --experts-backend torch-cutlass --out "$OUT/h200/2xh200-pr55579-torch-cutlass"
    h run deepseek-v3-dp32-pr55579 --num-ranks 2 --experts-backend vllm-ops --vllm-ops-library "$OPS" --out "$OUT/h200/2xh200-pr55579-vllm-ops"
    h run deepseek-v3-dp64-default-tokens --experts-backend vllm-ops --vllm-ops-library "$OPS" --out "$OUT/h200/2xh200-dp64-default-tokens"
    h run deepseek-v3-dp64-default-tokens --experts-backend torch-cutlass --out "$OUT/h200/2xh200-dp64-default-tokens-torch-cutlass"
    h run mixtral-8x22b-dp8 --experts-backend vllm-ops --vllm-ops-library "$OPS" --out "$OUT/h200/2xh200-mixtral-8x22b-dp8"
    h bench deepseek-v3-dp32-pr55579 --num-ranks 2 --experts-backend vllm-ops --vllm-ops-library "$OPS" --no-cpu-costs --out "$OUT/bench/2xh200-pr55579-vllm-ops"
    h bench deepseek-v3-dp32-default-tokens --num-ranks 2 --experts-backend vllm-ops --vllm-ops-library "$OPS" --no-cpu-costs --out "$OUT/bench/2xh200-dp32-default-tokens-vllm-ops"
    ;;
ray)
    # Two Ray nodes on this host, one GPU each: the raylet takes its GPU ids from CUDA_VISIBLE_DEVICES.
    export RAY_AUTH_MODE=disabled
    CUDA_VISIBLE_DEVICES=0 ray start --head --port=6390 --num-gpus=1 --num-cpus=8 --include-dashboard=false --disable-usage-stats > /dev/null
    CUDA_VISIBLE_DEVICES=1 ray start --address=127.0.0.1:6390 --num-gpus=1 --num-cpus=8 --disable-usage-stats > /dev/null
    python3 -c "import ray; ray.init(address='127.0.0.1:6390'); print([(n['NodeID'][:8], n['Resources'].get('GPU')) for n in ray.nodes()])"
    h run deepseek-v3-dp32-pr55579 --num-ranks 2 --launcher ray --address 127.0.0.1:6390 --placement-strategy SPREAD --experts-backend torch-cutlass --out "$OUT/h200/2xh200-ray-pr55579-torch-cutlass"
    h run smoke --launcher ray --address 127.0.0.1:6390 --placement-strategy SPREAD --device cuda --experts-backend torch-cutlass --out "$OUT/h200/2xh200-ray-smoke"
    ray stop --force > /dev/null
    # The torch-cutlass benches need no vLLM library, so they run here too.
    CUDA_VISIBLE_DEVICES=0 h bench deepseek-v3-dp32-pr55579 --experts-backend torch-cutlass --no-cpu-costs --out "$OUT/bench/1xh200-pr55579-torch-cutlass"
    h bench deepseek-v3-dp32-pr55579 --num-ranks 2 --experts-backend torch-cutlass --no-cpu-costs --out "$OUT/bench/2xh200-pr55579-torch-cutlass"
    ;;
*)
    echo "usage: bash scripts/gpu/records.sh OUT_DIR one-gpu|local|ray" >&2
    exit 2
    ;;
esac
