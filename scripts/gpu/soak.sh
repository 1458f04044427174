#!/usr/bin/env bash
# The comm soak on 2 GPUs (benchmarks/soak_comm.py): many checked rounds per backend and shape, then the
# gpu-marked tests of the comm path (test_fused, test_soak, test_comm).
#   bash scripts/gpu/device.sh soak [ROUNDS] [TEST_REPEATS]
set -uo pipefail
cd "$(dirname "$0")/../.."
RUNS=${1:?runs directory}/soak
ROUNDS=${2:-1500}
mkdir -p "$RUNS"
soak() {  # NAME LIMIT_S SCENARIO ARGS...
    local name=$1 limit=$2; shift 2
    local start=$SECONDS
    timeout "$limit" python3 benchmarks/soak_comm.py "$@" --out "$RUNS/$name.json" > "$RUNS/$name.log" 2>&1
    echo "exit $? ($((SECONDS - start)) s): python3 benchmarks/soak_comm.py $*" | tee -a "$RUNS/commands.log"
    tail -n 8 "$RUNS/$name.log"
}
tiny=(--set model.hidden_size=64 --set model.intermediate_size=32 --set model.num_experts=16 --set model.top_k=2
      --set parallel.num_local_experts=4 --set parallel.max_tokens_per_rank=16 --set parallel.num_dispatchers=4)
soak symm-mem-tiny 150 smoke --set device=cuda --comm symm-mem --ranks 2 "${tiny[@]}" --rounds "$ROUNDS"
soak symm-mem-smoke 150 smoke --set device=cuda --comm symm-mem --ranks 2 --rounds "$((ROUNDS / 2))"
soak nccl-smoke 90 smoke --set device=cuda --comm nccl --ranks 2 --rounds "$((ROUNDS / 5))"
soak symm-mem-qwen3-dp2 90 qwen3-30b-a3b-dp2 --set device=cuda --comm symm-mem --rounds 60
soak symm-mem-qwen3-skewed 90 qwen3-30b-a3b-dp8-skewed --set device=cuda --comm symm-mem --ranks 2 --rounds 60
for i in $(seq 1 "${3:-1}"); do
    start=$SECONDS
    timeout 200 python3 -m pytest -q -rs -m gpu -p no:cacheprovider tests/test_fused.py tests/test_soak.py \
        tests/test_comm.py --junitxml="$RUNS/tests-$i.xml" > "$RUNS/tests-$i.log" 2>&1
    echo "exit $? ($((SECONDS - start)) s): pytest -q -rs -m gpu tests/test_fused.py tests/test_soak.py" \
        "tests/test_comm.py (round $i)" | tee -a "$RUNS/commands.log"
    tail -n 6 "$RUNS/tests-$i.log"
done
