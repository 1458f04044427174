"""The KV cache vLLM makes of the memory left: bytes per token, blocks, tokens and concurrency (exact).

bytes per token   GQA: layers x 2 (K and V) x KV heads per GPU x head_dim x dtype
                  MLA: layers x (kv_lora_rank + qk_rope_head_dim) x dtype (the latent, not split by TP)
num_blocks        available // (block_size x bytes per token)        (v1/core/kv_cache_utils.py: available //
                                                                      page_size // num_layers)
tokens            num_blocks x block_size                             ("GPU KV cache size: N tokens")
concurrency       num_blocks / ceil(max_model_len / block_size)       ("Maximum concurrency for L tokens")
one request       fails when ceil(L / block_size) blocks do not fit   (vLLM's "To serve at least one request")
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from harness.sizing.deployment_weights import kv_heads_per_rank
from harness.sizing.model_config import ModelFacts

KV_DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1}
# CacheConfig.DEFAULT_BLOCK_SIZE. MLA on Hopper runs FlashAttention MLA first (16-token pages: DeepSeek-V2-Lite's
# published 0.19.0 log has 94097 blocks for 1,505,552 tokens); FlashMLA needs 64 (--block-size 64).
DEFAULT_BLOCK_SIZE = 16


@dataclass(frozen=True)
class KvShape:
    bytes_per_token: int
    per_layer_bytes_per_token: int
    num_layers: int
    dtype: str
    formula: str


def kv_dtype(facts: ModelFacts, kv_cache_dtype: str) -> str:
    return facts.dtype if kv_cache_dtype == "auto" else kv_cache_dtype


def kv_shape(facts: ModelFacts, tp: int, kv_cache_dtype: str = "auto") -> KvShape:
    dtype = kv_dtype(facts, kv_cache_dtype)
    width = KV_DTYPE_BYTES[dtype]
    layers = facts.num_hidden_layers
    if facts.is_mla:
        per_layer = (facts.kv_lora_rank + facts.qk_rope_head_dim) * width
        formula = (f"{layers} MLA layers x ({facts.kv_lora_rank} kv_lora_rank + {facts.qk_rope_head_dim} "
                   f"qk_rope_head_dim) x {width} B ({dtype}; the latent is not split by TP)")  # fmt: skip
    else:
        kv = kv_heads_per_rank(facts, tp)
        per_layer = 2 * kv * facts.head_dim * width
        formula = (f"{layers} layers x 2 x {kv} KV heads per GPU (of {facts.num_key_value_heads}, TP {tp}) x "
                   f"{facts.head_dim} head_dim x {width} B ({dtype})")  # fmt: skip
    return KvShape(per_layer * layers, per_layer, layers, dtype, formula)


@dataclass(frozen=True)
class KvCache:
    available_bytes: int
    block_size: int
    num_blocks: int
    max_model_len: int

    @property
    def tokens(self) -> int:
        return self.num_blocks * self.block_size

    @property
    def blocks_per_request(self) -> int:
        return math.ceil(self.max_model_len / self.block_size)

    @property
    def concurrency(self) -> float:
        return self.num_blocks / self.blocks_per_request

    @property
    def holds_one_request(self) -> bool:
        return self.num_blocks >= self.blocks_per_request


def kv_cache(shape: KvShape, available_bytes: int, block_size: int, max_model_len: int) -> KvCache:
    page = block_size * shape.per_layer_bytes_per_token
    blocks = max(0, available_bytes) // page // shape.num_layers
    return KvCache(available_bytes=available_bytes, block_size=block_size, num_blocks=int(blocks),
                   max_model_len=max_model_len)  # fmt: skip
