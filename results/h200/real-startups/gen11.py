"""Twelfth batch of real startups: MLA's graph pool at 1024 tokens on DeepSeek-V3 (no indexer: mla_pool was read
from DeepSeek-V3.2 there), and the WNA16 MoE experts at 32768 batched tokens, where vLLM's pick between the Marlin
and Triton WNA16 experts moves the profile's peak. Planned before they ran (README). Writes startups13.json."""
import json
import os

import gen5  # noqa: F401  (writes dsv3-4l's directory)
import gen6  # noqa: F401  (writes the checkpoint-format directories)

HERE = os.path.dirname(os.path.abspath(__file__))
D = dict(max_model_len=4096, max_num_batched_tokens=8192, max_num_seqs=256, gpu_memory_utilization=0.9)
S = [
    {"name": "qwen3-moe-4l-w4a16-mbt32k", "config": "qwen3-moe-4l-w4a16", "entry": "llm", "timeout": 300, "need": 60,
     "kwargs": {**D, "max_num_batched_tokens": 32768}},
    {"name": "dsv3-4l-capture1024", "config": "dsv3-4l", "entry": "llm", "timeout": 420, "need": 60,
     "env": {"VLLM_DEEP_GEMM_WARMUP": "skip"},
     "kwargs": {**D, "compilation_config": {"max_cudagraph_capture_size": 1024}}},
]
with open(os.path.join(HERE, "startups13.json"), "w") as f:
    json.dump(S, f, indent=1)
print(len(S), "startups")
