"""symm-mem: torch's symmetric memory (its CUDA backend), rows and counts pushed into the peers' buffers by
Triton kernels, ordered by release/acquire flags on the signal pads; nothing is read on the host, every shape is
fixed, so a dispatch and a combine each capture in a CUDA graph. Runs at any P >= 1 on GPUs of one node (at
P = 1 every "peer" is the rank itself: the same kernels, local stores).

Dispatch, per rank (harness.rank.comm.push has the kernels; a wait or signal "in" a kernel runs inside it):

    layout     route_layout: each pair's position among this rank's pairs for its expert (token order) and each
               token's row index per destination rank, no sort; in its scan kernel, the wait until every peer
               has consumed this rank's rows of the previous dispatch (its CONSUMED flag; the epoch advances
               here)
    pack       quantize_push: each bf16 token read once, FP8 and its scale computed (bit-equal to
               harness.rank.quant.quantize_per_token); one row per (token, other destination rank) stored
               straight into the destination's receive buffer (this rank's region, push.recv_region, at the
               row index), and this rank's own pairs written straight into its slots; its last program pushes,
               per destination, this rank's counts into its count buffer and a release store of the epoch into
               its READY flag
    exchange   in expert_base: wait (acquire) for every peer's READY flag of this epoch
    unpack     expert_base: each (source, expert)'s first slot, this rank first, then the others in rank order
               after it (expert_num_tokens, the overflow count); expand: every row received from another rank
               read once and written to slot base + position of each local expert it picked (deterministic:
               slot j of expert e is the j-th pair for e in (source, token) order, push.source_order), with
               scale and source; then CONSUMED to every source (a kernel of its own)

Combine: reduce_push sums each received row's weighted expert outputs (float32) into one bf16 partial and pushes
it into the source's combine buffer at [this rank, token], and its last program signals COMBINED to every rank;
wait for every COMBINED of this epoch; token_reduce sums each token's partials from the ranks it went to, in rank
order (at P = 1 the one partial is the sum: the combine buffer is returned as it is).

Why this order is safe (docs/comm.md has the argument in full): a flag store is a release at system scope after
a CTA barrier, issued after the kernels whose stores it publishes (stream order) or by the last program of the
kernel that stored them (every program's acq_rel increment of a done counter comes first); a wait
is an acquire load at system scope, and the kernels after it read only what the flags it saw published. Writes
into a peer's buffer wait for that peer's release of the previous contents: CONSUMED for the receive rows and
counts; for the combine buffer, the peer's READY of the same epoch, which the peer issues after its previous
token_reduce. So any sequence of dispatches, with or without combines between them, and graph replays of
either, stay ordered.

The peers' buffers are reachable only within one node (NVLink): setup refuses ranks whose peers are not mapped.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

import harness.rank.comm.push as push
from harness.core.comm_buffers import shapes_of, symm_mem_buffers
from harness.rank.comm.base import (
    BatchedBuffers,
    Comm,
    CommUnavailable,
    DispatchError,
    DispatchHandle,
    DispatchLayout,
    Quantize,
    Stages,
)
from harness.rank.comm.push import COMBINED, CONSUMED, FLAG_BASE, NUM_PHASES, READY, Mapped, PushFormat
from harness.rank.memory import Accountant
from harness.rank.quant import quantize_per_token


def symm_mem_available() -> bool:
    """Whether torch's symmetric memory can run here (CUDA and the module; no GPU is touched)."""
    try:
        import torch.distributed._symmetric_memory
    except ImportError:
        return False
    return torch.cuda.is_available()


@dataclass(frozen=True, kw_only=True)
class SymmMemState:
    """What symm-mem's combine reads of its dispatch (DispatchHandle.state)."""

    row_index: torch.Tensor  # (n, P) int32: each token's row index among those sent to rank d, -1 where none


class SymmMemComm(Comm):
    name = "symm-mem"
    graph_capturable = True

    def __init__(self, layout: DispatchLayout, accountant: Accountant, *, out_dtype: torch.dtype, device: torch.device):
        import torch.distributed._symmetric_memory as symm_mem

        if out_dtype != torch.bfloat16:
            raise CommUnavailable(f"comm symm-mem combines bf16 rows; the workspace dtype is {out_dtype}")
        P, rank = layout.num_ranks, layout.rank
        self.fmt = PushFormat(hidden_size=layout.hidden_size, top_k=layout.top_k)
        group = dist.group.WORLD.group_name  # type: ignore[union-attr]

        def symmetric(shape: tuple[int, ...], dtype: torch.dtype, kind: str) -> tuple[torch.Tensor, Mapped, object]:
            tensor = symm_mem.empty(shape, dtype=dtype, device=device)
            accountant.adopt(kind, tensor)
            handle = symm_mem.rendezvous(tensor, group)
            try:
                peers = [tensor if p == rank else handle.get_buffer(p, tuple(shape), dtype) for p in range(P)]
            except RuntimeError as exc:
                raise CommUnavailable(
                    f"comm symm-mem: this GPU cannot map its peers' buffers (peers are reached "
                    f"by load/store only within one node): {str(exc).splitlines()[0]}; "
                    "use nccl"
                ) from exc
            return tensor, Mapped.of(peers, device), handle

        # the other ranks' rows (push.recv_region); a rank's own pairs go straight into its slots, so at P = 1
        # there is no receive buffer
        shape = shapes_of(symm_mem_buffers(layout.comm_layout(out_dtype)))  # harness.core.comm_buffers
        if P > 1:
            self.recv_rows, self.rows, _ = symmetric(shape["recv_rows"], torch.uint8, "dispatch")
        else:
            self.recv_rows = torch.empty(shape["recv_rows"], dtype=torch.uint8, device=device)
            self.rows = Mapped.of([self.recv_rows], device)
        self.recv_counts, self.counts_of, handle = symmetric(shape["recv_counts"], torch.int32, "dispatch")
        self.combine_recv, self.partials_of, _ = symmetric(shape["combine_recv"], out_dtype, "combine")
        words = FLAG_BASE + NUM_PHASES * P
        pad_bytes = int(handle.signal_pad_size)  # type: ignore[attr-defined]
        if 4 * words > pad_bytes:
            raise CommUnavailable(
                f"comm symm-mem: {P} ranks need {4 * words} B of signal pad; torch's is "
                f"{pad_bytes} (symm_mem.set_signal_pad_size)"
            )
        pads = [handle.get_signal_pad(p, (words,), torch.int32) for p in range(P)]  # type: ignore[attr-defined]
        self.pad, self.pads = pads[rank], Mapped.of(pads, device)
        a = accountant.alloc
        self.pos = a("dispatch", shape["pos"], torch.int32)
        self.row_index = a("dispatch", shape["row_index"], torch.int32)
        self.counts = a("dispatch", shape["counts"], torch.int32)
        self.route_scratch = a("dispatch", shape["route_scratch"], torch.int32)
        self.base = a("dispatch", shape["base"], torch.int32)
        self.table = a("dispatch", shape["table"], torch.int64)
        self.table_w = a("dispatch", shape["table_w"], torch.float32)
        self.tok = a("dispatch", shape["tok"], torch.int32)
        self.epoch = a("dispatch", shape["epoch"], torch.int32)
        self.status = a("dispatch", shape["status"], torch.int32)
        self.done = a("dispatch", shape["done"], torch.int32)  # finished programs of quantize_push and of reduce_push
        local = (
            self.pos,
            self.row_index,
            self.counts,
            self.route_scratch,
            self.base,
            self.table,
            self.table_w,
            self.tok,
            self.epoch,
            self.status,
            self.done,
        )
        harness_bytes = sum(t.nbytes for t in (self.recv_rows, self.recv_counts, self.combine_recv, *local))
        super().__init__(
            layout, BatchedBuffers.allocate(layout, accountant, out_dtype=out_dtype), harness_bytes=harness_bytes
        )
        for t in (self.recv_counts, self.epoch, self.status, self.table_w, self.done):
            t.zero_()
        self.pad[FLAG_BASE:].zero_()
        torch.cuda.synchronize(device)
        dist.barrier()  # every rank's flags and counts are zero before any rank signals

    def dispatch(
        self,
        tokens: torch.Tensor,
        topk_ids: torch.Tensor,
        topk_weights: torch.Tensor,
        quantize: Quantize,
        stages: Stages,
    ) -> DispatchHandle:
        L, b, fmt = self.layout, self.batched, self.fmt
        n, P, E = tokens.shape[0], L.num_ranks, L.num_local_experts
        L.check_tokens(n)  # the invariant that keeps every expert's rows inside its M
        assert b.expert_x_flat is not None and b.expert_x_scale_flat is not None and b.expert_src_flat is not None
        stages.begin()
        consumed = push.Wait(
            pad=self.pad, phase=CONSUMED, num_ranks=P, epoch=self.epoch, status=self.status, bump=True, lag=1
        )
        push.route_layout(
            topk_ids,
            self.pos,
            self.row_index,
            self.counts,
            num_local_experts=E,
            num_ranks=P,
            scratch=self.route_scratch,
            wait_first=consumed,
        )
        stages.lap("dispatch.layout")
        if quantize is quantize_per_token:  # fused: each bf16 token read once
            x, scale = tokens, None
        else:  # another quantize kernel (vLLM's): its FP8 rows and scales, pushed as they are
            x, scale = quantize(tokens)
            x = x.view(torch.uint8)
        ready = push.Signal(
            pads=self.pads,
            phase=READY,
            rank=L.rank,
            epoch=self.epoch,
            done=self.done[0:1],
            counts=self.counts,
            recv_counts=self.counts_of,
            num_local_experts=E,
        )
        slots = push.Slots(
            x=b.expert_x_flat,
            scale=b.expert_x_scale_flat,
            src=b.expert_src_flat,
            table=self.table,
            table_w=self.table_w,
            tok=self.tok,
            max_slots=L.max_slots_per_expert,
        )
        push.quantize_push(
            x,
            scale,
            topk_ids,
            topk_weights,
            self.pos,
            self.row_index,
            self.rows,
            slots,
            fmt=fmt,
            rank=L.rank,
            capacity=L.buffer_tokens,
            num_local_experts=E,
            then=ready,
        )
        stages.lap("dispatch.pack")
        # The exchange is the wait for every READY, run by expert_base's program before it reads the counts.
        ready_wait = push.Wait(pad=self.pad, phase=READY, num_ranks=P, epoch=self.epoch, status=self.status)
        push.expert_base(
            self.recv_counts,
            self.base,
            b.expert_num_tokens,
            b.overflow,
            rank=L.rank,
            max_slots=L.max_slots_per_expert,
            wait_first=ready_wait,
        )
        stages.lap("dispatch.exchange")
        push.expand(self.recv_rows, self.recv_counts, self.base, slots, rank=L.rank, fmt=fmt)
        # CONSUMED as a kernel of its own: on the H200 expand with the signal inside ran 5-6 us slower (a
        # qwen3-30b-a3b-dp2 bench: 52.8 against 47.1 us), more than the launch it saves
        push.signal(self.pads, CONSUMED, rank=L.rank, epoch=self.epoch)
        stages.lap("dispatch.unpack")
        rows_sent = n * L.max_ranks_per_token  # an upper bound: the exact figure would need a host read
        return DispatchHandle(
            num_tokens=n,
            topk_weights=topk_weights,
            dispatch_bytes=rows_sent * fmt.row_bytes,
            combine_bytes=rows_sent * L.hidden_size * self.combine_recv.element_size(),
            num_host_syncs=0,
            state=SymmMemState(row_index=self.row_index[:n]),
        )

    def combine(self, expert_out: torch.Tensor, handle: DispatchHandle, stages: Stages) -> torch.Tensor:
        L, st = self.layout, handle.state
        assert isinstance(st, SymmMemState)
        E, M, K = L.num_local_experts, L.max_slots_per_expert, L.hidden_size
        stages.begin()
        push.reduce_push(
            expert_out.reshape(E * M, K),
            self.recv_counts,
            self.table,
            self.table_w,
            self.tok,
            self.partials_of,
            rank=L.rank,
            then=push.Signal(pads=self.pads, phase=COMBINED, rank=L.rank, epoch=self.epoch, done=self.done[1:2]),
        )
        stages.lap("combine.expert-reduce")
        push.wait(self.pad, COMBINED, num_ranks=L.num_ranks, epoch=self.epoch, status=self.status)
        stages.lap("combine.exchange")
        if L.num_ranks == 1:  # one partial per token, already its sum: the combine buffer is the output
            out = self.combine_recv[: handle.num_tokens]
        else:
            out = push.token_reduce(self.combine_recv, st.row_index, self.batched.combine_out[: handle.num_tokens])
        stages.lap("combine.token-reduce")
        return out

    def combine_terms(self, handle: DispatchHandle) -> tuple[torch.Tensor, torch.Tensor]:
        L, n, st = self.layout, handle.num_tokens, handle.state
        assert isinstance(st, SymmMemState)
        late = int(self.status.item())
        if late:
            raise DispatchError(
                f"rank {L.rank}: a wait for peers {[p for p in range(L.num_ranks) if late >> p & 1]} "
                "ran past its spin budget (a peer stopped or fell behind)"
            )
        P, C, K = L.num_ranks, L.buffer_tokens, L.hidden_size
        rows = self.combine_recv.view(P, C, K)[:, :n].transpose(0, 1).reshape(n * P, K)
        return rows, (st.row_index >= 0).float()
