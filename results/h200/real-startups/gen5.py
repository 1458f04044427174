"""Fifth batch of real startups: DeepSeek-V3 (block-FP8, dense MLA on FLASH_ATTN_MLA with 128 heads) cut to four
layers, the model of the PR case. Writes the config directories of the earlier batches (importing them) and
startups6.json."""
import json
import os

import gen
import gen4  # noqa: F401  (writes the fourth batch's configs; its BASE holds DeepSeek-V3.2's facts)

HERE = os.path.dirname(os.path.abspath(__file__))
# deepseek-ai/DeepSeek-V3 config.json (public): DeepSeek-V3.2's without the indexer
v3 = {k: v for k, v in gen.BASE["deepseek-v3.2"].items() if not k.startswith("index_")}
v3.update(architectures=["DeepseekV3ForCausalLM"], model_type="deepseek_v3")
gen.BASE["deepseek-v3"] = v3
gen.cfg("dsv3-4l", "deepseek-v3", 4, first_k_dense_replace=1)
S = [{"name": "dsv3-4l", "config": "dsv3-4l", "entry": "llm", "timeout": 420, "need": 60,
      "env": {"VLLM_DEEP_GEMM_WARMUP": "skip"},
      "kwargs": dict(max_model_len=4096, max_num_batched_tokens=8192, max_num_seqs=256, gpu_memory_utilization=0.9)}]
with open(os.path.join(HERE, "startups6.json"), "w") as f:
    json.dump(S, f, indent=1)
print(len(S), "startups")
