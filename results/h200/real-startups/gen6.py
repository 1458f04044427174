"""Sixth batch of real startups: the checkpoint formats the earlier batches did not reach (AWQ, GPTQ with and
without act order, compressed-tensors W4A16 pack-quantized and W8A8 INT8, ModelOpt FP8 and NVFP4), on the dense
Llama-3.1-8B cut to four layers and on Qwen3-30B-A3B cut to four layers (its MoE layers through the Marlin MoE
kernels). The quantization_config blocks are the formats' published ones (the layouts vLLM 0.26.0's
quantization methods read); dummy weights fill them. Writes the config directories and startups7.json."""
import json
import os

import gen

HERE = os.path.dirname(os.path.abspath(__file__))
AWQ = {"bits": 4, "group_size": 128, "quant_method": "awq", "version": "gemm", "zero_point": True}
GPTQ = {"bits": 4, "group_size": 128, "desc_act": False, "sym": True, "quant_method": "gptq", "damp_percent": 0.01,
        "static_groups": False, "true_sequential": True}
GPTQ_ACT = {**GPTQ, "desc_act": True}


def ct(weights, acts=None, fmt="pack-quantized", ignore=("lm_head",)):
    group = {"targets": ["Linear"], "weights": weights, "input_activations": acts, "output_activations": None}
    return {"quant_method": "compressed-tensors", "format": fmt, "quantization_status": "compressed",
            "ignore": list(ignore), "config_groups": {"group_0": group}}


def w4a16(group_size):
    return {"num_bits": 4, "type": "int", "symmetric": True, "strategy": "group", "group_size": group_size,
            "dynamic": False, "actorder": None, "observer": "minmax"}


W4A16 = ct(w4a16(128))
W4A16_MOE = ct(w4a16(32), ignore=("lm_head", "re:.*mlp.gate$"))  # Kimi-K2's group of 32
W8A8_INT8 = ct({"num_bits": 8, "type": "int", "symmetric": True, "strategy": "channel", "dynamic": False},
               {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "token", "dynamic": True},
               fmt="int-quantized")
MODELOPT_FP8 = {"quant_method": "modelopt", "quant_algo": "FP8", "exclude_modules": ["lm_head"]}
MODELOPT_NVFP4 = {"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16,
                  "exclude_modules": ["lm_head"]}
MOE_IGNORE = ["lm_head", "model.layers.*.mlp.gate"]

gen.cfg("llama-8b-4l-awq", "llama-3.1-8b", 4, AWQ)
gen.cfg("llama-8b-4l-gptq", "llama-3.1-8b", 4, GPTQ)
gen.cfg("llama-8b-4l-gptq-actorder", "llama-3.1-8b", 4, GPTQ_ACT)
gen.cfg("llama-8b-4l-w4a16", "llama-3.1-8b", 4, W4A16)
gen.cfg("llama-8b-4l-w8a8-int8", "llama-3.1-8b", 4, W8A8_INT8)
gen.cfg("llama-8b-4l-modelopt-fp8", "llama-3.1-8b", 4, MODELOPT_FP8)
gen.cfg("llama-8b-4l-nvfp4", "llama-3.1-8b", 4, MODELOPT_NVFP4)
gen.cfg("qwen3-moe-4l-w4a16", "qwen3-30b-a3b", 4, W4A16_MOE)
gen.cfg("qwen3-moe-4l-awq", "qwen3-30b-a3b", 4, {**AWQ, "modules_to_not_convert": ["gate"]})
gen.cfg("qwen3-moe-4l-gptq", "qwen3-30b-a3b", 4, GPTQ)
gen.cfg("qwen3-moe-4l-nvfp4", "qwen3-30b-a3b", 4, {**MODELOPT_NVFP4, "exclude_modules": MOE_IGNORE})

D = dict(max_model_len=4096, max_num_batched_tokens=8192, max_num_seqs=256, gpu_memory_utilization=0.9)
S = []


def llm(name, timeout=300):
    S.append({"name": name, "config": name, "entry": "llm", "kwargs": dict(D), "timeout": timeout, "need": 45})


for name in ("llama-8b-4l-awq", "llama-8b-4l-gptq", "llama-8b-4l-w8a8-int8", "llama-8b-4l-w4a16",
             "qwen3-moe-4l-w4a16", "qwen3-moe-4l-awq", "llama-8b-4l-gptq-actorder", "llama-8b-4l-modelopt-fp8",
             "llama-8b-4l-nvfp4", "qwen3-moe-4l-gptq", "qwen3-moe-4l-nvfp4"):
    llm(name)
with open(os.path.join(HERE, "startups7.json"), "w") as f:
    json.dump(S, f, indent=1)
print(len(S), "startups")
