#!/usr/bin/env bash
# The one device runner: prepare a bare GPU machine that reaches no registry, then run one named step.
#
#   bash scripts/gpu/device.sh STEP [ARGS...]
#
# Steps (scripts/gpu/STEP.sh; each file's header says what it runs, what it needs and what it writes):
#   comm          harness run + bench of every comm backend: PR case (1, 2 GPUs), DP2, skewed    needs 2 GPUs
#   comm-graph    the comm yardstick on one GPU: push-kernel tests, graph-replayed benches       1 GPU [quick]
#   comm-tests    the comm path's gpu-marked tests (tests/test_fused.py, tests/test_comm.py)   1 or 2 GPUs
#   deployment    the PR case inside its deployment (ballast), E=16 and 8: KV per policy, NVML  1 GPU (H200)
#   input-checks  harness run's machine checks: what the GPUs cannot hold is refused in one line  1 or 2 GPUs
#   kernels       vLLM's ops from releases: GPU tests, the #42860 scenario and matrix cell     VERSION[=LIB] ...
#   layer         the layer's components and workspaces, allocated and measured                 1 GPU [BACKEND [LIB]]
#   profile       kernel-level profiles of dispatch + combine (benchmarks/profile_comm.py)      1 GPU
#   records       the runs committed under results/h200/ and results/bench/         one-gpu | local (2 GPUs) | ray
#   soak          many checked comm rounds per backend, then the comm gpu tests                 2 GPUs [ROUNDS [TESTS]]
#   trust         every policy from the same baseline; lower-bound's live set seen by NVML      2 GPUs BACKEND [LIB]
#
# Every step's output goes to .gpu/runs/STEP/ (its first argument), and with $OUT set (the device tool) everything
# under .gpu/runs comes back as $OUT/runs.tgz. Beside the checkout (ignored by git, brought by the caller):
#   .whl/*.whl              pydantic, pydantic-core, annotated-types, typing-inspection, typing-extensions,
#                           nvidia-ml-py (cp312), installed once into .gpu/site
#   .gpu/x*/vllm-V.so.xz    vLLM ops libraries (vllm/_C_stable_libtorch.abi3.so of release V, xz-compressed to fit
#                           the transfer), decompressed once into .gpu/lib/vllm-V.so (what `kernels V` loads)
#   .gpu/x*/cache-*.tar.xz  cache entries of releases (HARNESS_CACHE_DIR) without their ops library, e.g.
#                           tar -cJf .gpu/x/cache-0.29.0-0.30.0.tar.xz -C ~/.cache/moe-harness --exclude='*.so' \
#                               --exclude=wheel vllm/0.29.0 vllm/0.30.0
# Ignored paths stay on a machine between calls, so libraries brought in different calls add up in .gpu/lib.
# Every process keeps NVLink multicast off (NCCL, torch symmetric memory, NVSHMEM).
set -uo pipefail
cd "$(dirname "$0")/../.."
STEPS="comm comm-graph comm-tests deployment input-checks kernels layer profile records soak trust"
step=${1:-}
if [[ -z "$step" || " $STEPS " != *" $step "* || ! -f "scripts/gpu/$step.sh" ]]; then
    echo "device.sh: step '$step' is not one of: $STEPS" >&2
    exit 2
fi
shift
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
mkdir -p .gpu/site .gpu/lib ".gpu/runs/$step"
if [ -d .whl ] && [ ! -f .gpu/site/.installed ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target .gpu/site .whl/*.whl \
        && touch .gpu/site/.installed
fi
export PYTHONPATH="$PWD/.gpu/site:$PWD"
for xz in .gpu/x*/vllm-*.so.xz; do
    [ -f "$xz" ] || continue
    lib=".gpu/lib/$(basename "$xz" .xz)"
    [ -s "$lib" ] || python3 -c "import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], 'wb'))" "$xz" "$lib"
done
# Cached releases (the release policies vllm==X.Y.Z read them): .gpu/x*/cache-*.tar.xz holds cache entries without
# their ops library; the library decompressed above goes back where the entry's manifest lists it, so the entry
# verifies as it did where it was made.
for tarball in .gpu/x*/cache-*.tar.xz; do
    [ -f "$tarball" ] || continue
    mkdir -p .gpu/cache && tar -xJf "$tarball" -C .gpu/cache
    for entry in .gpu/cache/vllm/*/release; do
        version=$(basename "$(dirname "$entry")")
        [ -f ".gpu/lib/vllm-$version.so" ] && [ ! -s "$entry/vllm/_C_stable_libtorch.abi3.so" ] &&
            grep -q '"ops_extracted": true' "$entry/manifest.json" &&
            cp ".gpu/lib/vllm-$version.so" "$entry/vllm/_C_stable_libtorch.abi3.so"
    done
    export HARNESS_CACHE_DIR="$PWD/.gpu/cache"
done
echo "device.sh: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | sort | uniq -c | tr -s ' ')"
echo "device.sh: torch $(python3 -c 'import torch; print(torch.__version__, torch.version.cuda)'); libraries: $(cd .gpu/lib && ls)"
bash "scripts/gpu/$step.sh" "$PWD/.gpu/runs/$step" "$@"
rc=$?
# Everything a step wrote comes back as one archive (the transfer returns at most 8 files).
if [ -n "${OUT:-}" ]; then tar -czf "$OUT/runs.tgz" -C .gpu runs && ls -la "$OUT"; fi
exit $rc
