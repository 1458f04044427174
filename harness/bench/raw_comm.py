"""The raw collectives the bench sets against the harness's dispatch and combine, and those two with their
sub-stages; every raw collective that works here moves the same bytes per peer as the harness did:

    dispatch:harness        the comm backend's dispatch; its sub-stages appear as dispatch.quantize,
                            dispatch.layout, dispatch.pack, dispatch.exchange, dispatch.unpack
    combine:harness         likewise: combine.expert-reduce, combine.exchange, combine.token-reduce
    a2a:raw-dispatch        NCCL (gloo on CPU) all_to_all_single of the dispatch's bytes, same per-peer splits
    a2a:raw-combine         the same for combine's bytes
    vdev:raw-dispatch       NVSHMEM all_to_all_vdev of the same rows, splits on the device   (CUDA + NVSHMEM)
    vdev:raw-combine
    vdev2d:raw-dispatch     NVSHMEM all_to_all_vdev_2d of the same rows per (peer, expert)  (and E <= 16: its limit)

The comm ratio divides the fastest raw dispatch plus the fastest raw combine by the harness's dispatch plus
combine: the fastest collective on the machine, not the backend's own.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from harness.rank.comm import DispatchHandle, Stages
from harness.rank.comm.symm_mem import MAX_LOCAL_EXPERTS, META_WORDS, SymmMemComm, nvshmem_available
from harness.rank.combine import combine
from harness.rank.dispatch import dispatch
from harness.rank.timing import StageTimer

RAW_DISPATCH = ("a2a:raw-dispatch", "vdev:raw-dispatch", "vdev2d:raw-dispatch")
RAW_COMBINE = ("a2a:raw-combine", "vdev:raw-combine")


@dataclass(frozen=True, kw_only=True)
class PeerBytes:
    """What one exchange moves: rows of `row_bytes` per peer, as this rank sends and receives them."""

    row_bytes: int
    send_rows: list[int]
    recv_rows: list[int]
    send_rows_per_expert: list[int] | None = None  # (peer, local expert) rank-major, for the 2d variant

    @property
    def send_bytes(self) -> int:
        return sum(self.send_rows) * self.row_bytes


@dataclass
class CommVariants:
    """Closures the bench interleaves, named as in the module docstring, and the bytes they move."""

    variants: list[tuple[str, Callable[[], Any]]] = field(default_factory=list)
    dispatch: PeerBytes | None = None
    combine: PeerBytes | None = None
    handle: DispatchHandle | None = None

    def ratio(self, median_us: dict[str, float]) -> tuple[float, str, str]:
        """(fastest raw dispatch + fastest raw combine) / (harness dispatch + harness combine), and the names."""
        raw_d = min((n for n in RAW_DISPATCH if n in median_us), key=median_us.__getitem__)
        raw_c = min((n for n in RAW_COMBINE if n in median_us), key=median_us.__getitem__)
        harness = median_us["dispatch:harness"] + median_us["combine:harness"]
        return (median_us[raw_d] + median_us[raw_c]) / harness, raw_d, raw_c


def _peer_bytes(setup: Any, handle: DispatchHandle) -> tuple[PeerBytes, PeerBytes]:
    """The harness's own per-peer rows of one dispatch and its combine (one host read, outside the timing)."""
    comm, L = setup.buffers, setup.layout
    K, P, E, C = L.hidden_size, L.num_ranks, L.num_local_experts, L.buffer_tokens
    out_bytes = comm.combine_recv.element_size() * K
    if isinstance(comm, SymmMemComm):
        per_expert = comm.meta_out[:, 0].reshape(-1).tolist()  # (counts, send offsets) per destination rank
        received = comm.meta_in[:, 0].sum(1).tolist()
        sent = [sum(per_expert[r * E:(r + 1) * E]) for r in range(P)]
        return (PeerBytes(row_bytes=K + 4 * META_WORDS, send_rows=sent, recv_rows=received,
                          send_rows_per_expert=per_expert),
                PeerBytes(row_bytes=out_bytes, send_rows=[C] * P, recv_rows=[C] * P))
    st = handle.state
    send, recv = list(st["send_splits"]), list(st["recv_splits"])  # type: ignore[call-overload]
    per_expert = [s // E + (1 if e < s % E else 0) for s in send for e in range(E)]
    return (PeerBytes(row_bytes=comm.fmt.row_bytes, send_rows=send, recv_rows=recv, send_rows_per_expert=per_expert),
            PeerBytes(row_bytes=out_bytes, send_rows=recv, recv_rows=send))


def _raw_a2a(pb: PeerBytes, device: torch.device) -> Callable[[], None]:
    send = torch.zeros(sum(pb.send_rows) * pb.row_bytes, dtype=torch.uint8, device=device)
    recv = torch.zeros(sum(pb.recv_rows) * pb.row_bytes, dtype=torch.uint8, device=device)
    in_splits = [r * pb.row_bytes for r in pb.send_rows]
    out_splits = [r * pb.row_bytes for r in pb.recv_rows]
    return lambda: dist.all_to_all_single(recv, send, output_split_sizes=out_splits, input_split_sizes=in_splits)


def _nvshmem(device: torch.device) -> Any:
    """torch's symmetric memory on NVSHMEM (the default CUDA backend has no all_to_all_vdev: "NYI")."""
    import torch.distributed._symmetric_memory as symm_mem

    if symm_mem.get_backend(device) != "NVSHMEM":
        symm_mem.set_backend("NVSHMEM")
    return symm_mem


_VDEV_ROW_BYTES = 64  # the unit all_to_all_vdev moves here


def vdev_blocks_per_peer(input_bytes: int, num_ranks: int) -> int:
    """How many blocks torch 2.11's allToAllV gives each peer (nvshmem_extension.cu: 8 to 64 blocks by input size,
    at most 16 or 8 past 8 ranks, split evenly over the peers). It asserts that each peer's bytes divide evenly
    over them, so the raw variant pads each peer's bytes up to a multiple of 64 B times this (under 2 KiB)."""
    mib = 2**20
    blocks = 8 if input_bytes < mib else 16 if input_bytes < 2 * mib else 32 if input_bytes < 4 * mib else 64
    if num_ranks > 8:
        blocks = min(blocks, 16 if num_ranks <= 16 else 8)
    return max(blocks // num_ranks, 1)


def vdev_rows(pb: PeerBytes, capacity_rows: int) -> tuple[int, list[int]]:
    """(capacity, per-peer send splits) in _VDEV_ROW_BYTES rows for all_to_all_vdev: each peer's bytes padded up
    to what its blocks divide evenly (vdev_blocks_per_peer)."""
    P = len(pb.send_rows)
    base = -(-capacity_rows * pb.row_bytes // _VDEV_ROW_BYTES)
    per_peer = vdev_blocks_per_peer(base * _VDEV_ROW_BYTES, P)
    while vdev_blocks_per_peer((base + P * per_peer) * _VDEV_ROW_BYTES, P) != per_peer:  # room for the padding
        per_peer = vdev_blocks_per_peer((base + P * per_peer) * _VDEV_ROW_BYTES, P)
    unit = _VDEV_ROW_BYTES * per_peer
    return base + P * per_peer, [-(-rows * pb.row_bytes // unit) * per_peer for rows in pb.send_rows]


def _raw_vdev(pb: PeerBytes, device: torch.device, capacity_rows: int) -> Callable[[], None]:
    symm_mem = _nvshmem(device)
    P = len(pb.send_rows)
    group = dist.group.WORLD.group_name  # type: ignore[union-attr]
    capacity, send_rows = vdev_rows(pb, capacity_rows)
    send = symm_mem.empty((capacity, _VDEV_ROW_BYTES), dtype=torch.uint8, device=device).zero_()
    recv = symm_mem.empty((capacity * P, _VDEV_ROW_BYTES), dtype=torch.uint8, device=device)
    splits = symm_mem.empty((P,), dtype=torch.int64, device=device).copy_(torch.tensor(send_rows))
    out = symm_mem.empty((2, P), dtype=torch.int64, device=device)
    for t in (send, recv, splits, out):
        symm_mem.rendezvous(t, group)
    return lambda: torch.ops.symm_mem.all_to_all_vdev(send, recv, splits, out, group)


def _raw_vdev_2d(pb: PeerBytes, device: torch.device, capacity_rows: int, num_experts: int) -> Callable[[], None]:
    symm_mem = _nvshmem(device)
    assert pb.send_rows_per_expert is not None
    P = len(pb.send_rows)
    group = dist.group.WORLD.group_name  # type: ignore[union-attr]
    send = symm_mem.empty((capacity_rows, pb.row_bytes), dtype=torch.uint8, device=device).zero_()
    recv = symm_mem.empty((capacity_rows * P + num_experts, pb.row_bytes), dtype=torch.uint8, device=device)
    splits = symm_mem.empty((P * num_experts,), dtype=torch.int64, device=device)
    splits.copy_(torch.tensor(pb.send_rows_per_expert))
    out = symm_mem.empty((2, P * num_experts), dtype=torch.int64, device=device)
    for t in (send, recv, splits, out):
        symm_mem.rendezvous(t, group)
    return lambda: torch.ops.symm_mem.all_to_all_vdev_2d(send, recv, splits, out, group, major_align=1)


def _max_over_ranks(value: int, device: torch.device) -> int:
    """Symmetric buffers have one size on every rank: the largest any rank needs."""
    t = torch.tensor([value], dtype=torch.int64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return int(t.item())


def comm_variants(setup: Any, expert_out: torch.Tensor, timer: StageTimer) -> CommVariants:
    """Build the comm variants for one policy: one harness dispatch (for the splits), then raw buffers."""
    device, L = setup.device, setup.layout
    handle = dispatch(setup.tokens, setup.routing, L, setup.buffers, setup.quantize)
    d_bytes, c_bytes = _peer_bytes(setup, handle)
    cv = CommVariants(dispatch=d_bytes, combine=c_bytes, handle=handle)

    def harness_dispatch() -> None:
        cv.handle = dispatch(setup.tokens, setup.routing, L, setup.buffers, setup.quantize, stages=Stages(timer))

    def harness_combine() -> None:
        assert cv.handle is not None
        combine(expert_out, cv.handle, L, setup.buffers, stages=Stages(timer))

    cv.variants += [("dispatch:harness", harness_dispatch), ("a2a:raw-dispatch", _raw_a2a(d_bytes, device))]
    if device.type == "cuda" and nvshmem_available() and L.num_ranks > 1:  # rendezvous needs two ranks
        d_rows = _max_over_ranks(max(sum(d_bytes.send_rows), 1), device)
        c_rows = _max_over_ranks(max(sum(c_bytes.send_rows), 1), device)
        cv.variants.append(("vdev:raw-dispatch", _raw_vdev(d_bytes, device, d_rows)))
        if L.num_local_experts <= MAX_LOCAL_EXPERTS:
            cv.variants.append(("vdev2d:raw-dispatch", _raw_vdev_2d(d_bytes, device, d_rows, L.num_local_experts)))
        combine_raw = [("vdev:raw-combine", _raw_vdev(c_bytes, device, c_rows))]
    else:
        combine_raw = []
    cv.variants += [("combine:harness", harness_combine), ("a2a:raw-combine", _raw_a2a(c_bytes, device)),
                    *combine_raw]
    return cv


def reserve_symmetric_heap(scenario: Any) -> None:
    """Size NVSHMEM's heap (fixed when NVSHMEM starts, at the first symmetric allocation) for the symm-mem
    backend's buffers and the raw variants' together: the batched buffer, and four pair-sized row buffers."""
    p, K = scenario.parallel, scenario.model.hidden_size
    num_tokens = max(scenario.num_tokens_on_rank(r) for r in range(p.num_ranks))
    rows = scenario.num_local_experts * p.max_tokens_per_rank * p.num_dispatchers
    rows += 4 * num_tokens * scenario.model.top_k * p.num_ranks
    os.environ.setdefault("NVSHMEM_SYMMETRIC_SIZE", str(rows * (K + 4 * META_WORDS) + 2**30))
