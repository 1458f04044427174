"""Thirteenth batch of real startups: the small pool of MLA's FULL captures away from the sizes it was read at.
DeepSeek-V3.2 cut to four layers with 16 attention heads (a TP 8 rank's share of its 128) and with max_num_seqs 128
(FULL graphs of 128 and 120 tokens, every first-layer tensor under 1 MiB at both), and DeepSeek-V3 with 16 heads.
Planned before they ran (README). Writes the config directories and startups14.json."""
import json
import os

import gen
import gen4  # noqa: F401  (DeepSeek-V3.2's facts in gen.BASE, dsv32-4l's directory)
import gen5  # noqa: F401  (DeepSeek-V3's facts, dsv3-4l's directory)

HERE = os.path.dirname(os.path.abspath(__file__))
gen.cfg("dsv32-4l-heads16", "deepseek-v3.2", 4, first_k_dense_replace=1, num_attention_heads=16,
        num_key_value_heads=16)
gen.cfg("dsv3-4l-heads16", "deepseek-v3", 4, first_k_dense_replace=1, num_attention_heads=16, num_key_value_heads=16)

D = dict(max_model_len=4096, max_num_batched_tokens=8192, max_num_seqs=256, gpu_memory_utilization=0.9)
SKIP_WARMUP = {"VLLM_DEEP_GEMM_WARMUP": "skip"}
S = [
    {"name": "dsv32-4l-heads16", "config": "dsv32-4l-heads16", "entry": "llm", "kwargs": D, "timeout": 400,
     "need": 60, "env": SKIP_WARMUP},
    {"name": "dsv32-4l-seqs128", "config": "dsv32-4l", "entry": "llm", "timeout": 400, "need": 60,
     "env": SKIP_WARMUP, "kwargs": {**D, "max_num_seqs": 128}},
    {"name": "dsv3-4l-heads16", "config": "dsv3-4l-heads16", "entry": "llm", "kwargs": D, "timeout": 400,
     "need": 150, "env": SKIP_WARMUP},
]
with open(os.path.join(HERE, "startups14.json"), "w") as f:
    json.dump(S, f, indent=1)
print(len(S), "startups")
