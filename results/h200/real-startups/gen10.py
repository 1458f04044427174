"""Eleventh batch of real startups: MLA models whose PIECEWISE warm-up keeps a profile stand-in's segment with the
capture stream's cuBLAS workspace (cudagraph_memory.held_mla_stand_in), at shapes the mechanism was not read from:
Kimi-K2 (64 heads, 384 experts, block FP8) cut to four layers, and DeepSeek-V3 at 8192 tokens of context (a stand-in
of 65536 rows). Planned before they ran (README). Writes startups12.json."""
import json
import os

import gen2
import gen5  # noqa: F401  (writes dsv3-4l's directory)

HERE = os.path.dirname(os.path.abspath(__file__))
gen2.write("kimi-k2-4l", gen2.preset("kimi-k2", 4))
D = dict(max_model_len=4096, max_num_batched_tokens=8192, max_num_seqs=256, gpu_memory_utilization=0.9)
SKIP = {"VLLM_DEEP_GEMM_WARMUP": "skip"}
S = [
    {"name": "kimi-k2-4l", "config": "kimi-k2-4l", "entry": "llm", "timeout": 420, "need": 60, "env": SKIP,
     "kwargs": D},
    {"name": "dsv3-4l-len8k", "config": "dsv3-4l", "entry": "llm", "timeout": 420, "need": 60, "env": SKIP,
     "kwargs": {**D, "max_model_len": 8192}},
]
with open(os.path.join(HERE, "startups12.json"), "w") as f:
    json.dump(S, f, indent=1)
print(len(S), "startups")
