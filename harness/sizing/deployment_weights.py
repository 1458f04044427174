"""The weights one GPU holds for the whole model, layer by layer, as vLLM's model files build them.

    per decoder layer        attention: GQA  qkv_proj (QKVParallelLinear: q heads / TP, KV heads / TP, replicated
                                             where TP exceeds them), o_proj (RowParallel), q/k norms (Qwen3)
                                        MLA  fused_qkv_a_proj (replicated), q_b_proj, kv_b_proj (ColumnParallel),
                                             o_proj (RowParallel), the a-norms, and for an fp8 kv_b_proj the
                                             dequantized copy W_UK_T / W_UV view (MLA process_weights_after_loading)
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

What vLLM logs ("Model loading took X GiB") is torch's allocated bytes, and torch's CUDA caching allocator gives a
tensor a block at least as large as asked (allocator_block_bytes): the last line, allocator rounding, is that
excess over every tensor of weight_tensors, each taken as a fresh allocation (the model is built after the
profiler's empty_cache).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from harness.sizing.model_config import ModelFacts, pad_vocab

# torch's CUDA caching allocator (c10/cuda/CUDACachingAllocator.cpp, the default configuration: no expandable
# segments, no max_split_size): kMinBlockSize, kSmallSize, kMinLargeAlloc, kRoundLarge.
MIN_BLOCK = 512
SMALL_SIZE = 1 << 20
MIN_LARGE_ALLOC = 10 << 20
ROUND_LARGE = 2 << 20


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


def allocator_block_bytes(size: int) -> int:
    """The bytes torch's caching allocator counts as allocated for one fresh allocation of `size` bytes: round_size
    rounds to 512 B; a request over 1 MiB and of at least 10 MiB gets a segment rounded up to 2 MiB
    (get_allocation_size) and is split off it only when more than 1 MiB would remain (should_split), else the
    whole segment is its block. Requests up to 10 MiB are cut from a 2 MiB or a 20 MiB segment, with room left."""
    if size <= 0:
        return 0
    rounded = -(-size // MIN_BLOCK) * MIN_BLOCK
    if rounded <= SMALL_SIZE or rounded < MIN_LARGE_ALLOC:
        return rounded
    segment = -(-rounded // ROUND_LARGE) * ROUND_LARGE
    return rounded if segment - rounded > SMALL_SIZE else segment


def linear_tensors(facts: ModelFacts, out_features: int, in_features: int, *, quantized: bool = True,
                   bias: bool = False, stacked: int = 1) -> list[int]:  # fmt: skip
    """The bytes of each tensor one linear allocates: the weight, its fp8 scales, its bias; `stacked` experts share
    each tensor (FusedMoE's w13 (E, 2I, K) and w2 (E, K, I), with their scales (E, ...))."""
    tensors = []
    if quantized and facts.quant_method == "fp8":
        scales = 4  # per-tensor scale
        if facts.weight_block_size is not None:
            bo, bi = facts.weight_block_size
            scales = math.ceil(out_features / bo) * math.ceil(in_features / bi) * 4
        tensors += [stacked * out_features * in_features, stacked * scales]
    else:
        tensors.append(stacked * out_features * in_features * facts.dtype_bytes)
    if bias:
        tensors.append(stacked * out_features * facts.dtype_bytes)
    return tensors


def linear_bytes(facts: ModelFacts, out_features: int, in_features: int, *, quantized: bool = True,
                 bias: bool = False) -> int:  # fmt: skip
    """One linear's weight (+ fp8 block scales, + bias) at the checkpoint's quantization."""
    return sum(linear_tensors(facts, out_features, in_features, quantized=quantized, bias=bias))


def kv_heads_per_rank(facts: ModelFacts, tp: int) -> int:
    """QKVParallelLinear: KV heads split over TP, each rank keeps at least one (replicated where TP exceeds them)."""
    return max(1, facts.num_key_value_heads // tp)


def attention_tensors(facts: ModelFacts, tp: int) -> tuple[list[int], str]:
    """The tensors of one layer's attention on one GPU, and how they are made."""
    K, d = facts.hidden_size, facts.dtype_bytes
    if facts.is_mla:
        heads = facts.num_attention_heads // tp
        qk_head = facts.qk_nope_head_dim + facts.qk_rope_head_dim
        kv_a_out = facts.kv_lora_rank + facts.qk_rope_head_dim
        if facts.q_lora_rank:
            a_proj = linear_tensors(facts, facts.q_lora_rank + kv_a_out, K)
            q_proj = [*linear_tensors(facts, heads * qk_head, facts.q_lora_rank), facts.q_lora_rank * d]
        else:
            a_proj = linear_tensors(facts, kv_a_out, K)
            q_proj = linear_tensors(facts, heads * qk_head, K)
        o_proj = linear_tensors(facts, K, heads * facts.v_head_dim)
        # MLA's W_UK_T (H, nope, L) and W_UV (H, L, v) are views of kv_b_proj's weight in the activation dtype
        # (mla_attention.py process_weights_after_loading, vLLM 0.19.0 :710-797): the weight itself when it is
        # unquantized (quant_utils.py get_and_maybe_dequant_weights returns weight.to(act_dtype)), one dequantized
        # (H x (nope + v), L) copy when it is fp8.
        kv_b_out = heads * (facts.qk_nope_head_dim + facts.v_head_dim)
        kv_b = linear_tensors(facts, kv_b_out, facts.kv_lora_rank)
        absorbed = [kv_b_out * facts.kv_lora_rank * d] if facts.quant_method == "fp8" else []
        norms = [facts.kv_lora_rank * d]
        return a_proj + q_proj + kv_b + o_proj + absorbed + norms, (
            f"MLA: fused_qkv_a_proj ({(facts.q_lora_rank or 0) + kv_a_out}, {K}) replicated, q_b_proj "
            f"({heads}x{qk_head}, {facts.q_lora_rank}), kv_b_proj ({kv_b_out}, {facts.kv_lora_rank}), o_proj ({K}, "
            f"{heads}x{facts.v_head_dim}), {heads} heads/GPU; "
            + (f"+ the dequantized kv_b_proj behind W_UK_T/W_UV {sum(absorbed)} B" if absorbed else
               "W_UK_T/W_UV are views of kv_b_proj"))  # fmt: skip
    heads = facts.num_attention_heads // tp
    kv = kv_heads_per_rank(facts, tp)
    hd = facts.head_dim
    qkv = linear_tensors(facts, (heads + 2 * kv) * hd, K, bias=facts.attention_bias)
    o_proj = linear_tensors(facts, K, heads * hd)
    norms = [hd * d, hd * d] if facts.qk_norm else []
    bias = " + bias" if facts.attention_bias else ""
    return qkv + o_proj + norms, (f"GQA: qkv_proj (({heads} + 2x{kv}) x {hd}, {K}){bias}, "
                                  f"o_proj ({K}, {heads}x{hd}); {heads} q / {kv} KV heads per GPU"
                                  + ("; q/k norms" if facts.qk_norm else ""))  # fmt: skip


def attention_bytes(facts: ModelFacts, tp: int) -> tuple[int, str]:
    tensors, how = attention_tensors(facts, tp)
    return sum(tensors), how


def mlp_tensors(facts: ModelFacts, intermediate: int, tp: int) -> list[int]:
    I_tp = intermediate // tp
    return linear_tensors(facts, 2 * I_tp, facts.hidden_size) + linear_tensors(facts, facts.hidden_size, I_tp)


def mlp_bytes(facts: ModelFacts, intermediate: int, tp: int) -> int:
    return sum(mlp_tensors(facts, intermediate, tp))


def routed_experts_tensors(facts: ModelFacts, sharding: Sharding) -> tuple[list[int], int]:
    """(tensors, I per GPU) of one MoE layer: w13 (E, 2I, K) and w2 (E, K, I), each with its scales."""
    E, K = sharding.local_experts, facts.hidden_size
    I = facts.moe_intermediate_size // sharding.moe_tp
    return linear_tensors(facts, 2 * I, K, stacked=E) + linear_tensors(facts, K, I, stacked=E), I


def routed_experts_bytes(facts: ModelFacts, sharding: Sharding) -> tuple[int, int]:
    """(bytes, I per GPU) of one MoE layer's w13 (E, 2I, K) and w2 (E, K, I) with their scales."""
    tensors, I = routed_experts_tensors(facts, sharding)
    return sum(tensors), I


@dataclass(frozen=True)
class _Group:
    name: str
    tensors: list[int]  # bytes of each tensor one holder allocates
    count: int  # how many layers (or 1) hold these
    source: str


def _groups(facts: ModelFacts, sharding: Sharding) -> list[_Group]:
    d, K, tp = facts.dtype_bytes, facts.hidden_size, sharding.tp
    cfg = facts.ref
    layers = facts.num_hidden_layers
    moe = len(facts.moe_layers)
    dense = layers - moe
    scales = (f" + f32 scales per {facts.weight_block_size[0]}x{facts.weight_block_size[1]} block"
              if facts.weight_block_size else " + per-tensor scale")  # fmt: skip
    quant = "fp8" + scales if facts.quant_method else facts.dtype
    groups: list[_Group] = []
    attn, how = attention_tensors(facts, tp)
    groups.append(_Group("attention", attn, layers, f"{cfg('num_attention_heads', 'kv_lora_rank')}: {how}, {quant}; "
                         f"x {layers} layers"))  # fmt: skip
    groups.append(_Group("layer norms", [K * d, K * d], layers, f"{cfg('hidden_size')}: 2 RMSNorm ({K}) per layer"))
    if dense:
        size = facts.intermediate_size
        groups.append(_Group("dense MLP", mlp_tensors(facts, size, tp), dense,
                             f"{cfg('intermediate_size')}: gate_up (2x{size // tp}, {K}), down ({K}, {size // tp}), "
                             f"{quant}; x {dense} dense layers"))  # fmt: skip
    if moe:
        experts, I_gpu = routed_experts_tensors(facts, sharding)
        experts_ref = cfg("n_routed_experts", "num_experts", "num_local_experts")
        layers_ref = cfg("first_k_dense_replace", "decoder_sparse_step", "num_hidden_layers")
        groups.append(_Group("routed experts", experts, moe,
                             f"{experts_ref}: {sharding.local_experts} local experts x (w13 (2x{I_gpu}, {K}) + w2 "
                             f"({K}, {I_gpu})), {quant}; x {moe} MoE layers ({layers_ref})"))  # fmt: skip
        gate = [facts.num_routed_experts * K * d] + ([facts.num_routed_experts * 4] if facts.is_mla else [])
        groups.append(_Group("router", gate, moe,
                             f"{experts_ref}: gate ({facts.num_routed_experts}, {K}) {facts.dtype}, replicated"
                             + (" + f32 e_score_correction_bias" if facts.is_mla else "") + f"; x {moe}"))  # fmt: skip
        shared = facts.num_shared_experts * facts.moe_intermediate_size or facts.shared_expert_intermediate_size
        if shared:
            gate = [K * d] if facts.shared_expert_intermediate_size else []  # Qwen2-MoE's shared_expert_gate (1, K)
            groups.append(_Group("shared experts", mlp_tensors(facts, shared, tp) + gate, moe,
                                 f"{cfg('n_shared_experts', 'shared_expert_intermediate_size')}: an MLP of "
                                 f"intermediate {shared} / TP {tp}, {quant}; x {moe}"))  # fmt: skip
    vocab_rows = pad_vocab(facts.vocab_size, tp)
    tied = facts.tie_word_embeddings
    groups.append(_Group("embeddings + lm_head", [vocab_rows * K * d] * (1 if tied else 2) + [K * d], 1,
                         f"{cfg('vocab_size')}: ({vocab_rows}, {K}) {facts.dtype} per GPU (vocab padded to 64, / TP "
                         f"{tp}){', tied' if tied else ' x 2 (embed_tokens, lm_head)'} + final norm"))  # fmt: skip
    rotary, how = rotary_cache_bytes(facts)
    groups.append(_Group("rotary cache", [rotary], 1, how))
    return groups


def weight_tensors(facts: ModelFacts, sharding: Sharding) -> list[tuple[int, int]]:
    """Every weight tensor one GPU allocates: (bytes, how many of it)."""
    return [(b, g.count) for g in _groups(facts, sharding) for b in g.tensors]


def weight_lines(facts: ModelFacts, sharding: Sharding) -> list[WeightLine]:
    """Every weight of the model on one GPU, grouped: one line per kind, with the layer count, and the caching
    allocator's rounding over all of them."""
    groups = _groups(facts, sharding)
    lines = [WeightLine(g.name, sum(g.tensors) * g.count, g.source, g.count) for g in groups]
    tensors = weight_tensors(facts, sharding)
    excess = sum((allocator_block_bytes(b) - b) * n for b, n in tensors)
    lines.append(WeightLine("allocator rounding", excess,
                            f"torch's CUDA caching allocator over {sum(n for _, n in tensors)} weight tensors, each a "
                            "fresh allocation: 512 B rounding, and a whole 2 MiB-rounded segment where at most 1 MiB "
                            "would remain (c10/cuda/CUDACachingAllocator.cpp round_size, get_allocation_size, "
                            "should_split)"))  # fmt: skip
    return lines


def rotary_cache_bytes(facts: ModelFacts) -> tuple[int, str]:
    """get_rope's cos_sin_cache, shared by every layer: (positions, rotary_dim) in the model dtype."""
    rotary_dim = facts.qk_rope_head_dim if facts.is_mla else facts.head_dim
    positions = facts.max_position_embeddings or 0
    return positions * rotary_dim * facts.dtype_bytes, (
        f"{facts.ref('max_position_embeddings')}: cos_sin_cache ({positions}, {rotary_dim}) {facts.dtype}, one for "
        "every layer (get_rope's cache)")  # fmt: skip
