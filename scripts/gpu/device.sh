#!/usr/bin/env bash
# Prepare a bare H200 machine that reaches no registry, then run one evidence step.
#
#   bash scripts/gpu/device.sh STEP [ARGS...]      STEP is scripts/gpu/STEP.sh; its runs go under .gpu/runs/
#
# What it expects beside the checkout (ignored by git, brought by the caller):
#   .whl/*.whl              pydantic, pydantic-core, annotated-types, typing-inspection, typing-extensions,
#                           nvidia-ml-py (cp312), installed once into .gpu/site
#   .gpu/x*/vllm-V.so.xz    vLLM ops libraries (vllm/_C_stable_libtorch.abi3.so of release V, xz-compressed to fit
#                           the transfer), decompressed once into .gpu/lib/vllm-V.so
# Ignored paths stay on a machine between calls, so libraries brought in different calls add up in .gpu/lib.
# Every process keeps NVLink multicast off (NCCL, torch symmetric memory, NVSHMEM).
set -uo pipefail
cd "$(dirname "$0")/../.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
mkdir -p .gpu/site .gpu/lib .gpu/runs
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
echo "device.sh: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | sort | uniq -c | tr -s ' ')"
echo "device.sh: torch $(python3 -c 'import torch; print(torch.__version__, torch.version.cuda)'); libraries: $(cd .gpu/lib && ls)"
step=$1; shift
bash "scripts/gpu/$step.sh" "$PWD/.gpu/runs" "$@"
rc=$?
# Everything a step wrote comes back as one archive (the transfer returns at most 8 files).
if [ -n "${OUT:-}" ]; then tar -czf "$OUT/runs.tgz" -C .gpu runs && ls -la "$OUT"; fi
exit $rc
