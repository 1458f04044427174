#!/usr/bin/env bash
# Device side: $1 = seconds this call may use; $2 = "verify" to run harness verify live first; LIST = the
# startups file (default .verify/startups2.json).
T0=$(date +%s); BUDGET=$1
source .oracle/env.sh || exit 3
export VLLM_LOGGING_LEVEL=DEBUG
if [ ! -d /tmp/hw ]; then pip install -q --no-index --no-deps --target /tmp/hw .whl/*.whl >/dev/null 2>&1; fi
export PYTHONPATH="$PWD:/tmp/hw:$PYTHONPATH" HARNESS_CACHE_DIR=$PWD/.vcache
mkdir -p "$OUT"
if [ "${2:-}" = verify ]; then
  timeout 240 python3 -m harness verify --entry llm --timeout 200 --save "$OUT/verify-qwen3-8b-4l.yaml" \
    -- vllm serve .verify/configs/qwen3-8b-4l --max-model-len 4096 --max-num-seqs 128 > "$OUT/verify.out" 2>&1
  echo "verify rc=$?" >> "$OUT/verify.out"; tail -40 "$OUT/verify.out"
fi
LEFT=$(( BUDGET - ($(date +%s) - T0) ))
python3 .verify/drive.py "${LIST:-.verify/startups2.json}" "$LEFT"
cat "$OUT/tail.log"; nvidia-smi --query-gpu=memory.used --format=csv
