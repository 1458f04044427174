"""The packed-row path over `all_to_all_single` with host-side splits: nccl on GPU, gloo on CPU.

Dispatch, per rank:

    quantize   tokens (n, K) bf16 -> FP8 (n, K) + scales (n, 1)
    layout     which ranks each token goes to; one fixed-size exchange of the (rows, pairs) counts per rank,
               and the one host read that variable splits need (split sizes of all_to_all_single live on the host)
    pack       one row per (token, destination rank): FP8 payload, scale, source, that rank's local expert ids
               and weights (base.RowFormat)
    exchange   one all_to_all_single of the rows
    unpack     each row placed once per local expert it picked: slot j of expert e is the j-th pair for e in
               (source rank, token) order; expert_num_tokens stays on the device

Combine: the expert side reduces each received row's weighted expert outputs into one bf16 row (a weighted
embedding_bag over the slots, float32 accumulation), sends it back on the same splits, and the token's rank sums
the rows from each rank (embedding_bag again). With top_k = 8 over two ranks this moves 2 rows per token each
way where a row per (token, slot) moved 8.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F

from harness.rank.comm.base import (
    BatchedBuffers, Comm, DispatchHandle, DispatchLayout, Quantize, RowFormat, Stages, as_words,
)
from harness.rank.memory import Accountant


def _exclusive_cumsum(counts: torch.Tensor) -> torch.Tensor:
    return torch.cumsum(counts, 0) - counts


class CollectiveComm(Comm):
    """Packed rows over torch.distributed's all_to_all_single on the default group."""

    def __init__(self, layout: DispatchLayout, accountant: Accountant, *, out_dtype: torch.dtype):
        fmt = RowFormat(hidden_size=layout.hidden_size, top_k=layout.top_k)
        C, P = layout.buffer_tokens, layout.num_ranks
        # A rank sends at most min(P, top_k) rows per token and receives at most one per (source, token).
        max_send = C * layout.max_ranks_per_token
        self.send_rows = accountant.alloc("dispatch", (max_send, fmt.row_bytes), torch.uint8)
        self.recv_rows = accountant.alloc("dispatch", (P * C, fmt.row_bytes), torch.uint8)
        self.send_counts = accountant.alloc("dispatch", (P, 2), torch.int64)  # (rows, pairs) per destination
        self.recv_counts = accountant.alloc("dispatch", (P, 2), torch.int64)
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
        plan = self._plan(topk_ids)
        dist.all_to_all_single(self.recv_counts, self.send_counts)
        # The one host read: all_to_all_single takes its split sizes as Python ints.
        send_counts, recv_counts = torch.stack([self.send_counts, self.recv_counts]).tolist()
        send_splits, recv_splits = [c[0] for c in send_counts], [c[0] for c in recv_counts]
        num_send, num_recv, num_pairs = sum(send_splits), sum(recv_splits), sum(c[1] for c in recv_counts)
        stages.lap("dispatch.layout")
        self._pack(q, scale, topk_ids, topk_weights, plan["order"][:num_send])
        stages.lap("dispatch.pack")
        dist.all_to_all_single(self.recv_rows[:num_recv], self.send_rows[:num_send],
                               output_split_sizes=recv_splits, input_split_sizes=send_splits)
        stages.lap("dispatch.exchange")
        bags = self._unpack(num_recv, num_pairs)
        stages.lap("dispatch.unpack")
        # Token side of combine: for each token, the positions of its rows in send order (one per rank it went to).
        member = plan["member"]
        position = torch.empty(member.numel(), dtype=torch.int64, device=tokens.device)
        position.index_copy_(0, plan["order"][:num_send], torch.arange(num_send, device=tokens.device))
        token_major = torch.sort(plan["order"][:num_send]).values  # flat (token * P + rank), token order
        rows_per_token = member.sum(1)
        return DispatchHandle(
            num_tokens=n, topk_weights=topk_weights, dispatch_bytes=num_send * fmt.row_bytes,
            combine_bytes=num_recv * L.hidden_size * self.combine_recv.element_size(), num_host_syncs=1,
            state={"send_splits": send_splits, "recv_splits": recv_splits,
                   "token_rows": position.index_select(0, token_major),
                   "token_of_rows": torch.div(token_major, L.num_ranks, rounding_mode="floor"),
                   "token_offsets": _exclusive_cumsum(rows_per_token), **bags},
        )

    def _plan(self, topk_ids: torch.Tensor) -> dict[str, torch.Tensor]:
        """Which ranks each token goes to, the send order (destination-major, token order within) and the counts
        this rank sends each destination, written into self.send_counts. Fixed sizes: no host read."""
        L = self.layout
        n, P, E = topk_ids.shape[0], L.num_ranks, L.num_local_experts
        device = topk_ids.device
        dest = torch.div(topk_ids, E, rounding_mode="floor")
        member = torch.zeros((n, P), dtype=torch.bool, device=device)
        member.scatter_(1, dest, True)
        flat = torch.arange(n * P, device=device)
        # key d * n + t for the rows to send; non-members sort after every row
        key = torch.where(member.reshape(-1), (flat % P) * n + torch.div(flat, P, rounding_mode="floor"), P * n)
        order = torch.sort(key, stable=True).indices
        self.send_counts[:, 0].copy_(member.sum(0))
        self.send_counts[:, 1].zero_().index_add_(0, dest.reshape(-1), torch.ones_like(dest.reshape(-1)))
        return {"member": member, "order": order}

    def _pack(self, q: torch.Tensor, scale: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor,
              selected: torch.Tensor) -> None:
        """Write one row per selected (token, destination) into self.send_rows, in the selected order."""
        L, fmt = self.layout, self.fmt
        P, E, k = L.num_ranks, L.num_local_experts, L.top_k
        num_send = selected.numel()
        token = torch.div(selected, P, rounding_mode="floor")
        dst = selected % P
        rows = self.send_rows[:num_send]
        torch.index_select(as_words(q), 0, token, out=rows.view(torch.int64)[:, : fmt.payload_words])
        ids = topk_ids.index_select(0, token)
        here = torch.div(ids, E, rounding_mode="floor") == dst.unsqueeze(1)
        local = torch.where(here, ids % E, -1).to(torch.int16)
        if k % 2:  # int16 ids travel as int32 pairs
            local = torch.cat([local, local.new_full((num_send, 1), -1)], dim=1)
        weights = torch.where(here, topk_weights.index_select(0, token), 0.0).float()
        meta = torch.cat([
            scale.reshape(-1).index_select(0, token).view(torch.int32).unsqueeze(1),
            token.to(torch.int32).unsqueeze(1),
            torch.full((num_send, 1), L.rank, dtype=torch.int32, device=q.device),
            local.view(torch.int32), weights.view(torch.int32),
        ], dim=1)
        words = rows.view(torch.int32)
        start = L.hidden_size // 4
        words[:, start: start + fmt.meta_words].copy_(meta)

    def _unpack(self, num_recv: int, num_pairs: int) -> dict[str, torch.Tensor]:
        """Place every received (row, local expert) pair into its slot; return the bags combine reduces."""
        L, fmt, b = self.layout, self.fmt, self.batched
        E, M, k = L.num_local_experts, L.max_slots_per_expert, L.top_k
        device = self.recv_rows.device
        words = self.recv_rows[:num_recv].view(torch.int32)
        meta = words[:, L.hidden_size // 4: L.hidden_size // 4 + fmt.meta_words]
        ids = meta[:, 3: 3 + fmt.id_words].contiguous().view(torch.int16)[:, :k].to(torch.int64)
        weights = meta[:, 3 + fmt.id_words: 3 + fmt.id_words + k].contiguous().view(torch.float32)
        valid = ids >= 0
        key = torch.where(valid, ids, E).reshape(-1)
        # Expert-major, and within an expert in (source rank, token) order: the rows arrive in that order.
        sorted_key, pairs = torch.sort(key, stable=True)
        pairs, pair_expert = pairs[:num_pairs], sorted_key[:num_pairs]
        pair_row = torch.div(pairs, k, rounding_mode="floor")
        counts = torch.zeros(E, dtype=torch.int64, device=device).index_add_(0, pair_expert, torch.ones_like(pairs))
        slot = torch.arange(num_pairs, device=device) - _exclusive_cumsum(counts).index_select(0, pair_expert)
        fits = slot < M
        b.overflow.add_((~fits).sum())
        slot_index = torch.where(fits, pair_expert * M + slot, E * M)  # the sink row past E*M
        assert b.expert_x_flat is not None and b.expert_x_scale_flat is not None and b.expert_src_flat is not None
        payload = self.recv_rows[:num_recv].view(torch.int64)[:, : fmt.payload_words]
        as_words(b.expert_x_flat).index_copy_(0, slot_index, payload.index_select(0, pair_row))
        b.expert_x_scale_flat.index_copy_(0, slot_index, meta[:, 0].view(torch.float32).index_select(0, pair_row))
        source = torch.stack([meta[:, 2], meta[:, 1]], dim=1)  # (rank, token); a list index would copy from the host
        b.expert_src_flat.index_copy_(0, slot_index, source.index_select(0, pair_row))
        b.expert_num_tokens.copy_(counts.clamp(max=M))
        # Bags for combine: each received row's slots, in row order.
        slot_of_pair = torch.zeros(num_recv * k, dtype=torch.int64, device=device)
        slot_of_pair.index_copy_(0, pairs, torch.where(fits, slot_index, 0))
        row_major = torch.sort((~valid).reshape(-1).to(torch.uint8), stable=True).indices[:num_pairs]
        per_row = valid.sum(1)
        return {"bag_slots": slot_of_pair.index_select(0, row_major),
                "bag_weights": weights.reshape(-1).index_select(0, row_major),
                "bag_offsets": _exclusive_cumsum(per_row)}

    # ---------------------------------------------------------------- combine
    def combine(self, expert_out: torch.Tensor, handle: DispatchHandle, stages: Stages) -> torch.Tensor:
        L, st = self.layout, handle.state
        E, M, K = L.num_local_experts, L.max_slots_per_expert, L.hidden_size
        n = handle.num_tokens
        send_splits, recv_splits = st["send_splits"], st["recv_splits"]
        num_send, num_recv = sum(send_splits), sum(recv_splits)
        stages.begin()
        partial = F.embedding_bag(st["bag_slots"], expert_out.reshape(E * M, K), st["bag_offsets"], mode="sum",
                                  per_sample_weights=st["bag_weights"].to(expert_out.dtype))
        stages.lap("combine.expert-reduce")
        back = self.combine_recv[:num_send]
        dist.all_to_all_single(back, partial[:num_recv], output_split_sizes=send_splits,
                               input_split_sizes=recv_splits)
        stages.lap("combine.exchange")
        out = self.batched.combine_out[:n]
        if n:
            rows, offsets = st["token_rows"], st["token_offsets"]
            out.copy_(F.embedding_bag(rows, back, offsets, mode="sum"))
        stages.lap("combine.token-reduce")
        return out

    def combine_terms(self, handle: DispatchHandle) -> tuple[torch.Tensor, torch.Tensor]:
        st, n, W = handle.state, handle.num_tokens, self.layout.max_ranks_per_token
        back = self.combine_recv[: sum(st["send_splits"])]
        rows, tokens, offsets = st["token_rows"], st["token_of_rows"], st["token_offsets"]
        position = torch.arange(rows.numel(), device=back.device) - offsets.index_select(0, tokens)
        cell = tokens * W + position
        table = torch.zeros(n * W, dtype=torch.int64, device=back.device).index_copy_(0, cell, rows)
        weights = torch.zeros(n * W, dtype=torch.float32, device=back.device).index_fill_(0, cell, 1.0)
        return back.index_select(0, table) if n else back[:0], weights.view(n, W)
