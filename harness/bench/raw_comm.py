"""The raw collectives the bench sets against the harness's dispatch and combine, those two with their
sub-stages, and their CUDA-graph replays:

    dispatch:harness        the comm backend's dispatch, eager; its sub-stages appear as dispatch.layout, ...
    combine:harness         likewise: combine.expert-reduce, combine.exchange, combine.token-reduce
    dispatch:graph          one dispatch captured in a CUDA graph, replayed (backends that capture: symm-mem, nccl)
                            behind a GPU sleep (harness.rank.timing.QueueAhead): the GPU's time for the graph, its
                            launch hidden as inside vLLM's replayed forward pass; what the yardstick measures
    combine:graph           likewise, right after its dispatch (a combine belongs to one dispatch)
    dispatch:graph-idle     the same replays launched on an idle GPU: with the graph's launch latency (a diagnostic)
    combine:graph-idle
    a2a:raw-dispatch        NCCL (gloo on CPU) all_to_all_single of the dispatch's bytes, same per-peer splits
    a2a:raw-combine         the same for combine's bytes

The raw ratio (raw dispatch + raw combine over harness dispatch + combine) is a diagnostic: what gates is the
yardstick's bound (harness.bench.yardstick), the same for every backend.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from harness.rank.combine import combine
from harness.rank.comm import DispatchHandle, Stages
from harness.rank.comm.symm_mem import SymmMemComm
from harness.rank.dispatch import dispatch
from harness.rank.graphs import capture_reason, capture_round
from harness.rank.timing import StageTimer

QUEUED = frozenset({"dispatch:graph", "combine:graph"})  # timed behind a GPU sleep (QueueAhead)
RAW_DISPATCH = ("a2a:raw-dispatch",)
RAW_COMBINE = ("a2a:raw-combine",)


@dataclass(frozen=True, kw_only=True)
class PeerBytes:
    """What one exchange moves: rows of `row_bytes` per peer, as this rank sends and receives them."""

    row_bytes: int
    send_rows: list[int]
    recv_rows: list[int]

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
    graph_error: str | None = None  # why the harness's dispatch and combine were not captured, where they were not
    replay: Callable[[], None] | None = None  # one replayed dispatch + combine (for the profiler)

    def ratio(self, median_us: dict[str, float]) -> tuple[float, str, str]:
        """(fastest raw dispatch + fastest raw combine) / (harness dispatch + harness combine), and the names."""
        raw_d = min((n for n in RAW_DISPATCH if n in median_us), key=median_us.__getitem__)
        raw_c = min((n for n in RAW_COMBINE if n in median_us), key=median_us.__getitem__)
        harness = median_us["dispatch:harness"] + median_us["combine:harness"]
        return (median_us[raw_d] + median_us[raw_c]) / harness, raw_d, raw_c


def _peer_bytes(setup: Any, handle: DispatchHandle) -> tuple[PeerBytes, PeerBytes]:
    """The harness's own per-peer rows of one dispatch and its combine (one host read, outside the timing)."""
    comm, L = setup.buffers, setup.layout
    K, P, E = L.hidden_size, L.num_ranks, L.num_local_experts
    out_bytes = comm.combine_recv.element_size() * K
    if isinstance(comm, SymmMemComm):
        sent = comm.counts[E * P :].tolist()  # rows to each destination
        received = comm.recv_counts[:, E].tolist()
        row_bytes = comm.fmt.row_bytes
    else:
        # the rows that carry a token: the equal splits move every region at its capacity, the rest ignored
        sent, received = comm.send_counts.tolist(), comm.recv_counts.tolist()
        row_bytes = comm.fmt.row_bytes
    return (
        PeerBytes(row_bytes=row_bytes, send_rows=sent, recv_rows=received),
        PeerBytes(row_bytes=out_bytes, send_rows=received, recv_rows=sent),
    )


def _raw_a2a(pb: PeerBytes, device: torch.device) -> Callable[[], None]:
    send = torch.zeros(sum(pb.send_rows) * pb.row_bytes, dtype=torch.uint8, device=device)
    recv = torch.zeros(sum(pb.recv_rows) * pb.row_bytes, dtype=torch.uint8, device=device)
    in_splits = [r * pb.row_bytes for r in pb.send_rows]
    out_splits = [r * pb.row_bytes for r in pb.recv_rows]
    return lambda: dist.all_to_all_single(recv, send, output_split_sizes=out_splits, input_split_sizes=in_splits)


def comm_variants(setup: Any, expert_out: torch.Tensor, timer: StageTimer) -> CommVariants:
    """Build the comm variants for one policy: one harness dispatch (for the splits) and its combine, the graphs
    where the backend captures, then raw buffers."""
    device, L = setup.device, setup.layout
    handle = dispatch(setup.tokens, setup.routing, L, setup.buffers, setup.quantize)
    d_bytes, c_bytes = _peer_bytes(setup, handle)
    combine(expert_out, handle, L, setup.buffers)
    cv = CommVariants(dispatch=d_bytes, combine=c_bytes, handle=handle)

    def harness_dispatch() -> None:
        cv.handle = dispatch(setup.tokens, setup.routing, L, setup.buffers, setup.quantize, stages=Stages(timer))

    def harness_combine() -> None:
        assert cv.handle is not None
        combine(expert_out, cv.handle, L, setup.buffers, stages=Stages(timer))

    graphs: list[tuple[str, Callable[[], Any]]] = []
    cv.graph_error = capture_reason(device, setup.buffers)
    if cv.graph_error is None:
        rnd = capture_round(setup.tokens, setup.routing, L, setup.buffers, setup.quantize, expert_out)
        graphs = [
            ("dispatch:graph", rnd.dispatch_graph.replay),
            ("combine:graph", rnd.combine_graph.replay),
            ("dispatch:graph-idle", rnd.dispatch_graph.replay),
            ("combine:graph-idle", rnd.combine_graph.replay),
        ]
        cv.replay = rnd.replay
    cv.variants += [("dispatch:harness", harness_dispatch), ("a2a:raw-dispatch", _raw_a2a(d_bytes, device))]
    cv.variants += [("combine:harness", harness_combine), ("a2a:raw-combine", _raw_a2a(c_bytes, device)), *graphs]
    return cv
