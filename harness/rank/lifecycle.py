"""One rank's lifecycle: join the group, set up weights and comm buffers, then for every sizing policy
allocate the workspace the way vLLM's modular kernel does, run route -> dispatch -> experts -> combine,
measure memory and time, check correctness, and free the workspace before the next policy.

Launchers (harness.launch.local, harness.launch.ray_launcher) only build RankInfos and call `rank_main`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
import torch.distributed as dist

from harness.rank.combine import combine
from harness.rank.dispatch import DispatchBuffers, DispatchLayout, dispatch
from harness.rank.distributed import RankInfo, init_rank, shutdown_rank
from harness.core.environment import collect_hardware, collect_versions
from harness.rank.experts.reference import expert_forward
from harness.rank.experts import (
    ExpertsBackend, ExpertWeights, Workspace, generate_expert, make_weights, select_backend, useful_flops,
)
from harness.rank.memory import (
    Accountant, MemoryProbe, PeakSampler, SnapshotRecorder, apply_budget, free_and_total_bytes,
    free_bytes_from_message, release_cached, requested_bytes_from_message, synchronize,
)
from harness.sizing.plan import policy_shapes
from harness.rank.quant import quantize_per_channel, quantize_per_token
from harness.core.records import (
    Breakdown, ContractBytes, Correctness, MemoryMeasurement, OomRecord, PolicyResult, RankRecord, Throughput, Timings,
)
from harness.rank.route import Routing, route
from harness.scenario.schema import Scenario
from harness.rank.timing import StageTimer, stats_drop_first
from harness.core.contract import WorkspaceShapes

Progress = Callable[[dict[str, Any]], None]
MAX_CHECKED_TOKENS = 64


def resolve_device(scenario: Scenario, num_gpus: int) -> Literal["cuda", "cpu"]:
    """The scenario's device; "auto" takes GPUs when there is one per physical rank."""
    if scenario.device == "auto":
        return "cuda" if num_gpus >= scenario.parallel.num_ranks else "cpu"
    return scenario.device


def can_run(scenario: Scenario, *, device_type: str, num_gpus: int) -> str | None:
    """Why this scenario cannot run with these resources, or None. Never touches a GPU itself."""
    P = scenario.parallel.num_ranks
    if device_type == "cuda" and num_gpus < P:
        return f"the scenario needs {P} GPUs (one per physical rank), {num_gpus} are available"
    if device_type == "cpu" and scenario.experts_backend in ("torch-cutlass", "vllm-ops"):
        return f"experts_backend {scenario.experts_backend} needs GPUs; use reference or auto on CPU"
    return None


def make_tokens(*, seed: int, rank: int, num_tokens: int, hidden_size: int, device: torch.device) -> torch.Tensor:
    """This rank's hidden states (num_tokens, K) bf16, seeded by (seed, rank) so any rank can regenerate them."""
    g = torch.Generator(device=device)
    g.manual_seed(seed * 1_000_033 + rank)
    return torch.randn((num_tokens, hidden_size), generator=g, device=device).to(torch.bfloat16)


def make_routing(scenario: Scenario, rank: int, num_tokens: int) -> Routing:
    P, E = scenario.parallel.num_ranks, scenario.num_local_experts
    return route(
        kind=scenario.routing.kind, num_tokens=num_tokens, num_experts=P * E, top_k=scenario.model.top_k or 1,
        seed=scenario.seed * 1_000_037 + rank, zipf_exponent=scenario.routing.zipf_exponent,
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
    buffers: DispatchBuffers
    backend: ExpertsBackend
    accountant: Accountant
    probe: MemoryProbe
    external_bytes: int  # device memory in use before this process allocated anything (other processes)
    run_dir: Path

    @property
    def quantize(self) -> Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]:
        """The dispatch side's per-token FP8 quantization: the backend's own kernel where it has one."""
        return getattr(self.backend, "quantize_per_token", quantize_per_token)


def _slot_errors(setup: RankSetup) -> int:
    """Slots whose content does not match what the senders routed to this rank's experts, plus count errors."""
    s, layout, buffers = setup.scenario, setup.layout, setup.buffers
    E, M, P, K = layout.num_local_experts, layout.max_slots_per_expert, layout.num_ranks, layout.hidden_size
    counts = buffers.expert_num_tokens.cpu().tolist()
    num_tokens = max(s.num_tokens_on_rank(r) for r in range(P))  # key stride: src * num_tokens + token
    expected_keys: list[list[int]] = [[] for _ in range(E)]
    quantized: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
    for src in range(P):
        ids = make_routing(s, src, s.num_tokens_on_rank(src)).topk_ids
        token, _slot = torch.nonzero(torch.div(ids, E, rounding_mode="floor") == layout.rank, as_tuple=True)
        local = torch.remainder(ids[token, _slot], E)
        for e in range(E):
            expected_keys[e].extend((src * num_tokens + token[local == e]).tolist())
        if token.numel():
            x = make_tokens(seed=s.seed, rank=src, num_tokens=s.num_tokens_on_rank(src), hidden_size=K,
                            device=setup.device)
            quantized[src] = setup.quantize(x)  # the same kernel the sender used
    num_wrong = 0
    src_all = buffers.expert_src.cpu()
    for e in range(E):
        n = counts[e]
        got = src_all[e, :n]
        got_keys = sorted((got[:, 0].to(torch.int64) * num_tokens + got[:, 1]).tolist())
        want = sorted(expected_keys[e])
        if len(want) != n:
            num_wrong += abs(len(want) - n) + min(len(want), n)
            continue
        num_wrong += sum(1 for a, b in zip(got_keys, want) if a != b)
        for j in range(n):  # payload: FP8 bytes and scale of slot j equal the sender's quantized token
            src, tok = int(got[j, 0]), int(got[j, 1])
            q, sc = quantized[src]
            same = torch.equal(buffers.expert_x[e, j].view(torch.uint8), q[tok].view(torch.uint8)) and bool(
                buffers.expert_x_scale[e, j, 0] == sc[tok, 0]
            )
            num_wrong += 0 if same else 1
    return num_wrong


def reference_output(setup: RankSetup, token_index: torch.Tensor) -> torch.Tensor:
    """The MoE output of the chosen tokens in one process, float32: sum_k w_k * expert_k(x), experts regenerated.

    The same math as the batched path (FP8 tokens and weights, per-token FP8 activation), without the batched
    layout, the all-to-all or any workspace. Returns (len(token_index), K) float32.
    """
    s = setup.scenario
    K, I = setup.layout.hidden_size, s.model.intermediate_size or 0
    q, scale = quantize_per_token(setup.tokens.index_select(0, token_index))
    ids = setup.routing.topk_ids.index_select(0, token_index).cpu()
    w = setup.routing.topk_weights.index_select(0, token_index)
    out = torch.zeros((len(token_index), K), dtype=torch.float32, device=setup.device)
    for g in sorted(set(ids.reshape(-1).tolist())):
        rows, slots = torch.nonzero(ids == g, as_tuple=True)
        f1, f2 = generate_expert(seed=s.seed, global_expert=g, hidden_size=K, intermediate_size=I, device=setup.device)
        q1, s1 = quantize_per_channel(f1.unsqueeze(0))
        q2, s2 = quantize_per_channel(f2.unsqueeze(0))
        rows_d = rows.to(setup.device)
        y = expert_forward(q.index_select(0, rows_d), scale.index_select(0, rows_d), q1[0], s1[0], q2[0], s2[0])
        out.index_add_(0, rows_d, y * w[rows_d, slots.to(setup.device)].unsqueeze(1))
    return out


def _check_output(setup: RankSetup, combined: torch.Tensor, num_wrong_slots: int) -> Correctness:
    n = combined.shape[0]
    num_checked = min(n, MAX_CHECKED_TOKENS)
    tolerance = setup.scenario.expect.max_error
    if num_checked == 0:
        return Correctness(max_abs_error=0.0, max_rel_error=0.0, num_wrong_slots=num_wrong_slots,
                           num_checked_tokens=0, within_tolerance=num_wrong_slots == 0, tolerance=tolerance)
    index = torch.linspace(0, n - 1, num_checked, device=setup.device).round().to(torch.int64).unique()
    ref = reference_output(setup, index)
    got = combined.index_select(0, index).float()
    abs_err = float((got - ref).abs().max())
    rel_err = abs_err / max(float(ref.abs().max()), 1e-30)
    ok = math.isfinite(rel_err) and rel_err <= tolerance and num_wrong_slots == 0
    return Correctness(max_abs_error=abs_err, max_rel_error=rel_err, num_wrong_slots=num_wrong_slots,
                       num_checked_tokens=int(index.numel()), within_tolerance=ok, tolerance=tolerance)


def _contract(shapes: WorkspaceShapes) -> ContractBytes:
    return ContractBytes(
        ws13_shape=list(shapes.ws13), ws2_shape=list(shapes.ws2), out_shape=list(shapes.out),
        common_bytes=shapes.common_bytes, ws2_bytes=shapes.ws2_bytes, total_bytes=shapes.total_bytes,
        source=shapes.source,
    )


def _any_rank_failed(ok: bool, device: torch.device) -> list[int]:
    """Ranks whose flag is False, agreed by every rank (so all take the same branch before the next collective)."""
    flags = torch.zeros(dist.get_world_size(), dtype=torch.int32, device=device)
    flags[dist.get_rank()] = 0 if ok else 1
    dist.all_reduce(flags)
    return [r for r, f in enumerate(flags.tolist()) if f]


def _oom_record(setup: RankSetup, policy: str, stage: str, exc: BaseException, requested: int | None,
                snapshot: SnapshotRecorder) -> OomRecord:
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
    return OomRecord(policy=policy, stage=stage, requested_bytes=requested, free_bytes=free, total_bytes=total,
                     budget_bytes=budget, message=message[:500], snapshot_file=snapshot_file)


def measure_policy(setup: RankSetup, policy: str, progress: Progress | None) -> tuple[PolicyResult, list[int]]:
    """Allocate one policy's workspace, run the data path on it, and measure. Returns the result and the
    expert_num_tokens of the last iteration."""
    s, device, acc = setup.scenario, setup.device, setup.accountant
    shapes = policy_shapes(policy, s.sizing_args())
    contract = _contract(shapes)
    expected = s.expect.outcomes.get(policy)
    if progress:
        progress({"rank": setup.info.rank, "event": "policy", "policy": policy})

    release_cached(device)
    dist.barrier()
    baseline = setup.probe.used_bytes()
    allocator_baseline = None
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        allocator_baseline = int(torch.cuda.memory_allocated(device))

    workspace: Workspace | None = None
    oom: OomRecord | None = None
    workspace_delta = 0
    workspace_reserved: int | None = None
    reserved_before = int(torch.cuda.memory_reserved(device)) if device.type == "cuda" else 0
    samples: dict[str, list[float]] = {"dispatch": [], "experts": [], "combine": []}
    combined: torch.Tensor | None = None
    handle = None
    failed_ranks: list[int] = []
    wdtype = getattr(torch, s.model.workspace_dtype)
    snapshot = SnapshotRecorder(device, enabled=s.memory.snapshot_on_oom and s.memory.budget_bytes is not None)
    with PeakSampler(setup.probe, interval_s=s.memory.sample_interval_ms / 1e3) as sampler, snapshot:
        try:
            workspace = Workspace.allocate(
                shapes, acc, dtype=wdtype, num_local_experts=s.num_local_experts,
                max_slots_per_expert=setup.layout.max_slots_per_expert, hidden_size=setup.layout.hidden_size,
                intermediate_size=s.model.intermediate_size or 0,
            )
            synchronize(device)
            workspace_delta = setup.probe.used_bytes() - baseline
            if device.type == "cuda":
                workspace_reserved = int(torch.cuda.memory_reserved(device)) - reserved_before
        except torch.OutOfMemoryError as exc:
            oom = _oom_record(setup, policy, "workspace", exc, shapes.common_bytes + shapes.ws2_bytes, snapshot)
        failed_ranks = _any_rank_failed(oom is None, device)
        if not failed_ranks:
            assert workspace is not None
            timer = StageTimer(device)
            for iteration in range(s.warmup + s.iterations):
                t0 = timer.start()
                handle = dispatch(setup.tokens, setup.routing, setup.layout, setup.buffers, setup.quantize)
                timer.stop("dispatch", t0)
                t1 = timer.start()
                try:
                    expert_out = setup.backend.apply(
                        expert_x=setup.buffers.expert_x, expert_x_scale=setup.buffers.expert_x_scale,
                        expert_num_tokens=setup.buffers.expert_num_tokens, weights=setup.weights,
                        workspace=workspace,
                    )
                except torch.OutOfMemoryError as exc:
                    # Combine still runs so every rank reaches the same collectives; the flag stops the loop.
                    oom = _oom_record(setup, policy, "experts", exc, None, snapshot)
                    expert_out = workspace.out
                timer.stop("experts", t1)
                t2 = timer.start()
                combined = combine(expert_out, handle, setup.layout, setup.buffers)
                timer.stop("combine", t2)
                elapsed = timer.elapsed_us()
                if iteration >= s.warmup:
                    for stage in samples:
                        samples[stage].append(elapsed[stage])
                failed_ranks = _any_rank_failed(oom is None, device)
                if failed_ranks:
                    break
        synchronize(device)

    memory = MemoryMeasurement(
        method=setup.probe.method,  # type: ignore[arg-type]
        label=setup.probe.label,
        baseline_bytes=baseline,
        peak_bytes=sampler.peak_bytes,
        delta_bytes=sampler.peak_bytes - baseline,
        workspace_delta_bytes=workspace_delta,
        workspace_reserved_bytes=workspace_reserved,
        process_peak_bytes=sampler.process_peak_bytes,
        allocator_allocated_peak_bytes=int(torch.cuda.max_memory_allocated(device)) if device.type == "cuda" else acc.total_bytes,
        allocator_reserved_peak_bytes=int(torch.cuda.max_memory_reserved(device)) if device.type == "cuda" else None,
        allocator_baseline_bytes=allocator_baseline,
        num_samples=sampler.num_samples,
    )
    tracked = acc.total_bytes - acc.untouched_bytes
    peak_for_other = sampler.process_peak_bytes if sampler.process_peak_bytes else sampler.peak_bytes - setup.external_bytes
    breakdown = Breakdown(
        weights_bytes=acc.bytes_of("weights"), dispatch_bytes=acc.bytes_of("dispatch"),
        common_bytes=acc.bytes_of("common"), ws2_bytes=acc.bytes_of("ws2"), combine_bytes=acc.bytes_of("combine"),
        ballast_bytes=acc.bytes_of("ballast"), other_bytes=max(0, peak_for_other - tracked),
    )
    expert_num_tokens = [int(c) for c in setup.buffers.expert_num_tokens.tolist()]
    status: Literal["ok", "oom", "error"] = "ok"
    error = None
    timings = throughput = correctness = None
    if oom is not None:
        status = "oom"
    elif failed_ranks:
        status = "error"
        error = f"skipped: rank(s) {failed_ranks} ran out of memory for this policy"
    else:
        assert handle is not None and combined is not None
        stats = {stage: stats_drop_first(v) for stage, v in samples.items()}
        timings = Timings(
            dispatch_us=stats["dispatch"].median_us, experts_us=stats["experts"].median_us,
            combine_us=stats["combine"].median_us, num_samples=stats["experts"].num_samples,
        )
        throughput = _throughput(setup, timings, handle)
        correctness = _check_output(setup, combined, _slot_errors(setup))
    if workspace is not None:
        workspace.release(acc)
        del workspace
    release_cached(device)
    outcome = "oom" if status == "oom" else "fit"
    met = None if expected is None or status == "error" else outcome == expected
    result = PolicyResult(
        policy=policy, status=status, contract=contract, memory=memory, breakdown=breakdown, timings=timings,
        throughput=throughput, correctness=correctness, expected_outcome=expected, expectation_met=met, oom=oom,
        error=error,
    )
    return result, expert_num_tokens


def _throughput(setup: RankSetup, timings: Timings, handle: Any) -> Throughput:
    layout, P = setup.layout, setup.layout.num_ranks
    flops = useful_flops(setup.buffers.expert_num_tokens, hidden_size=layout.hidden_size,
                         intermediate_size=setup.scenario.model.intermediate_size or 0)
    dispatch_bytes = handle.num_send_rows * layout.row_bytes
    combine_bytes = handle.num_recv_rows * layout.hidden_size * 2
    bus = (P - 1) / P  # nccl-tests' all-to-all bus factor: the self-send crosses no link

    def gbps(num_bytes: int, us: float) -> float:
        return num_bytes / (us * 1e3) if us > 0 else 0.0

    return Throughput(
        experts_tflops=flops / (timings.experts_us * 1e6) if timings.experts_us > 0 else 0.0,
        dispatch_algbw_gbps=gbps(dispatch_bytes, timings.dispatch_us),
        dispatch_busbw_gbps=gbps(dispatch_bytes, timings.dispatch_us) * bus,
        combine_algbw_gbps=gbps(combine_bytes, timings.combine_us),
        combine_busbw_gbps=gbps(combine_bytes, timings.combine_us) * bus,
        dispatch_bytes=dispatch_bytes, combine_bytes=combine_bytes,
    )


def resolve_ops_library(scenario: Scenario) -> tuple[str | None, str | None]:
    """(ops library path, description of the vLLM source) for the vllm-ops backend, if the scenario names one."""
    v = scenario.vllm
    if v.ops_library:
        return v.ops_library, f"ops library {v.ops_library}"
    if not (v.version or v.wheel or v.src):
        if scenario.experts_backend != "vllm-ops":
            return None, None
    from harness.sizing.vllm_source import locate

    source = locate(
        version=v.version, wheel=Path(v.wheel) if v.wheel else None, src=Path(v.src) if v.src else None, with_ops=True
    )
    desc = f"{source.kind} {source.version or ''} ({source.origin})".strip()
    return (str(source.ops_library) if source.ops_library else None), desc


def setup_rank(scenario: Scenario, info: RankInfo, device: torch.device, run_dir: Path, external_bytes: int) -> RankSetup:
    s = scenario
    E, K, I = s.num_local_experts, s.model.hidden_size or 0, s.model.intermediate_size or 0
    D, P, T = s.parallel.num_dispatchers, s.parallel.num_ranks, s.parallel.max_tokens_per_rank
    layout = DispatchLayout(
        num_ranks=P, rank=info.rank, num_local_experts=E, max_slots_per_expert=T * D, hidden_size=K,
        top_k=s.model.top_k or 1, max_tokens=T * (D // P),
        num_buffer_tokens=max(s.num_tokens_on_rank(r) for r in range(P)),
    )
    ops_library, _ = resolve_ops_library(s) if s.experts_backend in ("vllm-ops", "auto") else (None, None)
    backend = select_backend(s.experts_backend, device, vllm_ops_library=ops_library)
    budget = s.memory.budget_bytes
    apply_budget(device, budget)
    accountant = Accountant(device, budget_bytes=budget)
    probe = MemoryProbe(device)
    if s.memory.ballast_bytes:
        # Never paged in on CPU: it only stands for memory a deployment would hold.
        accountant.alloc("ballast", (s.memory.ballast_bytes,), torch.uint8, touch=False)
    weights = make_weights(rank=info.rank, num_local_experts=E, hidden_size=K, intermediate_size=I, seed=s.seed,
                           device=device, accountant=accountant)
    buffers = DispatchBuffers.allocate(layout, accountant, out_dtype=getattr(torch, s.model.workspace_dtype))
    num_tokens = s.num_tokens_on_rank(info.rank)
    tokens = make_tokens(seed=s.seed, rank=info.rank, num_tokens=num_tokens, hidden_size=K, device=device)
    return RankSetup(
        scenario=s, info=info, device=device, layout=layout, tokens=tokens,
        routing=make_routing(s, info.rank, num_tokens).to(device),
        weights=weights, buffers=buffers, backend=backend, accountant=accountant, probe=probe,
        external_bytes=external_bytes, run_dir=run_dir,
    )


def rank_main(scenario: Scenario, info: RankInfo, run_dir: Path, progress: Progress | None = None) -> RankRecord:
    """Run every policy of `scenario` on this rank and return its record. Joins and leaves the process group."""
    started = time.time()
    device = init_rank(info)
    try:
        probe = MemoryProbe(device)
        external = probe.used_bytes() if probe.method == "nvml" else 0
        _, vllm_desc = resolve_ops_library(scenario) if scenario.experts_backend == "vllm-ops" else (None, None)
        setup = setup_rank(scenario, info, device, run_dir, external)
        ready_at = time.time()
        if progress:
            progress({"rank": info.rank, "event": "ready", "backend": setup.backend.name})
        results: list[PolicyResult] = []
        first_counts: list[int] | None = None
        for policy in scenario.policies:
            result, counts = measure_policy(setup, policy, progress)
            results.append(result)
            if first_counts is None and result.status == "ok":
                first_counts = counts
        record = RankRecord(
            run_id=info.run_id, scenario_name=scenario.name or "", scenario_hash=scenario.scenario_hash,
            scenario=scenario.model_dump(mode="json"), rank=info.rank, num_ranks=info.world_size,
            num_dispatchers=scenario.parallel.num_dispatchers, emulated=scenario.emulated,
            comm_backend=info.comm_backend, experts_backend=setup.backend.name,
            measurement_method="same-baseline",
            versions=collect_versions(vllm_source=vllm_desc,
                                      vllm_kernels=setup.backend.kernels if setup.backend.name == "vllm-ops" else None),
            hardware=collect_hardware(device), policies=results, started_at=started, finished_at=time.time(),
            ready_at=ready_at,
            expert_num_tokens=first_counts or [],
        )
        if progress:
            progress({"rank": info.rank, "event": "done"})
        return record
    finally:
        shutdown_rank()

