"""Fourth batch of real startups: DeepSeek-V3.2's sparse attention (its indexer and its key cache, with a bf16 and an
fp8 MLA cache) and the full-size gpt-oss-20b.

Writes the config directories of the earlier batches (importing them), DeepSeek-V3.2's cut to four layers (one dense,
three MoE, the public config.json otherwise), and startups4.json. DeepGEMM's kernel warm-up runs after the KV cache
is sized and prints no memory figure: it is skipped (VLLM_DEEP_GEMM_WARMUP=skip) so that the call's time goes to
startups."""
import json
import os

import gen
import gen2  # noqa: F401  (writes the second batch's config directories)
import gen3  # noqa: F401  (writes the third batch's list; its configs are the first two batches')

HERE = os.path.dirname(os.path.abspath(__file__))
# deepseek-ai/DeepSeek-V3.2-Exp config.json (public): MLA with the sparse-attention indexer, block-FP8 weights
gen.BASE["deepseek-v3.2"] = {
    "architectures": ["DeepseekV32ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "bos_token_id": 0, "eos_token_id": 1, "ep_size": 1, "first_k_dense_replace": 3, "hidden_act": "silu",
    "hidden_size": 7168, "index_head_dim": 128, "index_n_heads": 64, "index_topk": 2048,
    "initializer_range": 0.02, "intermediate_size": 18432, "kv_lora_rank": 512, "max_position_embeddings": 163840,
    "model_type": "deepseek_v32", "moe_intermediate_size": 2048, "moe_layer_freq": 1, "n_group": 8,
    "n_routed_experts": 256, "n_shared_experts": 1, "norm_topk_prob": True, "num_attention_heads": 128,
    "num_experts_per_tok": 8, "num_hidden_layers": 61, "num_key_value_heads": 128, "num_nextn_predict_layers": 1,
    "q_lora_rank": 1536, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
    "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                            "weight_block_size": [128, 128]},
    "rms_norm_eps": 1e-06,
    "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0, "mscale_all_dim": 1.0,
                     "original_max_position_embeddings": 4096, "type": "yarn"},
    "rope_theta": 10000, "routed_scaling_factor": 2.5, "scoring_func": "sigmoid", "tie_word_embeddings": False,
    "topk_group": 4, "topk_method": "noaux_tc", "torch_dtype": "bfloat16", "use_cache": True, "v_head_dim": 128,
    "vocab_size": 129280,
}
gen.cfg("dsv32-4l", "deepseek-v3.2", 4, first_k_dense_replace=1)

D = dict(max_model_len=4096, max_num_batched_tokens=8192, max_num_seqs=256, gpu_memory_utilization=0.9)
SKIP_WARMUP = {"VLLM_DEEP_GEMM_WARMUP": "skip"}
S = []


def llm(name, config, timeout=400, env=None, **kw):
    S.append({"name": name, "config": config, "entry": "llm", "kwargs": {**D, **kw}, "timeout": timeout,
              "need": 60, "env": env or {}})


llm("gpt-oss-20b", "gpt-oss-20b", timeout=300)
llm("dsv32-4l", "dsv32-4l", timeout=480, env=SKIP_WARMUP)
llm("dsv32-4l-kvfp8", "dsv32-4l", timeout=400, env=SKIP_WARMUP, kv_cache_dtype="fp8")
llm("dsv32-4l-eager", "dsv32-4l", timeout=300, env=SKIP_WARMUP, enforce_eager=True)
with open(os.path.join(HERE, "startups4.json"), "w") as f:
    json.dump(S, f, indent=1)
print(len(S), "startups")
