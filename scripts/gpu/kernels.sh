#!/usr/bin/env bash
# Step kernels: vLLM's own compiled ops from several releases, and vLLM #42860 caught and named.
#
#   bash scripts/gpu/device.sh kernels VERSION[=LIBFILE] ...  (or: scripts/gpu/kernels.sh OUT_DIR VERSION[=LIBFILE] ...)
#   e.g. bash scripts/gpu/device.sh kernels 0.26.0 0.30.0      (LIBFILE defaults to .gpu/lib/vllm-VERSION.so)
#
# LIBFILE is the release's vllm/_C_stable_libtorch.abi3.so (harness.sizing.vllm_source.locate(version=...,
# with_ops=True) puts it in the cache on a machine with registry access).
# Runs:   for each release given,
#   1. tests/test_gpu_kernels.py (-m gpu): every backend and that release's kernels against the reference on tiny
#      shapes, and its silu_and_mul just past 2^32 elements -> OUT_DIR/gpu-tests-VERSION.{log,xml};
#   2. scenarios/vllm-42860-silu-and-mul-2p32.yaml with its kernels -> OUT_DIR/1xh200-42860-VERSION/;
#   3. its cell of scenarios/matrix/kernels-42860.yaml (the default-tokens case) -> OUT_DIR/1xh200-kernels-42860/.
#      A cell whose release is not given says so in one line and is not run; calls with other releases into the
#      same OUT_DIR add their cells, and `harness collect OUT_DIR/1xh200-kernels-42860` (run last) reports them;
#   4. scenarios/deepseek-v3-dp64-default-tokens.yaml on 2 GPUs when there are 2
#      -> OUT_DIR/2xh200-dp64-default-tokens-VERSION/.
# Needs:  1 GPU (2 for step 4), pytest, the libraries (one per call fits the GPU machine's carry limit); no Ray.
# Writes: the directories above, OUT_DIR/commands.log (every command, exit code, time) and OUT_DIR/libraries.txt
#         (each library's size and sha256; the records carry them too). The libraries are never copied to OUT_DIR.
set -uo pipefail
cd "$(dirname "$0")/../.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

USAGE="usage: kernels.sh OUT_DIR VERSION[=LIBFILE] [VERSION[=LIBFILE] ...]"
OUT=${1:?$USAGE}
shift
[[ $# -ge 1 ]] || { echo "kernels.sh: give at least one VERSION=LIBFILE; $USAGE" >&2; exit 2; }
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
LOG="$OUT/commands.log"
MATRIX=scenarios/matrix/kernels-42860.yaml
MATRIX_DIR="$OUT/1xh200-kernels-42860"

declare -A LIBS=()
for pair in "$@"; do
    [[ "$pair" == *=* ]] || pair="$pair=$PWD/.gpu/lib/vllm-$pair.so"  # a bare VERSION: the library device.sh unpacked
    version=${pair%%=*}
    file=${pair#*=}
    if [[ "$pair" != *=* || -z "$version" || ! -f "$file" ]]; then
        echo "kernels.sh: '$pair' is not VERSION=LIBFILE with an existing file; $USAGE" >&2
        exit 2
    fi
    LIBS[$version]=$(cd "$(dirname "$file")" && pwd)/$(basename "$file")
done

logged() {  # run a command, keep its output in OUT/NAME.log, log the command and its exit code
    local start=$SECONDS name=$1
    shift
    "$@" > "$OUT/$name.log" 2>&1
    local rc=$?
    grep -E "^(OK|FAILED|harness: |kernels: )|passed|failed|skipped" "$OUT/$name.log" | tail -n 6
    echo "exit $rc ($((SECONDS - start)) s; CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-all}): $*" | tee -a "$LOG"
}

nvidia-smi --query-gpu=index,name,memory.used,memory.total --format=csv > "$OUT/nvidia-smi.csv" 2>&1
NUM_GPUS=$(python3 -c "import torch; print(torch.cuda.device_count())")
for version in "${!LIBS[@]}"; do
    lib=${LIBS[$version]}
    echo "$version $(stat -c %s "$lib") B sha256 $(sha256sum "$lib" | cut -d' ' -f1) $lib" | tee -a "$OUT/libraries.txt"
done

for version in $(printf '%s\n' "${!LIBS[@]}" | sort -V); do
    lib=${LIBS[$version]}
    if python3 -c "import pytest" 2>/dev/null; then
        HARNESS_TEST_OPS_LIBRARIES="$version:$lib" logged "gpu-tests-$version" \
            python3 -m pytest -q -m gpu tests/test_gpu_kernels.py --junitxml "$OUT/gpu-tests-$version.xml"
    else
        echo "kernels.sh: pytest is not installed here; the GPU tests of $version were not run" | tee -a "$LOG"
    fi
    CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0} logged "42860-$version" python3 -m harness run \
        scenarios/vllm-42860-silu-and-mul-2p32.yaml --kernels "$version" --vllm-ops-library "$lib" \
        --out "$OUT/1xh200-42860-$version"
    CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0} logged "kernels-42860-$version" python3 -m harness run \
        "$MATRIX" --kernels "$version" --vllm-ops-library "$lib" --out "$MATRIX_DIR"
    if [[ "$NUM_GPUS" -ge 2 ]]; then
        logged "dp64-default-tokens-$version" python3 -m harness run scenarios/deepseek-v3-dp64-default-tokens.yaml \
            --experts-backend vllm-ops --kernels "$version" --vllm-ops-library "$lib" \
            --out "$OUT/2xh200-dp64-default-tokens-$version"
    fi
done

for version in $(python3 -c "import yaml; print(' '.join(yaml.safe_load(open('$MATRIX'))['matrix']['axes']['vllm.kernels']))"); do
    [[ -n "${LIBS[$version]:-}" ]] || echo "kernels $version: no library given, its cell of $MATRIX was not run" | tee -a "$LOG"
done
logged collect-kernels-42860 python3 -m harness collect "$MATRIX_DIR"
