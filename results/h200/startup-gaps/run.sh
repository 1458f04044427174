#!/usr/bin/env bash
# Device side: bash .gpuwork/gap/run.sh BUDGET_S  (after `source .oracle/env.sh`): lanes of probe.py at once.
#   LANES   the lanes, ";" between lanes, NAME:UTIL items in a lane run one after another (default: the first batch's)
#   RESERVE seconds kept back from the probes for what follows them (default 8)
#   AFTER   a real-startups list run through .verify/drive.py alone on the GPU once the probes end (default none)
# probe.py reads its keyword arguments from $PROBE_KWARGS (default kwargs.json beside it).
T0=$(date +%s); BUDGET=$1; H=.gpuwork/gap
LANES=${LANES:-"qwen3-moe-4l-fp8block-kvfp8:0.25;gpt-oss-4l:0.25;qwen3-next-4l:0.25 dsv32-4l-eager:0.25"}
RESERVE=${RESERVE:-8}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
mkdir -p "$OUT"; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > "$OUT/machine.txt"
lane() {
  for item in "$@"; do
    n=${item%%:*}; u=${item##*:}
    LEFT=$(( BUDGET - ($(date +%s) - T0) - RESERVE )); [ $LEFT -lt 30 ] && { echo "skip $n" >> "$OUT/lanes.txt"; continue; }
    C=/tmp/caches/$n; rm -rf $C; mkdir -p $C
    s=$(date +%s)
    VLLM_CACHE_ROOT=$C/vllm TORCHINDUCTOR_CACHE_DIR=$C/inductor TRITON_CACHE_DIR=$C/triton \
      timeout -k 3 $LEFT python3 $H/probe.py $n $u > "$OUT/$n.log" 2>&1
    echo "$n rc=$? $(( $(date +%s) - s ))s start=$(( s - T0 ))" >> "$OUT/lanes.txt"
    [ -n "${KEEP_SRC:-}" ] && (cd $C && find . -name '*.py' -size -4M | tar czf "$OUT/$n.src.tgz" -T -)
  done
}
PIDS=()
IFS=';' read -ra LANE_LIST <<< "$LANES"
for items in "${LANE_LIST[@]}"; do
  # shellcheck disable=SC2086  (a lane's items are words)
  lane $items & PIDS+=($!)
done
( while sleep 15; do nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits >> "$OUT/mem.txt"; done ) &
M=$!
wait "${PIDS[@]}"
kill $M
python3 -c "import torch,vllm,triton;print(vllm.__version__,torch.__version__,torch.version.cuda,triton.__version__)" >> "$OUT/machine.txt" 2>&1
cat "$OUT/lanes.txt"; grep -h -E "PROBE-|Profiling CUDA|Estimated (PIECEWISE|FULL)|torch peak|Error|error" "$OUT"/*.log | cut -c1-250 | tail -30
for f in "$OUT"/*.log; do gzip -9 "$f"; done
if [ -n "${AFTER:-}" ]; then
  while [ "$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits)" -gt 2000 ]; do sleep 2; done
  export VLLM_LOGGING_LEVEL=DEBUG VLLM_USE_FLASHINFER_SAMPLER=0
  python3 .verify/drive.py "$AFTER" $(( BUDGET - ($(date +%s) - T0) - 5 ))
  tail -20 "$OUT/tail.log" 2>/dev/null
fi
ls -la "$OUT"
