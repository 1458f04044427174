"""Schema-valid synthetic run directories: what `harness bench` collects to measure the collector's CPU cost
(harness.bench.probe_collect, probe_matrix_collect), and what the collector's tests judge.

The records are built with the real pydantic models of harness.core.records and the real contracts of
harness.core.contract, so the collector sees exactly what a rank would write. Numbers vary with the rank in a way
the tests can recompute (see `workspace_delta_for`).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Literal

from harness.core.contract import builtin_shapes
from harness.core.records import (
    Breakdown,
    ContractBytes,
    Correctness,
    Hardware,
    MemoryMeasurement,
    OomRecord,
    PolicyResult,
    RankFailure,
    RankRecord,
    RunManifest,
    Throughput,
    Timings,
    Versions,
    rank_record_path,
    write_record,
)
from harness.scenario.schema import Scenario, parse_scenario

STARTED_AT = 1_764_480_000.0  # 2025-11-30 05:20 UTC; fixed so reports are reproducible

SMOKE: dict[str, Any] = {
    "name": "synthetic-smoke",
    "model": {"hidden_size": 128, "intermediate_size": 64, "num_experts": 16, "top_k": 4},
    "parallel": {"num_dispatchers": 4, "num_ranks": 2, "num_local_experts": 4, "max_tokens_per_rank": 32},
    "policies": ["legacy", "fixed"],
    "expect": {"outcomes": {"legacy": "fit", "fixed": "fit"}, "memory_tolerance_pct": 1.0},
}


def unpadded_md(text: str) -> str:
    """Markdown with each table row's padding removed ("| a   | b |" -> "| a | b |"): the cells, as written."""
    lines = []
    for line in text.splitlines():
        if line.startswith("|") and not line.startswith("|-"):
            cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]]
            line = "| " + " | ".join(cells) + " |"
        lines.append(line)
    return "\n".join(lines) + "\n"


def read_md(path: Path) -> str:
    """report.md, unpadded (unpadded_md)."""
    return unpadded_md(path.read_text())


def make_scenario(data: dict[str, Any] | None = None, **sections: Any) -> Scenario:
    """The smoke-like scenario, with top-level sections replaced by keyword (parallel={...}, policies=[...])."""
    merged = dict(SMOKE if data is None else data)
    merged.update(sections)
    return parse_scenario(merged, path="<synthetic>")


def versions() -> Versions:
    return Versions(
        harness="0.1.0",
        python="3.11.2",
        torch="2.13.0",
        cuda="12.8",
        nccl="2.27.3",
        driver="580.95.05",
        ray="2.52.0",
        vllm_source="release 0.30.0 (wheel, cached)",
        vllm_kernels="vllm/_C_stable_libtorch.abi3.so",
    )


# Release policies without downloading the releases: 0.29.0 and earlier double-count (legacy), later ones are fixed
# (docs/vllm-sources.md). Synthetic records only need the right bytes.
def _synthetic_policy(policy: str) -> str:
    if not policy.startswith("vllm=="):
        return policy
    version = tuple(int(p) for p in policy.removeprefix("vllm==").split(".")[:2])
    return "legacy" if version <= (0, 29) else "fixed"


def contract(scenario: Scenario, policy: str) -> ContractBytes:
    shapes = builtin_shapes(_synthetic_policy(policy), scenario.sizing_args())
    return ContractBytes(
        ws13_shape=list(shapes.ws13),
        ws2_shape=list(shapes.ws2),
        out_shape=list(shapes.out),
        common_bytes=shapes.common_bytes,
        ws2_bytes=shapes.ws2_bytes,
        total_bytes=shapes.total_bytes,
        source=shapes.source,
    )


def workspace_delta_for(scenario: Scenario, policy: str, rank: int) -> int:
    """The synthetic measured workspace delta: the allocated contract plus 0, 0.1 or 0.2 % by rank."""
    c = contract(scenario, policy)
    allocated = c.common_bytes + c.ws2_bytes
    return allocated + (allocated * (rank % 3)) // 1000


def timings(dispatch_us: float, experts_us: float, combine_us: float, spread: float | None) -> Timings:
    """Medians with per-stage min/max `spread` (relative) around them; None: a record from before min/max."""
    if spread is None:
        return Timings(dispatch_us=dispatch_us, experts_us=experts_us, combine_us=combine_us, num_samples=19)
    lo, hi = 1 - spread / 2, 1 + spread / 2
    return Timings(
        dispatch_us=dispatch_us,
        experts_us=experts_us,
        combine_us=combine_us,
        num_samples=19,
        dispatch_min_us=dispatch_us * lo,
        dispatch_max_us=dispatch_us * hi,
        experts_min_us=experts_us * lo,
        experts_max_us=experts_us * hi,
        combine_min_us=combine_us * lo,
        combine_max_us=combine_us * hi,
    )


def policy_result(
    scenario: Scenario,
    policy: str,
    rank: int,
    *,
    status: str = "ok",
    workspace_delta_bytes: int | None = None,
    max_rel_error: float | None = None,
    experts_us: float | None = None,
    experts_tflops: float | None = None,
    device_kind: Literal["cuda", "cpu"] = "cuda",
    baseline_bytes: int | None = None,
    num_wrong_slots: int = 0,
    timing_spread: float | None = 0.04,
    failed_ranks: list[int] | None = None,
) -> PolicyResult:
    c = contract(scenario, policy)
    baseline = 1_000_000_000 + rank if baseline_bytes is None else baseline_bytes
    gpu = device_kind == "cuda"
    # Like harness.rank.lifecycle: a policy that did not run still records the memory seen (the failed allocation
    # adds 0).
    unmeasured = MemoryMeasurement(
        method="nvml" if gpu else "rss",
        label="GPU memory (NVML device used)" if gpu else "CPU memory (process RSS)",
        baseline_bytes=baseline,
        peak_bytes=baseline + 4096,
        delta_bytes=4096,
        workspace_delta_bytes=0,
        num_samples=3,
    )
    if status == "oom":
        return PolicyResult(
            policy=policy,
            status="oom",
            contract=c,
            memory=unmeasured,
            oom=OomRecord(
                policy=policy,
                stage="workspace",
                requested_bytes=c.common_bytes,
                free_bytes=2**30,
                total_bytes=80 * 2**30,
                budget_bytes=80 * 10**9,
                message=f"CUDA out of memory. Tried to allocate {c.common_bytes / 2**30:.2f} GiB",
            ),
        )
    if status == "stopped":  # harness.rank.lifecycle's record on the ranks that did not OOM when another rank did
        return PolicyResult(
            policy=policy,
            status="error",
            contract=c,
            memory=unmeasured,
            error="skipped: rank(s) [1] ran out of memory for this policy",
            failed_ranks=failed_ranks,
        )
    if status == "error":
        return PolicyResult(
            policy=policy, status="error", contract=c, error="RuntimeError: kernel not found", failed_ranks=failed_ranks
        )
    delta = workspace_delta_for(scenario, policy, rank) if workspace_delta_bytes is None else workspace_delta_bytes
    return PolicyResult(
        policy=policy,
        status="ok",
        contract=c,
        memory=MemoryMeasurement(
            method="nvml" if gpu else "rss",
            label="GPU memory (NVML device used)" if gpu else "CPU memory (process RSS)",
            baseline_bytes=baseline,
            peak_bytes=baseline + delta + 4096,
            delta_bytes=delta + 4096,
            workspace_delta_bytes=delta,
            process_peak_bytes=baseline + delta if gpu else None,
            allocator_allocated_peak_bytes=c.common_bytes + c.ws2_bytes + 1000 * rank if gpu else None,
            allocator_reserved_peak_bytes=c.common_bytes + c.ws2_bytes + 2**21 if gpu else None,
            allocator_baseline_bytes=500_000_000 if gpu else None,
            num_samples=50,
        ),
        breakdown=Breakdown(
            weights_bytes=300_000_000,
            dispatch_bytes=40_000_000,
            common_bytes=c.common_bytes,
            ws2_bytes=c.ws2_bytes,
            combine_bytes=20_000_000,
            ballast_bytes=0,
            other_bytes=600_000_000 + rank,
        ),
        timings=timings(
            100.0 + rank, experts_us if experts_us is not None else 200.0 + 2 * rank, 90.0 + rank, timing_spread
        ),
        throughput=Throughput(
            experts_tflops=experts_tflops if experts_tflops is not None else 900.0 - rank % 100,
            dispatch_algbw_gbps=300.0,
            dispatch_busbw_gbps=250.0 - rank % 100,
            combine_algbw_gbps=290.0,
            combine_busbw_gbps=240.0 - rank % 100,
            dispatch_bytes=1_000_000,
            combine_bytes=2_000_000,
        ),
        correctness=Correctness(
            max_abs_error=0.002 * (rank + 1),
            max_rel_error=max_rel_error if max_rel_error is not None else 0.01 + 0.001 * (rank % 10),
            num_wrong_slots=num_wrong_slots,
            num_checked_tokens=32,
            tolerance=0.06,
        ),
    )


def rank_record(
    scenario: Scenario,
    rank: int,
    *,
    run_id: str,
    overrides: dict[str, dict[str, Any]] | None = None,
    device_kind: Literal["cuda", "cpu"] = "cuda",
    num_nodes: int = 1,
    complete: bool = True,
    warmup: str | None = "full",
) -> RankRecord:
    """One rank's record; `overrides` maps a policy to policy_result keyword arguments."""
    overrides = overrides or {}
    ranks_per_node = max(1, scenario.parallel.num_ranks // num_nodes)
    node = rank // ranks_per_node
    return RankRecord(
        run_id=run_id,
        scenario_name=scenario.name or "synthetic",
        scenario_hash=scenario.scenario_hash,
        scenario=scenario.model_dump(mode="json"),
        rank=rank,
        num_ranks=scenario.parallel.num_ranks,
        num_dispatchers=scenario.parallel.num_dispatchers,
        emulated=scenario.emulated,
        comm_backend="nccl" if device_kind == "cuda" else "gloo",
        experts_backend="torch-cutlass" if device_kind == "cuda" else "reference",
        measurement_method=scenario.memory.method,
        versions=versions(),
        hardware=Hardware(
            hostname=f"node-{node}",
            node_ip=f"10.0.0.{node + 1}",
            device_kind=device_kind,
            device_name="NVIDIA H200" if device_kind == "cuda" else "x86_64",
            device_uuid=f"GPU-{rank:08d}" if device_kind == "cuda" else None,
            device_total_bytes=150_754_820_096 if device_kind == "cuda" else None,
            device_capability="9.0" if device_kind == "cuda" else None,
            num_cpus=16,
        ),
        policies=[
            policy_result(scenario, p, rank, device_kind=device_kind, **overrides.get(p, {})) for p in scenario.policies
        ],
        started_at=STARTED_AT + rank,
        finished_at=STARTED_AT + 60.0 + rank,
        expert_num_tokens=[8] * scenario.num_local_experts,
        complete=complete,
        warmup=warmup,  # type: ignore[arg-type]
    )


def write_run(
    run_dir: Path,
    scenario: Scenario,
    *,
    run_id: str = "20251130-052000-synthetic",
    skip_ranks: tuple[int, ...] = (),
    failed_ranks: dict[int, str] | None = None,
    overrides: dict[int, dict[str, dict[str, Any]]] | None = None,
    device_kind: Literal["cuda", "cpu"] = "cuda",
    num_nodes: int = 1,
    manifest: bool = True,
) -> Path:
    """A complete run directory: run.json and one record per rank (or a failure record, or nothing)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    if manifest:
        write_record(
            run_dir / "run.json",
            RunManifest(
                run_id=run_id,
                scenario_name=scenario.name or "synthetic",
                scenario_hash=scenario.scenario_hash,
                scenario=scenario.model_dump(mode="json"),
                scenario_path="scenarios/synthetic.yaml",
                num_ranks=scenario.parallel.num_ranks,
                launcher="local",
                command=["harness", "run", "synthetic"],
                started_at=STARTED_AT,
                versions=versions(),
            ),
        )
    failed_ranks = failed_ranks or {}
    for rank in range(scenario.parallel.num_ranks):
        if rank in skip_ranks:
            continue
        if rank in failed_ranks:
            write_record(
                rank_record_path(run_dir, rank, failed=True),
                RankFailure(
                    run_id=run_id, rank=rank, node="node-0", cause=failed_ranks[rank], detail="", at=STARTED_AT + 30
                ),
            )
            continue
        record = rank_record(
            scenario,
            rank,
            run_id=run_id,
            overrides=(overrides or {}).get(rank),
            device_kind=device_kind,
            num_nodes=num_nodes,
        )
        write_record(rank_record_path(run_dir, rank), record)
    return run_dir


def read_json(path: Path) -> Any:
    return json.loads(path.read_text())
