"""Combine: expert outputs back to the tokens' ranks, weighted by the top-k weights and summed per token."""

from __future__ import annotations

import torch
import torch.distributed as dist

from harness.dispatch import DispatchBuffers, DispatchHandle, DispatchLayout

COMBINE_CHUNK_ROWS = 4096


def combine(
    expert_out: torch.Tensor, handle: DispatchHandle, layout: DispatchLayout, buffers: DispatchBuffers
) -> torch.Tensor:
    """Return (num_tokens, K) in expert_out's dtype: sum over top-k slots of weight * expert output.

    expert_out: (E, M, K) bf16, the experts' `out` (a view of the policy's common workspace).
    """
    E, M, K = layout.num_local_experts, layout.max_slots_per_expert, layout.hidden_size
    num_recv, num_send = handle.num_recv_rows, handle.num_send_rows
    expert_side = buffers.combine_send[:num_recv]
    torch.index_select(expert_out.reshape(E * M, K), 0, handle.recv_slot_index, out=expert_side)
    dp_side = buffers.combine_recv[:num_send]
    dist.all_to_all_single(
        dp_side, expert_side, output_split_sizes=handle.send_splits, input_split_sizes=handle.recv_splits
    )
    # Rows come back in the order this rank sent them: row j belongs to flat (token, slot) send_order[j].
    weights = handle.topk_weights.reshape(-1).index_select(0, handle.send_order)
    token = torch.div(handle.send_order, handle.topk_weights.shape[1], rounding_mode="floor")
    acc = buffers.combine_out[: handle.num_tokens]
    acc.zero_()
    # Chunked so the float32 weighted rows stay a small transient next to the buffers.
    for start in range(0, num_send, COMBINE_CHUNK_ROWS):
        end = min(start + COMBINE_CHUNK_ROWS, num_send)
        acc.index_add_(0, token[start:end], dp_side[start:end].float() * weights[start:end].unsqueeze(1))
    return acc.to(expert_out.dtype)
