"""The packed-row path over `all_to_all_single` with capacity-sized equal splits: nccl on GPU, gloo on CPU.

Every peer's region in the send and receive buffers is its full capacity C (the most tokens any rank routes: a
rank sends a token at most once to each rank), so every all_to_all_single moves P x C rows of fixed size: the
split sizes never change, nothing is read on the host, and on a GPU a dispatch and a combine each capture in a
CUDA graph. The price is capacity-sized staging and exchanges (docs/comm.md, Memory).

Dispatch, per rank:

    quantize   tokens (n, K) bf16 -> FP8 (n, K) + scales (n, 1)
    layout     which ranks each token goes to and its row's place in the send buffer: rank d's region
               [d*C, d*C + C), token order within (a cumulative sum, no sort); one fixed-size exchange of the row
               counts per rank, kept on the device
    pack       one row per (token, destination rank): FP8 payload, scale, source, that rank's local expert ids
               and weights (base.RowFormat); the rest of each region is filled with token 0's row, which the
               receiver ignores (past the count)
    exchange   one all_to_all_single of the P x C rows, equal splits
    unpack     the rows past each source's count are masked (no local expert), then each row placed once per
               local expert it picked (fused.place_rows: the row is read once); on CPU slot j of expert e is the
               j-th pair for e in (source rank, token) order, on GPU slots are taken with atomics (any order;
               every slot records its source); expert_num_tokens stays on the device

Combine: the expert side reduces each received row's weighted expert outputs into one bf16 row (fused.bag_sum
over a dense (rows, top_k) table of its slots, float32 accumulation; a masked row sums nothing), sends the P x C
rows back on the same equal splits, and the token's rank sums the rows from each rank (bag_sum over a dense
(tokens, P) table). With top_k = 8 over two ranks this moves 2 rows per token each way where a row per (token,
slot) moved 8.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from harness.core.comm_buffers import collective_buffers, shapes_of
from harness.rank.comm.base import (
    BatchedBuffers,
    Comm,
    DispatchHandle,
    DispatchLayout,
    Quantize,
    RowFormat,
    Stages,
    as_words,
)
from harness.rank.comm.fused import bag_sum, pack_rows, place_rows
from harness.rank.memory import Accountant


def _exclusive_cumsum(counts: torch.Tensor) -> torch.Tensor:
    """Along the first dimension."""
    return torch.cumsum(counts, 0) - counts


@dataclass(frozen=True, kw_only=True)
class CollectiveState:
    """What the collective path's combine reads of its dispatch (DispatchHandle.state)."""

    token_table: torch.Tensor  # (n, P) int64: token t's row for rank d in the send order, d*C + j (0 where none)
    token_weights: torch.Tensor  # (n, P) float32: 1 where token t went to rank d
    bag_table: torch.Tensor  # (P*C, top_k) int64: each received row's slot rows
    bag_weights: torch.Tensor  # (P*C, top_k) float32: their weights, 0 where none (and on rows past a count)


class CollectiveComm(Comm):
    """Packed rows over torch.distributed's all_to_all_single on the default group, capacity-sized equal splits."""

    # Fixed split sizes and nothing read on the host, so a round captures. On one H200 the first replay of a
    # captured round in a process delivered zero partials and every later one was right (a 300-round graph soak,
    # with and without per-rank delays: round 0 only); every user of the graphs replays them once first
    # (harness.rank.graphs.capture_round, harness.rank.soak.GraphRounds).
    graph_capturable = True

    def __init__(self, layout: DispatchLayout, accountant: Accountant, *, out_dtype: torch.dtype):
        fmt = RowFormat(hidden_size=layout.hidden_size, top_k=layout.top_k)
        shape = shapes_of(collective_buffers(layout.comm_layout(out_dtype)))  # harness.core.comm_buffers
        a = accountant.alloc
        # Each peer's region is C rows both ways: rank s's rows for rank d sit at [d*C, d*C + C) of s's send
        # buffer and land at [s*C, s*C + C) of d's receive buffer; a row is RowFormat's.
        self.send_rows = a("dispatch", shape["send_rows"], torch.uint8)
        self.recv_rows = a("dispatch", shape["recv_rows"], torch.uint8)
        self.send_counts = a("dispatch", shape["send_counts"], torch.int64)  # rows to each destination
        self.recv_counts = a("dispatch", shape["recv_counts"], torch.int64)
        self.combine_send = a("combine", shape["combine_send"], out_dtype)  # one partial per received row
        self.combine_recv = a("combine", shape["combine_recv"], out_dtype)
        harness_bytes = sum(
            t.nbytes
            for t in (
                self.send_rows,
                self.recv_rows,
                self.send_counts,
                self.recv_counts,
                self.combine_send,
                self.combine_recv,
            )
        )
        super().__init__(
            layout, BatchedBuffers.allocate(layout, accountant, out_dtype=out_dtype), harness_bytes=harness_bytes
        )
        self.fmt = fmt
        self.recv_rows.zero_()  # rows past a count are masked, but never uninitialised memory

    # ---------------------------------------------------------------- dispatch
    def dispatch(
        self,
        tokens: torch.Tensor,
        topk_ids: torch.Tensor,
        topk_weights: torch.Tensor,
        quantize: Quantize,
        stages: Stages,
    ) -> DispatchHandle:
        L, fmt = self.layout, self.fmt
        n = tokens.shape[0]
        L.check_tokens(n)
        stages.begin()
        q, scale = quantize(tokens)
        stages.lap("dispatch.quantize")
        member, position, order = self._plan(topk_ids)
        dist.all_to_all_single(self.recv_counts, self.send_counts)  # fixed size, stays on the device
        stages.lap("dispatch.layout")
        if n:  # an idle rank sends only stale rows, every one past its count of 0
            pack_rows(
                as_words(q),
                scale,
                topk_ids,
                topk_weights,
                order,
                self.send_rows,
                fmt=fmt,
                num_ranks=L.num_ranks,
                num_local_experts=L.num_local_experts,
                rank=L.rank,
            )
        stages.lap("dispatch.pack")
        dist.all_to_all_single(self.recv_rows, self.send_rows)  # equal splits: C rows per peer
        stages.lap("dispatch.exchange")
        bags = self._unpack()
        stages.lap("dispatch.unpack")
        rows = self.send_rows.shape[0]  # what crosses: every region at its capacity
        return DispatchHandle(
            num_tokens=n,
            topk_weights=topk_weights,
            dispatch_bytes=rows * fmt.row_bytes,
            combine_bytes=rows * L.hidden_size * self.combine_recv.element_size(),
            num_host_syncs=0,
            # Token side of combine: token t's row for rank d came back at `position[t, d]` (send order).
            state=CollectiveState(
                token_table=torch.where(member, position, 0),
                token_weights=member.float(),
                bag_table=bags[0],
                bag_weights=bags[1],
            ),
        )

    def _plan(self, topk_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(member (n, P) bool: token t goes to rank d; position (n, P): its row's index in the send buffer,
        d*C + its place among the tokens sent to d (token order); order (P*C,): order[i] = t*P + d of send row i,
        d (token 0's row for rank d) past the rows sent). Writes the rows per destination into self.send_counts.
        Fixed sizes: no host read."""
        L = self.layout
        n, P, E, C = topk_ids.shape[0], L.num_ranks, L.num_local_experts, L.buffer_tokens
        device = topk_ids.device
        member = torch.zeros((n, P), dtype=torch.bool, device=device)
        member.scatter_(1, torch.div(topk_ids, E, rounding_mode="floor"), True)
        ones = member.to(torch.int64)
        self.send_counts.copy_(ones.sum(0))
        position = torch.arange(P, device=device) * C + _exclusive_cumsum(ones)
        target = torch.where(member, position, P * C).reshape(-1)  # non-members all land on the spare last entry
        order = torch.div(torch.arange(P * C + 1, device=device), C, rounding_mode="floor")
        order.scatter_(0, target, torch.arange(n * P, device=device))
        return member, position, order[: P * C]

    def _unpack(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Place every received (row, local expert) pair into its slot; return the dense bags combine reduces.
        Rows past each source's count (recv_counts) are masked: no local expert, weight 0."""
        L, fmt, b = self.layout, self.fmt, self.batched
        E, M, k, C = L.num_local_experts, L.max_slots_per_expert, L.top_k, L.buffer_tokens
        words = self.recv_rows.view(torch.int32)
        meta = words[:, L.hidden_size // 4 : L.hidden_size // 4 + fmt.meta_words]
        valid = (torch.arange(C, device=words.device) < self.recv_counts.unsqueeze(1)).reshape(-1, 1)
        ids = torch.where(
            valid, meta[:, 3 : 3 + fmt.id_words].contiguous().view(torch.int16)[:, :k].to(torch.int64), -1
        )
        weights = torch.where(
            valid, meta[:, 3 + fmt.id_words : 3 + fmt.id_words + k].contiguous().view(torch.float32), 0.0
        )
        assert b.expert_x_flat is not None and b.expert_x_scale_flat is not None and b.expert_src_flat is not None
        source = torch.stack([meta[:, 2], meta[:, 1]], dim=1)  # (rank, token); a list index would copy from the host
        counts, table, bag_weights = place_rows(
            self.recv_rows.view(torch.int64)[:, : fmt.payload_words],
            ids,
            weights,
            meta[:, 0].view(torch.float32),
            source,
            x_flat=as_words(b.expert_x_flat),
            x_scale_flat=b.expert_x_scale_flat,
            x_src_flat=b.expert_src_flat,
            max_slots=M,
            num_experts=E,
        )
        b.overflow.add_((counts - M).clamp(min=0).sum())
        b.expert_num_tokens.copy_(counts.clamp(max=M))
        # Bags for combine: row r's slots, weight 0 where the pair is elsewhere (or past M: counted as overflow).
        return table, bag_weights

    # ---------------------------------------------------------------- combine
    def combine(self, expert_out: torch.Tensor, handle: DispatchHandle, stages: Stages) -> torch.Tensor:
        L, st = self.layout, handle.state
        assert isinstance(st, CollectiveState)
        E, M, K = L.num_local_experts, L.max_slots_per_expert, L.hidden_size
        stages.begin()
        bag_sum(st.bag_table, st.bag_weights, expert_out.reshape(E * M, K), out=self.combine_send)
        stages.lap("combine.expert-reduce")
        dist.all_to_all_single(self.combine_recv, self.combine_send)  # equal splits: C rows per peer
        stages.lap("combine.exchange")
        out = bag_sum(
            st.token_table, st.token_weights, self.combine_recv, out=self.batched.combine_out[: handle.num_tokens]
        )
        stages.lap("combine.token-reduce")
        return out

    def combine_terms(self, handle: DispatchHandle) -> tuple[torch.Tensor, torch.Tensor]:
        st, n = handle.state, handle.num_tokens
        assert isinstance(st, CollectiveState)
        back = self.combine_recv
        table = st.token_table  # (n, P): W = P here, weight 0 where the token did not go
        return back.index_select(0, table.reshape(-1)) if n else back[:0], st.token_weights
