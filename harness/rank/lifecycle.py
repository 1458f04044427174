"""One rank's lifecycle: join the group, set up weights and comm buffers, warm up once, then for every sizing
policy allocate the workspace the way vLLM's modular kernel does, run route -> dispatch -> experts -> combine,
measure memory and time, check correctness, and free the workspace before the next policy. A rank records facts:
every verdict on them (expectation, tolerance, memory, baseline) is the collector's (harness.report.checks).

    rank_main
      setup_rank          weights, comm buffers, backend, tokens and routing (shared by every policy)
      warm_up             one full pass on a live-set workspace, freed before the first baseline
      measure_policy      per policy: _baseline -> _allocate -> _iterate (_one_pass x n) -> _measure ->
                          _correctness (one checked pass, harness.rank.check) -> _result
                          every step that can fail on some ranks ends in distributed.agree
      PolicyDone event    the record so far, after every policy; the final record at the end

Launchers (harness.launch.local, harness.launch.ray_launcher) only build RankInfos and call `rank_main`, with
the kernels the driver resolved once for every rank.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, cast

import torch
import torch.distributed as dist

from harness.core.backends import DeviceType
from harness.core.contract import WorkspaceShapes
from harness.core.environment import collect_hardware, collect_versions
from harness.core.events import Done, PolicyDone, PolicyStarted, RankEvent, Ready
from harness.core.records import (
    Breakdown,
    CommBackend,
    CommRecord,
    ComponentMemory,
    ContractBytes,
    Correctness,
    DeploymentKv,
    MemoryMeasurement,
    OomRecord,
    PolicyResult,
    RankRecord,
    Throughput,
    Timings,
)
from harness.core.rounding import CUDA_SMALL_SEGMENT_BYTES, RSS_ROUNDING_BYTES
from harness.rank.check import CheckedPass
from harness.rank.combine import combine
from harness.rank.comm import Comm, create_comm, resolve_comm, row_kernels
from harness.rank.dispatch import DispatchHandle, DispatchLayout, dispatch
from harness.rank.distributed import RankInfo, StageFailure, agree, init_rank, shutdown_rank
from harness.rank.experts import (
    ExpertsBackend,
    ExpertWeights,
    Workspace,
    kernels_record,
    make_weights,
    select_backend,
    useful_flops,
)
from harness.rank.graphs import CapturedRound, capture_agreed
from harness.rank.memory import (
    Accountant,
    MemoryProbe,
    PeakSampler,
    SnapshotRecorder,
    apply_budget,
    baseline_rounding_bytes,
    free_and_total_bytes,
    free_bytes_from_message,
    pay_first_op_costs,
    release_cached,
    requested_bytes_from_message,
    synchronize,
)
from harness.rank.quant import quantize_per_token
from harness.rank.route import Routing, route
from harness.rank.timing import StageTimer, stats_drop_first
from harness.scenario.fit import backend_query
from harness.scenario.schema import Scenario
from harness.sizing.deepep import deepep_low_latency_bytes
from harness.sizing.layer import Prediction, run_predictions
from harness.sizing.plan import policy_shapes
from harness.sizing.vllm_source.kernels import KernelsLibrary

Progress = Callable[[RankEvent], None]


def make_tokens(*, seed: int, rank: int, num_tokens: int, hidden_size: int, device: torch.device) -> torch.Tensor:
    """This rank's hidden states (num_tokens, K) bf16, seeded by (seed, rank) so any rank can regenerate them."""
    g = torch.Generator(device=device)
    g.manual_seed(seed * 1_000_033 + rank)
    return torch.randn((num_tokens, hidden_size), generator=g, device=device).to(torch.bfloat16)


def make_routing(scenario: Scenario, rank: int, num_tokens: int) -> Routing:
    P, E = scenario.parallel.num_ranks, scenario.num_local_experts
    return route(
        kind=scenario.routing.kind,
        num_tokens=num_tokens,
        num_experts=P * E,
        top_k=scenario.model.top_k or 1,
        seed=scenario.seed * 1_000_037 + rank,
        zipf_exponent=scenario.routing.zipf_exponent,
    )


@dataclass(frozen=True, kw_only=True)
class RankSetup:
    """What every policy of this rank shares: inputs, weights, comm buffers, backend."""

    scenario: Scenario
    info: RankInfo
    device: torch.device
    layout: DispatchLayout
    tokens: torch.Tensor
    routing: Routing
    weights: ExpertWeights
    buffers: Comm  # the comm backend: its batched buffers (expert_x, ...) and its send/receive buffers
    comm_record: CommRecord
    backend: ExpertsBackend
    accountant: Accountant
    probe: MemoryProbe
    external_bytes: int  # device memory in use before this process allocated anything (other processes)
    run_dir: Path
    components: list[ComponentMemory] = field(default_factory=list)  # the layer's buffers set up, measured
    ballast: list[ComponentMemory] = field(default_factory=list)  # memory.deployment_ballast's parts, measured
    kernels: KernelsLibrary | None = None  # the vLLM ops library the backend loads, if it loads one
    # The ballast itself, held for the rank's life: a dropped tensor goes back to torch's caching allocator, whose
    # cached block the next allocation (a policy's workspace) would reuse, so the ballast would hold nothing.
    ballast_tensors: tuple[torch.Tensor, ...] = ()

    @property
    def quantize(self) -> Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]:
        """The dispatch side's per-token FP8 quantization: the backend's own kernel where it has one."""
        return getattr(self.backend, "quantize_per_token", quantize_per_token)

    def event(self, kind: type[RankEvent], **fields: Any) -> RankEvent:
        """A progress event of this rank, with the header every record and event carries."""
        return kind(run_id=self.info.run_id, scenario_hash=self.scenario.scenario_hash, rank=self.info.rank, **fields)


# ---------------------------------------------------------------------------------------------------------------
# The correctness check (harness.rank.check): one checked pass after the measured ones, outside the memory window.


def source_inputs(setup: RankSetup) -> Callable[[int], tuple[torch.Tensor, torch.Tensor]]:
    """src rank -> (its tokens (n, K) bf16, its top-k ids (n, top_k)), regenerated from the seeds for the check."""
    s = setup.scenario

    def inputs(src: int) -> tuple[torch.Tensor, torch.Tensor]:
        n = s.num_tokens_on_rank(src)
        tokens = make_tokens(
            seed=s.seed, rank=src, num_tokens=n, hidden_size=setup.layout.hidden_size, device=setup.device
        )
        return tokens, make_routing(s, src, n).topk_ids

    return inputs


def _contract(shapes: WorkspaceShapes) -> ContractBytes:
    return ContractBytes(
        ws13_shape=list(shapes.ws13),
        ws2_shape=list(shapes.ws2),
        out_shape=list(shapes.out),
        common_bytes=shapes.common_bytes,
        ws2_bytes=shapes.ws2_bytes,
        total_bytes=shapes.total_bytes,
        source=shapes.source,
    )


def _oom_record(
    setup: RankSetup, policy: str, stage: str, exc: BaseException, requested: int | None, snapshot: SnapshotRecorder
) -> OomRecord:
    message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    # The allocation that failed, as the error reports it; else what the stage as a whole asked for.
    requested = getattr(exc, "requested_bytes", None) or requested_bytes_from_message(str(exc)) or requested
    free, total = free_and_total_bytes(setup.device, setup.accountant)
    # Free memory when the allocation failed, not after the partial workspace was dropped.
    at_failure = getattr(exc, "free_bytes", None)
    free = at_failure if at_failure is not None else free_bytes_from_message(str(exc)) or free
    snapshot_file = None
    if snapshot.enabled:
        rel = Path("oom") / f"rank-{setup.info.rank:05d}-{policy.replace('=', '_')}.pickle"
        if snapshot.dump(setup.run_dir / rel):
            snapshot_file = str(rel)
    budget = setup.scenario.memory.budget_bytes
    allocated = getattr(exc, "allocated_bytes", 0) if stage == "workspace" else None
    return OomRecord(
        policy=policy,
        stage=stage,
        requested_bytes=requested,
        free_bytes=free,
        total_bytes=total,
        budget_bytes=budget,
        message=message[:500],
        snapshot_file=snapshot_file,
        allocated_bytes=allocated,
    )


def _correctness(setup: RankSetup, state: PolicyState) -> Correctness | None:
    """One checked pass on state.workspace (the stage hooks see the views while they are live), then the check's
    verdict; None when a step failed on some rank (state says which, as for a timed pass)."""
    checked = CheckedPass(setup, source_inputs(setup))
    _one_pass(setup, state, StageTimer(setup.device), checked=checked)
    combined = state.combined
    if state.failed or combined is None:  # combined is set on every rank that did not fail
        return None
    return _run_stage(setup, state, "check", lambda: checked.correctness(combined))


# ---------------------------------------------------------------------------------------------------------------
# One policy, step by step: allocate -> iterate -> measure -> record. Every step that may fail on some ranks ends in
# `agree`, so all ranks take the same branch before the next collective, and the run goes on to the next policy.


def allocate_workspace(setup: RankSetup, shapes: WorkspaceShapes) -> Workspace:
    s = setup.scenario
    return Workspace.allocate(
        shapes,
        setup.accountant,
        dtype=getattr(torch, s.model.workspace_dtype),
        num_local_experts=s.num_local_experts,
        max_slots_per_expert=setup.layout.max_slots_per_expert,
        hidden_size=setup.layout.hidden_size,
        intermediate_size=s.model.intermediate_size or 0,
    )


@dataclass(frozen=True, kw_only=True)
class Baseline:
    """Device memory when a policy starts: caches released, every rank at the same point."""

    used_bytes: int  # NVML device used, or process RSS
    allocator_bytes: int | None  # torch allocated (GPU)
    reserved_bytes: int  # torch reserved (GPU), 0 on CPU


def _baseline(setup: RankSetup) -> Baseline:
    device = setup.device
    release_cached(device)
    dist.barrier()
    used = setup.probe.used_bytes()
    if device.type != "cuda":
        return Baseline(used_bytes=used, allocator_bytes=None, reserved_bytes=0)
    torch.cuda.reset_peak_memory_stats(device)
    return Baseline(
        used_bytes=used,
        allocator_bytes=int(torch.cuda.memory_allocated(device)),
        reserved_bytes=int(torch.cuda.memory_reserved(device)),
    )


@dataclass(kw_only=True)
class PolicyState:
    """What one policy's steps build up on this rank."""

    policy: str
    shapes: WorkspaceShapes
    snapshot: SnapshotRecorder
    workspace: Workspace | None = None
    workspace_delta_bytes: int = 0
    workspace_reserved_bytes: int | None = None
    own: StageFailure | None = None  # what failed on this rank
    oom: OomRecord | None = None  # this rank's OOM, with the bytes asked for
    failed: dict[int, StageFailure] = field(default_factory=dict)  # agreed by every rank
    samples: dict[str, list[float]] = field(default_factory=lambda: {"dispatch": [], "experts": [], "combine": []})
    handle: DispatchHandle | None = None
    combined: torch.Tensor | None = None
    correctness: Correctness | None = None
    timing_mode: Literal["graph", "eager"] = "eager"  # how the timed dispatch and combine ran
    timing_reason: str | None = None  # why eager
    kv_tensor: torch.Tensor | None = None  # memory.deployment_ballast: this policy's KV cache, after its workspace
    deployment_kv: DeploymentKv | None = None

    def fail(self, setup: RankSetup, stage: str, exc: Exception, requested_bytes: int | None = None) -> None:
        self.own = StageFailure.of(stage, exc)
        if self.own.kind == "oom":
            self.oom = _oom_record(setup, self.policy, stage, exc, requested_bytes, self.snapshot)


def _allocate(setup: RankSetup, state: PolicyState, baseline: Baseline) -> None:
    """Allocate the policy's workspace as vLLM's modular kernel does; measure what the device shows for it."""
    device = setup.device
    try:
        state.workspace = allocate_workspace(setup, state.shapes)
        synchronize(device)
        state.workspace_delta_bytes = setup.probe.used_bytes() - baseline.used_bytes
        if device.type == "cuda":
            state.workspace_reserved_bytes = int(torch.cuda.memory_reserved(device)) - baseline.reserved_bytes
    except Exception as exc:  # noqa: BLE001 - an OOM or a workspace that does not fit: agreed below, recorded
        state.fail(setup, "workspace", exc, state.shapes.common_bytes + state.shapes.ws2_bytes)
    state.failed = agree(state.own, device)


def _run_stage(setup: RankSetup, state: PolicyState, stage: str, fn: Callable[[], Any]) -> Any:
    """fn(), or None with the failure kept on `state`: the caller agrees before the next collective."""
    try:
        return fn()
    except Exception as exc:  # noqa: BLE001 - OOM, DispatchError, a backend's ValueError or RuntimeError
        state.fail(setup, stage, exc)
        return None


def _one_pass(
    setup: RankSetup,
    state: PolicyState,
    timer: StageTimer,
    *,
    checked: CheckedPass | None = None,
    captured: CapturedRound | None = None,
) -> None:
    """dispatch -> experts -> combine once on state.workspace; ranks agree after the experts and after combine.

    `checked`: the correctness check's pass (its hooks run between the stages; nothing of it is timed).
    `captured`: replay its graphs in place of the eager dispatch and combine (the checked pass is always eager).

    A failure in dispatch after its collectives (an expert past M slots), in the experts (OOM, a kernel's error)
    or in combine after its all-to-all leaves every rank at the same next collective: the agreement. Dispatch's
    capacity checks before its first collective cannot fail for a validated scenario (routing.num_tokens <= T).
    """
    b, workspace = setup.buffers, state.workspace
    assert workspace is not None
    t0 = timer.start()
    state.handle = _run_stage(
        setup,
        state,
        "dispatch",
        captured.dispatch
        if captured is not None
        else lambda: dispatch(setup.tokens, setup.routing, setup.layout, b, setup.quantize),
    )
    timer.stop("dispatch", t0)
    if state.own is None and checked is not None:
        _run_stage(setup, state, "check", checked.after_dispatch)
    if state.own is None:
        t1 = timer.start()
        expert_out = _run_stage(
            setup,
            state,
            "experts",
            lambda: setup.backend.apply(
                expert_x=b.expert_x,
                expert_x_scale=b.expert_x_scale,
                expert_num_tokens=b.expert_num_tokens,
                weights=setup.weights,
                workspace=workspace,
                hooks=checked,
            ),
        )
        timer.stop("experts", t1)
    state.failed = agree(state.own, setup.device)
    handle = state.handle
    if state.failed or handle is None:  # the handle is set on every rank whose dispatch did not fail
        return
    t2 = timer.start()
    state.combined = combined = _run_stage(
        setup,
        state,
        "combine",
        captured.combine if captured is not None else lambda: combine(expert_out, handle, setup.layout, b),
    )
    timer.stop("combine", t2)
    if state.own is None and checked is not None:
        _run_stage(setup, state, "check", lambda: checked.after_combine(combined, handle))
    state.failed = agree(state.own, setup.device)


def _iterate(setup: RankSetup, state: PolicyState) -> None:
    """scenario.warmup + scenario.iterations passes; the timed samples are the passes after the warm-ups.
    Dispatch and combine are CUDA-graph replays where the comm captures (harness.rank.graphs.capture_agreed),
    eager otherwise; the experts step is eager either way."""
    s = setup.scenario
    timer = StageTimer(setup.device)
    assert state.workspace is not None
    captured, state.timing_reason = capture_agreed(
        setup.tokens, setup.routing, setup.layout, setup.buffers, setup.quantize, state.workspace.out
    )
    state.timing_mode = "eager" if captured is None else "graph"
    for iteration in range(s.warmup + s.iterations):
        _one_pass(setup, state, timer, captured=captured)
        if state.failed:
            return
        elapsed = timer.elapsed_us()
        if iteration >= s.warmup:
            for stage, samples in state.samples.items():
                samples.append(elapsed[stage])
    if captured is not None:
        synchronize(setup.device)
        captured.reset()


def _measure(
    setup: RankSetup, state: PolicyState, baseline: Baseline, sampler: PeakSampler
) -> tuple[MemoryMeasurement, Breakdown]:
    """The policy's memory window: peaks against the baseline, and the exact breakdown of the harness's tensors."""
    device, acc = setup.device, setup.accountant
    cuda = device.type == "cuda"
    memory = MemoryMeasurement(
        method=setup.probe.method,
        label=setup.probe.label,
        baseline_bytes=baseline.used_bytes,
        peak_bytes=sampler.peak_bytes,
        delta_bytes=sampler.peak_bytes - baseline.used_bytes,
        workspace_delta_bytes=state.workspace_delta_bytes,
        workspace_reserved_bytes=state.workspace_reserved_bytes,
        process_peak_bytes=sampler.process_peak_bytes,
        allocator_allocated_peak_bytes=int(torch.cuda.max_memory_allocated(device)) if cuda else acc.total_bytes,
        allocator_reserved_peak_bytes=int(torch.cuda.max_memory_reserved(device)) if cuda else None,
        allocator_baseline_bytes=baseline.allocator_bytes,
        num_samples=sampler.num_samples,
        allocator_rounding_bytes=baseline_rounding_bytes(device),
    )
    tracked = acc.total_bytes - acc.untouched_bytes
    scratch = setup.backend.scratch_bytes(state.workspace) if state.workspace is not None else 0
    peak = sampler.process_peak_bytes if sampler.process_peak_bytes else sampler.peak_bytes - setup.external_bytes
    breakdown = Breakdown(
        weights_bytes=acc.bytes_of("weights"),
        dispatch_bytes=acc.bytes_of("dispatch"),
        common_bytes=acc.bytes_of("common"),
        ws2_bytes=acc.bytes_of("ws2"),
        combine_bytes=acc.bytes_of("combine"),
        ballast_bytes=acc.bytes_of("ballast"),
        other_bytes=max(0, peak - tracked - scratch),
        scratch_bytes=scratch,
        comm_bytes=acc.bytes_of("comm"),
    )
    return memory, breakdown


def _timings(state: PolicyState) -> Timings:
    stats = {stage: stats_drop_first(samples) for stage, samples in state.samples.items()}
    return Timings(
        dispatch_us=stats["dispatch"].median_us,
        experts_us=stats["experts"].median_us,
        combine_us=stats["combine"].median_us,
        num_samples=stats["experts"].num_samples,
        dispatch_min_us=stats["dispatch"].min_us,
        dispatch_max_us=stats["dispatch"].max_us,
        experts_min_us=stats["experts"].min_us,
        experts_max_us=stats["experts"].max_us,
        combine_min_us=stats["combine"].min_us,
        combine_max_us=stats["combine"].max_us,
    )


def _stopped_message(failed: dict[int, StageFailure]) -> str:
    """This rank's error when other ranks' failures stopped the policy."""
    ranks = sorted(failed)
    if all(f.kind == "oom" for f in failed.values()):
        return f"skipped: rank(s) {ranks} ran out of memory for this policy"
    first = failed[ranks[0]]
    return f"stopped: rank(s) {ranks} failed; rank {ranks[0]}: {first.stage}: {first.message}"


def _result(setup: RankSetup, state: PolicyState, memory: MemoryMeasurement, breakdown: Breakdown) -> PolicyResult:
    """Status, timings, throughput and correctness of the policy: facts only (the collector judges them)."""
    expected = setup.scenario.expect.outcomes.get(state.policy)
    status: Literal["ok", "oom", "error"] = "ok"
    error = None
    timings = throughput = correctness = None
    if state.own is not None and state.own.kind == "oom":
        status = "oom"
    elif state.own is not None:
        status, error = "error", f"{state.own.stage}: {state.own.message}"
    elif state.failed:
        status, error = "error", _stopped_message(state.failed)
    else:
        assert state.handle is not None and state.combined is not None
        timings = _timings(state).model_copy(
            update=dict(
                timing_mode=state.timing_mode,
                timing_reason=state.timing_reason,
                num_host_syncs=state.handle.num_host_syncs,
            )
        )
        throughput = _throughput(setup, timings, state.handle)
        correctness = state.correctness
    return PolicyResult(
        policy=state.policy,
        status=status,
        contract=_contract(state.shapes),
        memory=memory,
        breakdown=breakdown,
        timings=timings,
        throughput=throughput,
        correctness=correctness,
        expected_outcome=expected,
        oom=state.oom,
        error=error,
        failed_ranks=sorted(state.failed) if state.failed else None,
        deployment_kv=state.deployment_kv,
    )


def measure_policy(setup: RankSetup, policy: str, progress: Progress | None) -> tuple[PolicyResult, list[int]]:
    """Allocate one policy's workspace, run the data path on it, measure memory and time, record the result.

    Returns the result and the expert_num_tokens (E,) of the last pass. The workspace is freed and the cache
    released before returning, so the next policy starts from the same baseline.
    """
    s = setup.scenario
    if progress:
        progress(setup.event(PolicyStarted, policy=policy))
    state = PolicyState(
        policy=policy,
        shapes=policy_shapes(policy, s.sizing_args()),
        snapshot=SnapshotRecorder(setup.device, enabled=s.memory.snapshot_on_oom and s.memory.budget_bytes is not None),
    )
    baseline = _baseline(setup)
    with PeakSampler(setup.probe, interval_s=s.memory.sample_interval_ms / 1e3) as sampler, state.snapshot:
        _allocate(setup, state, baseline)
        if s.memory.deployment_ballast:
            _deployment_kv(setup, state, allocate=not state.failed)
        if not state.failed:
            _iterate(setup, state)
        synchronize(setup.device)
    memory, breakdown = _measure(setup, state, baseline, sampler)
    if not state.failed and state.own is None:
        state.correctness = _correctness(setup, state)  # after the window: the check's temporaries are not the policy's
    result = _result(setup, state, memory, breakdown)
    counts = [int(c) for c in setup.buffers.expert_num_tokens.tolist()]
    if state.workspace is not None:
        state.workspace.release(setup.accountant)
    if state.kv_tensor is not None:
        setup.accountant.release("ballast", state.kv_tensor)
    state.workspace = state.combined = state.kv_tensor = None
    release_cached(setup.device)
    return result, counts


class DeploymentDoesNotStart(torch.OutOfMemoryError):
    """vLLM's "No available memory for the cache blocks" / "To serve at least one request": what is left after the
    policy's workspace holds no KV cache for one request. Counted as an OOM of the deployment at its KV cache."""


def _deployment_kv(setup: RankSetup, state: PolicyState, *, allocate: bool) -> None:
    """memory.deployment_ballast, after the policy's workspace: the KV cache vLLM would size from what is left
    (harness.sizing.deployment_ballast.policy_kv_cache), allocated and measured; a deployment that would not start
    ends the policy as out of memory at the kv-cache stage. allocate False (the workspace itself failed): recorded
    only."""
    from harness.sizing.deployment_ballast import KV_PART, policy_kv_cache

    s, acc = setup.scenario, setup.accountant
    total = free_and_total_bytes(setup.device, acc)[1] or 0
    kv = policy_kv_cache(s, total, state.policy, state.shapes.total_bytes)
    component = None
    if not allocate:
        state.deployment_kv = DeploymentKv(outcome=kv.outcome, verdict=kv.verdict, kv_tokens=kv.tokens,
                                           num_blocks=kv.num_blocks)  # fmt: skip
        return
    try:
        if kv.outcome != "starts":
            raise DeploymentDoesNotStart(f"the deployment does not start with {state.policy}'s workspace: {kv.verdict}")
        predicted = {KV_PART: Prediction(kv.bytes, kv.source)}
        state.kv_tensor, step = _measured_step(setup.probe, acc, lambda: acc.alloc("ballast", (kv.bytes,), torch.uint8))
        component = step.component(KV_PART, predicted, step.allocated_bytes)
    except Exception as exc:  # noqa: BLE001 - an OOM here is the policy's outcome: agreed below, recorded
        state.fail(setup, "kv-cache", exc, kv.bytes or None)
    state.deployment_kv = DeploymentKv(outcome=kv.outcome, verdict=kv.verdict, kv_tokens=kv.tokens,
                                       num_blocks=kv.num_blocks, component=component)  # fmt: skip
    state.failed = agree(state.own, setup.device)


def _throughput(setup: RankSetup, timings: Timings, handle: DispatchHandle) -> Throughput:
    layout, P = setup.layout, setup.layout.num_ranks
    flops = useful_flops(
        setup.buffers.expert_num_tokens,
        hidden_size=layout.hidden_size,
        intermediate_size=setup.scenario.model.intermediate_size or 0,
    )
    dispatch_bytes, combine_bytes = handle.dispatch_bytes, handle.combine_bytes
    bus = (P - 1) / P  # nccl-tests' all-to-all bus factor: the self-send crosses no link

    def gbps(num_bytes: int, us: float) -> float:
        return num_bytes / (us * 1e3) if us > 0 else 0.0

    return Throughput(
        experts_tflops=flops / (timings.experts_us * 1e6) if timings.experts_us > 0 else 0.0,
        dispatch_algbw_gbps=gbps(dispatch_bytes, timings.dispatch_us),
        dispatch_busbw_gbps=gbps(dispatch_bytes, timings.dispatch_us) * bus,
        combine_algbw_gbps=gbps(combine_bytes, timings.combine_us),
        combine_busbw_gbps=gbps(combine_bytes, timings.combine_us) * bus,
        dispatch_bytes=dispatch_bytes,
        combine_bytes=combine_bytes,
    )


def _setup_comm(
    s: Scenario, layout: DispatchLayout, probe: MemoryProbe, accountant: Accountant, predicted: dict[str, Prediction]
) -> tuple[tuple[Comm, CommRecord], list[ComponentMemory]]:
    """The comm backend with every buffer at full capacity, then the comm region: with memory.comm_buffer
    deepep-ll (the default) and layer.all2all deepep-low-latency (also the default), one allocation of what DeepEP
    low-latency holds for the same T, K and global experts (E x D, the redundant ones included: vLLM issue
    #57894) in the scenario's layer.deepep_layout, so the GPU's memory includes that cost. The harness's own
    send/receive staging counts under dispatch and combine. Each step is measured as a layer component."""
    device = probe.device
    name, choice = resolve_comm(
        s.comm, device_type=device.type, num_local_experts=layout.num_local_experts, num_ranks=layout.num_ranks
    )
    comm, comm_step = _measured_step(probe, accountant, lambda: create_comm(
        name, layout, accountant, device=device, out_dtype=getattr(torch, s.model.workspace_dtype)))  # fmt: skip
    components = [comm_step.component("dispatch-quant", predicted, _tensor_bytes(comm.expert_x, comm.expert_x_scale))]
    deepep = deepep_low_latency_bytes(
        max_tokens_per_rank=s.parallel.max_tokens_per_rank,
        hidden_size=layout.hidden_size,
        num_experts=s.sizing_args().num_global_experts,
        combine_variant="bf16" if s.layer.deepep_layout == "bf16-combine" else "logfmt",
    )
    if s.memory.comm_buffer == "deepep-ll" and s.layer.all2all == "deepep-low-latency":
        _, region_step = _measured_step(probe, accountant, lambda: accountant.alloc(
            "comm", (deepep.total_bytes,), torch.uint8))  # fmt: skip
        components.append(region_step.component("deepep-rdma", predicted, region_step.allocated_bytes))
    record = CommRecord(
        backend=cast(CommBackend, name),
        choice=choice,
        deepep_ll_bytes=deepep.total_bytes,
        deepep_combine_variant=deepep.combine_variant,
        harness_bytes=comm.harness_bytes,
        comm_bytes=accountant.bytes_of("comm"),
        row_kernels=row_kernels(device),
    )
    return (comm, record), components


def dispatch_layout(scenario: Scenario, rank: int) -> DispatchLayout:
    """Rank `rank`'s dispatch layout: M = T * D slots per local expert, T * D/P tokens of its own at most, every
    buffer sized for the most tokens any rank holds."""
    s = scenario
    D, P, T = s.parallel.num_dispatchers, s.parallel.num_ranks, s.parallel.max_tokens_per_rank
    return DispatchLayout(
        num_ranks=P,
        rank=rank,
        num_local_experts=s.num_local_experts,
        max_slots_per_expert=T * D,
        hidden_size=s.model.hidden_size or 0,
        top_k=s.model.top_k or 1,
        max_tokens=T * (D // P),
        num_buffer_tokens=max(s.num_tokens_on_rank(r) for r in range(P)),
    )


def setup_rank(
    scenario: Scenario,
    info: RankInfo,
    device: torch.device,
    run_dir: Path,
    external_bytes: int,
    *,
    kernels: KernelsLibrary | None = None,
) -> RankSetup:
    """Everything the policies share. `kernels` is the ops library the driver resolved for the scenario
    (harness.launch.run.scenario_kernels), handed over as it is: a rank never locates or fetches a release."""
    s = scenario
    E, K, I = s.num_local_experts, s.model.hidden_size or 0, s.model.intermediate_size or 0
    layout = dispatch_layout(s, info.rank)
    device_type = cast(DeviceType, device.type)  # a rank runs on cuda or cpu (harness.launch resolved it)
    backend = select_backend(s.experts_backend, device, backend_query(s, device_type), kernels=kernels)
    budget = s.memory.budget_bytes
    apply_budget(device, budget)
    accountant = Accountant(device, budget_bytes=budget)
    probe = MemoryProbe(device)
    pay_first_op_costs(device)  # before the first measured step, not inside it
    held: list[torch.Tensor] = []
    if s.memory.ballast_bytes:
        # Never paged in on CPU: it only stands for memory a deployment would hold.
        held.append(accountant.alloc("ballast", (s.memory.ballast_bytes,), torch.uint8, touch=False))
    ballast = _deployment_ballast(s, device, probe, accountant, held) if s.memory.deployment_ballast else []
    predicted = run_predictions(s)
    weights, weights_step = _measured_step(probe, accountant, lambda: make_weights(
        rank=info.rank, num_local_experts=E, hidden_size=K, intermediate_size=I, seed=s.seed, device=device,
        accountant=accountant))  # fmt: skip
    (buffers, comm_record), components = _setup_comm(s, layout, probe, accountant, predicted)
    components.insert(0, weights_step.component("expert-weights", predicted, weights_step.allocated_bytes))
    num_tokens = s.num_tokens_on_rank(info.rank)
    tokens = make_tokens(seed=s.seed, rank=info.rank, num_tokens=num_tokens, hidden_size=K, device=device)
    return RankSetup(
        scenario=s,
        info=info,
        device=device,
        layout=layout,
        tokens=tokens,
        routing=make_routing(s, info.rank, num_tokens).to(device),
        weights=weights,
        buffers=buffers,
        comm_record=comm_record,
        backend=backend,
        accountant=accountant,
        probe=probe,
        external_bytes=external_bytes,
        run_dir=run_dir,
        components=components,
        kernels=kernels,
        ballast=ballast,
        ballast_tensors=tuple(held),
    )


@dataclass(frozen=True, kw_only=True)
class _Step:
    """What one setup step allocated, and what the device showed for it."""

    allocated_bytes: int  # the accountant's growth: every tensor the step kept
    measured_delta_bytes: int
    reserved_delta_bytes: int | None
    num_tensors: int
    device_type: str

    def component(self, name: str, predicted: dict[str, Prediction], allocated_bytes: int) -> ComponentMemory:
        """The step's bytes as one layer component; rounding: the caching allocator's 2 MiB blocks (and a 20 MiB
        segment for a small tensor) per tensor on GPU, with NVML showing exactly what it reserved; RSS within
        RSS_ROUNDING_BYTES plus 1% on CPU."""
        if self.device_type == "cuda":
            slack = self.num_tensors * CUDA_SMALL_SEGMENT_BYTES
            within = (self.measured_delta_bytes == self.reserved_delta_bytes
                      and 0 <= self.measured_delta_bytes - self.allocated_bytes <= slack)  # fmt: skip
        else:
            within = abs(self.measured_delta_bytes - self.allocated_bytes) <= (
                RSS_ROUNDING_BYTES + self.allocated_bytes // 100
            )
        return ComponentMemory(
            name=name, predicted_bytes=predicted[name].bytes, prediction_source=predicted[name].source,
            allocated_bytes=allocated_bytes, step_allocated_bytes=self.allocated_bytes,
            measured_delta_bytes=self.measured_delta_bytes, reserved_delta_bytes=self.reserved_delta_bytes,
            within_rounding=within,
        )  # fmt: skip


def _measured_step(probe: MemoryProbe, accountant: Accountant, allocate: Callable[[], Any]) -> tuple[Any, _Step]:
    """Run one allocating setup step and measure it: cached blocks (the step's temporaries) released on both
    sides, so the device delta is what the step kept."""
    device = probe.device
    release_cached(device)
    used, kept = probe.used_bytes(), accountant.total_bytes
    reserved = int(torch.cuda.memory_reserved(device)) if device.type == "cuda" else None
    tensors_before = accountant.num_tensors
    value = allocate()
    synchronize(device)
    release_cached(device)
    reserved_delta = int(torch.cuda.memory_reserved(device)) - reserved if reserved is not None else None
    return value, _Step(allocated_bytes=accountant.total_bytes - kept, measured_delta_bytes=probe.used_bytes() - used,
                        reserved_delta_bytes=reserved_delta, num_tensors=accountant.num_tensors - tensors_before,
                        device_type=device.type)  # fmt: skip


def _deployment_ballast(
    s: Scenario, device: torch.device, probe: MemoryProbe, accountant: Accountant, held: list[torch.Tensor]
) -> list[ComponentMemory]:
    """The rest of the deployment as ballast, one measured step per part: every other layer's weights and the KV
    cache, sized by the deployment model on this device's total (GPU: mem_get_info's, as vLLM; CPU: the budget, else
    the RAM). Touched on CPU, so RSS shows each part as NVML shows a cudaMalloc. Each part's tensor joins `held`."""
    from harness.sizing.deployment_ballast import ballast_parts

    if device.type == "cpu" and accountant.budget_bytes is None:
        raise ValueError("memory.deployment_ballast on CPU ranks needs memory.budget_gb: the KV cache is sized on it")
    total = free_and_total_bytes(device, accountant)[1] or 0
    parts = ballast_parts(s, total)
    predicted = {p.name: Prediction(p.bytes, p.source) for p in parts}
    measured = []
    for part in parts:
        tensor, step = _measured_step(
            probe, accountant, functools.partial(accountant.alloc, "ballast", (part.bytes,), torch.uint8)
        )
        held.append(tensor)
        measured.append(step.component(part.name, predicted, step.allocated_bytes))
    return measured


def _tensor_bytes(*tensors: torch.Tensor) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


# ---------------------------------------------------------------------------------------------------------------
# Set up once, warm up once, then every policy from the same warmed state.


def warm_up(setup: RankSetup) -> Literal["full", "comm-only", "failed"]:
    """One full dispatch -> experts -> combine pass (and the correctness check) through the real path, on a
    warm-up workspace freed and released from the cache before the first policy's baseline.

    Lazy initialisation (NCCL communicators and their buffers, cuBLAS/CUTLASS handles, kernel modules, allocator
    pools, on CPU the heap's growth) then happens here, not inside the first policy's memory window, so every
    policy is measured from the same warmed state. The workspace is the live-set arena (lower-bound), the smallest
    any policy asks for. Returns "full", "comm-only" when that workspace did not fit on some rank (dispatch alone
    ran), or "failed" when a step raised (the policies then record the error themselves).
    """
    shapes = policy_shapes("lower-bound", setup.scenario.sizing_args())
    state = PolicyState(policy="warm-up", shapes=shapes, snapshot=SnapshotRecorder(setup.device, enabled=False))
    try:
        state.workspace = allocate_workspace(setup, shapes)
    except Exception as exc:  # noqa: BLE001 - an OOM here only makes the warm-up smaller
        state.own = StageFailure.of("workspace", exc)
    state.failed = agree(state.own, setup.device)
    result: Literal["full", "comm-only", "failed"] = "full"
    if state.failed:
        state.own, result = None, "comm-only"
        _run_stage(
            setup,
            state,
            "dispatch",
            lambda: dispatch(setup.tokens, setup.routing, setup.layout, setup.buffers, setup.quantize),
        )
        if agree(state.own, setup.device):
            result = "failed"
    else:
        _one_pass(setup, state, StageTimer(setup.device))
        if state.failed or _correctness(setup, state) is None:
            result = "failed"
    if state.workspace is not None:
        state.workspace.release(setup.accountant)
    state.workspace = state.combined = state.handle = None
    release_cached(setup.device)
    return result


@dataclass(frozen=True, kw_only=True)
class _RecordFields:
    """The parts of a rank's record that do not change from policy to policy."""

    fields: dict[str, Any]

    def record(self, results: list[PolicyResult], counts: list[int] | None, *, complete: bool) -> RankRecord:
        return RankRecord(
            **self.fields,
            policies=list(results),
            finished_at=time.time(),
            expert_num_tokens=counts or [],
            complete=complete,
        )


def _record_fields(
    setup: RankSetup, *, started: float, ready_at: float, warmup: Literal["full", "comm-only", "failed"]
) -> _RecordFields:
    s, info, backend = setup.scenario, setup.info, setup.backend
    return _RecordFields(
        fields=dict(
            run_id=info.run_id,
            scenario_name=s.name or "",
            scenario_hash=s.scenario_hash,
            scenario=s.model_dump(mode="json"),
            rank=info.rank,
            num_ranks=info.world_size,
            num_dispatchers=s.parallel.num_dispatchers,
            emulated=s.emulated,
            comm_backend=setup.comm_record.backend,
            comm=setup.comm_record,
            experts_backend=backend.name,
            measurement_method="same-baseline",
            versions=collect_versions(
                vllm_source=setup.kernels.origin if setup.kernels else None,
                vllm_kernels=backend.kernels if backend.name == "vllm-ops" else None,
            ),
            kernels=kernels_record(backend, setup.kernels),
            hardware=collect_hardware(setup.device),
            started_at=started,
            ready_at=ready_at,
            warmup=warmup,
            components=list(setup.components),
            ballast=list(setup.ballast),
        )
    )


def rank_main(
    scenario: Scenario,
    info: RankInfo,
    run_dir: Path,
    progress: Progress | None = None,
    *,
    kernels: KernelsLibrary | None = None,
) -> RankRecord:
    """Run every policy of `scenario` on this rank and return its record. Joins and leaves the process group.
    `kernels`: the vLLM ops library the driver resolved (harness.launch.contract.RankEntry.kernels), or None.

    After every policy the record so far (complete=False) goes to the driver in a PolicyDone event, so a later
    fault loses nothing that finished.
    """
    started = time.time()
    device = init_rank(info)
    try:
        probe = MemoryProbe(device)
        external = probe.used_bytes() if probe.method == "nvml" else 0
        setup = setup_rank(scenario, info, device, run_dir, external, kernels=kernels)
        warmup = warm_up(setup)
        fields = _record_fields(setup, started=started, ready_at=time.time(), warmup=warmup)
        if progress:
            progress(setup.event(Ready, backend=setup.backend.name))
        results: list[PolicyResult] = []
        first_counts: list[int] | None = None
        for policy in scenario.policies:
            result, counts = measure_policy(setup, policy, progress)
            results.append(result)
            if first_counts is None and result.status == "ok":
                first_counts = counts
            if progress:
                so_far = fields.record(results, first_counts, complete=False)
                progress(
                    setup.event(PolicyDone, policy=policy, status=result.status, record=so_far.model_dump(mode="json"))
                )
        record = fields.record(results, first_counts, complete=True)
        if progress:
            progress(setup.event(Done))
        return record
    finally:
        shutdown_rank()
