"""symm-mem: torch's NVSHMEM symmetric memory; the splits never leave the device.

Dispatch, per rank:

    quantize   tokens (n, K) bf16 -> FP8 (n, K) + scales (n, 1)
    layout     (token, slot) pairs sorted by global expert (destination rank, then its local expert, token
               order within); per-expert counts and their send offsets, on the device
    pack       the pairs' FP8 rows and their words (scale, token, source rank, weight) into this dispatch's symmetric
               send buffers (two of each, used in turn)
    exchange   one fixed-size all_to_all_single of (counts, send offsets) for each rank's experts; then every rank
               pulls each (peer, local expert) chunk from the peer's send buffers, which NVSHMEM maps into its
               address space, straight into the batched buffer: expert e at rows [e*M, e*M + count)
               (fused.pull_rows, one Triton kernel)
    unpack     expert_num_tokens from the received counts; scales and sources copied out of the words

Why not torch's all_to_all_vdev_2d, which does this exchange: in torch 2.11 its pull kernel has block 0 overwrite
the source-offsets row with the receive offsets while other blocks may still be reading it, with no grid-wide
barrier in between (torch/csrc/distributed/c10d/symm_mem/nvshmem_extension.cu). A block that reads late pulls
its chunk from the wrong place. benchmarks/soak_comm.py saw it on 2 x H200: 36 of 4000 rank-rounds with wrong
rows, every one at the start of an expert whose first peer sent nothing. Later torch sources write the offsets in
a separate kernel. docs/comm.md has the record.

Ordering without barriers: a peer's send buffer is read after the (counts, offsets) exchange, which the peer
joins only after packing it (stream order); and the peer packs that buffer again two dispatches later, after a
later exchange that this rank joins only after its pull (stream order again). So two send buffers used in turn
make back-to-back dispatches safe with or without a combine between them. A CUDA graph captures one of the two:
replaying a whole round stays ordered (combine's exchange waits for every pull of the round), replaying dispatch
alone back to back would not be.

Combine: the expert side reduces the weighted outputs of each (source rank, token) into one bf16 row (fused.bag_sum
over a dense (P*C, min(top_k, E)) table of its slots, fixed size), one equal-split
all_to_all_single sends C rows to each rank (fixed sizes: no host read), and the token's rank sums the P rows of
each token in float32.

The peers' buffers are reachable only within one node (NVLink): setup refuses ranks whose peers are not mapped.
Never touched without CUDA and NVSHMEM: harness.rank.comm.unavailable_reason answers from the layout
(its declaration, harness.core.backends.COMM) and the torch build alone.
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist

from harness.rank.comm.base import (
    BatchedBuffers, Comm, CommUnavailable, DispatchHandle, DispatchLayout, Quantize, Stages, as_words,
)
from harness.rank.comm.fused import PeerRows, bag_sum, pull_rows
from harness.rank.memory import Accountant
from harness.scenario.fit import SYMM_MEM_MAX_LOCAL_EXPERTS, SYMM_MEM_META_BYTES

MAX_LOCAL_EXPERTS = SYMM_MEM_MAX_LOCAL_EXPERTS  # torch's all_to_all_vdev_2d (the raw collective bench times)
META_WORDS = SYMM_MEM_META_BYTES // 4  # scale, token, source rank, weight: 16 bytes a pair
_HEAP_MARGIN_BYTES = 256 * 2**20


def nvshmem_available() -> bool:
    """Whether this torch build can use NVSHMEM here (a library check; no GPU is touched)."""
    try:
        import torch.distributed._symmetric_memory as symm_mem

        return bool(torch.cuda.is_available() and symm_mem.is_nvshmem_available())
    except (ImportError, RuntimeError):
        return False


class SymmMemComm(Comm):
    name = "symm-mem"

    def __init__(self, layout: DispatchLayout, accountant: Accountant, *, out_dtype: torch.dtype,
                 device: torch.device):
        import torch.distributed._symmetric_memory as symm_mem

        E, M, K = layout.num_local_experts, layout.max_slots_per_expert, layout.hidden_size
        C, P, k = layout.buffer_tokens, layout.num_ranks, layout.top_k
        symmetric_bytes = 2 * C * k * (K + 4 * META_WORDS)
        # NVSHMEM sizes its heap when it starts (at the first symmetric allocation).
        os.environ.setdefault("NVSHMEM_SYMMETRIC_SIZE", str(symmetric_bytes + _HEAP_MARGIN_BYTES))
        if symm_mem.get_backend(device) != "NVSHMEM":
            symm_mem.set_backend("NVSHMEM")
        self.group_name = dist.group.WORLD.group_name

        def symmetric(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
            tensor = symm_mem.empty(shape, dtype=dtype, device=device)
            accountant.adopt("dispatch", tensor)
            return tensor

        self.send_x = symmetric((2, C * k, K), torch.uint8)  # two send buffers, used in turn (module docstring)
        self.send_meta = symmetric((2, C * k, META_WORDS), torch.int32)
        self.meta_out = accountant.alloc("dispatch", (P, 2, E), torch.int64)  # (counts, send offsets) per rank
        self.meta_in = accountant.alloc("dispatch", (P, 2, E), torch.int64)
        self.expert_meta = accountant.alloc("dispatch", (E * M, META_WORDS), torch.int32)
        self.combine_recv = accountant.alloc("combine", (P * C, K), out_dtype)
        harness_bytes = sum(t.nbytes for t in (self.send_x, self.send_meta, self.meta_out, self.meta_in,
                                               self.expert_meta, self.combine_recv))
        recv_x = accountant.alloc("dispatch", (E * M, K), torch.uint8)  # the batched buffer itself
        self.peers = self._map_peers(layout.rank, P)
        super().__init__(layout, BatchedBuffers.allocate(layout, accountant, out_dtype=out_dtype, expert_x=recv_x),
                         harness_bytes=harness_bytes)
        self.recv_x = recv_x
        self.expert_meta.zero_()  # slots past expert_num_tokens are never read, but start them defined
        self._round = 0

    def _map_peers(self, rank: int, P: int) -> list[PeerRows]:
        """Each send buffer of every rank as this GPU reaches it (collective, once: rendezvous)."""
        import torch.distributed._symmetric_memory as symm_mem

        views = []
        for tensor in (self.send_x, self.send_meta):
            handle = symm_mem.rendezvous(tensor, self.group_name)
            try:
                views.append([tensor if p == rank else handle.get_buffer(p, tuple(tensor.shape), tensor.dtype)
                              for p in range(P)])
            except RuntimeError as exc:
                raise CommUnavailable(f"comm symm-mem: this GPU cannot map its peers' buffers (NVSHMEM reaches "
                                      f"peers by load/store only within one node): {str(exc).splitlines()[0]}; "
                                      "use nccl") from exc
        device = self.send_x.device
        return [PeerRows.of([v[b] for v in views[0]], [v[b] for v in views[1]], device) for b in range(2)]

    def dispatch(self, tokens: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor,
                 quantize: Quantize, stages: Stages) -> DispatchHandle:
        L = self.layout
        n, k, M, E, P = tokens.shape[0], L.top_k, L.max_slots_per_expert, L.num_local_experts, L.num_ranks
        L.check_tokens(n)  # the invariant that keeps every expert's rows inside its M (see module docstring)
        stages.begin()
        q, scale = quantize(tokens)
        stages.lap("dispatch.quantize")
        flat = topk_ids.reshape(-1)  # global expert = rank * E + local: rank-major order
        order = torch.sort(flat, stable=True).indices
        token = torch.div(order, k, rounding_mode="floor")
        counts = torch.zeros(P * E, dtype=torch.int64, device=flat.device).index_add_(0, flat, torch.ones_like(flat))
        self.meta_out[:, 0].copy_(counts.view(P, E))
        self.meta_out[:, 1].copy_((torch.cumsum(counts, 0) - counts).view(P, E))
        stages.lap("dispatch.layout")
        b = self._round % 2
        self._round += 1
        num_pairs = n * k
        torch.index_select(as_words(q), 0, token, out=self.send_x[b].view(torch.int64)[:num_pairs])
        self.send_meta[b, :num_pairs].copy_(torch.stack([
            scale.reshape(-1).index_select(0, token).view(torch.int32), token.to(torch.int32),
            torch.full_like(token, L.rank, dtype=torch.int32),
            topk_weights.reshape(-1).index_select(0, order).float().view(torch.int32),
        ], dim=1))
        stages.lap("dispatch.pack")
        dist.all_to_all_single(self.meta_in, self.meta_out)  # after this, every peer's buffer b is packed
        received, src_off = self.meta_in[:, 0], self.meta_in[:, 1]  # (P, E): from rank p for local expert e
        dst_off = torch.arange(E, device=flat.device) * M + (torch.cumsum(received, 0) - received)
        pull_rows(self.peers[b], received, src_off, dst_off, self.recv_x, self.expert_meta, max_rows=L.buffer_tokens)
        stages.lap("dispatch.exchange")
        bags = self._unpack(received.sum(0))
        stages.lap("dispatch.unpack")
        return DispatchHandle(
            num_tokens=n, topk_weights=topk_weights, dispatch_bytes=num_pairs * (L.hidden_size + 4 * META_WORDS),
            combine_bytes=self.combine_recv.numel() * self.combine_recv.element_size(), num_host_syncs=0,
            state=bags,
        )

    def _unpack(self, counts: torch.Tensor) -> dict[str, torch.Tensor]:
        """Counts, scales and sources out of the received words; the bags combine reduces (all on the device)."""
        L, b = self.layout, self.batched
        M = L.max_slots_per_expert
        b.overflow.add_((counts > M).sum())
        b.expert_num_tokens.copy_(counts)
        meta = self.expert_meta
        b.expert_x_scale.view(-1).copy_(meta[:, 0].view(torch.float32))
        b.expert_src.view(-1, 2).copy_(torch.stack([meta[:, 2], meta[:, 1]], dim=1))
        valid = (torch.arange(M, device=meta.device).unsqueeze(0) < counts.unsqueeze(1)).reshape(-1)
        return self._bags(valid)

    def _bags(self, valid: torch.Tensor) -> dict[str, torch.Tensor]:
        """A dense (P*C, W) table of each (source rank, token)'s slots on this rank, W = min(top_k, E) (a token
        picks each expert once), with their weights; unused cells repeat the bag's first slot with weight 0, so
        combine reads only rows the experts wrote. Fixed sizes, no host read."""
        L, meta = self.layout, self.expert_meta
        E, M, P, C = L.num_local_experts, L.max_slots_per_expert, L.num_ranks, L.buffer_tokens
        B, W, device = P * C, min(L.top_k, E), meta.device
        # A slot's words name its bag (source rank, token). Words out of range (never from a correct exchange) put
        # the slot in no bag: its row is then missing from the combined output and the combine check reports the
        # token wrong, where an index past the bag table would stop the rank with a device-side assert.
        source, token = meta[:, 2].to(torch.int64), meta[:, 1].to(torch.int64)
        named = valid & (source >= 0) & (source < P) & (token >= 0) & (token < C)
        key = torch.where(named, source * C + token, B)  # bag (source, token), or none
        order = torch.sort(key, stable=True).indices
        sorted_key = key.index_select(0, order)
        per_bag = torch.zeros(B + 1, dtype=torch.int64, device=device).index_add_(0, key, torch.ones_like(key))
        start = torch.cumsum(per_bag, 0) - per_bag
        position = torch.arange(E * M, device=device) - start.index_select(0, sorted_key)
        cell = torch.where((sorted_key < B) & (position < W), sorted_key * W + position, B * W)  # B*W: a sink
        first = order.index_select(0, start[:B].clamp(max=E * M - 1))  # an empty bag's is masked in combine
        table = torch.cat([first.repeat_interleave(W), first.new_zeros(1)]).index_copy_(0, cell, order)
        weights = torch.zeros(B * W + 1, dtype=torch.float32, device=device)
        weights.index_copy_(0, cell, meta[:, 3].view(torch.float32).index_select(0, order))
        return {"bag_table": table[: B * W].view(B, W), "bag_weights": weights[: B * W].view(B, W)}

    def combine(self, expert_out: torch.Tensor, handle: DispatchHandle, stages: Stages) -> torch.Tensor:
        L, st = self.layout, handle.state
        E, M, K, P, C = L.num_local_experts, L.max_slots_per_expert, L.hidden_size, L.num_ranks, L.buffer_tokens
        n = handle.num_tokens
        stages.begin()
        # (P*C, K); a token that sent nothing here has only zero weights: a zero row, its cells never read
        partial = bag_sum(st["bag_table"], st["bag_weights"], expert_out.reshape(E * M, K))
        stages.lap("combine.expert-reduce")
        dist.all_to_all_single(self.combine_recv, partial)  # C rows to each rank: row s*C + t is its token t
        stages.lap("combine.exchange")
        out = self.batched.combine_out[:n]
        if n:
            out.copy_(torch.sum(self.combine_recv.view(P, C, K)[:, :n], dim=0, dtype=torch.float32))
        stages.lap("combine.token-reduce")
        return out

    def combine_terms(self, handle: DispatchHandle) -> tuple[torch.Tensor, torch.Tensor]:
        L, n = self.layout, handle.num_tokens
        P, C, K = L.num_ranks, L.buffer_tokens, L.hidden_size
        rows = self.combine_recv.view(P, C, K)[:, :n].transpose(0, 1).reshape(n * P, K)
        return rows, torch.ones((n, P), dtype=torch.float32, device=rows.device)
