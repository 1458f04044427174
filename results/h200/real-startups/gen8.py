"""Ninth batch of real startups: FULL CUDA graphs over 992 sequences on FlashAttention 3's dense path, where the
metadata builder asks for 32 splits and FlashAttention 3 takes one (mha_fwd: "disable split for varlen and >992
batches") and allocates no accumulators. gpt-oss cut to four layers with max_num_seqs 1024 (its config hook raises the
largest capture size to 1024), and Qwen3-30B-A3B cut to four layers with max_num_seqs 1024 and
max_cudagraph_capture_size 1024. Writes startups10.json; the config directories are gen.py's."""
import json
import os

import gen  # noqa: F401  (writes the config directories)

HERE = os.path.dirname(os.path.abspath(__file__))
D = dict(max_model_len=4096, max_num_batched_tokens=8192, max_num_seqs=1024, gpu_memory_utilization=0.9)
S = [
    {"name": "qwen3-moe-4l-seqs1024-capture1024", "config": "qwen3-moe-4l", "entry": "llm", "timeout": 280,
     "need": 45, "kwargs": {**D, "compilation_config": {"max_cudagraph_capture_size": 1024}}},
    {"name": "gpt-oss-4l-seqs1024", "config": "gpt-oss-4l", "entry": "llm", "timeout": 280, "need": 45,
     "kwargs": D},
]
with open(os.path.join(HERE, "startups10.json"), "w") as f:
    json.dump(S, f, indent=1)
print(len(S), "startups")
