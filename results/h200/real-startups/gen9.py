"""Tenth batch of real startups: longer contexts and other batch settings on the hybrid and sliding-window
architectures, where vLLM's hybrid KV cache manager gives each layer kind its own block budget (Qwen3-Next's
gated-delta-net state, Llama-4's chunked local attention, Gemma 3's sliding layers beside a global one, gpt-oss's
128-token window), and GLM-4.5 with an fp8 KV cache. Planned before they ran (README). Writes startups11.json and the
config directories (gen.py's, gen2.py's and Gemma 3 at eight layers), fastest first."""
import json
import os

import gen  # noqa: F401  (writes the first batch's config directories)
import gen2  # writes the preset configs at four layers; its preset() and write() are used below

HERE = os.path.dirname(os.path.abspath(__file__))
# Eight layers: the sixth is Gemma 3's first global (full-attention) layer, beside seven sliding ones.
gen2.write("gemma3-4b-8l", gen2.preset("gemma-3-4b-it", 8))
D = dict(max_model_len=4096, max_num_batched_tokens=8192, max_num_seqs=256, gpu_memory_utilization=0.9)
TEXT = {"limit_mm_per_prompt": {"image": 0}}
S = []


def llm(name, config, timeout=240, **kw):
    S.append({"name": name, "config": config, "entry": "llm", "kwargs": {**D, **kw}, "timeout": timeout, "need": 45})


llm("gemma3-4b-8l-text-len16k", "gemma3-4b-8l", max_model_len=16384, **TEXT)
llm("glm45-4l-kvfp8-seqs128", "glm45-4l", kv_cache_dtype="fp8", max_num_seqs=128)
llm("qwen3-next-4l-len16k-seqs64-mbt4096", "qwen3-next-4l", max_model_len=16384, max_num_seqs=64,
    max_num_batched_tokens=4096)
llm("llama4-scout-4l-text-len32k", "llama4-scout-4l", max_model_len=32768, **TEXT)
llm("gpt-oss-4l-len16k-seqs128", "gpt-oss-4l", max_model_len=16384, max_num_seqs=128, timeout=300)
with open(os.path.join(HERE, "startups11.json"), "w") as f:
    json.dump(S, f, indent=1)
print(len(S), "startups")
