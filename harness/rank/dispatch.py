"""Quantize-dispatch: FP8 tokens to the ranks that hold their experts, into the batched-experts format vLLM's
BatchedExperts classes take (the format DeepEP low-latency produces for them):

    expert_x          (E, M, K)  float8_e4m3fn   slot j of expert e holds the j-th token routed to it
    expert_x_scale    (E, M, 1)  float32         per-token scales
    expert_num_tokens (E,)       int32           valid slots per expert, kept on the device

The comm backend (harness.rank.comm: symm-mem, nccl, gloo) owns the buffers, allocated once at full capacity,
and the exchange; every slot also records its source rank and token (expert_src) so each can be traced.
"""

from __future__ import annotations

import torch

from harness.rank.comm import Comm, DispatchError, DispatchHandle, DispatchLayout, Quantize, Stages, as_words
from harness.rank.quant import quantize_per_token
from harness.rank.route import Routing

__all__ = ["DispatchError", "DispatchHandle", "DispatchLayout", "Quantize", "as_words", "dispatch"]


def dispatch(
    tokens: torch.Tensor,
    routing: Routing,
    layout: DispatchLayout,
    comm: Comm,
    quantize: Quantize = quantize_per_token,
    *,
    stages: Stages | None = None,
) -> DispatchHandle:
    """Quantize and send this rank's tokens; fill comm.expert_x / expert_x_scale / expert_num_tokens.

    tokens: (num_tokens, K) bf16 on the rank's device; routing.topk_ids: (num_tokens, top_k) int64 global expert
    ids over the P * E physical experts, topk_weights (num_tokens, top_k) float32. `quantize` maps (n, K) bf16 to
    (FP8 (n, K), float32 scales (n, 1)); the vllm-ops backend passes vLLM's own per-token kernel. `stages`
    collects sub-stage times (bench). Raises DispatchError when num_tokens exceeds the rank's capacity.
    """
    if layout is not comm.layout and layout != comm.layout:
        raise ValueError("dispatch: the layout differs from the one the comm buffers were allocated for")
    device = tokens.device
    return comm.dispatch(
        tokens, routing.topk_ids.to(device), routing.topk_weights.to(device), quantize, stages or Stages()
    )
