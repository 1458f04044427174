"""Second batch of real startups: flag variations on the 4-layer configs, and 4-layer configs of the presets."""
import copy, json, os
HERE = os.path.dirname(os.path.abspath(__file__))
PRESETS = next(os.path.join(d, "harness", "defaults", "models") for d in (os.path.join(HERE, *[".."] * n) for n in range(4))
               if os.path.isdir(os.path.join(d, "harness", "defaults", "models")))

def preset(name, layers, **over):
    c = {k: v for k, v in json.load(open(os.path.join(PRESETS, name + ".json"))).items() if not k.startswith("_")}
    tgt = c["text_config"] if "text_config" in c else c
    tgt["num_hidden_layers"] = layers
    for k in ("max_window_layers",):
        if k in tgt: tgt[k] = layers
    if "layer_types" in tgt: tgt["layer_types"] = tgt["layer_types"][:layers]
    tgt.update(over)
    return c

def write(name, c):
    d = os.path.join(HERE, "configs", name); os.makedirs(d, exist_ok=True)
    json.dump(c, open(os.path.join(d, "config.json"), "w"), indent=1)

write("gemma2-9b-4l", preset("gemma-2-9b-it", 4))
write("granite-8b-4l", preset("granite-3.1-8b", 4))
write("phi4-4l", preset("phi-4", 4))
write("phi2-4l", preset("phi-2", 4))
write("mistral-7b-4l", preset("mistral-7b-v0.3", 4))
write("glm45-4l", preset("glm-4.5", 4, first_k_dense_replace=1, num_nextn_predict_layers=0))
write("minimax-m2-4l", preset("minimax-m2", 4))
write("qwen3-next-4l", preset("qwen3-next-80b-a3b", 4))
write("llama4-scout-4l", preset("llama-4-scout", 4))
write("gemma3-4b-4l", preset("gemma-3-4b-it", 4))

D = dict(max_model_len=4096, max_num_batched_tokens=8192, max_num_seqs=256, gpu_memory_utilization=0.9)
S = []
def llm(name, config, timeout=240, **kw):
    S.append({"name": name, "config": config, "entry": "llm", "kwargs": {**D, **kw}, "timeout": timeout, "need": 45})
E = {"enforce_eager": True}
# flag variations on the configs the earlier startups used (quick: warm compile caches for most)
llm("llama-8b-4l-kvfp8", "llama-8b-4l", kv_cache_dtype="fp8")
llm("qwen3-moe-4l-bs32", "qwen3-moe-4l", block_size=32)
llm("llama-8b-4l-bs64-seqs512", "llama-8b-4l", block_size=64, max_num_seqs=512)
llm("qwen3-moe-4l-len32k-seqs64-mbt4096", "qwen3-moe-4l", max_model_len=32768, max_num_batched_tokens=4096, max_num_seqs=64)
llm("llama-8b-4l-mbt32k", "llama-8b-4l", max_num_batched_tokens=32768)
llm("qwen3-moe-4l-util05", "qwen3-moe-4l", gpu_memory_utilization=0.5)
llm("qwen3-moe-4l-piecewise", "qwen3-moe-4l", compilation_config={"cudagraph_mode": "PIECEWISE"})
llm("qwen3-moe-4l-full-decode-only", "qwen3-moe-4l", compilation_config={"cudagraph_mode": "FULL_DECODE_ONLY"})
llm("qwen3-moe-4l-capture64", "qwen3-moe-4l", compilation_config={"max_cudagraph_capture_size": 64})
llm("qwen3-moe-4l-nographs", "qwen3-moe-4l", compilation_config={"cudagraph_mode": "NONE"})
llm("qwen3-moe-4l-len16k-util095", "qwen3-moe-4l", max_model_len=16384, gpu_memory_utilization=0.95)
llm("dsv2-lite-4l-kvfp8", "dsv2-lite-4l", kv_cache_dtype="fp8")
llm("dsv2-lite-4l-eager", "dsv2-lite-4l", **E)
llm("qwen2.5-7b-4l-fp16", "qwen2.5-7b-4l", dtype="float16")
llm("qwen3-8b-4l-fp8block", "qwen3-8b-4l-fp8block", timeout=400)
llm("llama-8b-4l-ctfp8", "llama-8b-4l-ctfp8", timeout=400)
llm("mixtral-2l-online-fp8", "mixtral-2l", quantization="fp8", timeout=400)
llm("qwen1.5-moe-4l-kvfp8-eager", "qwen1.5-moe-4l", kv_cache_dtype="fp8", **E)
llm("qwen3-moe-4l-fp8block-kvfp8", "qwen3-moe-4l-fp8block", kv_cache_dtype="fp8")
llm("qwen3-moe-4l-llm-defaults", "qwen3-moe-4l", max_num_batched_tokens=None, max_num_seqs=None)
# architectures from the presets, four layers each
llm("gemma2-9b-4l", "gemma2-9b-4l")
llm("granite-8b-4l", "granite-8b-4l")
llm("phi4-4l", "phi4-4l")
llm("phi2-4l", "phi2-4l", max_model_len=2048)
llm("mistral-7b-4l", "mistral-7b-4l")
llm("glm45-4l", "glm45-4l")
llm("qwen3-next-4l", "qwen3-next-4l", timeout=300)
llm("minimax-m2-4l-eager", "minimax-m2-4l", timeout=400, **E)
llm("llama4-scout-4l-text", "llama4-scout-4l", limit_mm_per_prompt={"image": 0})
llm("gemma3-4b-4l-text", "gemma3-4b-4l", limit_mm_per_prompt={"image": 0})
llm("gpt-oss-4l", "gpt-oss-4l", timeout=300)
# full-size models
llm("qwen3-30b-a3b", "qwen3-30b-a3b")
llm("llama-3.1-8b", "llama-3.1-8b")
llm("deepseek-v2-lite", "deepseek-v2-lite")
for s in S:
    s["kwargs"] = {k: v for k, v in s["kwargs"].items() if v is not None}
json.dump(S, open(os.path.join(HERE, "startups2.json"), "w"), indent=1)
print(len(S), "startups")
