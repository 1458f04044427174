"""The comm yardstick, the same for every backend: the bytes dispatch and combine must move, the bandwidths of this
run's own copy probes, the bound they give, CUDA-graph replays of the harness's dispatch and combine (the GPU's
time: each replay queued behind a GPU sleep, harness.rank.timing.QueueAhead; the same replays launched on an idle
GPU beside them, launch latency included), and the profiler's per-kernel GPU time.

Bytes, per rank, from the rank's routing and the dispatch's received counts (host reads outside any timing):

    minimal remote   dispatch: one FP8 row + its float32 scale + top_k int16 ids per (token, distinct remote
                     rank); combine: one bf16 partial per (token, distinct remote rank)
    local            writing every (token, expert) slot this rank's experts received (FP8 row + scale), and
                     reading every expert output (bf16 row): work no backend can skip
    moved            what the backend puts on the link: its row format per (token, distinct remote rank) both
                     ways (symm-mem and the collective path both send one row per (token, destination rank))
    anchors          DeepEP's per-selection count, every (token, top-k selection): (K + K/128 * 4 + 16) bytes
                     for dispatch, 2K for combine, so its tables line up with these numbers

    bound = minimal remote / link bandwidth + local / HBM bandwidth, per stage; ratio = bound / measured

Both bandwidths come from copy probes in the same run: HBM a device-to-device copy (bytes read + written over
the time), the link a copy from a peer's symmetric buffer into this GPU (bytes over the time; P >= 2). At P = 1
there is no remote byte, and on CPU ranks no probe: the bound and the ratio are None there ("n/a").
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import Any, Literal

import torch
import torch.distributed as dist

from harness.bench.records import CommYardstick, KernelTime
from harness.rank.timing import QueueAhead

_PROBE_BYTES = 1 << 30  # 1 GiB: many times the H200's 50 MB L2
_PROBE_REPEATS = 10
_LINK_PROBE_BYTES = 256 << 20
ID_BYTES = 2  # an int16 local expert id per top-k slot


def _median_event_us(fn: Callable[[], Any], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    return statistics.median(times)


def hbm_probe_gbps(device: torch.device) -> float | None:
    """Device-to-device copy bandwidth, (read + write) bytes over the median time; None off CUDA."""
    if device.type != "cuda":
        return None
    src = torch.empty(_PROBE_BYTES, dtype=torch.uint8, device=device).random_(0, 255)
    dst = torch.empty_like(src)
    dst.copy_(src)
    us = _median_event_us(lambda: dst.copy_(src), _PROBE_REPEATS)
    return 2 * _PROBE_BYTES / (us * 1e3)


def link_probe_gbps(device: torch.device, rank: int, num_ranks: int) -> float | None:
    """One-way bandwidth of a copy from the next rank's symmetric buffer into this GPU (every rank at once, as
    in an exchange); None at P = 1 or off CUDA. Collective."""
    if device.type != "cuda" or num_ranks < 2:
        return None
    import torch.distributed._symmetric_memory as symm_mem

    buf = symm_mem.empty(_LINK_PROBE_BYTES, dtype=torch.uint8, device=device).fill_(rank)
    handle = symm_mem.rendezvous(buf, dist.group.WORLD.group_name)  # type: ignore[union-attr]
    peer = handle.get_buffer((rank + 1) % num_ranks, (_LINK_PROBE_BYTES,), torch.uint8)
    dst = torch.empty(_LINK_PROBE_BYTES, dtype=torch.uint8, device=device)
    torch.cuda.synchronize(device)
    dist.barrier()
    dst.copy_(peer)
    times = []
    for _ in range(_PROBE_REPEATS):
        torch.cuda.synchronize(device)
        dist.barrier()
        times.append(_median_event_us(lambda: dst.copy_(peer), 1))
    torch.cuda.synchronize(device)
    dist.barrier()  # no rank frees its buffer while a peer still reads it
    return _LINK_PROBE_BYTES / (statistics.median(times) * 1e3)


def distinct_remote_rows(topk_ids: torch.Tensor, *, rank: int, num_local_experts: int, num_ranks: int) -> int:
    """(token, destination rank) pairs with a destination other than `rank`: the rows that cross the link."""
    n = topk_ids.shape[0]
    if n == 0:
        return 0
    member = torch.zeros((n, num_ranks), dtype=torch.bool)
    member.scatter_(1, torch.div(topk_ids.cpu(), num_local_experts, rounding_mode="floor"), True)
    member[:, rank] = False
    return int(member.sum())


def yardstick(
    *,
    topk_ids: torch.Tensor,
    rank: int,
    num_ranks: int,
    num_local_experts: int,
    hidden_size: int,
    received_pairs: int,
    moved_row_bytes: int,
    out_bytes: int,
    hbm_gbps: float | None,
    link_gbps: float | None,
    dispatch_us: float,
    combine_us: float,
    timing: Literal["graph", "eager"],
    idle_dispatch_us: float | None = None,
    idle_combine_us: float | None = None,
    queue: QueueAhead | None = None,
) -> CommYardstick:
    """The bytes, bound and ratio of one rank (module docstring); topk_ids (n, top_k) this rank's routing."""
    K, k = hidden_size, topk_ids.shape[1] if topk_ids.dim() == 2 else 1
    remote_rows = distinct_remote_rows(topk_ids, rank=rank, num_local_experts=num_local_experts, num_ranks=num_ranks)
    selections = int((topk_ids >= 0).sum())
    d_remote = remote_rows * (K + 4 + ID_BYTES * k)
    c_remote = remote_rows * K * out_bytes
    d_local = received_pairs * (K + 4)
    c_local = received_pairs * K * out_bytes
    bound_d = bound_c = None
    if hbm_gbps is not None and (num_ranks == 1 or link_gbps is not None):
        link = link_gbps or float("inf")  # P = 1: no remote byte
        bound_d = (d_remote / link + d_local / hbm_gbps) / 1e3
        bound_c = (c_remote / link + c_local / hbm_gbps) / 1e3
    ratio = None if bound_d is None or bound_c is None else (bound_d + bound_c) / (dispatch_us + combine_us)
    return CommYardstick(
        timing=timing,
        hbm_gbps=hbm_gbps,
        link_gbps=link_gbps,
        remote_rows=remote_rows,
        selections=selections,
        received_pairs=received_pairs,
        dispatch_min_remote_bytes=d_remote,
        combine_min_remote_bytes=c_remote,
        dispatch_local_bytes=d_local,
        combine_local_bytes=c_local,
        dispatch_moved_bytes=remote_rows * moved_row_bytes,
        combine_moved_bytes=c_remote,
        anchor_dispatch_bytes=selections * (K + K // 128 * 4 + 16),
        anchor_combine_bytes=selections * 2 * K,
        dispatch_us=dispatch_us,
        combine_us=combine_us,
        dispatch_bound_us=bound_d,
        combine_bound_us=bound_c,
        bound_ratio=ratio,
        idle_dispatch_us=idle_dispatch_us,
        idle_combine_us=idle_combine_us,
        queued_ahead_us=queue.sleep_us if queue is not None else None,
        late_samples=queue.late if queue is not None else 0,
    )


def kernel_times(fn: Callable[[], Any], device: torch.device, rounds: int) -> list[KernelTime]:
    """GPU time per kernel name over `rounds` calls of fn, from torch.profiler's device events (kernels inside a
    graph replay are reported one by one); per round. Empty off CUDA."""
    if device.type != "cuda":
        return []
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize(device)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(rounds):
            fn()
        torch.cuda.synchronize(device)
    total: dict[str, list[float]] = {}
    for event in prof.events():
        if event.device_type != torch.autograd.DeviceType.CUDA:
            continue
        us = float(getattr(event, "device_time", None) or getattr(event, "cuda_time", 0.0) or 0.0)
        total.setdefault(event.name, []).append(us)
    times = [
        KernelTime(name=name[:200], calls_per_round=len(v) / rounds, us_per_round=sum(v) / rounds)
        for name, v in total.items()
    ]
    return sorted(times, key=lambda t: -t.us_per_round)
