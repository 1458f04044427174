"""One dispatch and its combine captured in CUDA graphs and replayed: how `harness run`'s timed iterations and
`harness bench` time the comm path where the backend captures (symm-mem; nccl with its capacity-sized equal
splits), as vLLM runs batched decode.

    capture_reason   why this rank's comm does not capture (CPU ranks; a backend that reads on the host), or None
    capture_round    dispatch captured in one graph, its combine in a second, each replayed once (the graphs'
                     own warm-up); the experts step stays eager between the replays
    capture_agreed   capture_round where the comm captures, agreed across ranks: a capture that fails on one rank
                     (an OOM in the graph pool) leaves every rank eager, with the reason

Only the comm calls are captured: a graph that also held the expert step (torch ops after dispatch's Triton
kernels in the same graph) did not take effect on the H200 (docs/comm.md, "Soaking a backend"). A replay reads
the tokens, routing and expert outputs at the addresses the capture saw and writes the same buffers the eager
call writes (every buffer is allocated once at full capacity), so the handle and the output of the capture stay
valid for every replay.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from harness.rank.combine import combine
from harness.rank.comm import Comm, DispatchHandle, DispatchLayout, Quantize
from harness.rank.dispatch import dispatch
from harness.rank.distributed import StageFailure, agree
from harness.rank.route import Routing


def capture_reason(device: torch.device, comm: Comm) -> str | None:
    """Why dispatch and combine are not captured on this rank, or None when they are."""
    if device.type != "cuda":
        return "CPU ranks: no CUDA graphs"
    if not comm.graph_capturable:
        if comm.not_captured_why:
            return comm.not_captured_why.format(name=comm.name)
        return f"comm {comm.name} reads on the host: it does not capture"
    return None


def capture(fn: Callable[[], Any]) -> torch.cuda.CUDAGraph:
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph


@dataclass(frozen=True, kw_only=True)
class CapturedRound:
    """A dispatch and its combine, each in its own CUDA graph; `handle` and `out` are the captured calls' (the
    buffers every replay writes)."""

    dispatch_graph: torch.cuda.CUDAGraph
    combine_graph: torch.cuda.CUDAGraph
    handle: DispatchHandle
    out: torch.Tensor  # (n, K) bf16: a view of the comm's combine buffer

    def dispatch(self) -> DispatchHandle:
        self.dispatch_graph.replay()
        return self.handle

    def combine(self) -> torch.Tensor:
        self.combine_graph.replay()
        return self.out

    def replay(self) -> None:
        self.dispatch_graph.replay()
        self.combine_graph.replay()

    def reset(self) -> None:
        """Free the graphs (and their memory pool) now rather than at garbage collection."""
        self.dispatch_graph.reset()
        self.combine_graph.reset()


def capture_round(
    tokens: torch.Tensor,
    routing: Routing,
    layout: DispatchLayout,
    comm: Comm,
    quantize: Quantize,
    expert_out: torch.Tensor,
) -> CapturedRound:
    """Capture dispatch(tokens (n, K) bf16, routing) and combine(expert_out (E, M, K) bf16), then replay each once.

    Collective: every rank calls it together, after at least one eager dispatch + combine (kernels built, NCCL
    communicators up). Raises whatever the capture raises (the caller agrees on it across ranks).
    """
    device = tokens.device
    torch.cuda.synchronize(device)
    dist.barrier()
    held: dict[str, Any] = {}
    d_graph = capture(lambda: held.setdefault("handle", dispatch(tokens, routing, layout, comm, quantize)))
    c_graph = capture(lambda: held.setdefault("out", combine(expert_out, held["handle"], layout, comm)))
    d_graph.replay()
    c_graph.replay()  # one replay of each before any timing: the graphs' own warm-up
    torch.cuda.synchronize(device)
    return CapturedRound(dispatch_graph=d_graph, combine_graph=c_graph, handle=held["handle"], out=held["out"])


def capture_agreed(
    tokens: torch.Tensor,
    routing: Routing,
    layout: DispatchLayout,
    comm: Comm,
    quantize: Quantize,
    expert_out: torch.Tensor,
) -> tuple[CapturedRound | None, str | None]:
    """(the captured round, None), or (None, why eager): capture_reason, or the capture failed on some rank (every
    rank then agrees to time eager). Collective where the comm captures."""
    reason = capture_reason(tokens.device, comm)
    if reason is not None:
        return None, reason
    own, captured = None, None
    try:
        captured = capture_round(tokens, routing, layout, comm, quantize, expert_out)
    except Exception as exc:  # noqa: BLE001 - agreed below; the caller times eager instead
        own = StageFailure.of("capture", exc)
    failed = agree(own, tokens.device)
    if not failed:
        return captured, None
    if captured is not None:
        captured.reset()
    rank = min(failed)
    return None, f"capture failed on rank {rank}: {failed[rank].message}"
