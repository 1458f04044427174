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

Quantized linears hold their checkpoint format's layout (harness.sizing.quant_formats: FP8, compressed-tensors,
AWQ, GPTQ, NVFP4, MXFP4), but the modules the format ignores; embeddings, lm_head, norms and routers stay in the
model's dtype. Beyond the decoder: attention sinks and biases (gpt-oss), DeepSeek-V3.2's indexer, Qwen3-Next's gated
delta net, and a vision tower (Llama-4, Gemma 3). All bytes are exact for the tensors listed; the tensors vLLM
allocates that are not listed are what the published-log tests measure.

What vLLM logs ("Model loading took X GiB") is torch's allocated bytes, and torch's CUDA caching allocator gives a
tensor a block at least as large as asked (allocator_block_bytes): the last line, allocator rounding, is that
excess over every tensor of weight_tensors, each taken as a fresh allocation (the model is built after the
profiler's empty_cache).
"""

from __future__ import annotations

from dataclasses import dataclass

from harness.core.units import round_up
from harness.sizing.model_config import ModelFacts, pad_vocab
from harness.sizing.quant_formats import linear_tensors as quant_linear
from harness.sizing.quant_formats import marlin_moe_workspace

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


def allocator_block_bytes(size: int, max_split: int | None = None) -> int:
    """The bytes torch's caching allocator counts as allocated for one fresh allocation of `size` bytes: round_size
    rounds to 512 B; a request over 1 MiB and of at least 10 MiB gets a segment rounded up to 2 MiB
    (get_allocation_size) and is split off it only when more than 1 MiB would remain (should_split), else the
    whole segment is its block. Requests up to 10 MiB are cut from a 2 MiB or a 20 MiB segment, with room left.
    With a max_split_size (release_defaults.load_max_split_size), should_split never splits a request of at least
    that size: its whole segment is its block."""
    if size <= 0:
        return 0
    rounded = round_up(size, MIN_BLOCK)
    if rounded <= SMALL_SIZE or rounded < MIN_LARGE_ALLOC:
        return rounded
    segment = round_up(rounded, ROUND_LARGE)
    if max_split is not None and rounded >= max_split:
        return segment
    return rounded if segment - rounded > SMALL_SIZE else segment


def linear_tensors(facts: ModelFacts, out_features: int, in_features: int, *, quantized: bool = True,
                   bias: bool = False, stacked: int = 1, module: str = "", shards: int = 1) -> list[int]:  # fmt: skip
    """The bytes of each tensor one linear allocates: the weight in the checkpoint's format (its scales, zero
    points, indices: harness.sizing.quant_formats), its bias; `stacked` experts share each tensor (FusedMoE's w13
    (E, 2I, K) and w2 (E, K, I), with their scales (E, ...)). `module`: vLLM's module name, for the format's
    ignore list."""
    q = facts.quant
    use = quantized and q is not None and q.quantizes(module, expert=stacked > 1 or module.endswith(".experts"))
    tensors = quant_linear(q if use else None, out_features, in_features, facts.dtype_bytes, stacked=stacked,
                           shards=shards)  # fmt: skip
    if bias:
        tensors.append(stacked * out_features * facts.dtype_bytes)
    return tensors


def linear_bytes(facts: ModelFacts, out_features: int, in_features: int, *, quantized: bool = True,
                 bias: bool = False, module: str = "") -> int:  # fmt: skip
    """One linear's weight (+ its format's scales, + bias)."""
    return sum(linear_tensors(facts, out_features, in_features, quantized=quantized, bias=bias, module=module))


def kv_heads_per_rank(facts: ModelFacts, tp: int) -> int:
    """QKVParallelLinear: KV heads split over TP, each rank keeps at least one (replicated where TP exceeds them)."""
    return max(1, facts.num_key_value_heads // tp)


def _first(facts: ModelFacts, kind: str) -> int:
    return next((i for i, k in enumerate(facts.kinds) if k == kind), 0)


def attention_tensors(facts: ModelFacts, tp: int, kind: str = "full",
                      layer: int | None = None) -> tuple[list[int], str]:  # fmt: skip
    """The tensors of one layer's attention on one GPU (layer `layer`, else the first of `kind`), and how they are
    made."""
    K, d = facts.hidden_size, facts.dtype_bytes
    layer = _first(facts, kind) if layer is None else layer
    mod = f"model.layers.{layer}.self_attn"
    if kind == "linear":
        return linear_attention_tensors(facts, tp, layer)
    if facts.is_mla:
        heads = facts.num_attention_heads // tp
        qk_head = facts.qk_nope_head_dim + facts.qk_rope_head_dim
        kv_a_out = facts.kv_lora_rank + facts.qk_rope_head_dim
        if facts.q_lora_rank:
            a_proj = linear_tensors(facts, facts.q_lora_rank + kv_a_out, K, module=f"{mod}.fused_qkv_a_proj", shards=2)
            q_proj = [
                *linear_tensors(facts, heads * qk_head, facts.q_lora_rank, module=f"{mod}.q_b_proj"),
                facts.q_lora_rank * d,
            ]
        else:
            a_proj = linear_tensors(facts, kv_a_out, K, module=f"{mod}.kv_a_proj_with_mqa")
            q_proj = linear_tensors(facts, heads * qk_head, K, module=f"{mod}.q_proj")
        o_proj = linear_tensors(facts, K, heads * facts.v_head_dim, module=f"{mod}.o_proj")
        # MLA's W_UK_T (H, nope, L) and W_UV (H, L, v) are views of kv_b_proj's weight in the activation dtype
        # (mla_attention.py process_weights_after_loading, vLLM 0.19.0 :710-797): the weight itself when it is
        # unquantized (quant_utils.py get_and_maybe_dequant_weights returns weight.to(act_dtype)), one dequantized
        # (H x (nope + v), L) copy when it is quantized.
        kv_b_out = heads * (facts.qk_nope_head_dim + facts.v_head_dim)
        kv_b = linear_tensors(facts, kv_b_out, facts.kv_lora_rank, module=f"{mod}.kv_b_proj")
        kv_b_quantized = facts.quant is not None and facts.quant.quantizes(f"{mod}.kv_b_proj")
        absorbed = [kv_b_out * facts.kv_lora_rank * d] if kv_b_quantized else []
        norms = [facts.kv_lora_rank * d]
        indexer, index_how = indexer_tensors(facts, mod)
        return a_proj + q_proj + kv_b + o_proj + absorbed + norms + indexer, (
            f"MLA: fused_qkv_a_proj ({(facts.q_lora_rank or 0) + kv_a_out}, {K}) replicated, q_b_proj "
            f"({heads}x{qk_head}, {facts.q_lora_rank}), kv_b_proj ({kv_b_out}, {facts.kv_lora_rank}), o_proj ({K}, "
            f"{heads}x{facts.v_head_dim}), {heads} heads/GPU; "
            + (f"+ the dequantized kv_b_proj behind W_UK_T/W_UV {sum(absorbed)} B" if absorbed else
               "W_UK_T/W_UV are views of kv_b_proj") + index_how)  # fmt: skip
    heads = facts.num_attention_heads // tp
    kv = kv_heads_per_rank(facts, tp)
    hd = facts.head_dim
    q_width = heads * hd * (2 if facts.gated_attention else 1)
    qkv = linear_tensors(facts, q_width + 2 * kv * hd, K, bias=facts.attention_bias, module=f"{mod}.qkv_proj",
                         shards=3)  # fmt: skip
    o_proj = linear_tensors(facts, K, heads * hd, module=f"{mod}.o_proj")
    if facts.o_proj_bias:
        o_proj.append(K * d)  # RowParallelLinear's bias is whole on every rank
    norms = {"head": [hd * d, hd * d], "full": [heads * hd * d, kv * hd * d]}.get(facts.qk_norm, [])
    sinks = [heads * 2] if facts.attention_sinks else []  # gpt_oss.py: sinks (heads / TP,) bf16
    bias = " + bias" if facts.attention_bias else ""
    return qkv + o_proj + norms + sinks, (
        f"GQA: qkv_proj (({heads}{'x2 (output gate)' if facts.gated_attention else ''} + 2x{kv}) x {hd}, {K}){bias}, "
        f"o_proj ({K}, {heads}x{hd}){' + bias' if facts.o_proj_bias else ''}; {heads} q / {kv} KV heads per GPU"
        + ({"head": "; q/k norms", "full": "; q/k norms over the heads (MiniMax-M2)"}.get(facts.qk_norm, ""))
        + ("; attention sinks" if facts.attention_sinks else ""))  # fmt: skip


def indexer_tensors(facts: ModelFacts, mod: str) -> tuple[list[int], str]:
    """DeepSeek-V3.2's indexer, replicated on every rank (deepseek_v2.py Indexer): wq_b (heads x dim, q_lora_rank)
    and wk (dim, hidden) in the checkpoint's format, k_norm (a LayerNorm: weight and bias), weights_proj (heads,
    hidden) unquantized."""
    if not facts.index_n_heads:
        return [], ""
    H, D, K, d = facts.index_n_heads, facts.index_head_dim, facts.hidden_size, facts.dtype_bytes
    tensors = (linear_tensors(facts, H * D, facts.q_lora_rank or K, module=f"{mod}.indexer.wq_b")
               + linear_tensors(facts, D, K, module=f"{mod}.indexer.wk") + [D * d, D * d] + [H * K * d])  # fmt: skip
    return tensors, f"; indexer wq_b ({H}x{D}, {facts.q_lora_rank}), wk ({D}, {K}), k_norm, weights_proj ({H}, {K})"


def linear_attention_tensors(facts: ModelFacts, tp: int, layer: int) -> tuple[list[int], str]:
    """Qwen3-Next's gated delta net (qwen3_next.py Qwen3NextGatedDeltaNet), per GPU: in_proj_qkvz (2 x key_dim +
    2 x value_dim) / TP and in_proj_ba (2 x value heads) / TP, the causal conv1d (conv_dim / TP, kernel), dt_bias
    and A_log (value heads / TP), the gated RMSNorm (head_v_dim), out_proj (hidden, value_dim / TP)."""
    K, d = facts.hidden_size, facts.dtype_bytes
    nk, nv = facts.linear_num_key_heads, facts.linear_num_value_heads
    key_dim, value_dim = nk * facts.linear_key_head_dim, nv * facts.linear_value_head_dim
    conv_dim = 2 * key_dim + value_dim
    mod = f"model.layers.{layer}.linear_attn"
    tensors = (linear_tensors(facts, (2 * key_dim + 2 * value_dim) // tp, K, module=f"{mod}.in_proj_qkvz")
               + linear_tensors(facts, 2 * nv // tp, K, module=f"{mod}.in_proj_ba")
               + [conv_dim // tp * facts.linear_conv_kernel_dim * d, nv // tp * d, nv // tp * d,
                  facts.linear_value_head_dim * d]
               + linear_tensors(facts, K, value_dim // tp, module=f"{mod}.out_proj"))  # fmt: skip
    return tensors, (f"gated delta net: in_proj_qkvz ({(2 * key_dim + 2 * value_dim) // tp}, {K}), in_proj_ba "
                     f"({2 * nv // tp}, {K}), conv1d ({conv_dim // tp}, {facts.linear_conv_kernel_dim}), out_proj "
                     f"({K}, {value_dim // tp}) per GPU")  # fmt: skip


def attention_bytes(facts: ModelFacts, tp: int) -> tuple[int, str]:
    tensors, how = attention_tensors(facts, tp)
    return sum(tensors), how


def mlp_tensors(facts: ModelFacts, intermediate: int, tp: int, module: str = "model.layers.0.mlp") -> list[int]:
    I_tp = intermediate // tp
    if not facts.mlp_gated:  # phi.py PhiMLP: fc1 (ColumnParallel, bias split) and fc2 (RowParallel, whole bias)
        d = facts.dtype_bytes
        return [
            *linear_tensors(facts, I_tp, facts.hidden_size, module=f"{module}.fc1"),
            I_tp * d,
            *linear_tensors(facts, facts.hidden_size, I_tp, module=f"{module}.fc2"),
            facts.hidden_size * d,
        ]
    return (linear_tensors(facts, 2 * I_tp, facts.hidden_size, module=f"{module}.gate_up_proj", shards=2)
            + linear_tensors(facts, facts.hidden_size, I_tp, module=f"{module}.down_proj"))  # fmt: skip


def mlp_bytes(facts: ModelFacts, intermediate: int, tp: int) -> int:
    return sum(mlp_tensors(facts, intermediate, tp))


def experts_intermediate(facts: ModelFacts, sharding: Sharding) -> int:
    """I per GPU as FusedMoE allocates it: the MXFP4 method pads it to a multiple of 64 for the Triton backend
    (mxfp4.py create_weights: round_up(intermediate_size_per_partition, 64))."""
    I = facts.moe_intermediate_size // sharding.moe_tp
    if facts.quant is not None and facts.quant.scheme == "mxfp4":
        I = round_up(I, 64)
    return I


def routed_experts_tensors(facts: ModelFacts, sharding: Sharding, layer: int | None = None) -> tuple[list[int], int]:
    """(tensors, I per GPU) of one MoE layer: w13 (E, 2I, K) and w2 (E, K, I), each with its scales (and gpt-oss's
    biases: bf16 in the checkpoint, f32 once the Triton MXFP4 backend has converted them)."""
    E, K = sharding.local_experts, facts.hidden_size
    I = experts_intermediate(facts, sharding)
    if layer is None:
        layer = facts.moe_layers[0] if facts.moe_layers else 0
    mod = f"model.layers.{layer}.mlp.experts"
    tensors = (linear_tensors(facts, 2 * I, K, stacked=E, module=mod, shards=2)
               + linear_tensors(facts, K, I, stacked=E, module=mod))  # fmt: skip
    tensors += marlin_moe_workspace(facts.quant if facts.quant is not None and facts.quant.quantizes(mod, expert=True)
                                    else None)  # fmt: skip
    if facts.expert_bias:
        width = 4 if facts.quant is not None and facts.quant.scheme == "mxfp4" else facts.dtype_bytes
        tensors += [E * 2 * I * width, E * K * width]
    return tensors, I


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


def _quant_label(facts: ModelFacts) -> str:
    return facts.quant.label if facts.quant is not None else facts.dtype


def _label(facts: ModelFacts, suffix: str) -> str:
    return facts.dtype if suffix else _quant_label(facts)


def _by_layer(facts: ModelFacts, indices: list[int], make) -> list[tuple[list[int], int, str, str]]:
    """One module kind over the layers that hold it, as (tensors, layers, how, name suffix): layers whose tensors
    differ (a format's ignore list naming some layers) make groups of their own, the ones left in the activation
    dtype suffixed so."""
    buckets: dict[tuple[int, ...], list[int]] = {}
    hows: dict[tuple[int, ...], str] = {}
    for i in indices:
        tensors, how = make(i)
        buckets.setdefault(tuple(tensors), []).append(i)
        hows[tuple(tensors)] = how
    out = []
    for tensors, members in buckets.items():
        suffix = "" if len(buckets) == 1 or facts.quant is None or not _unquantized(facts, tensors, buckets) else \
            f", {facts.dtype} (ignored by the format: layers {_spans(members)})"  # fmt: skip
        out.append((list(tensors), len(members), hows[tensors], suffix))
    return out


def _unquantized(facts: ModelFacts, tensors: tuple[int, ...], buckets: dict) -> bool:
    """The bucket left in the activation dtype: the largest bytes of the differing buckets."""
    return sum(tensors) == max(sum(t) for t in buckets)


def _spans(members: list[int]) -> str:
    """0, 3-5, 9: the layers listed as runs."""
    spans: list[str] = []
    start = members[0]
    for a, b in zip(members, [*members[1:], -1], strict=True):
        if b != a + 1:
            spans.append(f"{start}" if start == a else f"{start}-{a}")
            start = b
    return ", ".join(spans[:8]) + (", ..." if len(spans) > 8 else "")


def _groups(facts: ModelFacts, sharding: Sharding) -> list[_Group]:
    d, K, tp = facts.dtype_bytes, facts.hidden_size, sharding.tp
    cfg = facts.ref
    layers = facts.num_hidden_layers
    moe = len(facts.moe_layers)
    dense = layers - moe
    groups: list[_Group] = []
    kinds = facts.kinds
    for kind in dict.fromkeys(kinds):
        name = "attention" if len(set(kinds)) == 1 else f"attention ({kind})"
        indices = [i for i, k in enumerate(kinds) if k == kind]

        def make(i: int, kind: str = kind) -> tuple[list[int], str]:
            return attention_tensors(facts, tp, kind, i)

        for tensors, count, how, suffix in _by_layer(facts, indices, make):
            groups.append(_Group(name + suffix, tensors, count, f"{cfg('num_attention_heads', 'kv_lora_rank')}: "
                                 f"{how}, {_label(facts, suffix)}; x {count} layers"))  # fmt: skip
    norms = facts.norms_per_layer
    norm = "LayerNorm (weight + bias)" if facts.norm_bias else "RMSNorm"
    groups.append(_Group("layer norms", [K * d * (2 if facts.norm_bias else 1)] * norms, layers,
                         f"{cfg('hidden_size')}: {norms} {norm} ({K}) per layer"))  # fmt: skip
    if dense:
        size = facts.intermediate_size
        indices = [i for i in range(layers) if i not in facts.moe_layers]
        how = f"gate_up (2x{size // tp}, {K}), down ({K}, {size // tp})"
        for tensors, count, _, suffix in _by_layer(facts, indices, lambda i: (
                mlp_tensors(facts, size, tp, f"model.layers.{i}.mlp"), how)):  # fmt: skip
            groups.append(_Group("dense MLP" + suffix, tensors, count,
                                 f"{cfg('intermediate_size_mlp', 'intermediate_size')}: {how}, "
                                 f"{_label(facts, suffix)}; x {count} dense layers"))  # fmt: skip
    if moe:
        experts_ref = cfg("n_routed_experts", "num_experts", "num_local_experts")
        layers_ref = cfg("first_k_dense_replace", "decoder_sparse_step", "interleave_moe_layer_step",
                         "num_hidden_layers")  # fmt: skip
        I_gpu = experts_intermediate(facts, sharding)
        how = (f"{sharding.local_experts} local experts x (w13 (2x{I_gpu}, {K}) + w2 ({K}, {I_gpu}))"
               f"{' + biases' if facts.expert_bias else ''}")  # fmt: skip
        for tensors, count, _, suffix in _by_layer(facts, list(facts.moe_layers), lambda i: (
                routed_experts_tensors(facts, sharding, i)[0], how)):  # fmt: skip
            groups.append(_Group("routed experts" + suffix, tensors, count, f"{experts_ref}: {how}, "
                                 f"{_label(facts, suffix)}; x {count} MoE layers ({layers_ref})"))  # fmt: skip
        E = facts.num_routed_experts
        router_d = 4 if facts.router_dtype == "float32" else d
        gate = [E * K * router_d] + ([E * router_d] if facts.router_bias else []) + \
            ([E * 4] if facts.score_bias else [])  # fmt: skip
        extras = (" + bias" if facts.router_bias else "") + \
            (" + f32 e_score_correction_bias" if facts.score_bias else "")  # fmt: skip
        groups.append(_Group("router", gate, moe, f"{experts_ref}: gate ({E}, {K}) "
                             f"{facts.router_dtype or facts.dtype}, replicated{extras}; x {moe}"))  # fmt: skip
        shared = facts.num_shared_experts * facts.moe_intermediate_size or facts.shared_expert_intermediate_size
        if shared:
            gate = [K * d] if facts.shared_expert_intermediate_size else []  # Qwen's shared_expert_gate (1, K)
            how = f"an MLP of intermediate {shared} / TP {tp}"
            for tensors, count, _, suffix in _by_layer(facts, list(facts.moe_layers), lambda i: (
                    mlp_tensors(facts, shared, tp, f"model.layers.{i}.mlp.shared_experts") + gate, how)):  # fmt: skip
                ref = cfg("n_shared_experts", "shared_expert_intermediate_size", "intermediate_size")
                groups.append(_Group("shared experts" + suffix, tensors, count,
                                     f"{ref}: {how}, {_label(facts, suffix)}; x {count}"))  # fmt: skip
    vocab_rows = pad_vocab(facts.vocab_size, tp)
    tied = facts.tie_word_embeddings
    final = [K * d * (2 if facts.norm_bias else 1)] + ([vocab_rows * d] if facts.lm_head_bias else [])
    q = facts.quant
    if not tied and q is not None and q.lm_head and q.quantizes("lm_head"):  # ModelOpt builds ParallelLMHead quantized
        head = quant_linear(q, vocab_rows, K, d)
        groups.append(_Group("embeddings + lm_head", [vocab_rows * K * d, *head, *final], 1,
                             f"{cfg('vocab_size')}: ({vocab_rows}, {K}) {facts.dtype} per GPU (vocab padded to 64, / "
                             f"TP {tp}) embed_tokens, the lm_head in {q.label} (the release's get_quant_method "
                             "quantizes ParallelLMHead; not in its ignore list) + final norm"))  # fmt: skip
    else:
        both = ", tied" if tied else " x 2 (embed_tokens, lm_head)"
        groups.append(_Group("embeddings + lm_head", [vocab_rows * K * d] * (1 if tied else 2) + final, 1,
                             f"{cfg('vocab_size')}: ({vocab_rows}, {K}) {facts.dtype} per GPU (vocab padded to 64, / "
                             f"TP {tp}){both} + final norm"))  # fmt: skip
    rotary, how = rotary_cache_bytes(facts)
    groups.append(_Group("rotary cache", [rotary], 1, how))
    if facts.vision is not None:
        tensors, how = vision_tensors(facts, tp)
        groups.append(_Group("vision tower", tensors, 1, f"{cfg('vision_config')}: {how}"))
    return groups


def _encoder_layer(H: int, F: int, tp: int, d: int) -> list[int]:
    """One ViT encoder layer's tensors per GPU (SigLIP, Llama-4's, MoonViT): qkv and o_proj with biases, fc1 and fc2
    with biases (TP linears), two LayerNorms (weight and bias)."""
    return [3 * H // tp * H * d, 3 * H // tp * d, H * (H // tp) * d, H * d,
            F // tp * H * d, F // tp * d, H * (F // tp) * d, H * d, 4 * H * d]  # fmt: skip


def vision_tensors(facts: ModelFacts, tp: int) -> tuple[list[int], str]:
    """The vision encoder and its projector, unquantized, their linears split over TP (vLLM's default
    mm_encoder_tp_mode "weights"): Llama-4's (mllama4.py Llama4VisionModel: the unfold patch linear, class and
    position embeddings, pre/post LayerNorms, per layer QKV and o_proj with biases, fc1/fc2 with biases and two
    LayerNorms; the pixel-shuffle MLP fc1 (projector_input, hidden / ratio^2) and fc2; multi_modal_projector
    (text hidden, vision_output_dim)) or Gemma 3's SigLIP (siglip.py: the patch Conv2d, position embedding, the
    same encoder layers, post LayerNorm; gemma3_mm.py's mm_input_projection_weight and mm_soft_emb_norm)."""
    v, d, K = facts.vision, facts.dtype_bytes, facts.hidden_size
    assert v is not None
    H, F = v.hidden_size, v.intermediate_size
    patches = (v.image_size // v.patch_size) ** 2
    layer = _encoder_layer(H, F, tp, d)
    patch_in = v.num_channels * v.patch_size**2
    if v.kind in ("llava", "pixtral_hf", "pixtral", "moonvit"):
        return _wrapper_vision_tensors(facts, tp)
    if v.kind == "llama4":
        inner = int(H / v.pixel_shuffle_ratio**2)
        once = [H // tp * patch_in * d, H * d, (patches + 1) * H * d, 4 * H * d,
                v.projector_in // tp * inner * d, v.adapter_out * (v.projector_in // tp) * d,
                K // tp * v.projector_in * d]  # fmt: skip
        how = (
            f"Llama-4 vision encoder, {v.num_layers} layers of hidden {H}, MLP {F}, + pixel-shuffle MLP "
            f"({v.projector_in}, {inner}) and projector ({K}, {v.projector_in}), {facts.dtype}, / TP {tp}"
        )
    else:  # + siglip.py SiglipVisionEmbeddings' position_ids buffer (int64, not persistent: built on the GPU)
        once = [H * patch_in * d + H * d, patches * H * d, patches * 8, 2 * H * d, H * K * d, H * d]
        how = (
            f"SigLIP vision encoder, {v.num_layers} layers of hidden {H}, MLP {F}, + projector ({H}, {K}), "
            f"{facts.dtype}, / TP {tp}"
        )
    return layer * v.num_layers + once, how


def _wrapper_vision_tensors(facts: ModelFacts, tp: int) -> tuple[list[int], str]:
    """The vision towers of LLaVA-NeXT, Mistral 3, Pixtral and Kimi-VL with their projectors, unquantized (the
    checkpoints' formats leave them out), in the model dtype, per GPU:

        llava       siglip.py SiglipVisionModel built to the deepest feature layer, without post_layernorm
                    (llava_next.py: require_post_norm=False): the patch Conv2d + bias, the position embedding and its
                    int64 position_ids, per layer qkv/out_proj and fc1/fc2 with biases (TP linears) and two
                    LayerNorms; LlavaMultiModalProjector linear_1 (text hidden, vision hidden x feature layers) and
                    linear_2 (text hidden, text hidden), Column/RowParallel with biases; image_newline
        pixtral_hf  pixtral.py PixtralHFVisionModel: patch_conv without bias, ln_pre, per layer qkv_proj, o_proj,
                    gate_up_proj, down_proj (TP linears, no biases) and two RMSNorms; transformers'
                    PixtralRotaryEmbedding inv_freq (patches per side^2, head_dim) f32; mistral3.py's projector: norm,
                    patch_merger.merging_layer (hidden, hidden x merge^2), linear_1 / linear_2 (Column/RowParallel)
        pixtral     pixtral.py VisionTransformer (Mistral's layout): the same tensors in nn.Linear, whole on every
                    GPU; pre_mm_projector_norm, PatchMerger, VisionLanguageAdapter w_in / w_out (nn.Linear)
        moonvit     moonvit.py MoonVitPretrainedModel: the patch Conv2d + bias, the learned (h, w) position
                    embedding, per layer wqkv/wo and fc0/fc1 with biases (TP linears) and two LayerNorms, the final
                    LayerNorm; kimi_vl.py KimiVLMultiModalProjector: pre_norm (LayerNorm), linear_1 (hidden x k^2,
                    hidden x k^2) and linear_2 (text hidden, hidden x k^2), ReplicatedLinear with biases"""
    v, d, K = facts.vision, facts.dtype_bytes, facts.hidden_size
    assert v is not None
    H, F = v.hidden_size, v.intermediate_size
    patch_in = v.num_channels * v.patch_size**2
    pb = v.projector_bias
    if v.kind == "llava":
        patches = (v.image_size // v.patch_size) ** 2
        layer = _encoder_layer(H, F, tp, d)
        once = [H * patch_in * d, H * d, patches * H * d, patches * 8,
                K // tp * v.projector_in * d, *([K // tp * d] if pb else []),
                K * (K // tp) * d, *([K * d] if pb else []), K * d]  # fmt: skip
        return layer * v.num_layers + once, (
            f"SigLIP vision encoder, {v.num_layers} layers of hidden {H}, MLP {F} (to the deepest feature layer, no "
            f"post-norm), + projector ({K}, {v.projector_in}) and ({K}, {K}), image_newline, {facts.dtype}, / TP {tp}"
        )
    if v.kind in ("pixtral_hf", "pixtral"):
        split = tp if v.kind == "pixtral_hf" else 1
        layer = [3 * H // split * H * d, H * (H // split) * d, 2 * F // split * H * d, H * (F // split) * d,
                 2 * H * d]  # fmt: skip
        side = v.image_size // v.patch_size
        merger = [H * v.projector_in * d] if v.merge > 1 else []
        norm = [H * d] if v.pre_norm else []
        once = [H * patch_in * d, H * d, *norm, *merger,
                K // split * H * d, *([K // split * d] if pb else []),
                K * (K // split) * d, *([K * d] if pb else [])]  # fmt: skip
        if v.kind == "pixtral_hf":
            once.append(side * side * (H // v.num_heads) * 4)
        where = "Hugging Face layout, TP linears" if v.kind == "pixtral_hf" else "Mistral's layout, nn.Linear"
        return layer * v.num_layers + once, (
            f"Pixtral vision encoder ({where}), {v.num_layers} layers of hidden {H}, gated MLP {F}, + patch merger "
            f"({H}, {v.projector_in}) and projector ({K}, {H}) and ({K}, {K}), {facts.dtype}, / {split}"
        )
    # moonvit
    layer = _encoder_layer(H, F, tp, d)
    M = v.projector_in
    once = [H * patch_in * d, H * d, v.pos_emb[0] * v.pos_emb[1] * H * d, 2 * H * d,
            2 * H * d, M * M * d, M * d, K * M * d, K * d]  # fmt: skip
    return layer * v.num_layers + once, (
        f"MoonViT vision encoder, {v.num_layers} layers of hidden {H}, MLP {F}, + projector ({M}, {M}) and ({K}, {M}) "
        f"replicated, {facts.dtype}, / TP {tp}"
    )


def weight_tensors(facts: ModelFacts, sharding: Sharding) -> list[tuple[int, int]]:
    """Every weight tensor one GPU allocates: (bytes, how many of it)."""
    return [(b, g.count) for g in _groups(facts, sharding) for b in g.tensors]


def weight_lines(facts: ModelFacts, sharding: Sharding, max_split: int | None = None) -> list[WeightLine]:
    """Every weight of the model on one GPU, grouped: one line per kind, with the layer count, and the caching
    allocator's rounding over all of them (`max_split`: the allocator's max_split_size while the model loads)."""
    groups = _groups(facts, sharding)
    lines = [WeightLine(g.name, sum(g.tensors) * g.count, g.source, g.count) for g in groups]
    tensors = weight_tensors(facts, sharding)
    excess = sum((allocator_block_bytes(b, max_split) - b) * n for b, n in tensors)
    split = "" if max_split is None else (f"; under max_split_size {max_split} B (the release's load), a request of at "
                                          "least that size holds its whole segment")  # fmt: skip
    lines.append(WeightLine("allocator rounding", excess,
                            f"torch's CUDA caching allocator over {sum(n for _, n in tensors)} weight tensors, each a "
                            "fresh allocation: 512 B rounding, and a whole 2 MiB-rounded segment where at most 1 MiB "
                            "would remain (c10/cuda/CUDACachingAllocator.cpp round_size, get_allocation_size, "
                            f"should_split){split}"))  # fmt: skip
    return lines


def rotary_cache_bytes(facts: ModelFacts) -> tuple[int, str]:
    """get_rope's cos_sin_cache, shared by every layer of one rope configuration: (positions, rotary_dim) in the
    model dtype (gpt-oss builds its rope in f32); partial rotary (GLM, MiniMax-M2, Qwen3-Next) caches rotary_dim
    columns; rope_scaling sets the positions (harness.sizing.model_config._rope_positions)."""
    rotary_dim = facts.qk_rope_head_dim if facts.is_mla else facts.rotary_dim or facts.head_dim
    caches = facts.rope_positions or (facts.max_position_embeddings or 0,)
    dtype = facts.rotary_dtype or facts.dtype
    width = 4 if dtype == "float32" else facts.dtype_bytes
    shapes = " + ".join(f"({positions}, {rotary_dim})" for positions in caches)
    # DeepSeek-V3.2's indexer builds its own rope, neox-style where the attention's is not (models/deepseek_v2.py
    # DeepseekV2MLAAttention: indexer_rope_emb = get_rope(..., is_neox_style=not indexer_rope_interleave)): get_rope
    # caches per configuration, so a second cos_sin_cache of the same shape
    copies = 2 if facts.index_head_dim else 1
    twice = " x 2 (the attention's and the sparse indexer's, neox-style)" if copies == 2 else ""
    return copies * sum(caches) * rotary_dim * width, (
        f"{facts.ref('rope_scaling', 'max_position_embeddings')}: cos_sin_cache {shapes} {dtype}{twice}, shared by "
        "the layers (get_rope's cache; rope_scaling's positions)")  # fmt: skip
