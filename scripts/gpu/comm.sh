#!/usr/bin/env bash
# Step comm: the comm backends end to end, `harness run` and `harness bench` with every backend that works here.
#
#   bash scripts/gpu/device.sh comm                  (or: bash scripts/gpu/comm.sh OUT_DIR)
#
# Runs:   the PR case (deepseek-v3-dp32-pr55579) on 1 and 2 GPUs, the DP2 case (qwen3-30b-a3b-dp2) and the skewed
#         case (qwen3-30b-a3b-dp8-skewed), each with symm-mem and nccl; COMM_GPU_TESTS=1 adds the gpu-marked
#         exactness tests of tests/test_comm.py. About 3.5 minutes on 2 x H200 (each command starts its ranks,
#         NCCL and NVSHMEM afresh: 15-30 s).
# Needs:  2 GPUs; the package importable with pydantic, nvidia-ml-py, rich and PyYAML (this script puts the
#         checkout on PYTHONPATH); no vLLM.
# Writes: OUT_DIR/<case>/ (records, reports, bench.json, bench.md), OUT_DIR/logs/<case>.log, OUT_DIR/commands.log.
#         Per command it prints the exit code and the verdict, the bench ratios and sub-stage medians, or the end
#         of the log. Exit 1 from bench means below a scenario threshold (the 0.9 target), not a crash; 2 an error.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${1:?usage: bash scripts/gpu/comm.sh OUT_DIR}
mkdir -p "$OUT/logs"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
LOG="$OUT/commands.log"
T0=$SECONDS

python3 - <<'EOF' 2>&1 | tee "$OUT/environment.txt"
import torch, torch.distributed._symmetric_memory as sm
print(f"torch {torch.__version__}, {torch.cuda.device_count()} GPU(s): "
      + ", ".join(torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count()))
      + f"; NCCL {'.'.join(map(str, torch.cuda.nccl.version()))}; NVSHMEM available: {sm.is_nvshmem_available()}")
EOF

h() {  # h CASE ARGS...: run `harness ARGS`, keep its output, show what matters
    local case=$1; shift
    local log="$OUT/logs/$case.log" start=$SECONDS
    timeout 300 python3 -m harness "$@" --out "$OUT/$case" > "$log" 2>&1
    local rc=$?
    echo "exit $rc ($((SECONDS - start)) s; CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-all}): harness $* --out $OUT/$case" \
        | tee -a "$LOG"
    if [ -f "$OUT/$case/bench.md" ]; then  # the ratio table, then every rank's comm variants and sub-stages
        sed -n '/^## Ratios/,/^$/p;/^| *0 *| *fixed *| *\(dispatch\|combine\|a2a\|vdev\)/p' "$OUT/$case/bench.md" \
            | grep -v "^$" | head -n 24
    fi
    if [ "$rc" -ne 0 ] && [ "$rc" -ne 1 ] || ! grep -qE "^(OK|FAILED)" "$log"; then
        tail -n 30 "$log"
    else
        grep -E "^(OK|FAILED)|^- |below threshold|wrong|harness: " "$log" | head -n 12
    fi
}

echo "== 1 GPU: the PR case (symm-mem needs two ranks and says so; nccl runs and benches, one GPU each at once)"
CUDA_VISIBLE_DEVICES=0 h 1xh200-pr55579-symm-mem run deepseek-v3-dp32-pr55579 --comm symm-mem --policies fixed
(export CUDA_VISIBLE_DEVICES=0; h 1xh200-pr55579-nccl run deepseek-v3-dp32-pr55579 --comm nccl) &
(export CUDA_VISIBLE_DEVICES=1
 h 1xh200-pr55579-nccl-bench bench deepseek-v3-dp32-pr55579 --comm nccl --policies fixed --no-cpu-costs) &
wait

echo "== 2 GPUs: the real DP2 case (E=64), both backends"
for comm in symm-mem nccl; do
    h "2xh200-qwen3-dp2-$comm" run qwen3-30b-a3b-dp2 --comm "$comm" --policies fixed
    h "2xh200-qwen3-dp2-$comm-bench" bench qwen3-30b-a3b-dp2 --comm "$comm" --policies fixed --no-cpu-costs
done

echo "== 2 GPUs: skewed routing (run and bench), the PR case on two ranks (bench; its run is in harness run's checks)"
for comm in symm-mem nccl; do
    h "2xh200-skewed-$comm" run qwen3-30b-a3b-dp8-skewed --comm "$comm" --policies fixed
    h "2xh200-skewed-$comm-bench" bench qwen3-30b-a3b-dp8-skewed --comm "$comm" --policies fixed --no-cpu-costs
    h "2xh200-pr55579-$comm-bench" bench deepseek-v3-dp32-pr55579 --num-ranks 2 --comm "$comm" --policies fixed \
        --no-cpu-costs
done
if [ "${COMM_GPU_TESTS:-0}" = 1 ]; then  # the exactness tests of tests/test_comm.py (marked gpu), about 40 s more
    start=$SECONDS
    timeout 240 python3 -m pytest -q -x -m gpu tests/test_comm.py -p no:cacheprovider > "$OUT/logs/pytest-gpu.log" 2>&1
    echo "exit $? ($((SECONDS - start)) s): pytest -m gpu tests/test_comm.py" | tee -a "$LOG"
    tail -n 25 "$OUT/logs/pytest-gpu.log"
fi
echo "total $((SECONDS - T0)) s"
