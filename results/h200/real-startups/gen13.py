"""Fourteenth batch of real startups: MLA models whose profile peak is the compiled MoE layer's routed-experts call
(profile_run.mla_moe_point), at shapes it was not read from: Kimi-K2 (384 experts) with 16 attention heads,
DeepSeek-V3 with 16 heads at 16384 batched tokens (twice the tokens the point was read at), and DeepSeek-V3 with 16
heads, six experts a token and a 1024-wide expert MLP (another a2q, workspace and shared-experts width). max_num_seqs
64 keeps the graph captures short. Planned before they ran (README). Writes the config directories and
startups15.json."""
import json
import os

import gen
import gen2
import gen5  # noqa: F401  (DeepSeek-V3's facts in gen.BASE)

HERE = os.path.dirname(os.path.abspath(__file__))
HEADS16 = dict(num_attention_heads=16, num_key_value_heads=16)
gen2.write("kimi-k2-4l-heads16", gen2.preset("kimi-k2", 4, **HEADS16))
gen.cfg("dsv3-4l-heads16", "deepseek-v3", 4, first_k_dense_replace=1, **HEADS16)
gen.cfg("dsv3-4l-heads16-top6-i1024", "deepseek-v3", 4, first_k_dense_replace=1, num_experts_per_tok=6,
        moe_intermediate_size=1024, **HEADS16)

D = dict(max_model_len=4096, max_num_batched_tokens=8192, max_num_seqs=64, gpu_memory_utilization=0.9)
SKIP = {"VLLM_DEEP_GEMM_WARMUP": "skip"}
S = [
    {"name": "kimi-k2-4l-heads16", "config": "kimi-k2-4l-heads16", "entry": "llm", "kwargs": D, "timeout": 330,
     "need": 120, "env": SKIP},
    {"name": "dsv3-4l-heads16-b16k", "config": "dsv3-4l-heads16", "entry": "llm", "timeout": 330, "need": 120,
     "env": SKIP, "kwargs": {**D, "max_num_batched_tokens": 16384}},
    {"name": "dsv3-4l-heads16-top6-i1024", "config": "dsv3-4l-heads16-top6-i1024", "entry": "llm", "kwargs": D,
     "timeout": 330, "need": 120, "env": SKIP},
]
with open(os.path.join(HERE, "startups15.json"), "w") as f:
    json.dump(S, f, indent=1)
print(len(S), "startups")
