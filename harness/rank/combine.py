"""Combine: expert outputs back to the tokens' ranks, weighted by the top-k weights and summed per token."""

from __future__ import annotations

import torch
import torch.distributed as dist

from harness.rank.dispatch import DispatchBuffers, DispatchHandle, DispatchLayout, as_words


def combine(
    expert_out: torch.Tensor, handle: DispatchHandle, layout: DispatchLayout, buffers: DispatchBuffers
) -> torch.Tensor:
    """Return (num_tokens, K) in expert_out's dtype: sum over top-k slots of weight * expert output.

    expert_out: (E, M, K) bf16, the experts' `out` (a view of the policy's common workspace). The result is a
    view of buffers.combine_out, valid until the next combine.
    """
    E, M, K = layout.num_local_experts, layout.max_slots_per_expert, layout.hidden_size
    num_recv, num_send, n = handle.num_recv_rows, handle.num_send_rows, handle.num_tokens
    top_k = handle.topk_weights.shape[1]
    expert_side = buffers.combine_send[:num_recv]
    torch.index_select(as_words(expert_out.reshape(E * M, K)), 0, handle.recv_slot_index, out=as_words(expert_side))
    dp_side = buffers.combine_recv[:num_send]
    dist.all_to_all_single(
        dp_side, expert_side, output_split_sizes=handle.send_splits, input_split_sizes=handle.recv_splits
    )
    # Rows come back in the order this rank sent them; put them in (token, slot) order, then one batched
    # (1 x top_k) @ (top_k x K) product per token reduces them with float32 accumulation inside the GEMM.
    ordered = buffers.combine_ordered[:num_send]
    torch.index_select(as_words(dp_side), 0, handle.unsort, out=as_words(ordered))
    out = buffers.combine_out[:n]
    if n:
        weights = handle.topk_weights.to(ordered.dtype).view(n, 1, top_k)
        torch.bmm(weights, ordered.view(n, top_k, K), out=out.view(n, 1, K))
    return out
