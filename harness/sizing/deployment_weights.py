"""The weights one GPU holds for the whole model, layer by layer, as vLLM's model files build them.

    per decoder layer        attention: GQA  qkv_proj (QKVParallelLinear: q heads / TP, KV heads / TP, replicated
                                             where TP exceeds them), o_proj (RowParallel), q/k norms (Qwen3)
                                        MLA  fused_qkv_a_proj (replicated), q_b_proj, kv_b_proj (ColumnParallel),
                                             o_proj (RowParallel), the a-norms, and vLLM's bf16 W_UK_T / W_UV
                                             copies of kv_b_proj (MLA process_weights_after_loading)
                             MLP:  dense     gate_up (MergedColumnParallel, intermediate / TP), down (RowParallel)
                                   MoE       router gate (replicated, unquantized), routed experts w13 (E, 2I, K) and
                                             w2 (E, K, I): E local experts (redundant ones included) under EP, I / TP
                                             without it; shared experts as a dense MLP (TP-sharded)
                             2 RMSNorms
    once                     embed_tokens and lm_head (vocab padded to 64, / TP; one of them when tied), final norm,
                             the rotary cos/sin cache (shared by every layer)

Quantized linears (quantization_config fp8) hold 1 B per element and, with a weight_block_size, one f32 scale per
block; embeddings, lm_head, norms and routers stay in the model's dtype. All bytes are exact for the tensors
listed; the tensors vLLM allocates that are not listed are what the published-log test measures.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from harness.sizing.model_config import ModelFacts, pad_vocab


@dataclass(frozen=True)
class Sharding:
    tp: int  # attention / dense TP
    moe_tp: int  # experts' intermediate split (TP x DP without EP, 1 with EP)
    local_experts: int  # routed experts (and replicas) held on this GPU


@dataclass(frozen=True)
class WeightLine:
    name: str
    bytes: int
    source: str
    count: int = 1  # how many layers hold one of these


def linear_bytes(facts: ModelFacts, out_features: int, in_features: int, *, quantized: bool = True,
                 bias: bool = False) -> int:  # fmt: skip
    """One linear's weight (+ fp8 block scales, + bias) at the checkpoint's quantization."""
    if quantized and facts.quant_method == "fp8":
        scales = 4  # per-tensor scale
        if facts.weight_block_size is not None:
            bo, bi = facts.weight_block_size
            scales = math.ceil(out_features / bo) * math.ceil(in_features / bi) * 4
        weight = out_features * in_features + scales
    else:
        weight = out_features * in_features * facts.dtype_bytes
    return weight + (out_features * facts.dtype_bytes if bias else 0)


def kv_heads_per_rank(facts: ModelFacts, tp: int) -> int:
    """QKVParallelLinear: KV heads split over TP, each rank keeps at least one (replicated where TP exceeds them)."""
    return max(1, facts.num_key_value_heads // tp)


def attention_bytes(facts: ModelFacts, tp: int) -> tuple[int, str]:
    K, d = facts.hidden_size, facts.dtype_bytes
    if facts.is_mla:
        heads = facts.num_attention_heads // tp
        qk_head = facts.qk_nope_head_dim + facts.qk_rope_head_dim
        kv_a_out = facts.kv_lora_rank + facts.qk_rope_head_dim
        if facts.q_lora_rank:
            a_proj = linear_bytes(facts, facts.q_lora_rank + kv_a_out, K)
            q_proj = linear_bytes(facts, heads * qk_head, facts.q_lora_rank) + facts.q_lora_rank * d
        else:
            a_proj = linear_bytes(facts, kv_a_out, K)
            q_proj = linear_bytes(facts, heads * qk_head, K)
        kv_b = linear_bytes(facts, heads * (facts.qk_nope_head_dim + facts.v_head_dim), facts.kv_lora_rank)
        o_proj = linear_bytes(facts, K, heads * facts.v_head_dim)
        # vLLM's MLA keeps W_UK_T (H, nope, L) and W_UV (H, L, v) in the activation dtype, made from kv_b_proj.
        absorbed = heads * facts.kv_lora_rank * (facts.qk_nope_head_dim + facts.v_head_dim) * d
        norms = facts.kv_lora_rank * d
        total = a_proj + q_proj + kv_b + o_proj + absorbed + norms
        return total, (f"MLA: fused_qkv_a_proj ({(facts.q_lora_rank or 0) + kv_a_out}, {K}) replicated, q_b_proj "
                       f"({heads}x{qk_head}, {facts.q_lora_rank}), kv_b_proj ({heads}x"
                       f"{facts.qk_nope_head_dim + facts.v_head_dim}, {facts.kv_lora_rank}), o_proj ({K}, "
                       f"{heads}x{facts.v_head_dim}), {heads} heads/GPU; + bf16 W_UK_T/W_UV {absorbed} B")  # fmt: skip
    heads = facts.num_attention_heads // tp
    kv = kv_heads_per_rank(facts, tp)
    hd = facts.head_dim
    qkv = linear_bytes(facts, (heads + 2 * kv) * hd, K, bias=facts.attention_bias)
    o_proj = linear_bytes(facts, K, heads * hd)
    norms = 2 * hd * d if facts.qk_norm else 0
    return qkv + o_proj + norms, (f"GQA: qkv_proj (({heads} + 2x{kv}) x {hd}, {K}){' + bias' if facts.attention_bias else ''}, "
                                  f"o_proj ({K}, {heads}x{hd}); {heads} q / {kv} KV heads per GPU"
                                  + ("; q/k norms" if facts.qk_norm else ""))  # fmt: skip


def mlp_bytes(facts: ModelFacts, intermediate: int, tp: int) -> int:
    I_tp = intermediate // tp  # noqa: N806
    return linear_bytes(facts, 2 * I_tp, facts.hidden_size) + linear_bytes(facts, facts.hidden_size, I_tp)


def routed_experts_bytes(facts: ModelFacts, sharding: Sharding) -> tuple[int, int]:
    """(bytes, I per GPU) of one MoE layer's w13 (E, 2I, K) and w2 (E, K, I) with their scales."""
    E, K = sharding.local_experts, facts.hidden_size  # noqa: N806
    I = facts.moe_intermediate_size // sharding.moe_tp  # noqa: E741, N806
    return E * (linear_bytes(facts, 2 * I, K) + linear_bytes(facts, K, I)), I


def weight_lines(facts: ModelFacts, sharding: Sharding) -> list[WeightLine]:
    """Every weight of the model on one GPU, grouped: one line per kind, with the layer count."""
    d, K, tp = facts.dtype_bytes, facts.hidden_size, sharding.tp
    cfg = facts.ref
    layers = facts.num_hidden_layers
    moe = len(facts.moe_layers)
    dense = layers - moe
    quant = ("fp8" + (f" + f32 scales per {facts.weight_block_size[0]}x{facts.weight_block_size[1]} block"
                      if facts.weight_block_size else " + per-tensor scale")) if facts.quant_method else facts.dtype  # fmt: skip
    lines: list[WeightLine] = []
    attn, how = attention_bytes(facts, tp)
    lines.append(WeightLine("attention", attn * layers, f"{cfg('num_attention_heads', 'kv_lora_rank')}: {how}, "
                            f"{quant}; x {layers} layers", layers))  # fmt: skip
    lines.append(WeightLine("layer norms", 2 * K * d * layers, f"{cfg('hidden_size')}: 2 RMSNorm ({K}) per layer",
                            layers))  # fmt: skip
    if dense:
        size = facts.intermediate_size
        lines.append(WeightLine("dense MLP", mlp_bytes(facts, size, tp) * dense,
                                f"{cfg('intermediate_size')}: gate_up (2x{size // tp}, {K}), down ({K}, {size // tp}), "
                                f"{quant}; x {dense} dense layers", dense))  # fmt: skip
    if moe:
        experts, I_gpu = routed_experts_bytes(facts, sharding)  # noqa: N806
        redundant_note = f"{sharding.local_experts} local experts"
        lines.append(WeightLine("routed experts", experts * moe,
                                f"{cfg('n_routed_experts', 'num_experts', 'num_local_experts')}: {redundant_note} x "
                                f"(w13 (2x{I_gpu}, {K}) + w2 ({K}, {I_gpu})), {quant}; x {moe} MoE layers "
                                f"({cfg('first_k_dense_replace', 'decoder_sparse_step', 'num_hidden_layers')})", moe))  # fmt: skip
        gate = facts.num_routed_experts * K * d
        bias = facts.num_routed_experts * 4 if facts.is_mla else 0  # e_score_correction_bias, f32
        lines.append(WeightLine("router", (gate + bias) * moe,
                                f"{cfg('n_routed_experts', 'num_experts', 'num_local_experts')}: gate "
                                f"({facts.num_routed_experts}, {K}) {facts.dtype}, replicated"
                                + (" + f32 e_score_correction_bias" if bias else "") + f"; x {moe}", moe))  # fmt: skip
        shared = facts.num_shared_experts * facts.moe_intermediate_size or facts.shared_expert_intermediate_size
        if shared:
            extra = K * d if facts.shared_expert_intermediate_size else 0  # Qwen2-MoE's shared_expert_gate (1, K)
            lines.append(WeightLine("shared experts", (mlp_bytes(facts, shared, tp) + extra) * moe,
                                    f"{cfg('n_shared_experts', 'shared_expert_intermediate_size')}: an MLP of "
                                    f"intermediate {shared} / TP {tp}, {quant}; x {moe}", moe))  # fmt: skip
    vocab_rows = pad_vocab(facts.vocab_size, tp)
    embed = vocab_rows * K * d
    tied = facts.tie_word_embeddings
    lines.append(WeightLine("embeddings + lm_head", embed * (1 if tied else 2) + K * d,
                            f"{cfg('vocab_size')}: ({vocab_rows}, {K}) {facts.dtype} per GPU (vocab padded to 64, / TP "
                            f"{tp}){', tied' if tied else ' x 2 (embed_tokens, lm_head)'} + final norm"))  # fmt: skip
    rotary = rotary_cache_bytes(facts)
    lines.append(WeightLine("rotary cache", rotary[0], rotary[1]))
    return lines


def rotary_cache_bytes(facts: ModelFacts) -> tuple[int, str]:
    """get_rope's cos_sin_cache, shared by every layer: (positions, rotary_dim) in the model dtype."""
    rotary_dim = facts.qk_rope_head_dim if facts.is_mla else facts.head_dim
    positions = facts.max_position_embeddings or 0
    return positions * rotary_dim * facts.dtype_bytes, (
        f"{facts.ref('max_position_embeddings')}: cos_sin_cache ({positions}, {rotary_dim}) {facts.dtype}, one for "
        "every layer (get_rope's cache)")  # fmt: skip
