"""Routing: per-token top-k expert ids and weights, seeded so every rank can regenerate every rank's choice.

Experts are numbered globally over the *physical* ranks: expert g lives on rank g // E. With emulated
dispatchers (P < D) only the P * E experts that exist are routed to; each rank sends D/P dispatchers' tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True, kw_only=True)
class Routing:
    """topk_ids (num_tokens, top_k) int64 global expert ids, distinct per token; topk_weights float32, rows sum to 1."""

    topk_ids: torch.Tensor
    topk_weights: torch.Tensor

    @property
    def num_tokens(self) -> int:
        return int(self.topk_ids.shape[0])

    def to(self, device: torch.device) -> Routing:
        """The same routing on `device`: moved once at setup, not in every dispatch."""
        return Routing(topk_ids=self.topk_ids.to(device), topk_weights=self.topk_weights.to(device))


def _generator(seed: int) -> torch.Generator:
    g = torch.Generator(device="cpu")
    g.manual_seed(seed)
    return g


def route(
    *, kind: str, num_tokens: int, num_experts: int, top_k: int, seed: int, zipf_exponent: float = 1.2
) -> Routing:
    """Route `num_tokens` tokens over `num_experts` global experts, `top_k` distinct each.

    kind: "uniform" (every expert equally likely), "skewed" (popularity ~ 1 / rank^zipf_exponent over a
    seeded permutation, so hot experts land on different ranks per seed), "worst-case" (every token picks
    expert 0, so expert 0 of rank 0 receives every token of every rank: T * D = M when all D dispatch).
    Generated on CPU so the result does not depend on the device.
    """
    if top_k > num_experts:
        raise ValueError(f"top_k ({top_k}) is larger than the experts ({num_experts})")
    g = _generator(seed)
    if num_tokens == 0:
        empty = torch.empty((0, top_k), dtype=torch.int64)
        return Routing(topk_ids=empty, topk_weights=torch.empty((0, top_k), dtype=torch.float32))
    if kind == "uniform":
        scores = torch.rand((num_tokens, num_experts), generator=g)
        ids = scores.topk(top_k, dim=-1).indices
    elif kind == "skewed":
        popularity = 1.0 / torch.arange(1, num_experts + 1, dtype=torch.float64) ** zipf_exponent
        popularity = popularity[torch.randperm(num_experts, generator=g)]
        ids = torch.multinomial(popularity.expand(num_tokens, -1), top_k, replacement=False, generator=g)
    elif kind == "worst-case":
        rest = torch.rand((num_tokens, num_experts - 1), generator=g).topk(top_k - 1, dim=-1).indices + 1
        ids = torch.cat([torch.zeros((num_tokens, 1), dtype=torch.int64), rest], dim=1)
    else:
        raise ValueError(f"routing kind {kind!r} is not one of uniform, skewed, worst-case")
    logits = torch.randn((num_tokens, top_k), generator=g)
    weights = torch.softmax(logits, dim=-1)
    return Routing(topk_ids=ids.to(torch.int64), topk_weights=weights.float())
