import copy
import json
import os

HERE = os.path.dirname(os.path.abspath(__file__))
BASE = {
 "qwen3-30b-a3b": {"architectures":["Qwen3MoeForCausalLM"],"attention_bias":False,"attention_dropout":0.0,"bos_token_id":151643,"decoder_sparse_step":1,"eos_token_id":151645,"head_dim":128,"hidden_act":"silu","hidden_size":2048,"initializer_range":0.02,"intermediate_size":6144,"max_position_embeddings":40960,"max_window_layers":48,"mlp_only_layers":[],"model_type":"qwen3_moe","moe_intermediate_size":768,"norm_topk_prob":True,"num_attention_heads":32,"num_experts":128,"num_experts_per_tok":8,"num_hidden_layers":48,"num_key_value_heads":4,"output_router_logits":False,"rms_norm_eps":1e-06,"rope_scaling":None,"rope_theta":1000000.0,"router_aux_loss_coef":0.001,"sliding_window":None,"tie_word_embeddings":False,"torch_dtype":"bfloat16","use_cache":True,"use_sliding_window":False,"vocab_size":151936},
 "llama-3.1-8b": {"architectures":["LlamaForCausalLM"],"attention_bias":False,"attention_dropout":0.0,"bos_token_id":128000,"eos_token_id":128009,"head_dim":128,"hidden_act":"silu","hidden_size":4096,"initializer_range":0.02,"intermediate_size":14336,"max_position_embeddings":131072,"mlp_bias":False,"model_type":"llama","num_attention_heads":32,"num_hidden_layers":32,"num_key_value_heads":8,"pretraining_tp":1,"rms_norm_eps":1e-05,"rope_scaling":{"factor":8.0,"low_freq_factor":1.0,"high_freq_factor":4.0,"original_max_position_embeddings":8192,"rope_type":"llama3"},"rope_theta":500000.0,"tie_word_embeddings":False,"torch_dtype":"bfloat16","use_cache":True,"vocab_size":128256},
 "mixtral-8x7b": {"architectures":["MixtralForCausalLM"],"attention_dropout":0.0,"bos_token_id":1,"eos_token_id":2,"hidden_act":"silu","hidden_size":4096,"initializer_range":0.02,"intermediate_size":14336,"max_position_embeddings":32768,"model_type":"mixtral","num_attention_heads":32,"num_experts_per_tok":2,"num_hidden_layers":32,"num_key_value_heads":8,"num_local_experts":8,"output_router_logits":False,"rms_norm_eps":1e-05,"rope_theta":1000000.0,"router_aux_loss_coef":0.02,"sliding_window":None,"tie_word_embeddings":False,"torch_dtype":"bfloat16","use_cache":True,"vocab_size":32000},
 "deepseek-v2-lite": {"architectures":["DeepseekV2ForCausalLM"],"attention_bias":False,"attention_dropout":0.0,"aux_loss_alpha":0.001,"bos_token_id":100000,"eos_token_id":100001,"first_k_dense_replace":1,"hidden_act":"silu","hidden_size":2048,"initializer_range":0.02,"intermediate_size":10944,"kv_lora_rank":512,"max_position_embeddings":163840,"model_type":"deepseek_v2","moe_intermediate_size":1408,"moe_layer_freq":1,"n_group":1,"n_routed_experts":64,"n_shared_experts":2,"norm_topk_prob":False,"num_attention_heads":16,"num_experts_per_tok":6,"num_hidden_layers":27,"num_key_value_heads":16,"pretraining_tp":1,"q_lora_rank":None,"qk_nope_head_dim":128,"qk_rope_head_dim":64,"rms_norm_eps":1e-06,"rope_scaling":{"beta_fast":32,"beta_slow":1,"factor":40,"mscale":0.707,"mscale_all_dim":0.707,"original_max_position_embeddings":4096,"type":"yarn"},"rope_theta":10000,"routed_scaling_factor":1.0,"scoring_func":"softmax","seq_aux":True,"tie_word_embeddings":False,"topk_group":1,"topk_method":"greedy","torch_dtype":"bfloat16","use_cache":True,"v_head_dim":128,"vocab_size":102400},
 "qwen2.5-7b": {"architectures":["Qwen2ForCausalLM"],"attention_dropout":0.0,"bos_token_id":151643,"eos_token_id":151645,"hidden_act":"silu","hidden_size":3584,"initializer_range":0.02,"intermediate_size":18944,"max_position_embeddings":32768,"max_window_layers":28,"model_type":"qwen2","num_attention_heads":28,"num_hidden_layers":28,"num_key_value_heads":4,"rms_norm_eps":1e-06,"rope_theta":1000000.0,"sliding_window":131072,"tie_word_embeddings":False,"torch_dtype":"bfloat16","use_cache":True,"use_sliding_window":False,"vocab_size":152064},
 "qwen3-8b": {"architectures":["Qwen3ForCausalLM"],"attention_bias":False,"attention_dropout":0.0,"bos_token_id":151643,"eos_token_id":151645,"head_dim":128,"hidden_act":"silu","hidden_size":4096,"initializer_range":0.02,"intermediate_size":12288,"max_position_embeddings":40960,"max_window_layers":36,"model_type":"qwen3","num_attention_heads":32,"num_hidden_layers":36,"num_key_value_heads":8,"rms_norm_eps":1e-06,"rope_scaling":None,"rope_theta":1000000,"sliding_window":None,"tie_word_embeddings":False,"torch_dtype":"bfloat16","use_cache":True,"use_sliding_window":False,"vocab_size":151936},
 "qwen1.5-moe-a2.7b": {"architectures":["Qwen2MoeForCausalLM"],"attention_dropout":0.0,"bos_token_id":151643,"eos_token_id":151643,"decoder_sparse_step":1,"hidden_act":"silu","hidden_size":2048,"initializer_range":0.02,"intermediate_size":5632,"max_position_embeddings":8192,"max_window_layers":21,"model_type":"qwen2_moe","moe_intermediate_size":1408,"norm_topk_prob":False,"num_attention_heads":16,"num_experts":60,"num_experts_per_tok":4,"num_hidden_layers":24,"num_key_value_heads":16,"output_router_logits":False,"rms_norm_eps":1e-06,"rope_theta":1000000.0,"router_aux_loss_coef":0.001,"shared_expert_intermediate_size":5632,"sliding_window":32768,"tie_word_embeddings":False,"torch_dtype":"bfloat16","use_cache":True,"use_sliding_window":False,"vocab_size":151936},
 "gpt-oss-20b": {"architectures":["GptOssForCausalLM"],"attention_bias":True,"attention_dropout":0.0,"eos_token_id":200002,"experts_per_token":4,"head_dim":64,"hidden_act":"silu","hidden_size":2880,"initial_context_length":4096,"initializer_range":0.02,"intermediate_size":2880,"layer_types":["sliding_attention","full_attention"]*12,"max_position_embeddings":131072,"model_type":"gpt_oss","num_attention_heads":64,"num_experts_per_tok":4,"num_hidden_layers":24,"num_key_value_heads":8,"num_local_experts":32,"output_router_logits":False,"pad_token_id":199999,"quantization_config":{"modules_to_not_convert":["model.layers.*.self_attn","model.layers.*.mlp.router","model.embed_tokens","lm_head"],"quant_method":"mxfp4"},"rms_norm_eps":1e-05,"rope_scaling":{"beta_fast":32.0,"beta_slow":1.0,"factor":32.0,"original_max_position_embeddings":4096,"rope_type":"yarn","truncate":False},"rope_theta":150000,"router_aux_loss_coef":0.9,"sliding_window":128,"swiglu_limit":7.0,"tie_word_embeddings":False,"torch_dtype":"bfloat16","use_cache":True,"vocab_size":201088},
}
FP8_BLOCK = {"activation_scheme":"dynamic","fmt":"e4m3","quant_method":"fp8","weight_block_size":[128,128]}
FP8_TENSOR = {"activation_scheme":"dynamic","quant_method":"fp8"}
CT_FP8 = {"quant_method":"compressed-tensors","format":"float-quantized","quantization_status":"compressed","ignore":["lm_head"],
          "config_groups":{"group_0":{"targets":["Linear"],"weights":{"num_bits":8,"type":"float","strategy":"channel","symmetric":True,"dynamic":False},
          "input_activations":{"num_bits":8,"type":"float","strategy":"token","symmetric":True,"dynamic":True}}}}
def cfg(name, base, layers=None, quant=None, **over):
    c = copy.deepcopy(BASE[base])
    if layers:
        c["num_hidden_layers"] = layers
        if "max_window_layers" in c: c["max_window_layers"] = layers
        if "layer_types" in c: c["layer_types"] = c["layer_types"][:layers]
    if quant: c["quantization_config"] = quant
    c.update(over)
    d = os.path.join(HERE, "configs", name); os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(c, f, indent=1)
cfg("qwen3-moe-4l", "qwen3-30b-a3b", 4)
cfg("qwen3-moe-4l-fp8block", "qwen3-30b-a3b", 4, FP8_BLOCK)
cfg("qwen3-30b-a3b", "qwen3-30b-a3b")
cfg("llama-8b-4l", "llama-3.1-8b", 4)
cfg("llama-8b-4l-fp8tensor", "llama-3.1-8b", 4, FP8_TENSOR)
cfg("llama-8b-4l-ctfp8", "llama-3.1-8b", 4, CT_FP8)
cfg("llama-3.1-8b", "llama-3.1-8b")
cfg("mixtral-2l", "mixtral-8x7b", 2)
cfg("mixtral-8x7b", "mixtral-8x7b")
cfg("dsv2-lite-4l", "deepseek-v2-lite", 4)
cfg("deepseek-v2-lite", "deepseek-v2-lite")
cfg("qwen2.5-7b-4l", "qwen2.5-7b", 4)
cfg("qwen3-8b-4l", "qwen3-8b", 4)
cfg("qwen3-8b-4l-fp8block", "qwen3-8b", 4, FP8_BLOCK)
cfg("qwen1.5-moe-4l", "qwen1.5-moe-a2.7b", 4)
cfg("gpt-oss-20b", "gpt-oss-20b")
cfg("gpt-oss-4l", "gpt-oss-20b", 4)

D = {"max_model_len": 4096, "max_num_batched_tokens": 8192, "max_num_seqs": 256, "gpu_memory_utilization": 0.9}
S = []
def llm(name, config, timeout=300, **kw):
    S.append({"name": name, "config": config, "entry": "llm", "kwargs": {**D, **kw}, "timeout": timeout, "need": 50})
def serve(name, config, args, timeout=300):
    S.append({"name": name, "config": config, "entry": "serve", "args": args, "timeout": timeout, "need": 50})
E = {"enforce_eager": True}
llm("qwen3-moe-4l", "qwen3-moe-4l")
llm("llama-8b-4l", "llama-8b-4l")
llm("dsv2-lite-4l", "dsv2-lite-4l")
llm("mixtral-2l", "mixtral-2l")
llm("qwen2.5-7b-4l", "qwen2.5-7b-4l")
llm("qwen3-8b-4l", "qwen3-8b-4l")
llm("qwen1.5-moe-4l", "qwen1.5-moe-4l")
llm("qwen3-moe-4l-eager", "qwen3-moe-4l", **E)
llm("qwen3-moe-4l-kvfp8", "qwen3-moe-4l", kv_cache_dtype="fp8")
llm("qwen3-moe-4l-fp8block", "qwen3-moe-4l-fp8block", timeout=420)
llm("qwen3-moe-4l-online-fp8", "qwen3-moe-4l", quantization="fp8", timeout=420)
llm("llama-8b-4l-fp32", "llama-8b-4l", dtype="float32")
llm("llama-8b-4l-fp8tensor", "llama-8b-4l-fp8tensor")
llm("gpt-oss-20b", "gpt-oss-20b", timeout=420)
llm("llama-8b-4l-eager", "llama-8b-4l", **E)
llm("llama-8b-4l-kvfp8", "llama-8b-4l", kv_cache_dtype="fp8")
llm("qwen3-moe-4l-bs32", "qwen3-moe-4l", block_size=32)
llm("qwen3-moe-4l-len32k-seqs64-mbt4096", "qwen3-moe-4l", max_model_len=32768, max_num_seqs=64, max_num_batched_tokens=4096)
llm("llama-8b-4l-mbt32k", "llama-8b-4l", max_num_batched_tokens=32768)
llm("qwen3-moe-4l-util05", "qwen3-moe-4l", gpu_memory_utilization=0.5)
llm("qwen3-moe-4l-piecewise", "qwen3-moe-4l", compilation_config={"cudagraph_mode": "PIECEWISE"})
llm("qwen3-moe-4l-full-decode-only", "qwen3-moe-4l", compilation_config={"cudagraph_mode": "FULL_DECODE_ONLY"})
llm("qwen3-moe-4l-capture64", "qwen3-moe-4l", compilation_config={"max_cudagraph_capture_size": 64})
serve("qwen3-moe-4l-serve-O0", "qwen3-moe-4l", ["-O0", "--max-model-len", "4096"])
serve("qwen3-moe-4l-serve-defaults", "qwen3-moe-4l", ["--max-model-len", "4096"])
llm("qwen3-moe-4l-llm-defaults", "qwen3-moe-4l", max_num_batched_tokens=None, max_num_seqs=None)
llm("dsv2-lite-4l-kvfp8", "dsv2-lite-4l", kv_cache_dtype="fp8")
llm("dsv2-lite-4l-eager", "dsv2-lite-4l", **E)
llm("mixtral-2l-online-fp8", "mixtral-2l", quantization="fp8")
llm("qwen3-8b-4l-fp8block", "qwen3-8b-4l-fp8block")
llm("llama-8b-4l-ctfp8", "llama-8b-4l-ctfp8")
llm("qwen2.5-7b-4l-fp16", "qwen2.5-7b-4l", dtype="float16")
llm("qwen3-30b-a3b", "qwen3-30b-a3b")
llm("llama-3.1-8b", "llama-3.1-8b")
llm("deepseek-v2-lite", "deepseek-v2-lite")
llm("gpt-oss-4l", "gpt-oss-4l")
llm("qwen3-moe-4l-len16k-util095", "qwen3-moe-4l", max_model_len=16384, gpu_memory_utilization=0.95)
llm("llama-8b-4l-bs64-seqs512", "llama-8b-4l", block_size=64, max_num_seqs=512)
llm("mixtral-8x7b", "mixtral-8x7b", timeout=420)
llm("qwen1.5-moe-4l-kvfp8-eager", "qwen1.5-moe-4l", kv_cache_dtype="fp8", **E)
llm("qwen3-moe-4l-fp8block-kvfp8", "qwen3-moe-4l-fp8block", kv_cache_dtype="fp8")
for s in S:
    if s["entry"] == "llm":
        s["kwargs"] = {k: v for k, v in s["kwargs"].items() if v is not None}
with open(os.path.join(HERE, "startups.json"), "w") as f:
    json.dump(S, f, indent=1)
print(len(S), "startups")
