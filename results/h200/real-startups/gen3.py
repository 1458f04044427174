"""Third batch of real startups: the architectures and checkpoint formats the first two batches did not reach.

Writes the config directories of gen.py and gen2.py (importing them) and startups3.json, fastest first so that a
call's deadline cuts the slow ones."""
import json
import os

import gen  # noqa: F401  (writes the first batch's config directories)
import gen2  # noqa: F401  (writes the second batch's config directories)

HERE = os.path.dirname(os.path.abspath(__file__))
D = dict(max_model_len=4096, max_num_batched_tokens=8192, max_num_seqs=256, gpu_memory_utilization=0.9)
S = []


def llm(name, config, timeout=240, **kw):
    kwargs = {k: v for k, v in {**D, **kw}.items() if v is not None}
    S.append({"name": name, "config": config, "entry": "llm", "kwargs": kwargs, "timeout": timeout, "need": 45})


E = {"enforce_eager": True}
llm("qwen3-moe-4l-llm-defaults", "qwen3-moe-4l", max_num_batched_tokens=None, max_num_seqs=None)
llm("phi2-4l", "phi2-4l", max_model_len=2048)
llm("gemma3-4b-4l-text", "gemma3-4b-4l", limit_mm_per_prompt={"image": 0})
llm("qwen1.5-moe-4l-kvfp8-eager", "qwen1.5-moe-4l", kv_cache_dtype="fp8", **E)
llm("gpt-oss-4l", "gpt-oss-4l", timeout=360)
llm("minimax-m2-4l-eager", "minimax-m2-4l", timeout=400, **E)
llm("llama-8b-4l-ctfp8", "llama-8b-4l-ctfp8", timeout=400)
llm("mixtral-2l-online-fp8", "mixtral-2l", quantization="fp8", timeout=400)
llm("qwen3-moe-4l-fp8block-kvfp8", "qwen3-moe-4l-fp8block", kv_cache_dtype="fp8", timeout=400)
with open(os.path.join(HERE, "startups3.json"), "w") as f:
    json.dump(S, f, indent=1)
print(len(S), "startups")
