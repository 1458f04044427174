#!/usr/bin/env bash
# Device side: bash .gpuwork/gap/run.sh BUDGET_S (after `source .oracle/env.sh`): three probe.py lanes at once,
# then the eager DeepSeek-V3.2 startup repeated through drive.py.
T0=$(date +%s); BUDGET=$1; H=.gpuwork/gap
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
mkdir -p "$OUT"; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > "$OUT/machine.txt"
lane() {
  for item in "$@"; do
    n=${item%%:*}; u=${item##*:}
    LEFT=$(( BUDGET - ($(date +%s) - T0) - 150 )); [ $LEFT -lt 30 ] && { echo "skip $n" >> "$OUT/lanes.txt"; continue; }
    C=/tmp/caches/$n; rm -rf $C; mkdir -p $C
    s=$(date +%s)
    VLLM_CACHE_ROOT=$C/vllm TORCHINDUCTOR_CACHE_DIR=$C/inductor TRITON_CACHE_DIR=$C/triton \
      timeout -k 3 $LEFT python3 $H/probe.py $n $u > "$OUT/$n.log" 2>&1
    echo "$n rc=$? $(( $(date +%s) - s ))s start=$(( s - T0 ))" >> "$OUT/lanes.txt"
  done
}
lane dsv3-4l:0.25 & P1=$!
lane dsv32-4l-capture1024:0.25 & P2=$!
lane qwen3-moe-4l-awq:0.2 & P3=$!
( while sleep 15; do nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits >> "$OUT/mem.txt"; done ) &
M=$!
wait $P1 $P2 $P3
kill $M
python3 -c "import torch,vllm,triton;print(vllm.__version__,torch.__version__,torch.version.cuda,triton.__version__)" >> "$OUT/machine.txt" 2>&1
cat "$OUT/lanes.txt"; grep -h -E "PROBE-|Profiling CUDA|Estimated (PIECEWISE|FULL)|torch peak|Error|error" "$OUT"/*.log | cut -c1-250 | tail -30
for f in "$OUT"/*.log; do gzip -9 "$f"; done
while [ "$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits)" -gt 2000 ]; do sleep 2; done
LEFT=$(( BUDGET - ($(date +%s) - T0) - 5 ))
export VLLM_LOGGING_LEVEL=DEBUG VLLM_USE_FLASHINFER_SAMPLER=0
python3 .verify/drive.py .verify/eager.json "$LEFT"
tail -20 "$OUT/tail.log" 2>/dev/null; ls -la "$OUT"
