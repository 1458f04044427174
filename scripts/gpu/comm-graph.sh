#!/usr/bin/env bash
# Step comm-graph: the comm yardstick and symm-mem's device-side path on one GPU (P = 1).
#
#   bash scripts/gpu/device.sh comm-graph [quick|full|benches] [vllm-ops VERSION]
#                                  (or: bash scripts/gpu/comm-graph.sh OUT_DIR [quick|full|benches] [vllm-ops VERSION])
#
# Runs:   the gpu-marked tests of tests/test_push.py and tests/test_fused.py (the kernels compiled) and the
#         one-GPU exactness and graph-replay tests of tests/test_comm.py, the graph soak of tests/test_soak.py and
#         the bench's queued graph timing (tests/test_bench.py); then `harness bench` of the PR case,
#         qwen3-30b-a3b-dp2 on one rank and decode-128-deepseek-v3 on one rank with symm-mem (graph-replayed),
#         the PR case with nccl (graph-replayed too), and `harness run` of the PR case with
#         symm-mem and with nccl (the checked pass). quick: the tests and the PR-case bench only; benches: full
#         without the tests.
# Needs:  1 GPU, pytest, Triton; experts backend torch-cutlass (sm90+), or with `vllm-ops VERSION` vLLM's ops
#         library of that release in .gpu/lib/vllm-VERSION.so (device.sh decompresses it there).
# Writes: OUT_DIR/<case>/ (bench.json, bench.md or the run's records), OUT_DIR/logs/<case>.log,
#         OUT_DIR/commands.log, OUT_DIR/environment.txt; prints each command's exit code and the yardstick
#         lines. Exit 1 from bench means below a scenario threshold; 2 an error.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${1:?usage: bash scripts/gpu/comm-graph.sh OUT_DIR [quick]}
MODE=${2:-full}
EXPERTS=${3:-torch-cutlass}
if [ "$EXPERTS" = vllm-ops ]; then
    VERSION=${4:?usage: ... vllm-ops VERSION}
    EXPERTS_ARGS=(--experts-backend vllm-ops --vllm-ops-library "$PWD/.gpu/lib/vllm-$VERSION.so" --kernels "$VERSION")
else
    EXPERTS_ARGS=(--experts-backend torch-cutlass)
fi
mkdir -p "$OUT/logs"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
LOG="$OUT/commands.log"
T0=$SECONDS
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name(0))" \
    | tee "$OUT/environment.txt"
# the commit of the code that ran: COMMIT beside the copy (brought by the caller), else the checkout's
{ [ -f COMMIT ] && echo "commit $(cat COMMIT)" || git log -1 --format='commit %H'; } | tee -a "$OUT/environment.txt"

start=$SECONDS
if [ "$MODE" != benches ]; then
timeout 200 python3 -m pytest -q -x -p no:cacheprovider -m gpu tests/test_push.py tests/test_fused.py \
    "tests/test_comm.py::test_gpu_comm_on_one_gpu_is_exact" tests/test_comm.py::test_gpu_graph_replayed_run_iterations_equal_eager_bit_for_bit \
    tests/test_comm.py::test_gpu_graph_replay_equals_eager_bit_for_bit_with_rank_delays \
    tests/test_soak.py::test_graph_soak_with_rank_delays_finds_no_fault \
    tests/test_bench.py::test_queue_ahead_hides_the_launch_of_a_graph_replay \
    > "$OUT/logs/pytest-gpu.log" 2>&1
    echo "exit $? ($((SECONDS - start)) s): pytest -m gpu (push, fused, one-GPU comm, graph replay, graph soak)" | tee -a "$LOG"
    tail -n 15 "$OUT/logs/pytest-gpu.log"
fi

h() {  # h CASE ARGS...: run `harness ARGS`, keep its output, show what matters
    local case=$1; shift
    local log="$OUT/logs/$case.log" start=$SECONDS
    timeout 120 python3 -m harness "$@" --out "$OUT/$case" > "$log" 2>&1
    local rc=$?
    echo "exit $rc ($((SECONDS - start)) s): harness $* --out $OUT/$case" | tee -a "$LOG"
    if [ -f "$OUT/$case/bench.md" ]; then
        sed -n '/^## Comm yardstick/,/^## Reference/p' "$OUT/$case/bench.md" | grep "^| 0 " | head -n 30
        grep -E "^\| 0 \| fixed \| (dispatch|combine)[.:]" "$OUT/$case/bench.md" | head -n 20
    fi
    grep -E "^(OK|FAILED)|^- |harness: |Error|error" "$log" | head -n 8
    [ "$rc" -ne 0 ] && [ "$rc" -ne 1 ] && tail -n 25 "$log"
}
X=("${EXPERTS_ARGS[@]}" --policies fixed --no-cpu-costs)
h 1xh200-pr55579-symm-mem-bench bench deepseek-v3-dp32-pr55579 --comm symm-mem "${X[@]}"
if [ "$MODE" != quick ]; then
    h 1xh200-qwen3-dp2-1rank-symm-mem-bench bench qwen3-30b-a3b-dp2 --num-ranks 1 --comm symm-mem "${X[@]}"
    h 1xh200-decode-1rank-symm-mem-bench bench decode-128-deepseek-v3 --num-ranks 1 --comm symm-mem "${X[@]}"
    h 1xh200-pr55579-nccl-bench bench deepseek-v3-dp32-pr55579 --comm nccl "${X[@]}"
    h 1xh200-pr55579-symm-mem-run run deepseek-v3-dp32-pr55579 --comm symm-mem "${EXPERTS_ARGS[@]}" --policies fixed
    h 1xh200-pr55579-nccl-run run deepseek-v3-dp32-pr55579 --comm nccl "${EXPERTS_ARGS[@]}" --policies fixed
fi
echo "total $((SECONDS - T0)) s"
