"""The packed-row path over `all_to_all_single` with host-side splits: nccl on GPU, gloo on CPU.

Dispatch, per rank:

    quantize   tokens (n, K) bf16 -> FP8 (n, K) + scales (n, 1)
    layout     which ranks each token goes to and its row's place in the send buffer (destination-major, token
               order within: a cumulative sum, no sort); one fixed-size exchange of the row counts per rank, and
               the one host read that variable splits need (split sizes of all_to_all_single live on the host)
    pack       one row per (token, destination rank): FP8 payload, scale, source, that rank's local expert ids
               and weights (base.RowFormat)
    exchange   one all_to_all_single of the rows
    unpack     each row placed once per local expert it picked (fused.place_rows: the row is read once); on CPU
               slot j of expert e is the j-th pair for e in (source rank, token) order, on GPU slots are taken
               with atomics (any order; every slot records its source); expert_num_tokens stays on the device

Combine: the expert side reduces each received row's weighted expert outputs into one bf16 row (fused.bag_sum
over a dense (rows, top_k) table of its slots, float32 accumulation), sends it back on the same splits, and the
token's rank sums the rows from each rank (bag_sum over a dense (tokens, P) table). With top_k = 8 over two
ranks this moves 2 rows per token each way where a row per (token, slot) moved 8.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from harness.rank.comm.base import (
    BatchedBuffers, Comm, DispatchHandle, DispatchLayout, Quantize, RowFormat, Stages, as_words,
)
from harness.rank.comm.fused import bag_sum, pack_rows, place_rows
from harness.rank.memory import Accountant


def _exclusive_cumsum(counts: torch.Tensor) -> torch.Tensor:
    """Along the first dimension."""
    return torch.cumsum(counts, 0) - counts


@dataclass(frozen=True, kw_only=True)
class CollectiveState:
    """What the collective path's combine reads of its dispatch (DispatchHandle.state)."""

    send_splits: list[int]  # rows sent to each rank (host ints: all_to_all_single's split sizes)
    recv_splits: list[int]  # rows received from each rank
    token_table: torch.Tensor  # (n, P) int64: token t's row for rank d in the send order (0 where none)
    token_weights: torch.Tensor  # (n, P) float32: 1 where token t went to rank d
    bag_table: torch.Tensor  # (rows received, top_k) int64: each received row's slot rows
    bag_weights: torch.Tensor  # (rows received, top_k) float32: their weights, 0 where none


class CollectiveComm(Comm):
    """Packed rows over torch.distributed's all_to_all_single on the default group."""

    def __init__(self, layout: DispatchLayout, accountant: Accountant, *, out_dtype: torch.dtype):
        fmt = RowFormat(hidden_size=layout.hidden_size, top_k=layout.top_k)
        C, P = layout.buffer_tokens, layout.num_ranks
        # A rank sends at most min(P, top_k) rows per token and receives at most one per (source, token).
        max_send = C * layout.max_ranks_per_token
        self.send_rows = accountant.alloc("dispatch", (max_send, fmt.row_bytes), torch.uint8)
        self.recv_rows = accountant.alloc("dispatch", (P * C, fmt.row_bytes), torch.uint8)
        self.send_counts = accountant.alloc("dispatch", (P,), torch.int64)  # rows to each destination
        self.recv_counts = accountant.alloc("dispatch", (P,), torch.int64)
        self.combine_recv = accountant.alloc("combine", (max_send, layout.hidden_size), out_dtype)
        harness_bytes = sum(t.nbytes for t in (self.send_rows, self.recv_rows, self.send_counts, self.recv_counts,
                                               self.combine_recv))
        super().__init__(layout, BatchedBuffers.allocate(layout, accountant, out_dtype=out_dtype),
                         harness_bytes=harness_bytes)
        self.fmt = fmt

    # ---------------------------------------------------------------- dispatch
    def dispatch(self, tokens: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor,
                 quantize: Quantize, stages: Stages) -> DispatchHandle:
        L, fmt = self.layout, self.fmt
        n = tokens.shape[0]
        L.check_tokens(n)
        stages.begin()
        q, scale = quantize(tokens)
        stages.lap("dispatch.quantize")
        member, position, order = self._plan(topk_ids)
        dist.all_to_all_single(self.recv_counts, self.send_counts)
        # The one host read: all_to_all_single takes its split sizes as Python ints.
        send_splits, recv_splits = torch.stack([self.send_counts, self.recv_counts]).tolist()
        num_send, num_recv = sum(send_splits), sum(recv_splits)
        stages.lap("dispatch.layout")
        pack_rows(as_words(q), scale, topk_ids, topk_weights, order[:num_send], self.send_rows[:num_send], fmt=fmt,
                  num_ranks=L.num_ranks, num_local_experts=L.num_local_experts, rank=L.rank)
        stages.lap("dispatch.pack")
        dist.all_to_all_single(self.recv_rows[:num_recv], self.send_rows[:num_send],
                               output_split_sizes=recv_splits, input_split_sizes=send_splits)
        stages.lap("dispatch.exchange")
        bags = self._unpack(num_recv)
        stages.lap("dispatch.unpack")
        return DispatchHandle(
            num_tokens=n, topk_weights=topk_weights, dispatch_bytes=num_send * fmt.row_bytes,
            combine_bytes=num_recv * L.hidden_size * self.combine_recv.element_size(), num_host_syncs=1,
            # Token side of combine: token t's row for rank d came back at `position[t, d]` (send order).
            state=CollectiveState(send_splits=send_splits, recv_splits=recv_splits,
                                  token_table=torch.where(member, position, 0), token_weights=member.float(),
                                  bag_table=bags[0], bag_weights=bags[1]),
        )

    def _plan(self, topk_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(member (n, P) bool: token t goes to rank d; position (n, P): its row's index in the send buffer,
        destination-major and token order within; order (n*P + 1,): order[i] = t*P + d of send row i, for
        i < rows sent). Writes the rows per destination into self.send_counts. Fixed sizes: no host read."""
        L = self.layout
        n, P, E = topk_ids.shape[0], L.num_ranks, L.num_local_experts
        device = topk_ids.device
        member = torch.zeros((n, P), dtype=torch.bool, device=device)
        member.scatter_(1, torch.div(topk_ids, E, rounding_mode="floor"), True)
        ones = member.to(torch.int64)
        per_dest = ones.sum(0)
        self.send_counts.copy_(per_dest)
        position = _exclusive_cumsum(per_dest) + _exclusive_cumsum(ones)
        target = torch.where(member, position, n * P).reshape(-1)  # non-members all land on the spare last entry
        order = torch.empty(n * P + 1, dtype=torch.int64, device=device)
        order.scatter_(0, target, torch.arange(n * P, device=device))
        return member, position, order

    def _unpack(self, num_recv: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Place every received (row, local expert) pair into its slot; return the dense bags combine reduces."""
        L, fmt, b = self.layout, self.fmt, self.batched
        E, M, k = L.num_local_experts, L.max_slots_per_expert, L.top_k
        words = self.recv_rows[:num_recv].view(torch.int32)
        meta = words[:, L.hidden_size // 4: L.hidden_size // 4 + fmt.meta_words]
        ids = meta[:, 3: 3 + fmt.id_words].contiguous().view(torch.int16)[:, :k].to(torch.int64)
        weights = meta[:, 3 + fmt.id_words: 3 + fmt.id_words + k].contiguous().view(torch.float32)
        assert b.expert_x_flat is not None and b.expert_x_scale_flat is not None and b.expert_src_flat is not None
        source = torch.stack([meta[:, 2], meta[:, 1]], dim=1)  # (rank, token); a list index would copy from the host
        counts, table, bag_weights = place_rows(
            self.recv_rows[:num_recv].view(torch.int64)[:, : fmt.payload_words], ids, weights,
            meta[:, 0].view(torch.float32), source, x_flat=as_words(b.expert_x_flat),
            x_scale_flat=b.expert_x_scale_flat, x_src_flat=b.expert_src_flat, max_slots=M, num_experts=E)
        b.overflow.add_((counts - M).clamp(min=0).sum())
        b.expert_num_tokens.copy_(counts.clamp(max=M))
        # Bags for combine: row r's slots, weight 0 where the pair is elsewhere (or past M: counted as overflow).
        return table, bag_weights

    # ---------------------------------------------------------------- combine
    def combine(self, expert_out: torch.Tensor, handle: DispatchHandle, stages: Stages) -> torch.Tensor:
        L, st = self.layout, handle.state
        assert isinstance(st, CollectiveState)
        E, M, K = L.num_local_experts, L.max_slots_per_expert, L.hidden_size
        send_splits, recv_splits = st.send_splits, st.recv_splits
        stages.begin()
        partial = bag_sum(st.bag_table, st.bag_weights, expert_out.reshape(E * M, K))
        stages.lap("combine.expert-reduce")
        back = self.combine_recv[: sum(send_splits)]
        dist.all_to_all_single(back, partial, output_split_sizes=send_splits, input_split_sizes=recv_splits)
        stages.lap("combine.exchange")
        out = bag_sum(st.token_table, st.token_weights, back, out=self.batched.combine_out[: handle.num_tokens])
        stages.lap("combine.token-reduce")
        return out

    def combine_terms(self, handle: DispatchHandle) -> tuple[torch.Tensor, torch.Tensor]:
        st, n = handle.state, handle.num_tokens
        assert isinstance(st, CollectiveState)
        back = self.combine_recv[: sum(st.send_splits)]
        table = st.token_table  # (n, P): W = P here, weight 0 where the token did not go
        return back.index_select(0, table.reshape(-1)) if n else back[:0], st.token_weights
