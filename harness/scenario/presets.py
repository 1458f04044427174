"""Model presets: the MoE shapes of real models, from their configs (docs/adding-a-model-or-backend.md)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class ModelPreset:
    name: str
    hidden_size: int  # K
    intermediate_size: int  # I (moe_intermediate_size)
    num_experts: int  # routed experts; shared experts do not go through the batched path
    top_k: int
    activation: str = "silu"


PRESETS: dict[str, ModelPreset] = {
    p.name: p
    for p in (
        ModelPreset(name="deepseek-v3", hidden_size=7168, intermediate_size=2048, num_experts=256, top_k=8),
        ModelPreset(name="deepseek-r1", hidden_size=7168, intermediate_size=2048, num_experts=256, top_k=8),
        ModelPreset(name="kimi-k2", hidden_size=7168, intermediate_size=2048, num_experts=384, top_k=8),
        ModelPreset(name="qwen3-235b-a22b", hidden_size=4096, intermediate_size=1536, num_experts=128, top_k=8),
        ModelPreset(name="qwen3-30b-a3b", hidden_size=2048, intermediate_size=768, num_experts=128, top_k=8),
        ModelPreset(name="mixtral-8x7b", hidden_size=4096, intermediate_size=14336, num_experts=8, top_k=2),
        ModelPreset(name="mixtral-8x22b", hidden_size=6144, intermediate_size=16384, num_experts=8, top_k=2),
        ModelPreset(name="llama-4-maverick", hidden_size=5120, intermediate_size=8192, num_experts=128, top_k=1),
    )
}
