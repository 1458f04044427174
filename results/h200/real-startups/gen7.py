"""Seventh batch of real startups: FlashAttention 3's own split count under FLASH_ATTN_MLA_SPARSE's full CUDA graphs.
DeepSeek-V3.2 cut to four layers (gen4.py's config) with index_topk 512 (8 n blocks of 64: the plan's port of the
heuristic gives 7 splits, 28 at 2048), and with FULL graphs of 1024 and 1008 sequences (over 992 varlen sequences
FlashAttention takes one split). Writes the config directories and startups8.json."""
import json
import os

import gen
import gen4  # noqa: F401  (DeepSeek-V3.2's facts in gen.BASE, dsv32-4l's directory)

HERE = os.path.dirname(os.path.abspath(__file__))
gen.cfg("dsv32-4l-topk512", "deepseek-v3.2", 4, first_k_dense_replace=1, index_topk=512)

D = dict(max_model_len=4096, max_num_batched_tokens=8192, max_num_seqs=256, gpu_memory_utilization=0.9)
SKIP_WARMUP = {"VLLM_DEEP_GEMM_WARMUP": "skip"}
S = [
    {"name": "dsv32-4l-topk512", "config": "dsv32-4l-topk512", "entry": "llm", "kwargs": D, "timeout": 480,
     "need": 60, "env": SKIP_WARMUP},
    {"name": "dsv32-4l-capture1024", "config": "dsv32-4l", "entry": "llm", "timeout": 400, "need": 60,
     "env": SKIP_WARMUP,
     "kwargs": {**D, "max_num_seqs": 1024, "compilation_config": {"cudagraph_capture_sizes": [1008, 1024]}}},
]
with open(os.path.join(HERE, "startups8.json"), "w") as f:
    json.dump(S, f, indent=1)
print(len(S), "startups")
