#!/usr/bin/env bash
# $1 = seconds this call may use; the rest: NAME:TIMEOUT ...
T0=$(date +%s); BUDGET=$1; shift
source .oracle/env.sh || exit 3
echo "env: NCCL_NVLS_ENABLE=$NCCL_NVLS_ENABLE TORCH_SYMM_MEM_DISABLE_MULTICAST=$TORCH_SYMM_MEM_DISABLE_MULTICAST NVSHMEM_DISABLE_NVLS=$NVSHMEM_DISABLE_NVLS"
export VLLM_LOGGING_LEVEL=DEBUG
mkdir -p "$OUT"; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > "$OUT/machine.txt"
python3 -c "import torch,vllm,triton;print(vllm.__version__,torch.__version__,torch.version.cuda,triton.__version__)" >> "$OUT/machine.txt" 2>&1
for item in "$@"; do
  n=${item%%:*}; t=${item##*:}
  LEFT=$(( BUDGET - ($(date +%s) - T0) - 10 ))
  [ $LEFT -lt 40 ] && { echo "skip $n ($LEFT s left)"; continue; }
  [ $t -gt $LEFT ] && t=$LEFT
  s=$(date +%s); timeout -k 5 $t python3 .gpuwork/probe.py "$n" > "$OUT/$n.log" 2>&1; rc=$?
  echo "== $n rc=$rc $(( $(date +%s) - s ))s"; grep -E "Model loading took|torch peak|PROBE-DONE" "$OUT/$n.log" | cut -c1-300
  for i in $(seq 30); do u=$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits); [ "$u" -lt 1500 ] && break; sleep 1; done
done
cat "$OUT/machine.txt"
