#!/usr/bin/env bash
# Step soak: many checked dispatch + combine rounds per backend and shape (benchmarks/soak_comm.py), then the
# gpu-marked tests of the comm path.
#
#   bash scripts/gpu/device.sh soak [ROUNDS] [TEST_REPEATS]     (or: bash scripts/gpu/soak.sh OUT_DIR ...)
#
# Runs:   symm-mem on tiny and smoke shapes (ROUNDS, default 1500, and half that), nccl on smoke (a fifth), symm-mem
#         on the DP2 and skewed cases (60 rounds), then tests/test_fused.py, tests/test_soak.py and tests/test_comm.py
#         (-m gpu) TEST_REPEATS times (default 1). Every round checks counts, every slot and the output.
# Needs:  2 GPUs, pytest, Triton.
# Writes: OUT_DIR/<case>.{json,log} (each soak's faults and rounds), OUT_DIR/tests-N.{log,xml}, OUT_DIR/commands.log.
set -uo pipefail
cd "$(dirname "$0")/../.."
RUNS=${1:?usage: soak.sh OUT_DIR [ROUNDS] [TEST_REPEATS]}
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
        "tests/test_comm.py (repeat $i)" | tee -a "$RUNS/commands.log"
    tail -n 6 "$RUNS/tests-$i.log"
done
