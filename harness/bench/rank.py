"""The bench's rank side: the same setup and warm-up as `harness run`, then per policy allocate -> prepare ->
iterate -> judge, every variant interleaved round by round (A B C ... A B C ...) so clock and thermal drift hit
every variant alike:

    dispatch:harness     the comm backend's dispatch, with its sub-stages (dispatch.quantize ... dispatch.unpack)
    dispatch:graph       its CUDA-graph replay where it captures (raw_comm: queued behind a GPU sleep, and
                         dispatch:graph-idle launched on an idle GPU); combine:graph likewise
    *:raw-dispatch       raw_comm: every raw collective that works here, on the same bytes per peer
    experts:harness      the backend's step on the policy's workspace views (what `harness run` times)
    experts:raw-*        raw_kernels.raw_experts
    combine:harness      the comm backend's combine, with its sub-stages (combine.expert-reduce ...)
    *:raw-combine        raw_comm, likewise

Every step that can fail on some ranks ends in harness.rank.distributed.agree, as in harness.rank.lifecycle.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch

from harness.bench.raw_comm import QUEUED, CommVariants, comm_variants
from harness.bench.raw_kernels import max_rel_error_on_valid_rows, raw_experts
from harness.bench.records import BENCH_POLICIES, BenchPolicy, BenchRankRecord, KernelTime, VariantStats
from harness.bench.yardstick import hbm_probe_gbps, kernel_times, link_probe_gbps, yardstick
from harness.core.environment import collect_hardware, collect_versions
from harness.core.events import Done, PolicyDone, PolicyStarted, RankEvent, Ready
from harness.rank.distributed import RankInfo, StageFailure, agree, init_rank, shutdown_rank
from harness.rank.experts import Workspace, useful_flops
from harness.rank.lifecycle import RankSetup, allocate_workspace, setup_rank, warm_up
from harness.rank.memory import release_cached
from harness.rank.timing import QueueAhead, StageTimer, stats_drop_first
from harness.scenario.schema import Scenario
from harness.sizing.plan import policy_shapes
from harness.sizing.vllm_source.kernels import KernelsLibrary

H200_FP8_DENSE_TFLOPS = 1979.0  # vendor datasheet, dense (no sparsity)
Variant = tuple[str, Callable[[], Any], bool]  # name, run once, is a collective


def bench_policies(scenario: Scenario) -> list[str]:
    """The scenario's policies the bench compares (legacy and fixed: the fix changes memory, not speed)."""
    return [p for p in scenario.policies if p in BENCH_POLICIES] or list(BENCH_POLICIES)


@dataclass(kw_only=True)
class BenchState:
    """What one policy's bench steps build up on this rank."""

    policy: str
    workspace: Workspace | None = None
    own: StageFailure | None = None
    failed: dict[int, StageFailure] = field(default_factory=dict)
    comm: CommVariants | None = None
    timer: StageTimer | None = None
    variants: list[Variant] = field(default_factory=list)
    raw_name: str | None = None
    rel_error: float | None = None
    samples: dict[str, list[float]] = field(default_factory=dict)
    queue: QueueAhead | None = None  # the sleep ahead of the queued graph replays (CUDA)
    received_pairs: int = 0  # (token, expert) slots this rank's experts received in one dispatch
    kernels: list[KernelTime] = field(default_factory=list)


@dataclass(frozen=True, kw_only=True)
class Probes:
    """This run's copy-probe bandwidths (harness.bench.yardstick), measured once before the policies."""

    hbm_gbps: float | None
    link_gbps: float | None


def _guarded(state: BenchState, stage: str, fn: Callable[[], Any]) -> Any:
    try:
        return fn()
    except Exception as exc:  # noqa: BLE001 - an OOM or a kernel's error: agreed by the caller, recorded
        state.own = state.own or StageFailure.of(stage, exc)
        return None


def _allocate(setup: RankSetup, state: BenchState) -> None:
    shapes = policy_shapes(state.policy, setup.scenario.sizing_args())
    state.workspace = _guarded(state, "workspace", lambda: allocate_workspace(setup, shapes))
    state.failed = agree(state.own, setup.device)


def _prepare(setup: RankSetup, state: BenchState) -> None:
    """One dispatch (its splits serve the raw all-to-alls), the raw kernel, and the harness step against it."""
    b, workspace = setup.buffers, state.workspace
    assert workspace is not None

    def harness_experts() -> torch.Tensor:
        return setup.backend.apply(
            expert_x=b.expert_x,
            expert_x_scale=b.expert_x_scale,
            expert_num_tokens=b.expert_num_tokens,
            weights=setup.weights,
            workspace=workspace,
        )

    def cross_check() -> None:
        state.timer = StageTimer(setup.device)
        state.comm = comm_variants(setup, workspace.out, state.timer)  # one dispatch first: its splits size the raw
        state.raw_name, raw = raw_experts(setup, workspace)
        # Experts first: raw-vllm writes the same views the harness step uses, so compare before reuse.
        counts = [int(c) for c in b.expert_num_tokens.tolist()]
        state.received_pairs = sum(counts)
        harness_out = harness_experts().clone()
        state.rel_error = max_rel_error_on_valid_rows(harness_out, raw(), counts)
        comm = [name for name, _ in state.comm.variants]
        split = comm.index("combine:harness")
        state.variants = [
            *((name, fn, True) for name, fn in state.comm.variants[:split]),
            ("experts:harness", harness_experts, False),
            (state.raw_name, raw, False),
            *((name, fn, True) for name, fn in state.comm.variants[split:]),
        ]

    _guarded(state, "prepare", cross_check)
    state.failed = agree(state.own, setup.device)


def _iterate(setup: RankSetup, state: BenchState, num_rounds: int) -> None:
    """num_rounds interleaved rounds of every variant; the ranks agree after each round."""
    device = setup.device
    timer = state.timer or StageTimer(device)
    state.samples = {name: [] for name, _, _ in state.variants}
    if device.type == "cuda":
        state.queue = QueueAhead(device)
    for _ in range(num_rounds):
        for name, fn, collective in state.variants:
            if collective:  # start every rank together, so the time is the exchange, not the skew
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                torch.distributed.barrier()
            queued = state.queue is not None and name in QUEUED  # every rank sleeps alike: the start stays aligned
            since = state.queue.before() if queued else 0.0  # type: ignore[union-attr]
            started = timer.start()
            _guarded(state, name, fn)
            timer.stop(name, started)
            if queued:
                state.queue.after(since)  # type: ignore[union-attr]
            for mark, us in timer.elapsed_us().items():  # the variant and its sub-stages (dispatch.pack, ...)
                state.samples.setdefault(mark, []).append(us)
        state.failed = agree(state.own, device)
        if state.failed:
            return


def _profile(setup: RankSetup, state: BenchState) -> None:
    """Per-kernel GPU time of a few dispatch + combine rounds: the graphs' replays where they exist, else eager."""
    cv = state.comm
    assert cv is not None
    named = dict(cv.variants)
    fn: Callable[[], object] = (
        cv.replay if cv.replay is not None else (lambda: (named["dispatch:harness"](), named["combine:harness"]()))
    )
    if setup.device.type == "cuda":
        torch.cuda.synchronize(setup.device)
        torch.distributed.barrier()
    state.kernels = _guarded(state, "profile", lambda: kernel_times(fn, setup.device, rounds=5)) or []
    if state.timer is not None:
        state.timer.elapsed_us()  # the eager rounds' sub-stage marks: not samples
    state.failed = agree(state.own, setup.device)


def _failed_policy(state: BenchState) -> BenchPolicy:
    kinds = {f.kind for f in state.failed.values()}
    status: Literal["oom", "error"] = "oom" if kinds == {"oom"} else "error"
    error = None
    if status == "error":
        rank = min(r for r, f in state.failed.items() if f.kind == "error")
        error = f"rank {rank}: {state.failed[rank].stage}: {state.failed[rank].message}"
    return BenchPolicy(
        policy=state.policy,
        status=status,
        variants=[],
        experts_raw_variant=None,
        experts_ratio=None,
        comm_ratio=None,
        experts_tflops=None,
        experts_tflops_fraction_of_peak=None,
        raw_a2a_busbw_gbps=None,
        harness_comm_busbw_gbps=None,
        dispatch_bytes=0,
        combine_bytes=0,
        max_rel_error=None,
        error=error,
    )


def _judge(setup: RankSetup, state: BenchState, probes: Probes) -> BenchPolicy:
    """Medians per variant, the yardstick (bound / measured, graph replays where they ran), raw / harness ratios,
    TFLOP/s and bus bandwidths (nccl-tests' all-to-all factor)."""
    assert state.comm is not None and state.raw_name is not None
    assert state.comm.dispatch is not None and state.comm.combine is not None
    stats = [VariantStats(name=name, **asdict(stats_drop_first(values))) for name, values in state.samples.items()]
    by = {v.name: v.median_us for v in stats}
    layout = setup.layout
    flops = useful_flops(
        setup.buffers.expert_num_tokens,
        hidden_size=layout.hidden_size,
        intermediate_size=setup.scenario.model.intermediate_size or 0,
    )
    tflops = flops / (by["experts:harness"] * 1e6)
    bus = (layout.num_ranks - 1) / layout.num_ranks
    dispatch_bytes, combine_bytes = state.comm.dispatch.send_bytes, state.comm.combine.send_bytes
    comm_ratio, raw_dispatch_name, raw_combine_name = state.comm.ratio(by)
    raw_comm_us = by[raw_dispatch_name] + by[raw_combine_name]
    harness_comm_us = by["dispatch:harness"] + by["combine:harness"]
    comm_bytes = dispatch_bytes + combine_bytes
    graph = "dispatch:graph" in by and "combine:graph" in by
    timing: Literal["graph", "eager"] = "graph" if graph else "eager"
    stick = yardstick(
        topk_ids=setup.routing.topk_ids,
        rank=layout.rank,
        num_ranks=layout.num_ranks,
        num_local_experts=layout.num_local_experts,
        hidden_size=layout.hidden_size,
        received_pairs=state.received_pairs,
        moved_row_bytes=state.comm.dispatch.row_bytes,
        out_bytes=setup.buffers.combine_recv.element_size(),
        hbm_gbps=probes.hbm_gbps,
        link_gbps=probes.link_gbps,
        dispatch_us=by[f"dispatch:{'graph' if graph else 'harness'}"],
        combine_us=by[f"combine:{'graph' if graph else 'harness'}"],
        timing=timing,
        idle_dispatch_us=by.get("dispatch:graph-idle"),
        idle_combine_us=by.get("combine:graph-idle"),
        queue=state.queue if graph else None,
    )
    return BenchPolicy(
        policy=state.policy,
        status="ok",
        variants=stats,
        experts_raw_variant=state.raw_name,
        experts_ratio=by[state.raw_name] / by["experts:harness"],
        comm_ratio=comm_ratio,
        comm_raw_dispatch_variant=raw_dispatch_name,
        comm_raw_combine_variant=raw_combine_name,
        experts_tflops=tflops,
        experts_tflops_fraction_of_peak=tflops / H200_FP8_DENSE_TFLOPS if setup.device.type == "cuda" else None,
        raw_a2a_busbw_gbps=comm_bytes / (raw_comm_us * 1e3) * bus,
        harness_comm_busbw_gbps=comm_bytes / (harness_comm_us * 1e3) * bus,
        dispatch_bytes=dispatch_bytes,
        combine_bytes=combine_bytes,
        max_rel_error=state.rel_error,
        comm_yardstick=stick,
        comm_graph_error=state.comm.graph_error,
        kernels=state.kernels,
    )


def bench_policy(setup: RankSetup, policy: str, num_rounds: int, probes: Probes) -> BenchPolicy:
    """Interleave every variant `num_rounds` times on one policy's workspace: allocate -> prepare -> iterate ->
    judge."""
    release_cached(setup.device)
    state = BenchState(policy=policy)
    _allocate(setup, state)
    if not state.failed:
        _prepare(setup, state)
    if not state.failed:
        _iterate(setup, state, num_rounds)
    if not state.failed:
        _profile(setup, state)
    result = _failed_policy(state) if state.failed else _judge(setup, state, probes)
    if state.workspace is not None:
        state.workspace.release(setup.accountant)
    state.workspace = None
    state.variants.clear()
    release_cached(setup.device)
    return result


def bench_rank_main(
    scenario: Scenario,
    info: RankInfo,
    run_dir: Path,
    progress: Callable[[RankEvent], None] | None = None,
    *,
    kernels: KernelsLibrary | None = None,
) -> BenchRankRecord:
    """The bench counterpart of harness.rank.lifecycle.rank_main: same setup and warm-up (with the kernels the
    driver resolved), then bench_policy per policy, with the record so far sent after each."""
    device = init_rank(info)
    try:
        setup = setup_rank(scenario, info, device, run_dir, 0, kernels=kernels)
        warm_up(setup)
        probes = Probes(hbm_gbps=hbm_probe_gbps(device), link_gbps=link_probe_gbps(device, info.rank, info.world_size))
        release_cached(device)
        if progress:
            progress(setup.event(Ready, backend=setup.backend.name))
        fields: dict[str, Any] = dict(
            run_id=info.run_id,
            scenario_name=scenario.name or "",
            scenario_hash=scenario.scenario_hash,
            rank=info.rank,
            num_ranks=info.world_size,
            comm_backend=setup.comm_record.backend,
            experts_backend=setup.backend.name,
            versions=collect_versions(vllm_kernels=setup.backend.kernels if setup.backend.name == "vllm-ops" else None),
            hardware=collect_hardware(device),
            num_rounds=scenario.bench.iterations,
        )
        results: list[BenchPolicy] = []
        for policy in bench_policies(scenario):
            if progress:
                progress(setup.event(PolicyStarted, policy=policy))
            results.append(bench_policy(setup, policy, scenario.bench.iterations, probes))
            if progress:
                so_far = BenchRankRecord(**fields, policies=list(results), complete=False)
                progress(
                    setup.event(
                        PolicyDone, policy=policy, status=results[-1].status, record=so_far.model_dump(mode="json")
                    )
                )
        if progress:
            progress(setup.event(Done))
        return BenchRankRecord(**fields, policies=results)
    finally:
        shutdown_rank()
