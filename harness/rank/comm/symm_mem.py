"""symm-mem: torch's NVSHMEM symmetric memory; the splits never leave the device.

Dispatch, per rank:

    quantize   tokens (n, K) bf16 -> FP8 (n, K) + scales (n, 1)
    layout     (token, slot) pairs sorted by global expert (destination rank, then its local expert, token
               order within); per-expert counts into the symmetric in_splits, on the device
    pack       the pairs' FP8 rows and their words (scale, token, source rank, weight) into symmetric send buffers
    exchange   all_to_all_vdev_2d with major_align = M, twice (rows, words): the receiver pulls each expert's rows
               straight into the batched buffer, expert e at rows [e*M, e*M + count): it *is* expert_x (E, M, K)
    unpack     expert_num_tokens from the received splits; scales and sources copied out of the words

Combine: the expert side reduces the weighted outputs of each (source rank, token) into one bf16 row (fused.bag_sum
over a dense (P*C, min(top_k, E)) table of its slots, fixed size), one equal-split
all_to_all_single sends C rows to each rank (fixed sizes: no host read), and the token's rank sums the P rows of
each token in float32.

Limits of torch's kernels (torch/csrc/distributed/c10d/symm_mem/nvshmem_extension.cu): all_to_all_vdev_2d takes
at most 16 local experts (one 32-thread tile each in a 512-thread block) and 32 ranks. Empty experts still get
their M rows (the kernel pads an empty bin to major_align), so every expert starts at e*M.

Never touched without CUDA and NVSHMEM: harness.rank.comm.unavailable_reason answers from the layout
(harness.scenario.fit.comm_reason) and the torch build alone.
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist

from harness.rank.comm.base import (
    BatchedBuffers, Comm, DispatchHandle, DispatchLayout, Quantize, Stages, as_words,
)
from harness.rank.comm.fused import bag_sum
from harness.rank.memory import Accountant
from harness.scenario.fit import SYMM_MEM_MAX_LOCAL_EXPERTS, SYMM_MEM_META_BYTES

MAX_LOCAL_EXPERTS = SYMM_MEM_MAX_LOCAL_EXPERTS  # "Number of experts must be smaller than NUM_TILES" (16)
META_WORDS = SYMM_MEM_META_BYTES // 4  # scale, token, source rank, weight: 16 bytes a pair
_HEAP_MARGIN_BYTES = 256 * 2**20


def nvshmem_available() -> bool:
    """Whether this torch build can use NVSHMEM here (a library check; no GPU is touched)."""
    try:
        import torch.distributed._symmetric_memory as symm_mem

        return bool(torch.cuda.is_available() and symm_mem.is_nvshmem_available())
    except (ImportError, RuntimeError):
        return False


def _describe(**tensors: torch.Tensor) -> str:
    return ", ".join(f"{name} {tuple(t.shape)} {str(t.dtype).removeprefix('torch.')}" for name, t in tensors.items())


def _vdev_2d(send: torch.Tensor, recv: torch.Tensor, in_splits: torch.Tensor, out_splits_offsets: torch.Tensor,
             group_name: str, major_align: int) -> None:
    """torch.ops.symm_mem.all_to_all_vdev_2d; a failure names every argument's shape and dtype."""
    try:
        torch.ops.symm_mem.all_to_all_vdev_2d(send, recv, in_splits, out_splits_offsets, group_name,
                                              major_align=major_align)
    except RuntimeError as exc:
        args = _describe(input=send, out=recv, in_splits=in_splits, out_splits_offsets=out_splits_offsets)
        raise RuntimeError(f"all_to_all_vdev_2d({args}, major_align={major_align}): {exc}") from exc


class SymmMemComm(Comm):
    name = "symm-mem"

    def __init__(self, layout: DispatchLayout, accountant: Accountant, *, out_dtype: torch.dtype,
                 device: torch.device):
        import torch.distributed._symmetric_memory as symm_mem

        E, M, K = layout.num_local_experts, layout.max_slots_per_expert, layout.hidden_size
        C, P, k = layout.buffer_tokens, layout.num_ranks, layout.top_k
        symmetric_bytes = C * k * (K + 4 * META_WORDS) + E * M * (K + 4 * META_WORDS) + 5 * P * E * 8
        # NVSHMEM sizes its heap when it starts (at the first symmetric allocation).
        os.environ.setdefault("NVSHMEM_SYMMETRIC_SIZE", str(symmetric_bytes + _HEAP_MARGIN_BYTES))
        if symm_mem.get_backend(device) != "NVSHMEM":
            symm_mem.set_backend("NVSHMEM")
        self.group_name = dist.group.WORLD.group_name

        def symmetric(category: str, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
            tensor = symm_mem.empty(shape, dtype=dtype, device=device)
            accountant.adopt(category, tensor)
            return tensor

        self.send_x = symmetric("dispatch", (C * k, K), torch.uint8)
        self.send_meta = symmetric("dispatch", (C * k, META_WORDS), torch.int32)
        self.in_splits = symmetric("dispatch", (P * E,), torch.int64)
        # One (splits, offsets) pad per exchange. torch's allToAllV_2d ends by overwriting the offsets row with the
        # receive offsets, and the next exchange's first kernel has peers write source offsets into that row with
        # no barrier before it: with one pad for both exchanges, a peer already in the second could write its
        # source offsets before this rank's first kernel overwrote them, and the second would then read receive
        # offsets as source offsets (torch/csrc/distributed/c10d/symm_mem/nvshmem_extension.cu).
        self.out_splits_offsets = symmetric("dispatch", (2, P * E), torch.int64)
        self.meta_splits_offsets = symmetric("dispatch", (2, P * E), torch.int64)
        self.expert_meta = symmetric("dispatch", (E * M, META_WORDS), torch.int32)
        self.combine_recv = accountant.alloc("combine", (P * C, K), out_dtype)
        harness_bytes = sum(t.nbytes for t in (self.send_x, self.send_meta, self.in_splits, self.out_splits_offsets,
                                               self.meta_splits_offsets, self.expert_meta, self.combine_recv))
        recv_x = symmetric("dispatch", (E * M, K), torch.uint8)  # the batched buffer itself
        for tensor in (self.send_x, self.send_meta, self.in_splits, self.out_splits_offsets, self.meta_splits_offsets,
                       self.expert_meta, recv_x):
            symm_mem.rendezvous(tensor, self.group_name)  # collective, once: the timed path finds the handles cached
        super().__init__(layout, BatchedBuffers.allocate(layout, accountant, out_dtype=out_dtype, expert_x=recv_x),
                         harness_bytes=harness_bytes)
        self.recv_x = recv_x
        self.expert_meta.zero_()  # slots past expert_num_tokens are never read, but start them defined

    def dispatch(self, tokens: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor,
                 quantize: Quantize, stages: Stages) -> DispatchHandle:
        L = self.layout
        n, k, M = tokens.shape[0], L.top_k, L.max_slots_per_expert
        L.check_tokens(n)  # the invariant that keeps every expert's rows inside its M (see module docstring)
        stages.begin()
        q, scale = quantize(tokens)
        stages.lap("dispatch.quantize")
        flat = topk_ids.reshape(-1)  # global expert = rank * E + local: the rank-major order of in_splits
        order = torch.sort(flat, stable=True).indices
        token = torch.div(order, k, rounding_mode="floor")
        self.in_splits.zero_().index_add_(0, flat, torch.ones_like(flat))
        stages.lap("dispatch.layout")
        num_pairs = n * k
        torch.index_select(as_words(q), 0, token, out=self.send_x.view(torch.int64)[:num_pairs])
        self.send_meta[:num_pairs].copy_(torch.stack([
            scale.reshape(-1).index_select(0, token).view(torch.int32), token.to(torch.int32),
            torch.full_like(token, L.rank, dtype=torch.int32),
            topk_weights.reshape(-1).index_select(0, order).float().view(torch.int32),
        ], dim=1))
        stages.lap("dispatch.pack")
        _vdev_2d(self.send_x, self.recv_x, self.in_splits, self.out_splits_offsets, self.group_name, M)
        _vdev_2d(self.send_meta, self.expert_meta, self.in_splits, self.meta_splits_offsets, self.group_name, M)
        stages.lap("dispatch.exchange")
        bags = self._unpack()
        stages.lap("dispatch.unpack")
        return DispatchHandle(
            num_tokens=n, topk_weights=topk_weights, dispatch_bytes=num_pairs * (L.hidden_size + 4 * META_WORDS),
            combine_bytes=self.combine_recv.numel() * self.combine_recv.element_size(), num_host_syncs=0,
            state=bags,
        )

    def _unpack(self) -> dict[str, torch.Tensor]:
        """Counts, scales and sources out of the received words; the bags combine reduces (all on the device)."""
        L, b = self.layout, self.batched
        E, M, P = L.num_local_experts, L.max_slots_per_expert, L.num_ranks
        counts = self.out_splits_offsets[0].view(E, P).sum(1)  # received splits are (expert, source rank)
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
