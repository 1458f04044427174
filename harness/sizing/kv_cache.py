"""The KV cache vLLM makes of the memory left: bytes per token, blocks, tokens and concurrency (exact).

    bytes per token   GQA: layers x 2 (K and V) x KV heads per GPU x head_dim x dtype
                      MLA: layers x (kv_lora_rank + qk_rope_head_dim) x dtype (the latent, not split by TP);
                      DeepSeek-V3.2 adds its indexer's key cache, 132 B a token a layer (deepseek_v2.py
                      DeepseekV32IndexerCache: index_head_dim fp8 + an f32 scale per 128), and with an fp8 cache
                      FlashMLA sparse's fp8_ds_mla page of 656 B a token (kv_cache_interface.py MLAAttentionSpec)
    one KV type       num_blocks = available // (block_size x bytes per token)   (v1/core/kv_cache_utils.py
                      get_kv_cache_config_from_groups: available // page_size // num_layers, or over the summed
                      pages of UniformTypeKVCacheSpecs when the layers' pages differ)
                      tokens = num_blocks x block_size                         ("GPU KV cache size: N tokens")
    hybrid            sliding-window and full layers (gpt-oss, Gemma 2/3), or full and linear-attention layers
                      (Qwen3-Next): vLLM's hybrid KV cache manager (_get_kv_cache_groups_uniform_page_size) makes
                      groups of group_size layers (the fewest layers of one type, or the most when they differ by
                      less than 1.5x), ceil(n / group_size) groups per type; each of the group_size pools holds
                      one page per block for one layer of every group:
                      num_blocks = available // page_size // group_size. A linear-attention layer's page is its
                      state (conv + temporal, mamba_utils.py gated_delta_net_state_shape), padded to the attention
                      page (MambaSpec page_size_padded), and the attention block size grows to hold it:
                      16 x ceil(state / (16 x attention bytes per token)) (0.19.0: model_executor/models/config.py
                      HybridAttentionMambaModelConfig.verify_and_update_config; 0.26.0: platforms/interface.py
                      Platform._align_hybrid_block_size, its branch for mamba_cache_mode "none", which a hybrid model
                      runs: engine/arg_utils.py turns prefix caching off by default for is_hybrid models)
    printed tokens    0.19.0: num_blocks // groups x the smallest block size (kv_cache_utils.py
                      _report_kv_cache_config); 0.26.0: int(max_concurrency x max_model_len) (kv_cache_utils.py
                      get_kv_cache_configs -> get_kv_cache_capacity), which for a uniform model is the same figure
                      where block_size divides max_model_len, and for a hybrid one counts each request's blocks in
                      every group (a linear-attention group holds one block a request)
    one request       blocks per request: full ceil(L / block), sliding ceil(min(window - 1 + T, L) / block) + 1,
                      chunked ceil(min(chunk + T, L) / block), linear 1 (kv_cache_interface.py
                      max_memory_usage_bytes), summed over the groups; T is max_num_batched_tokens in 0.19.0 and
                      VllmConfig.max_in_flight_tokens in 0.26.0 (in_flight_tokens)
    concurrency       num_blocks / blocks per request                          ("Maximum concurrency for L tokens";
                      kv_cache_utils.py get_max_concurrency_for_kv_cache_config: cdiv of the summed
                      max_memory_usage_bytes of the groups' specs by one block's bytes, MambaSpec's one page a
                      request where mamba_cache_mode is "none")
    fails             when one request's blocks do not fit                     (vLLM's "To serve at least one request")

Llama-4's chunked local attention layers are a KV type of their own (ChunkedLocalAttentionSpec: a request holds
ceil(min(chunk + T, L) / block) blocks of them), as the hybrid manager runs them where
VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE is on (config/vllm.py; the published 0.19.0 log of
Llama-4-Scout shows its 4 groups: 365,968 tokens of 91,495 blocks).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from harness.sizing.deployment_weights import kv_heads_per_rank
from harness.sizing.model_config import ModelFacts

KV_DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4, "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1}
# CacheConfig.DEFAULT_BLOCK_SIZE. MLA on Hopper runs FlashAttention MLA first (16-token pages: DeepSeek-V2-Lite's
# published 0.19.0 log has 94097 blocks for 1,505,552 tokens); FlashMLA needs 64 (--block-size 64).
DEFAULT_BLOCK_SIZE = 16
FLASHMLA_SPARSE_BLOCK = 64  # DeepSeek-V3.2's sparse MLA backend (flashmla_sparse.py): 64-token pages only
FP8_DS_MLA_BYTES = 656  # kv_cache_interface.py MLAAttentionSpec: fp8_ds_mla's page is block_size x 656
KERNEL_BLOCK_ALIGNMENT = 16  # FlashAttention's supported kernel block sizes: multiples of 16
# The first release (of those read) whose "GPU KV cache size" is int(max_concurrency x max_model_len)
# (0.26.0's v1/core/kv_cache_utils.py get_kv_cache_capacity) and whose window and chunk specs count
# max_in_flight_tokens; 0.19.0's _report_kv_cache_config printed num_blocks // len(kv_cache_groups) x min block
# size. The releases between were not read: they take 0.19.0's.
CONCURRENCY_TOKENS_FROM = (0, 26, 0)


def in_flight_tokens(version: str | None, max_num_batched_tokens: int, *, pp: int, v2_runner: bool) -> int:
    """T of a sliding-window or chunked request's blocks. 0.26.0: VllmConfig.max_in_flight_tokens (config/vllm.py)
    = max_concurrent_batches x max_num_batched_tokens, with async scheduling on by default (VllmConfig
    __post_init__: async_scheduling None -> True for a generate model without speculative decoding): PP + 1 batches
    on the V2 runner, 2 on the V1 runner at PP 1, else PP. 0.19.0 (SlidingWindowSpec/ChunkedLocalAttentionSpec
    max_memory_usage_bytes): max_num_batched_tokens."""
    from harness.sizing.release_defaults import _release_key

    if _release_key(version) < CONCURRENCY_TOKENS_FROM:
        return max_num_batched_tokens
    batches = pp + 1 if v2_runner else (2 if pp <= 1 else pp)
    return batches * max_num_batched_tokens


def tokens_from_concurrency(version: str | None) -> bool:
    """Whether `version` prints its KV tokens as int(max_concurrency x max_model_len) (no version: the newest)."""
    from harness.sizing.release_defaults import _release_key

    return _release_key(version) >= CONCURRENCY_TOKENS_FROM


def indexer_bytes_per_token(facts: ModelFacts) -> int:
    """DeepSeek-V3.2's indexer key cache per token per layer: fp8 keys + an f32 scale per 128 values."""
    return facts.index_head_dim + facts.index_head_dim // 128 * 4 if facts.index_head_dim else 0


@dataclass(frozen=True)
class KvShape:
    bytes_per_token: int  # every attention layer's KV bytes per token on one GPU
    per_layer_bytes_per_token: int  # one attention layer's (the page unit)
    num_layers: int  # layers with a KV page (attention, and linear attention's state)
    dtype: str
    formula: str
    kinds: tuple[str, ...] = ()  # per layer: full | sliding | chunked | linear; () when every layer is full attention
    sliding_window: int = 0
    attention_chunk_size: int = 0
    state_bytes: int = 0  # one linear-attention layer's state per request (conv + temporal)
    required_block_size: int = 0  # a backend that takes one block size only (FlashMLA sparse: 64)


def kv_dtype(facts: ModelFacts, kv_cache_dtype: str) -> str:
    return facts.dtype if kv_cache_dtype == "auto" else kv_cache_dtype


def linear_state_bytes(facts: ModelFacts, tp: int) -> tuple[int, str]:
    """Qwen3-Next's gated delta net state per request per layer (mamba_utils.py gated_delta_net_state_shape):
    conv (conv_kernel - 1, conv_dim / TP) and temporal (value heads / TP, head_k_dim, head_v_dim), both in the
    model dtype (mamba_ssm_cache_dtype auto)."""
    conv_dim = 2 * facts.linear_num_key_heads * facts.linear_key_head_dim + \
        facts.linear_num_value_heads * facts.linear_value_head_dim  # fmt: skip
    conv = (facts.linear_conv_kernel_dim - 1) * (conv_dim // tp)
    temporal = facts.linear_num_value_heads // tp * facts.linear_key_head_dim * facts.linear_value_head_dim
    how = (
        f"conv ({facts.linear_conv_kernel_dim - 1}, {conv_dim // tp}) + temporal "
        f"({facts.linear_num_value_heads // tp}, {facts.linear_key_head_dim}, {facts.linear_value_head_dim})"
    )
    return (conv + temporal) * facts.dtype_bytes, how


def kv_shape(facts: ModelFacts, tp: int, kv_cache_dtype: str = "auto") -> KvShape:
    dtype = kv_dtype(facts, kv_cache_dtype)
    width = KV_DTYPE_BYTES[dtype]
    layers = facts.num_hidden_layers
    if facts.is_mla:
        latent = facts.kv_lora_rank + facts.qk_rope_head_dim
        index = indexer_bytes_per_token(facts)
        per_layer = (FP8_DS_MLA_BYTES if index and width == 1 else latent * width) + index
        formula = (f"{layers} MLA layers x ({facts.kv_lora_rank} kv_lora_rank + {facts.qk_rope_head_dim} "
                   f"qk_rope_head_dim) x {width} B ({dtype}; the latent is not split by TP)")  # fmt: skip
        if index:
            formula = (f"{layers} MLA layers x ({'656 B fp8_ds_mla' if width == 1 else f'{latent} x {width} B'} + "
                       f"{index} B indexer keys) ({dtype}; sparse MLA, 64-token blocks)")  # fmt: skip
        return KvShape(per_layer * layers, per_layer, layers, dtype, formula,
                       required_block_size=FLASHMLA_SPARSE_BLOCK if index else 0)  # fmt: skip
    kv = kv_heads_per_rank(facts, tp)
    per_layer = 2 * kv * facts.head_dim * width
    kinds = facts.kinds
    attention = sum(1 for k in kinds if k != "linear")
    formula = (f"{attention} layers x 2 x {kv} KV heads per GPU (of {facts.num_key_value_heads}, TP {tp}) x "
               f"{facts.head_dim} head_dim x {width} B ({dtype})")  # fmt: skip
    state = 0
    if "sliding" in kinds:
        formula += f"; {kinds.count('sliding')} of them sliding-window ({facts.sliding_window} tokens)"
    if "chunked" in kinds:
        formula += f"; {kinds.count('chunked')} of them chunked local ({facts.attention_chunk_size} tokens)"
    if "linear" in kinds:
        state, how = linear_state_bytes(facts, tp)
        formula += f"; + {kinds.count('linear')} linear-attention layers' state {state} B a request ({how})"
    return KvShape(per_layer * attention, per_layer, layers if state else attention, dtype, formula,
                   kinds=kinds if len(set(kinds)) > 1 or kinds[0] != "full" else (),
                   sliding_window=facts.sliding_window, attention_chunk_size=facts.attention_chunk_size,
                   state_bytes=state)  # fmt: skip


@dataclass(frozen=True)
class KvCache:
    available_bytes: int
    block_size: int
    num_blocks: int
    max_model_len: int
    groups: int = 1  # KV cache groups (hybrid models: one per group of group_size layers)
    group_size: int = 0  # layers per group (0: one KV type)
    page_bytes: int = 0  # one layer's page (hybrid)
    request_blocks: int = 0  # blocks one max_model_len request takes, over every group (0: ceil(L / block))
    bytes: int = 0  # the KV cache allocated
    concurrency_tokens: bool = False  # the printed tokens are int(concurrency x max_model_len) (0.26.0 on)

    @property
    def tokens(self) -> int:
        if self.concurrency_tokens:
            # v1/core/kv_cache_utils.py get_kv_cache_capacity: int(max_concurrency * max_model_len), the float
            # max_concurrency = num_blocks / num_block_per_request (get_max_concurrency_for_kv_cache_config)
            return int(self.num_blocks / self.blocks_per_request * self.max_model_len)
        return self.num_blocks // self.groups * self.block_size

    @property
    def blocks_per_request(self) -> int:
        return self.request_blocks or math.ceil(self.max_model_len / self.block_size)

    @property
    def concurrency(self) -> float:
        return self.num_blocks / self.blocks_per_request

    @property
    def holds_one_request(self) -> bool:
        return self.num_blocks >= self.blocks_per_request


def _request_blocks(kind: str, shape: KvShape, block: int, max_model_len: int, batched: int) -> int:
    if kind == "sliding":
        return math.ceil(min(shape.sliding_window - 1 + batched, max_model_len) / block) + 1
    if kind == "chunked":
        return math.ceil(min(shape.attention_chunk_size + batched, max_model_len) / block)
    if kind == "linear":
        return 1
    return math.ceil(max_model_len / block)


# The block size vLLM runs an MLA model with when --block-size is not given: Platform.update_block_size_for_backend
# (0.19.0 platforms/interface.py:427, 0.26.0 :609) takes the chosen backend's get_preferred_block_size: 16 where the
# backend takes it (FLASH_ATTN_MLA and TRITON_MLA: MultipleOf(16)), else its smallest size (FLASHMLA and both sparse
# backends: 64, FLASHINFER_MLA: 32, CUTLASS_MLA: 128). The backend is the first of platforms/cuda.py's MLA priorities
# the GPU and KV dtype allow: compute capability 10.x FLASHINFER_MLA; 9.x FLASH_ATTN_MLA (16-bit KV only) then
# FLASHMLA; others TRITON_MLA; DeepSeek-V3.2's sparse attention FLASH_ATTN_MLA_SPARSE or FLASHMLA_SPARSE.
MLA_PREFERRED_BLOCK = {
    "FLASH_ATTN_MLA": 16,
    "TRITON_MLA": 16,
    "FLASHMLA": 64,
    "FLASHINFER_MLA": 32,
    "FLASHMLA_SPARSE": FLASHMLA_SPARSE_BLOCK,
}


def mla_backend(facts: ModelFacts, capability: int, kv_cache_dtype: str = "auto") -> str:
    """The MLA attention backend vLLM picks on a GPU of this compute capability (major), as above."""
    if indexer_bytes_per_token(facts):
        return "FLASHMLA_SPARSE"  # FLASH_ATTN_MLA_SPARSE on 9.x with a 16-bit cache: the same 64-token pages
    if capability == 10:
        return "FLASHINFER_MLA"
    if capability == 9:
        return "FLASH_ATTN_MLA" if KV_DTYPE_BYTES[kv_dtype(facts, kv_cache_dtype)] == 2 else "FLASHMLA"
    return "TRITON_MLA"


def default_block_size(facts: ModelFacts, capability: int, kv_cache_dtype: str = "auto") -> tuple[int, str]:
    """--block-size when the serve line gives none, and why."""
    if not facts.is_mla:
        return DEFAULT_BLOCK_SIZE, "table: CacheConfig.DEFAULT_BLOCK_SIZE 16 (FlashAttention)"
    backend = mla_backend(facts, capability, kv_cache_dtype)
    return MLA_PREFERRED_BLOCK[backend], (
        f"the MLA backend's preferred block size: {backend} on compute capability {capability}.x "
        "(platforms/cuda.py priorities; Platform.update_block_size_for_backend, "
        "AttentionBackend.get_preferred_block_size)"
    )


def effective_block_size(shape: KvShape, block_size: int) -> int:
    """The block size vLLM runs: the backend's one size (FlashMLA sparse), or one grown so an attention page holds
    a linear-attention layer's state (HybridAttentionMambaModelConfig.verify_and_update_config)."""
    if shape.required_block_size:
        return shape.required_block_size
    if shape.state_bytes:
        align = KERNEL_BLOCK_ALIGNMENT
        needed = align * math.ceil(shape.state_bytes / (align * shape.per_layer_bytes_per_token))
        return max(block_size, needed)
    return block_size


def kv_cache(shape: KvShape, available_bytes: int, block_size: int, max_model_len: int,
             max_num_batched_tokens: int = 8192, *, concurrency_tokens: bool = False) -> KvCache:  # fmt: skip
    """The cache vLLM makes of `available_bytes`; concurrency_tokens: the release prints its tokens as
    int(concurrency x max_model_len) (tokens_from_concurrency), else as 0.19.0 did."""
    cache = _kv_cache(shape, available_bytes, block_size, max_model_len, max_num_batched_tokens)
    return dataclasses.replace(cache, concurrency_tokens=concurrency_tokens)


def _kv_cache(shape: KvShape, available_bytes: int, block_size: int, max_model_len: int,
              max_num_batched_tokens: int) -> KvCache:  # fmt: skip
    available = max(0, available_bytes)
    block = effective_block_size(shape, block_size)
    if not shape.kinds:
        page = block * shape.per_layer_bytes_per_token
        blocks = int(available // page // shape.num_layers)
        return KvCache(available_bytes=available_bytes, block_size=block, num_blocks=blocks,
                       max_model_len=max_model_len, bytes=blocks * page * shape.num_layers)  # fmt: skip
    counts = {kind: shape.kinds.count(kind) for kind in dict.fromkeys(shape.kinds)}
    page = block * shape.per_layer_bytes_per_token
    if len(counts) == 1:  # one type, e.g. every layer sliding-window (UniformTypeKVCacheSpecs)
        kind, layers = next(iter(counts.items()))
        blocks = int(available // page // layers)
        need = _request_blocks(kind, shape, block, max_model_len, max_num_batched_tokens)
        return KvCache(available_bytes=available_bytes, block_size=block, num_blocks=blocks,
                       max_model_len=max_model_len, request_blocks=need, bytes=blocks * page * layers)  # fmt: skip
    smallest, largest = min(counts.values()), max(counts.values())
    group_size = largest if largest < smallest * 1.5 else smallest
    groups = {kind: math.ceil(n / group_size) for kind, n in counts.items()}
    blocks = int(available // page // group_size)
    need = sum(g * _request_blocks(k, shape, block, max_model_len, max_num_batched_tokens) for k, g in groups.items())
    return KvCache(available_bytes=available_bytes, block_size=block, num_blocks=blocks, max_model_len=max_model_len,
                   groups=sum(groups.values()), group_size=group_size, page_bytes=page, request_blocks=need,
                   bytes=blocks * page * group_size)  # fmt: skip
