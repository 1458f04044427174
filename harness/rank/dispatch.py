"""Quantize-dispatch: FP8 tokens to the ranks that hold their experts, packed into the batched buffer.

Each rank quantizes its tokens per token, sends one row per (token, top-k slot) to the rank that holds the
expert, and the receiver packs the rows into the batched-experts format vLLM's BatchedExperts classes take:

    expert_x          (E, M, K)  float8_e4m3fn   slot j of expert e holds the j-th token routed to it
    expert_x_scale    (E, M, 1)  float32         per-token scales
    expert_num_tokens (E,)       int32           valid slots per expert

A row on the wire is K bytes of FP8 (as uint8), with four int32/float32 words beside it in a second tensor:
scale, local expert, source token, source rank (kept for tracing every slot back to its sender). Exchange:
`all_to_all_single` of the counts, then of the rows and of their words: NCCL on GPU, gloo on CPU. Keeping the
FP8 rows contiguous lets the gather on the sender and the scatter on the receiver each be one pass.
Buffers are allocated once, as EP kernels do.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist

from harness.rank.memory import Accountant
from harness.rank.quant import FP8_DTYPE, quantize_per_token
from harness.rank.route import Routing

META_WORDS = 4  # scale, local expert, source token, source rank


def as_words(rows: torch.Tensor) -> torch.Tensor:
    """The same rows viewed as int64 words where the row size allows: row gathers and scatters then move 8 bytes
    per element instead of 1 (on GPU the uint8 form was several times slower)."""
    row_bytes = rows.shape[-1] * rows.element_size()
    if rows.dim() == 2 and rows.stride(-1) == 1 and row_bytes % 8 == 0 and rows.is_contiguous():
        return rows.view(torch.uint8).view(torch.int64)
    return rows


class DispatchError(Exception):
    """A configuration error in what a rank was asked to dispatch."""


@dataclass(frozen=True, kw_only=True)
class DispatchLayout:
    """Sizes of one rank's dispatch, in the letters of shared/DESIGN.md."""

    num_ranks: int  # P
    rank: int
    num_local_experts: int  # E
    max_slots_per_expert: int  # M = T * D
    hidden_size: int  # K
    top_k: int
    max_tokens: int  # this rank's capacity: T * D / P dispatchers' worth
    # Tokens the comm buffers are sized for: the most any rank routes in this run. The capacity T*D/P bounds the
    # batched buffer's M; the send side of a real rank holds only what it routes (at vLLM's default T = 8192
    # with D/P = 32 emulated dispatchers, capacity-sized send buffers alone would need over 100 GB).
    num_buffer_tokens: int | None = None

    @property
    def buffer_tokens(self) -> int:
        return self.max_tokens if self.num_buffer_tokens is None else self.num_buffer_tokens

    @property
    def row_bytes(self) -> int:
        """Bytes on the wire per (token, slot): the FP8 row and its words."""
        return self.hidden_size + 4 * META_WORDS

    @property
    def max_send_rows(self) -> int:
        return self.buffer_tokens * self.top_k

    @property
    def max_recv_rows(self) -> int:
        # Every sender routes at most buffer_tokens * top_k rows; no expert can hold more than M.
        return min(self.num_ranks * self.buffer_tokens * self.top_k, self.num_local_experts * self.max_slots_per_expert)


@dataclass(frozen=True, kw_only=True)
class DispatchBuffers:
    """Receive and send buffers of both all-to-alls, allocated once."""

    send_x: torch.Tensor  # (max_send_rows, K) uint8 view of FP8, dp side
    send_meta: torch.Tensor  # (max_send_rows, META_WORDS) int32, dp side
    recv_x: torch.Tensor  # (max_recv_rows, K) uint8, expert side
    recv_meta: torch.Tensor  # (max_recv_rows, META_WORDS) int32, expert side
    expert_x: torch.Tensor  # (E, M, K) fp8
    expert_x_scale: torch.Tensor  # (E, M, 1) float32
    expert_src: torch.Tensor  # (E, M, 2) int32: source rank, source token of each slot
    expert_num_tokens: torch.Tensor  # (E,) int32
    combine_send: torch.Tensor  # (max_recv_rows, K) bf16, expert side
    combine_recv: torch.Tensor  # (max_send_rows, K) bf16, dp side, in the order rows were sent
    combine_ordered: torch.Tensor  # (max_send_rows, K) bf16, dp side, in (token, slot) order
    combine_out: torch.Tensor  # (buffer_tokens, K) bf16, dp side: the layer's output

    @staticmethod
    def allocate(layout: DispatchLayout, accountant: Accountant, *, out_dtype: torch.dtype) -> DispatchBuffers:
        E, M, K = layout.num_local_experts, layout.max_slots_per_expert, layout.hidden_size
        a = accountant.alloc
        return DispatchBuffers(
            send_x=a("dispatch", (layout.max_send_rows, K), torch.uint8),
            send_meta=a("dispatch", (layout.max_send_rows, META_WORDS), torch.int32),
            recv_x=a("dispatch", (layout.max_recv_rows, K), torch.uint8),
            recv_meta=a("dispatch", (layout.max_recv_rows, META_WORDS), torch.int32),
            expert_x=a("dispatch", (E, M, K), FP8_DTYPE),
            expert_x_scale=a("dispatch", (E, M, 1), torch.float32),
            expert_src=a("dispatch", (E, M, 2), torch.int32),
            expert_num_tokens=a("dispatch", (E,), torch.int32),
            combine_send=a("combine", (layout.max_recv_rows, K), out_dtype),
            combine_recv=a("combine", (layout.max_send_rows, K), out_dtype),
            combine_ordered=a("combine", (layout.max_send_rows, K), out_dtype),
            combine_out=a("combine", (layout.buffer_tokens, K), out_dtype),
        )


@dataclass(frozen=True, kw_only=True)
class DispatchHandle:
    """What combine needs to send results back and reduce them; produced by `dispatch`."""

    num_tokens: int
    send_order: torch.Tensor  # (num_send_rows,) int64: flat (token * top_k + slot) index of each sent row
    unsort: torch.Tensor  # (num_send_rows,) int64: position in send order of flat index f
    send_splits: list[int]  # rows this rank sent to each rank
    recv_splits: list[int]  # rows this rank received from each rank
    recv_slot_index: torch.Tensor  # (num_recv_rows,) int64: e * M + slot of each received row
    topk_weights: torch.Tensor  # (num_tokens, top_k) float32

    @property
    def num_send_rows(self) -> int:
        return sum(self.send_splits)

    @property
    def num_recv_rows(self) -> int:
        return sum(self.recv_splits)


def _all_to_all_counts(send_counts: torch.Tensor) -> torch.Tensor:
    recv_counts = torch.empty_like(send_counts)
    dist.all_to_all_single(recv_counts, send_counts)
    return recv_counts


Quantize = Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


def dispatch(
    tokens: torch.Tensor, routing: Routing, layout: DispatchLayout, buffers: DispatchBuffers,
    quantize: Quantize = quantize_per_token,
) -> DispatchHandle:
    """Quantize and send this rank's tokens; fill buffers.expert_x / expert_x_scale / expert_num_tokens.

    tokens: (num_tokens, K) bf16 on the rank's device; routing.topk_ids: (num_tokens, top_k) global expert
    ids over the P * E physical experts. `quantize` maps (n, K) bf16 to (FP8 (n, K), float32 scales (n, 1)); the
    vllm-ops backend passes vLLM's own per-token kernel. Raises DispatchError when num_tokens exceeds the
    rank's capacity.
    """
    num_tokens, K = tokens.shape
    if num_tokens > layout.max_tokens:
        raise DispatchError(
            f"rank {layout.rank} was handed {num_tokens} tokens, more than its capacity of {layout.max_tokens} "
            "(max_tokens_per_rank T x D/P dispatchers); the batched buffer's M assumes no dispatcher exceeds T"
        )
    if num_tokens > layout.buffer_tokens:
        raise DispatchError(
            f"rank {layout.rank} was handed {num_tokens} tokens; its buffers were sized for {layout.buffer_tokens}"
        )
    E, M, P = layout.num_local_experts, layout.max_slots_per_expert, layout.num_ranks
    device = tokens.device
    topk_ids = routing.topk_ids.to(device)

    # Dp side: one row per (token, slot), grouped by destination rank (stable, so the order is reproducible).
    flat_expert = topk_ids.reshape(-1)
    dest_rank = torch.div(flat_expert, E, rounding_mode="floor")
    send_order = torch.sort(dest_rank, stable=True).indices
    send_counts = torch.bincount(dest_rank, minlength=P).to(torch.int64)
    num_send = int(flat_expert.numel())

    q, scale = quantize(tokens)
    src_token = torch.div(send_order, layout.top_k, rounding_mode="floor")
    send_x = buffers.send_x[:num_send]
    torch.index_select(as_words(q), 0, src_token, out=as_words(send_x))
    meta = buffers.send_meta[:num_send]
    meta[:, 0].copy_(scale.reshape(-1).index_select(0, src_token).view(torch.int32))
    meta[:, 1].copy_(torch.remainder(flat_expert.index_select(0, send_order), E).to(torch.int32))
    meta[:, 2].copy_(src_token.to(torch.int32))
    meta[:, 3].fill_(layout.rank)

    recv_counts = _all_to_all_counts(send_counts)
    send_splits = send_counts.tolist()
    recv_splits = recv_counts.tolist()
    num_recv = sum(recv_splits)
    if num_recv > layout.max_recv_rows:
        raise DispatchError(
            f"rank {layout.rank} would receive {num_recv} rows, more than its buffer of {layout.max_recv_rows}"
        )
    recv_x = buffers.recv_x[:num_recv]
    recv_meta = buffers.recv_meta[:num_recv]
    dist.all_to_all_single(recv_x, send_x, output_split_sizes=recv_splits, input_split_sizes=send_splits)
    dist.all_to_all_single(recv_meta, meta, output_split_sizes=recv_splits, input_split_sizes=send_splits)

    # Expert side: slot j of expert e is the j-th row for e, in (source rank, sender order) order.
    local_expert = recv_meta[:, 1].to(torch.int64)
    counts = torch.bincount(local_expert, minlength=E)
    if num_recv and int(counts.max()) > M:
        raise DispatchError(
            f"rank {layout.rank}: an expert received {int(counts.max())} tokens, more than M = {M} slots; "
            "some dispatcher sent more than T tokens"
        )
    by_expert = torch.sort(local_expert, stable=True).indices
    starts = torch.cumsum(counts, 0) - counts
    sorted_expert = local_expert.index_select(0, by_expert)
    slot = torch.arange(num_recv, device=device) - starts.index_select(0, sorted_expert)
    slot_index = torch.empty(num_recv, dtype=torch.int64, device=device)
    slot_index.index_copy_(0, by_expert, sorted_expert * M + slot)

    as_words(buffers.expert_x.view(E * M, K)).index_copy_(0, slot_index, as_words(recv_x))
    buffers.expert_x_scale.view(E * M).index_copy_(0, slot_index, recv_meta[:, 0].view(torch.float32))
    src = torch.stack([recv_meta[:, 3], recv_meta[:, 2]], dim=1)
    buffers.expert_src.view(E * M, 2).index_copy_(0, slot_index, src)
    buffers.expert_num_tokens.copy_(counts.to(torch.int32))

    unsort = torch.empty_like(send_order)
    unsort[send_order] = torch.arange(num_send, device=device)
    return DispatchHandle(
        num_tokens=num_tokens,
        send_order=send_order,
        unsort=unsort,
        send_splits=send_splits,
        recv_splits=recv_splits,
        recv_slot_index=slot_index,
        topk_weights=routing.topk_weights.to(device),
    )
