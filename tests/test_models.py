"""Architectures and checkpoint formats, each on its real model's config.json facts (the presets in
harness/defaults/models/ carry their URL; the formats' configs below name theirs): the weights one GPU holds equal a
hand computation from the layout vLLM allocates, and the KV cache follows vLLM's groups (v1/core/kv_cache_utils.py).
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

import pytest

from cli_utils import run_cli_inproc, without_download_lines
from harness.sizing.deployment_weights import Sharding, weight_lines
from harness.sizing.kv_cache import kv_cache, kv_shape
from harness.sizing.model_config import ModelConfigError, load_model
from harness.sizing.serve_args import parse_serve

GIB = 2**30
MODELS = Path(__file__).resolve().parents[1] / "harness" / "defaults" / "models"


def _weights(facts, tp: int = 1, ep: int = 1) -> dict[str, int]:
    local = facts.num_routed_experts // ep if ep > 1 else facts.num_routed_experts
    sharding = Sharding(tp=tp, moe_tp=1 if ep > 1 else tp, local_experts=local)
    return {line.name: line.bytes for line in weight_lines(facts, sharding)}


def _tensors_total(weights: dict[str, int]) -> int:
    return sum(b for name, b in weights.items() if name != "allocator rounding")


def _preset(name: str) -> dict:
    return {k: v for k, v in json.loads((MODELS / f"{name}.json").read_text()).items() if not k.startswith("_")}


# --- architectures --------------------------------------------------------------------------------------------------


def test_gpt_oss_20b_mxfp4_experts_sinks_and_biases():
    """openai/gpt-oss-20b: hidden 2880, 24 layers, 64 q / 8 KV heads of 64, 32 experts of 2880, vocab 201088,
    untied; MXFP4 experts only (modules_to_not_convert: attention, router, embeddings, lm_head)."""
    f = load_model("gpt-oss-20b")
    K, I, E, L, V = 2880, 2880, 32, 24, 201088
    attention = (64 + 16) * 64 * K * 2 + (64 + 16) * 64 * 2 + K * 64 * 64 * 2 + K * 2 + 64 * 2  # qkv, o, biases, sinks
    # mxfp4.py: w13 (E, 2I, K/2) u8 + scales (E, 2I, K/32) u8, w2 (E, K, I/2) + (E, K, I/32); biases f32 (Triton);
    # the Triton backend's swizzled values, rows of 1440 B padded to 1472 (64 B), and its swizzled scales beside the
    # loaded ones (it deletes only the loaded weights), their rows padded to 256 (5760 -> 5888, 2880 -> 3072)
    experts = E * (2 * I * 1472 + 2 * I * 90 + 5888 * 90 + K * 1472 + K * 90 + 3072 * 90) + E * (2 * I + K) * 4
    router = E * K * 2 + E * 2
    w = _weights(f)
    assert w["attention (sliding)"] == w["attention (full)"] == 12 * attention
    assert w["routed experts"] == L * experts
    assert w["router"] == L * router
    assert w["embeddings + lm_head"] == 2 * V * K * 2 + K * 2
    assert w["rotary cache"] == 131072 * 64 * 4  # gpt_oss.py builds its yarn rope in f32
    assert _tensors_total(w) == L * (attention + experts + router + 2 * K * 2) + 2 * V * K * 2 + K * 2 + 131072 * 64 * 4


def test_gpt_oss_sliding_layers_take_their_own_kv_groups():
    """12 sliding-window (128) and 12 full layers: two groups of 12 layers, every block a page of each."""
    f = load_model("gpt-oss-20b")
    shape = kv_shape(f, tp=1)
    assert shape.bytes_per_token == 24 * 2 * 8 * 64 * 2
    available = 50 * GIB
    page = 16 * 2 * 8 * 64 * 2
    cache = kv_cache(shape, available, 16, 131072, 8192)
    assert cache.num_blocks == available // page // 12
    assert cache.tokens == cache.num_blocks // 2 * 16
    # a request: ceil(131072 / 16) full blocks + ceil(min(127 + 8192, 131072) / 16) + 1 sliding ones
    assert cache.blocks_per_request == 8192 + math.ceil((127 + 8192) / 16) + 1
    held_as_full = available // (page * 24) / 8192  # every layer full attention (the hybrid manager off)
    assert cache.concurrency == cache.num_blocks / (8192 + 521) and cache.concurrency > 1.8 * held_as_full


def test_gpt_oss_120b_under_ep():
    """openai/gpt-oss-120b: 36 layers, 128 experts; EP 8 holds 16 of them per GPU."""
    f = load_model("gpt-oss-120b")
    K, I = 2880, 2880
    w = _weights(f, tp=1, ep=8)
    per_expert = (2 * I + K) * 1472 + (2 * I + K) * 90 + (5888 + 3072) * 90 + (2 * I + K) * 4
    assert w["routed experts"] == 36 * 16 * per_expert


def test_gpt_oss_120b_against_its_published_h100_log():
    """vLLM issue #33155 (https://github.com/vllm-project/vllm/issues/33155): vLLM 0.14.1 on one H100, "Using
    Triton backend" for MXFP4, "Model loading took 64.38 GiB memory". That release's pip triton_kernels padded the
    swizzled values to 16 rows x 32 bytes (1440-byte rows unpadded): the weights, allocator rounding included, within
    0.01 GiB; with the 64 x 64 padding vLLM vendors since, 1.19 GiB more."""
    facts = load_model("openai/gpt-oss-120b")
    older = dataclasses.replace(facts, quant=dataclasses.replace(facts.quant, swizzle_align=(16, 32)))
    assert abs(sum(_weights(older).values()) - 64.38 * GIB) < 0.01 * GIB
    assert _weights(facts)["routed experts"] - _weights(older)["routed experts"] == 36 * 128 * (5760 + 2880) * 32


def test_llama4_scout_interleaved_moe_chunked_attention_and_vision_tower():
    """meta-llama/Llama-4-Scout-17B-16E-Instruct: 48 layers all MoE (interleave_moe_layer_step 1), 16 experts of
    8192 + one shared expert, hidden 5120, 40 q / 8 KV heads of 128, chunked local attention (8192) but every 4th
    layer (NoPE, global); vision encoder 34 layers of 1408 (MLP 5632), patch 14 at 336."""
    f = load_model("llama-4-scout")
    K, I, L = 5120, 8192, 48
    assert f.moe_layers == tuple(range(L)) and f.kinds.count("chunked") == 36 and f.kinds.count("full") == 12
    w = _weights(f)
    assert w["routed experts"] == L * 16 * 3 * I * K * 2
    assert w["shared experts"] == L * 3 * I * K * 2
    H, F = 1408, 5632
    layer = 3 * H * H * 2 + 3 * H * 2 + H * H * 2 + H * 2 + F * H * 2 + F * 2 + H * F * 2 + H * 2 + 4 * H * 2
    once = H * 3 * 14 * 14 * 2 + H * 2 + ((336 // 14) ** 2 + 1) * H * 2 + 4 * H * 2  # patch, class, positions, norms
    once += 4096 * (H * 4) * 2 + 4096 * 4096 * 2 + K * 4096 * 2  # pixel-shuffle MLP fc1, fc2; multi_modal_projector
    assert w["vision tower"] == 34 * layer + once
    # 12 full and 36 chunked layers: groups of 12, 4 groups; a request holds ceil(min(8192 + T, L) / 16) chunked
    # blocks in each of the 3 chunked groups
    shape = kv_shape(f, tp=4)
    assert shape.bytes_per_token == 48 * 2 * 2 * 128 * 2
    cache = kv_cache(shape, 16 * GIB, 16, 32768, 8192)
    assert cache.num_blocks == 16 * GIB // (16 * 2 * 2 * 128 * 2) // 12 and cache.tokens == cache.num_blocks // 4 * 16
    assert cache.blocks_per_request == 32768 // 16 + 3 * (8192 + 8192) // 16


def test_llava_next_granite_vision_reads_its_language_model_and_siglip_tower():
    """ibm-granite/granite-vision-3.3-2b: a Granite 2B language model from text_config; SigLIP built to the deepest of
    four feature layers (-1: all 27), no post-norm; the projector's shapes are the ones vLLM 0.19.0's log prints,
    (2048, 4608) and (2048, 2048) with biases, and image_newline (2048)."""
    f = load_model("granite-vision-3.3-2b")
    assert f.architecture == "GraniteForCausalLM" and f.num_hidden_layers == 40 and f.head_dim == 64
    assert f.vision is not None and (f.vision.kind, f.vision.num_layers, f.vision.projector_in) == ("llava", 27, 4608)
    H, F, K, patches = 1152, 4304, 2048, (384 // 14) ** 2
    layer = 3 * H * H * 2 + 3 * H * 2 + H * H * 2 + H * 2 + F * H * 2 + F * 2 + H * F * 2 + H * 2 + 4 * H * 2
    once = H * 3 * 14 * 14 * 2 + H * 2 + patches * H * 2 + patches * 8  # patch conv + bias, positions (+ int64 ids)
    once += K * 4608 * 2 + K * 2 + K * K * 2 + K * 2 + K * 2  # linear_1, linear_2 with biases, image_newline
    assert _weights(f)["vision tower"] == 27 * layer + once
    # at TP 2 the SigLIP and projector linears split, the biases of the row-parallel ones stay whole
    assert _weights(f, tp=2)["vision tower"] < _weights(f)["vision tower"]


def test_multimodal_wrappers_refuse_what_they_do_not_size(tmp_path):
    base = _preset("granite-vision-3.3-2b")
    for change, message in (
        ({"text_config": {**base["text_config"], "model_type": "phi3"}}, 'text_config.model_type = "phi3"'),
        ({"vision_feature_layer": [0]}, "vision_feature_layer = [0]"),
        ({"vision_config": {**base["vision_config"], "model_type": "clip_vision_model"}}, "siglip_vision_model"),
    ):
        (tmp_path / "config.json").write_text(json.dumps({**base, **change}))
        with pytest.raises(ModelConfigError) as error:
            load_model(str(tmp_path))
        assert message in str(error.value) and "\n" not in str(error.value)


def test_pixtral_and_mistral3_towers_match_their_logged_weights():
    """Mistral-Small-3.1-24B: Mistral's layout (PixtralForConditionalGeneration, nn.Linear tower whole on every GPU)
    and the W8A8 checkpoint's Hugging Face layout (Mistral3ForConditionalGeneration: TP linears, + transformers'
    PixtralRotaryEmbedding inv_freq (110^2, 64) f32) hold the same tower at TP 1 but that buffer."""
    bf16, w8a8 = load_model("mistral-small-3.1-24b"), load_model("mistral-small-3.1-24b-w8a8")
    assert bf16.architecture == w8a8.architecture == "MistralForCausalLM"
    assert (bf16.vision.kind, w8a8.vision.kind) == ("pixtral", "pixtral_hf")
    assert _weights(w8a8)["vision tower"] - _weights(bf16)["vision tower"] == 110 * 110 * 64 * 4
    assert _weights(bf16, tp=2)["vision tower"] == _weights(bf16)["vision tower"]
    assert _weights(w8a8, tp=2)["vision tower"] < _weights(w8a8)["vision tower"]


def test_llama4_maverick_alternates_dense_and_moe_layers():
    """meta-llama/Llama-4-Maverick-17B-128E-Instruct: interleave_moe_layer_step 2: odd layers MoE (128 experts of
    8192), even layers a dense MLP of intermediate_size_mlp 16384."""
    f = load_model("llama-4-maverick")
    K = 5120
    assert f.moe_layers == tuple(range(1, 48, 2))
    w = _weights(f, tp=8)
    assert w["dense MLP"] == 24 * 3 * (16384 // 8) * K * 2
    assert w["routed experts"] == 24 * 128 * 3 * (8192 // 8) * K * 2


def test_glm_45_and_46():
    """zai-org/GLM-4.5 and GLM-4.6: 92 layers (first 3 dense of 12288), 160 experts of 1536 + 1 shared, 96 q / 8 KV
    heads of 128 with q/k/v biases and q/k norms, partial rotary 0.5, f32 router with its f32 correction bias."""
    for name, positions in (("glm-4.5", 131072), ("glm-4.6", 202752)):
        f = load_model(name)
        K = 5120
        w = _weights(f)
        attention = (96 + 16) * 128 * K * 2 + (96 + 16) * 128 * 2 + K * 96 * 128 * 2 + 2 * 128 * 2
        assert w["attention"] == 92 * attention
        assert w["dense MLP"] == 3 * 3 * 12288 * K * 2
        assert w["routed experts"] == 89 * 160 * 3 * 1536 * K * 2
        assert w["shared experts"] == 89 * 3 * 1536 * K * 2
        assert w["router"] == 89 * (160 * K * 4 + 160 * 4)
        assert w["rotary cache"] == positions * 64 * 2
        assert kv_shape(f, tp=8).bytes_per_token == 92 * 2 * 1 * 128 * 2


def test_deepseek_v32_indexer_weights_and_cache():
    """deepseek-ai/DeepSeek-V3.2: DeepSeek-V3's MLA + an indexer of 64 heads of 128 per layer (wq_b from the
    1536 q_lora_rank, wk from the hidden 7168, both fp8 with 128x128 block scales, k_norm, weights_proj bf16),
    and its key cache: 128 fp8 + an f32 scale, 132 B a token a layer, in FlashMLA sparse's 64-token blocks."""
    v32, v3 = load_model("deepseek-v3.2"), load_model("deepseek-v3")
    indexer = (8192 * 1536 + 64 * 12 * 4) + (128 * 7168 + 1 * 56 * 4) + 2 * 128 * 2 + 64 * 7168 * 2
    assert _weights(v32, tp=8)["attention"] - _weights(v3, tp=8)["attention"] == 61 * indexer
    shape = kv_shape(v32, tp=8)
    assert shape.bytes_per_token == 61 * ((512 + 64) * 2 + 132)
    assert kv_shape(v32, tp=8, kv_cache_dtype="fp8").bytes_per_token == 61 * (656 + 132)
    cache = kv_cache(shape, 40 * GIB, 16, 163840)
    assert cache.block_size == 64 and cache.num_blocks == 40 * GIB // (64 * shape.bytes_per_token)


def test_minimax_m2():
    """MiniMaxAI/MiniMax-M2: 62 layers, 256 experts of 1536 (no shared), hidden 3072, 48 q / 8 KV heads of 128,
    q/k RMSNorms over all heads, rotary_dim 64, f32 gate + f32 routing bias, fp8 128x128 blocks."""
    f = load_model("minimax-m2")
    K = 3072
    qkv = (48 + 16) * 128 * K + math.ceil(8192 / 128) * math.ceil(K / 128) * 4
    o_proj = K * 48 * 128 + math.ceil(K / 128) * math.ceil(6144 / 128) * 4
    w = _weights(f)
    assert w["attention"] == 62 * (qkv + o_proj + (48 * 128 + 8 * 128) * 2)
    assert w["router"] == 62 * (256 * K * 4 + 256 * 4)
    assert w["rotary cache"] == 196608 * 64 * 2
    assert w["routed experts"] == 62 * 256 * (3 * 1536 * K + (24 * 24 + 24 * 12) * 4)
    assert kv_shape(f, tp=1).bytes_per_token == 62 * 2 * 8 * 128 * 2


def test_qwen3_next_linear_attention_state_in_place_of_kv():
    """Qwen/Qwen3-Next-80B-A3B-Instruct: 48 layers, every 4th full attention (16 q / 2 KV heads of 256, gated
    output), the rest a gated delta net (16 key heads and 32 value heads of 128, conv kernel 4); 512 experts of 512
    + a shared expert of 512 on every layer."""
    f = load_model("qwen3-next-80b-a3b")
    K = 2048
    assert f.kinds.count("full") == 12 and f.kinds.count("linear") == 36
    w = _weights(f)
    linear = 12288 * K * 2 + 64 * K * 2 + 8192 * 4 * 2 + 32 * 2 + 32 * 2 + 128 * 2 + K * 4096 * 2
    full = (16 * 2 + 2 * 2) * 256 * K * 2 + K * 16 * 256 * 2 + 2 * 256 * 2
    assert w["attention (linear)"] == 36 * linear and w["attention (full)"] == 12 * full
    assert w["shared experts"] == 48 * (3 * 512 * K * 2 + K * 2)
    shape = kv_shape(f, tp=1)
    state = (3 * 8192 + 32 * 128 * 128) * 2  # conv (3, 8192) + temporal (32, 128, 128) bf16
    assert shape.state_bytes == state and shape.bytes_per_token == 12 * 2 * 2 * 256 * 2
    available = 60 * GIB
    cache = kv_cache(shape, available, 16, 262144, 8192)
    block = 16 * math.ceil(state / (16 * 2 * 2 * 256 * 2))  # the attention page grown to hold the state
    assert block == 544 and cache.block_size == block
    page = block * 2 * 2 * 256 * 2
    assert cache.num_blocks == available // page // 12  # groups of 12: 1 full + 3 linear
    assert cache.tokens == cache.num_blocks // 4 * 544
    assert cache.blocks_per_request == math.ceil(262144 / 544) + 3


def test_gemma_2_and_3():
    """google/gemma-2-9b-it (float32 checkpoint: vLLM runs it in bfloat16 unless --dtype float32; sliding 4096 on
    even layers, 4 norms a layer, tied) and google/gemma-3-27b-it (62 layers, 5 sliding (1024) to 1 full, q/k
    norms, a SigLIP tower; vocab 262208 and 131072 positions from transformers' Gemma3TextConfig)."""
    g2 = load_model("gemma-2-9b-it")
    assert (g2.checkpoint_dtype, g2.dtype) == ("float32", "bfloat16")
    K = 3584
    w = _weights(g2)
    assert w["layer norms"] == 42 * 4 * K * 2 and w["embeddings + lm_head"] == 256000 * K * 2 + K * 2
    f32 = load_model("gemma-2-9b-it", dtype="float32")
    assert _tensors_total(_weights(f32)) == 2 * _tensors_total(w)
    assert kv_shape(f32, tp=1).bytes_per_token == 2 * kv_shape(g2, tp=1).bytes_per_token == 2 * 42 * 2 * 8 * 256 * 2
    g3 = load_model("gemma-3-27b-it")
    assert g3.vocab_size == 262208 and g3.max_position_embeddings == 131072
    assert g3.kinds.count("full") == 10 and g3.kinds.count("sliding") == 52
    cache = kv_cache(kv_shape(g3, tp=1), 30 * GIB, 16, 32768, 8192)
    assert cache.group_size == 10 and cache.groups == 1 + 6  # 52 sliding layers padded into 6 groups of 10
    assert cache.num_blocks == 30 * GIB // (16 * 2 * 16 * 128 * 2) // 10


def test_phi2_gemma1_granite_phi3():
    """microsoft/phi-2 (PhiForCausalLM: q/k/v and dense biases, one LayerNorm a layer, fc1/fc2 with biases, a biased
    lm_head, partial rotary 0.4), google/gemma-7b (tied, 2 norms), ibm-granite/granite-3.1-8b-instruct and
    microsoft/phi-4 (Llama's layout)."""
    phi2 = _weights(load_model("phi-2"))
    K, I, V = 2560, 10240, 51200
    assert phi2["attention"] == 32 * (3 * K * K * 2 + 3 * K * 2 + K * K * 2 + K * 2)
    assert phi2["dense MLP"] == 32 * (I * K * 2 + I * 2 + K * I * 2 + K * 2)
    assert phi2["layer norms"] == 32 * 2 * K * 2
    assert phi2["embeddings + lm_head"] == 2 * V * K * 2 + 2 * K * 2 + V * 2
    assert phi2["rotary cache"] == 2048 * 32 * 2
    gemma = _weights(load_model("gemma-7b"))
    assert gemma["embeddings + lm_head"] == 256000 * 3072 * 2 + 3072 * 2 and gemma["layer norms"] == 28 * 2 * 3072 * 2
    granite = _weights(load_model("granite-3.1-8b"))
    assert granite["dense MLP"] == 40 * 3 * 12800 * 4096 * 2
    assert granite["embeddings + lm_head"] == 49216 * 4096 * 2 + 4096 * 2  # 49155 padded to 64, tied
    assert kv_shape(load_model("phi-4"), tp=1).bytes_per_token == 40 * 2 * 10 * 128 * 2


def test_dense_families():
    """mistralai/Mistral-7B-Instruct-v0.3 (no sliding window), Llama-3.1-8B, Qwen2.5-7B (q/k/v biases), Qwen3-8B
    (q/k norms): KV bytes per token and the attention line."""
    m = load_model("mistral-7b-v0.3")
    assert kv_shape(m, tp=1).bytes_per_token == 32 * 2 * 8 * 128 * 2 and not m.layer_kinds
    assert _weights(m)["attention"] == 32 * ((32 + 16) * 128 * 4096 * 2 + 4096 * 4096 * 2)
    q2 = load_model("qwen2.5-7b")
    assert _weights(q2)["attention"] == 28 * ((28 + 8) * 128 * 3584 * 2 + (28 + 8) * 128 * 2 + 3584 * 3584 * 2)


# Parameter counts as the model cards give them (Hugging Face's safetensors metadata, rounded as shown there): the
# presets' bf16 tensors at TP 1, less the rotary cache (a buffer, not a parameter), round to the same figure.
MODEL_CARD_PARAMS = {
    "qwen3-32b": (32.8e9, 0.1e9),  # Qwen/Qwen3-32B: "Number of Parameters: 32.8B"
    "llama-3.1-70b": (70.6e9, 0.1e9),  # meta-llama/Llama-3.1-70B: 70.6B params
    "llama-3.3-70b": (70.6e9, 0.1e9),  # meta-llama/Llama-3.3-70B-Instruct: 70.6B params
    "llama-3.1-405b": (406e9, 1e9),  # meta-llama/Llama-3.1-405B: 406B params
    "qwen3-coder-480b-a35b": (480e9, 1e9),  # Qwen/Qwen3-Coder-480B-A35B-Instruct: 480B in total
}


@pytest.mark.parametrize("name", sorted(MODEL_CARD_PARAMS))
def test_bf16_presets_hold_their_model_cards_parameter_count(name):
    count, unit = MODEL_CARD_PARAMS[name]
    facts = load_model(name)
    w = _weights(facts)
    params = (_tensors_total(w) - w["rotary cache"]) / facts.dtype_bytes
    assert abs(params - count) <= unit / 2, f"{name}: {params / 1e9:.2f}B, the model card {count / 1e9:g}B"


def test_qwen3_coder_480b_a35b_experts_and_active_parameters():
    """Qwen/Qwen3-Coder-480B-A35B-Instruct: 62 layers of 160 experts of 2560 (8 routed per token), hidden 6144, 96 q
    / 8 KV heads of 128; 35B parameters active per token (the model card): the non-expert tensors and 8 of 160
    experts."""
    f = load_model("qwen3-coder-480b-a35b")
    w = _weights(f)
    assert w["routed experts"] == 62 * 160 * 3 * 2560 * 6144 * 2
    assert kv_shape(f, tp=1).bytes_per_token == 62 * 2 * 8 * 128 * 2
    assert _weights(f, tp=1, ep=32)["routed experts"] == 62 * 5 * 3 * 2560 * 6144 * 2
    active = (_tensors_total(w) - w["rotary cache"] - w["routed experts"] * (1 - 8 / 160)) / 2
    assert round(active / 1e9) == 35


def test_fp8_block_presets_keep_the_bf16_models_shapes():
    """Qwen/Qwen3-30B-A3B-FP8 and Qwen3-32B-FP8: their bf16 models' shapes, every linear in fp8 with f32 scales per
    128x128 block, the router and norms (modules_to_not_convert) and the embeddings in bf16."""
    fp8, bf16 = load_model("qwen3-30b-a3b-fp8"), load_model("qwen3-30b-a3b")
    assert fp8.weight_block_size == (128, 128) and kv_shape(fp8, tp=1) == kv_shape(bf16, tp=1)
    w, b = _weights(fp8), _weights(bf16)
    per_expert = 3 * 768 * 2048 + (math.ceil(1536 / 128) * 16 + 16 * math.ceil(768 / 128)) * 4
    assert w["routed experts"] == 48 * 128 * per_expert
    assert w["router"] == b["router"] and w["embeddings + lm_head"] == b["embeddings + lm_head"]
    dense = _weights(load_model("qwen3-32b-fp8"))
    gate_up, down = 2 * 25600 * 5120 + 400 * 40 * 4, 5120 * 25600 + 40 * 200 * 4
    assert dense["dense MLP"] == 64 * (gate_up + down)
    assert dense["embeddings + lm_head"] == _weights(load_model("qwen3-32b"))["embeddings + lm_head"]


def test_minimax_m27_is_m2s_shapes_with_a_longer_rotary_cache():
    """MiniMaxAI/MiniMax-M2.7: MiniMax-M2's config facts but max_position_embeddings 204800 (196608 in M2), so a
    longer rotary cache (and the allocator's rounding of it)."""
    m27, m2 = _weights(load_model("minimax-m2.7")), _weights(load_model("minimax-m2"))
    same = ("attention", "layer norms", "routed experts", "router", "embeddings + lm_head")
    assert {k: m27[k] for k in same} == {k: m2[k] for k in same}
    assert m27["rotary cache"] == 204800 * 64 * 2 and m2["rotary cache"] == 196608 * 64 * 2


# --- checkpoint formats ---------------------------------------------------------------------------------------------

LLAMA_8B = _preset("llama-3.1-8b")  # meta-llama/Llama-3.1-8B-Instruct's shapes, which these releases quantize
Q, O, GU, D = ((32 + 16) * 128, 4096), (4096, 4096), (2 * 14336, 4096), (4096, 14336)
WORKSPACE = 132 * 4  # marlin_make_workspace_new: one int32 per SM of an H200


def _llama_with(tmp_path: Path, quant: dict, dtype: str = "bfloat16", **kw: str) -> object:
    (tmp_path / "config.json").write_text(json.dumps({**LLAMA_8B, "torch_dtype": dtype, "quantization_config": quant}))
    return load_model(str(tmp_path), **kw)


def _linears(facts) -> int:
    w = _weights(facts)
    return w["attention"] + w["dense MLP"]


def _per_layer(each) -> int:
    return 32 * sum(each(o, i) for o, i in (Q, O, GU, D))


def test_awq_marlin(tmp_path):
    """hugging-quants/Meta-Llama-3.1-8B-Instruct-AWQ-INT4: bits 4, group 128, zero points, float16: qweight
    (in, out/8) int32, scales (in/128, out) fp16, qzeros (in/128, out/8) int32, repacked for Marlin."""
    f = _llama_with(tmp_path, {"bits": 4, "group_size": 128, "quant_method": "awq", "version": "gemm",
                               "zero_point": True}, dtype="float16")  # fmt: skip
    assert f.dtype == "float16"
    expected = _per_layer(lambda o, i: o * i // 2 + i // 128 * o * 2 + i // 128 * o // 8 * 4 + WORKSPACE)
    assert _linears(f) == expected


def test_gptq_marlin_desc_act(tmp_path):
    """hugging-quants/Meta-Llama-3.1-8B-Instruct-GPTQ-INT4: bits 4, group 128, desc_act, sym: Marlin keeps the
    packed weight, the scales, g_idx and its sort indices; the symmetric zero points are dropped."""
    f = _llama_with(tmp_path, {"bits": 4, "desc_act": True, "group_size": 128, "quant_method": "gptq",
                               "static_groups": False, "sym": True}, dtype="float16")  # fmt: skip
    assert _linears(f) == _per_layer(lambda o, i: o * i // 2 + i // 128 * o * 2 + 2 * i * 4 + WORKSPACE)


def test_gptq_machete_without_act_order(tmp_path):
    """GPTQ 4-bit, group 128, symmetric, no desc_act, on Hopper: Machete prepacks qweight in place and keeps the
    scales, qzeros and g_idx as loaded, without a workspace."""
    f = _llama_with(tmp_path, {"bits": 4, "desc_act": False, "group_size": 128, "quant_method": "gptq", "sym": True},
                    dtype="float16")  # fmt: skip
    assert _linears(f) == _per_layer(lambda o, i: o * i // 2 + i // 128 * o * 2 + i // 128 * o // 8 * 4 + i * 4)


def test_compressed_tensors_w4a16(tmp_path):
    """A pack-quantized int4 compressed-tensors checkpoint (llm-compressor's W4A16 scheme: group 128, symmetric):
    weight_packed (out, in/8) int32, weight_scale (out, in/128) bf16, weight_shape (2,) int64; Machete on Hopper
    (no workspace); with actorder "group", Marlin keeps weight_g_idx and its sort indices and a workspace."""
    scheme = {"num_bits": 4, "type": "int", "symmetric": True, "strategy": "group", "group_size": 128}
    quant = {
        "quant_method": "compressed-tensors",
        "format": "pack-quantized",
        "ignore": ["lm_head"],
        "config_groups": {"group_0": {"targets": ["Linear"], "input_activations": None, "weights": scheme}},
    }
    f = _llama_with(tmp_path, quant)
    assert _linears(f) == _per_layer(lambda o, i: o * i // 2 + o * (i // 128) * 2 + 16)
    scheme["actorder"] = "group"
    f = _llama_with(tmp_path, quant)
    assert _linears(f) == _per_layer(lambda o, i: o * i // 2 + o * (i // 128) * 2 + 2 * i * 4 + 16 + WORKSPACE)


def test_compressed_tensors_w8a8_fp8_and_int8(tmp_path):
    """RedHatAI/Meta-Llama-3.1-8B-Instruct-FP8-dynamic (fp8 weights per channel) and ...-quantized.w8a8 (int8 per
    channel): 1 B a weight + an f32 scale per output row; dynamic per-token activations hold no scale."""
    for kind, fmt in (("float", "float-quantized"), ("int", "int-quantized")):
        f = _llama_with(tmp_path, {"quant_method": "compressed-tensors", "format": fmt, "ignore": ["lm_head"],
                                   "config_groups": {"group_0": {"targets": ["Linear"], "input_activations": {
                                       "num_bits": 8, "type": kind, "strategy": "token", "dynamic": True},
                                       "weights": {"num_bits": 8, "type": kind, "strategy": "channel",
                                                   "symmetric": True}}}})  # fmt: skip
        assert _linears(f) == _per_layer(lambda o, i: o * i + o * 4)


def test_nvfp4_compressed_tensors_and_modelopt(tmp_path):
    """RedHatAI/Meta-Llama-3.1-8B-Instruct-NVFP4 (nvfp4-pack-quantized) and nvidia's ModelOpt NVFP4 exports: fp4
    pairs (out, in/2), fp8 scales per 16 (out, in/16), one global and one input f32 scale; Marlin FP4 on Hopper."""
    fp4 = {"num_bits": 4, "type": "float", "strategy": "tensor_group", "group_size": 16}
    ct = {
        "quant_method": "compressed-tensors",
        "format": "nvfp4-pack-quantized",
        "ignore": ["lm_head"],
        "config_groups": {
            "group_0": {"targets": ["Linear"], "weights": fp4, "input_activations": {**fp4, "dynamic": "local"}}
        },
    }
    modelopt = {"quant_method": "modelopt", "quant_algo": "NVFP4", "exclude_modules": ["lm_head"]}
    for quant in (ct, modelopt):
        f = _llama_with(tmp_path, quant)
        assert _linears(f) == _per_layer(lambda o, i: o * i // 2 + o * i // 16 + 4 + 4 + WORKSPACE)


def test_modelopt_fp8_and_online_fp8(tmp_path):
    """nvidia/Llama-3.1-8B-Instruct-FP8 (ModelOpt FP8: per-tensor weight scale and a static input scale) and
    `--quantization fp8` of the bf16 checkpoint (one scale a linear, no input scale)."""
    f = _llama_with(tmp_path, {"quant_method": "modelopt", "quant_algo": "FP8", "exclude_modules": ["lm_head"]})
    assert _linears(f) == _per_layer(lambda o, i: o * i + 4 + 4)
    online = load_model("llama-3.1-8b", quantization="fp8")
    assert _linears(online) == _per_layer(lambda o, i: o * i + 4)
    w = _weights(online)
    assert w["embeddings + lm_head"] == _weights(load_model("llama-3.1-8b"))["embeddings + lm_head"]  # stay bf16


def test_fbgemm_fp8(tmp_path):
    """fbgemm_fp8 (meta-llama's FP8 releases, e.g. Llama-3.1-405B-Instruct-FP8): fp8 weights, an f32 scale per output
    channel and the f32 input_scale_ub of each linear (fbgemm_fp8.py); modules_to_not_convert stay in bf16."""
    f = _llama_with(tmp_path, {"quant_method": "fbgemm_fp8", "activation_scale_ub": 1200.0,
                               "modules_to_not_convert": ["lm_head", "model.layers.0.mlp"]})  # fmt: skip
    w = _weights(f)
    assert w["attention"] == 32 * sum(o * i + o * 4 + 4 for o, i in (Q, O))
    assert w["dense MLP"] == 31 * sum(o * i + o * 4 + 4 for o, i in (GU, D))
    assert w["dense MLP, bfloat16 (ignored by the format: layers 0)"] == sum(o * i * 2 for o, i in (GU, D))


def test_fp8_block_qwen3_235b_preset():
    """Qwen/Qwen3-235B-A22B-FP8: the bf16 model's shapes in fp8 with 128x128 block scales."""
    f = load_model("qwen3-235b-a22b-fp8")
    assert f.weight_block_size == (128, 128)
    w = _weights(f, tp=1, ep=8)
    per_expert = 3 * 1536 * 4096 + (math.ceil(3072 / 128) * 32 + 32 * math.ceil(1536 / 128)) * 4
    assert w["routed experts"] == 94 * 16 * per_expert


def test_kimi_k2_thinking_w4a16_experts_only():
    """moonshotai/Kimi-K2-Thinking: compressed-tensors int4, group 32, symmetric, ignoring lm_head, attention, the
    shared experts and the dense MLP: only the routed experts are packed (Marlin MoE: one workspace a layer)."""
    f = load_model("kimi-k2-thinking")
    K, I, E = 7168, 2048, 48
    w = _weights(f, tp=1, ep=8)
    w13 = E * 2 * I * K // 2 + E * (K // 32) * 2 * I * 2 + E * 2 * 2
    w2 = E * K * I // 2 + E * (I // 32) * K * 2 + E * 2 * 2
    assert w["routed experts"] == 60 * (w13 + w2 + 132 * 4 * 4)
    assert w["shared experts"] == 60 * 3 * I * K * 2 and w["dense MLP"] == 3 * 18432 * K * 2
    bf16 = load_model("kimi-k2-thinking")
    assert bf16.quant is not None and not bf16.quant.quantizes("model.layers.1.self_attn.q_b_proj")


def test_dtype_float32_refused_with_fp8_checkpoints():
    """vLLM refuses an activation dtype the quantization does not support (Fp8Config: bfloat16, float16)."""
    with pytest.raises(ModelConfigError, match="float32 is not supported for quantization method fp8"):
        load_model("deepseek-v3", dtype="float32")
    with pytest.raises(ModelConfigError, match="mxfp4"):
        load_model("gpt-oss-20b", dtype="float16")
    _, spec, _ = parse_serve(["vllm", "serve", "llama-3.1-8b", "--dtype", "float32", "--quantization", "fp8"])
    assert (spec.dtype, spec.quantization) == ("float32", "fp8")
    # --quantization naming the checkpoint's own method is valid (awq is run as awq_marlin); another is refused
    assert load_model("gpt-oss-20b", quantization="mxfp4").quant.method == "mxfp4"
    with pytest.raises(ModelConfigError, match="does not match"):
        load_model("deepseek-v3", quantization="awq")
    with pytest.raises(ModelConfigError, match="has no quantization_config"):
        load_model("llama-3.1-8b", quantization="gptq")


# --- hub ids --------------------------------------------------------------------------------------------------------


def test_hub_ids_resolve_to_presets_and_the_local_cache(tmp_path, monkeypatch):
    assert load_model("deepseek-ai/DeepSeek-R1").name == "deepseek-r1"
    assert load_model("openai/gpt-oss-20b").name == "gpt-oss-20b"
    snapshot = tmp_path / "hub" / "models--acme--Tiny-8B" / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text(json.dumps(LLAMA_8B))
    (tmp_path / "hub" / "models--acme--Tiny-8B" / "refs").mkdir()
    (tmp_path / "hub" / "models--acme--Tiny-8B" / "refs" / "main").write_text("abc123")
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    facts = load_model("acme/Tiny-8B")
    assert facts.path == str(snapshot / "config.json") and facts.hidden_size == 4096
    result = run_cli_inproc("plan", "--vllm-version", "0.29.0", "--gpu", "H200-141GB", "--", "vllm", "serve",
                         "acme/Unknown-1B", env={"HF_HOME": str(tmp_path)})  # fmt: skip
    assert result.returncode == 2
    assert without_download_lines(result.stderr).strip().count("\n") == 0
    assert "neither a preset nor in the local Hugging Face cache" in result.stderr and "presets:" in result.stderr


@pytest.mark.vllm_wheel
def test_a_path_not_on_this_machine_is_read_by_the_name_it_ends_in(tmp_path, monkeypatch):
    """A serve line pasted from the GPU host names a directory there: its last component names a preset (its file
    name or its hub id's name, any case), a Hugging Face cache path its hub id; the plan says how it read it."""
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    facts = load_model("/mnt/models/Qwen3-Coder-480B-A35B-Instruct/")
    assert facts.name == "qwen3-coder-480b-a35b" and facts.num_routed_experts == 160
    assert facts.read_as == ("/mnt/models/Qwen3-Coder-480B-A35B-Instruct/ is not on this machine; read as the preset "
                             "its name names, harness/defaults/models/qwen3-coder-480b-a35b.json")  # fmt: skip
    assert load_model("/data/QWEN3-32B-FP8").name == "qwen3-32b-fp8"
    assert load_model("/root/.cache/huggingface/hub/models--Qwen--Qwen3-32B/snapshots/0123abcd").name == "qwen3-32b"
    snapshot = tmp_path / "hub" / "models--acme--Tiny-8B" / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text(json.dumps(LLAMA_8B))
    facts = load_model("/gpu-host/hf/hub/models--acme--Tiny-8B/snapshots/feed")
    assert facts.path == str(snapshot / "config.json") and "read as acme/Tiny-8B from the local" in facts.read_as
    assert load_model("llama-3.1-8b").read_as == ""
    # ORG/NAME that is no preset's hub id and not in the cache: a relative directory there, or another upload
    relative = load_model("models/Qwen3-32B")
    assert relative.name == "qwen3-32b" and "another upload or directory of that name may hold" in relative.read_as
    for unknown in ("/mnt/models/Tiny-8B", "/mnt/models/qwen3", "/gpu-host/hub/models--acme--Other-1B/snapshots/x"):
        with pytest.raises(ModelConfigError, match=r"not a directory with config\.json nor a preset"):
            load_model(unknown)
    serve = ("vllm", "serve", "/models/qwen3-32b", "--tensor-parallel-size", "2")
    result = run_cli_inproc("plan", "--vllm-version", "0.29.0", "--gpu", "H200-141GB", "--", *serve,
                            env={"HF_HOME": str(tmp_path)})  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "model: /models/qwen3-32b is not on this machine; read as the preset its name names" in result.stdout


# --- bad model configs: one line, exit 2 -----------------------------------------------------------------------------

BAD: list[tuple[dict[str, Any], str]] = [
    ({"max_position_embeddings": None}, "max_position_embeddings is missing"),
    ({"max_position_embeddings": 0}, "max_position_embeddings = 0"),
    ({"max_position_embeddings": -5}, "max_position_embeddings = -5"),
    ({"max_position_embeddings": "8k"}, 'max_position_embeddings = "8k"'),
    ({"num_hidden_layers": 0}, "num_hidden_layers = 0"),
    ({"num_attention_heads": 0, "head_dim": None}, "num_attention_heads = 0"),
    ({"num_key_value_heads": 0}, "num_key_value_heads = 0"),
    ({"quantization_config": "fp8"}, 'quantization_config = "fp8" is not a JSON object'),
    ({"quantization_config": {"quant_method": "fp8", "weight_block_size": [128]}}, "weight_block_size = [128]"),
    ({"quantization_config": {"quant_method": "bitsandbytes"}}, 'quant_method = "bitsandbytes"'),
    ({"torch_dtype": "int8"}, 'torch_dtype "int8"'),
    ({"num_key_value_heads": 5}, "num_key_value_heads = 5; vLLM's attention needs it to divide"),
    ({"architectures": "LlamaForCausalLM"}, "is not one this model sizes"),
    ({"text_config": "llama"}, 'text_config = "llama" is not a JSON object'),
    ({"rope_scaling": {"rope_type": "linear", "factor": "x"}}, 'rope_scaling.factor = "x"'),
    ({"num_hidden_layers": 10**7}, "num_hidden_layers = 10000000; at most 1024"),
    (
        {
            "quantization_config": {
                "quant_method": "compressed-tensors",
                "ignore": ["re:(.*)*x"],
                "config_groups": {"g": {"weights": {"num_bits": 4, "type": "int"}}},
            }
        },
        "is not a regex matched in bounded time",
    ),
    ({"quantization_config": {"quant_method": "fp8", "modules_to_not_convert": ["x"] * 300}}, "at most 256"),
]


@pytest.mark.parametrize(("change", "message"), BAD, ids=[next(iter(c)) + str(i) for i, (c, _) in enumerate(BAD)])
def test_bad_model_configs_one_line_exit_2(tmp_path, change, message):
    config = {**LLAMA_8B, **change}
    config = {k: v for k, v in config.items() if v is not None}
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelConfigError) as error:
        load_model(str(tmp_path))
    assert message in str(error.value) and "\n" not in str(error.value)


@pytest.mark.vllm_wheel  # plans for 0.29.0: its release read from the cache
def test_bad_configs_through_the_cli(tmp_path):
    cases = {
        "mlp_only_layers": ({**_preset("qwen3-30b-a3b"), "mlp_only_layers": [[1]]}, "mlp_only_layers = [[1]]"),
        "layers": ({**LLAMA_8B, "num_hidden_layers": 0}, "num_hidden_layers = 0"),
        "deep": ("[" * 3000 + "]" * 3000, "nests 3000 levels deep"),
        "quant": ({**LLAMA_8B, "quantization_config": "fp8"}, 'quantization_config = "fp8"'),
    }
    for name, (config, message) in cases.items():
        model = tmp_path / name
        model.mkdir()
        (model / "config.json").write_text(config if isinstance(config, str) else json.dumps(config))
        result = run_cli_inproc("plan", "--vllm-version", "0.29.0", "--gpu", "H200-141GB", "--", "vllm", "serve",
                             str(model))  # fmt: skip
        assert result.returncode == 2, (name, result.stderr)
        assert without_download_lines(result.stderr).strip().count("\n") == 0 and "Traceback" not in result.stderr
        assert message in result.stderr, (name, result.stderr)
    result = run_cli_inproc("plan", "--vllm-version", "0.29.0", "--gpu", "H200-141GB", "--", "vllm", "serve",
                         "llama-3.1-8b", "--tensor-parallel-size", "3")  # fmt: skip
    assert result.returncode == 2 and "num_attention_heads = 32; vLLM needs it divisible by" in result.stderr
    deep = '{"num_redundant_experts": ' + "[" * 3000 + "]" * 3000 + "}"
    result = run_cli_inproc("plan", "--vllm-version", "0.29.0", "--gpu", "H200-141GB", "--", "vllm", "serve",
                         "deepseek-v3", "--enable-eplb", "--eplb-config", deep)  # fmt: skip
    assert result.returncode == 2 and without_download_lines(result.stderr).strip().count("\n") == 0
    assert "--eplb-config" in result.stderr and "nests 3001 levels deep" in result.stderr
