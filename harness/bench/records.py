"""What `harness bench` measures and writes: per-rank records, the aggregated report, bench.json. Frozen, typed and
versioned like every record, sharing their header (harness.core.records.RunHeader / RankHeader)."""

from __future__ import annotations

from typing import Literal

from harness.core.records import Hardware, RankHeader, Record, RunHeader, Versions

BENCH_POLICIES = ("legacy", "fixed")


class VariantStats(Record):
    """One variant's samples in microseconds, the first round dropped."""

    name: str  # "experts:harness", "experts:raw-vllm", "a2a:raw-dispatch", "dispatch.pack" (a sub-stage), ...
    median_us: float
    min_us: float
    max_us: float
    num_samples: int


class KernelTime(Record):
    """One kernel's GPU time per round, from torch.profiler's device events."""

    name: str
    calls_per_round: float
    us_per_round: float


class CommYardstick(Record):
    """The same yardstick for every comm backend (harness.bench.yardstick): bytes, bandwidths, bound, ratio."""

    timing: Literal["graph", "eager"]  # what dispatch_us / combine_us are: CUDA-graph replays, or eager calls
    hbm_gbps: float | None  # device-to-device copy probe, (read + write) / time; None on CPU
    link_gbps: float | None  # peer copy probe, one way; None at P = 1 and on CPU
    remote_rows: int  # (token, distinct remote rank) pairs this rank sends
    selections: int  # (token, top-k selection) pairs of this rank
    received_pairs: int  # (token, expert) slots this rank's experts received
    dispatch_min_remote_bytes: int
    combine_min_remote_bytes: int
    dispatch_local_bytes: int  # every slot written: FP8 row + scale
    combine_local_bytes: int  # every expert output read
    dispatch_moved_bytes: int  # the backend's own rows on the link
    combine_moved_bytes: int
    anchor_dispatch_bytes: int  # DeepEP's count: every selection, (K + K/128 * 4 + 16) bytes
    anchor_combine_bytes: int  # every selection, 2K
    dispatch_us: float
    combine_us: float
    dispatch_bound_us: float | None
    combine_bound_us: float | None
    bound_ratio: float | None  # (dispatch + combine bound) / (dispatch + combine measured); None: n/a here
    # graph timing: the replays above ran queued behind a GPU sleep of queued_ahead_us (the last one; it doubles
    # after a late sample, whose enqueueing outlasted it); the same replays launched on an idle GPU, for contrast
    idle_dispatch_us: float | None = None
    idle_combine_us: float | None = None
    queued_ahead_us: float | None = None
    late_samples: int = 0


class BenchPolicy(Record):
    policy: str
    status: Literal["ok", "oom", "error"]
    variants: list[VariantStats]
    experts_raw_variant: str | None
    experts_ratio: float | None  # raw / harness
    # (fastest raw dispatch + fastest raw combine) / (harness dispatch + harness combine), same bytes per peer
    comm_ratio: float | None
    experts_tflops: float | None
    experts_tflops_fraction_of_peak: float | None
    raw_a2a_busbw_gbps: float | None
    harness_comm_busbw_gbps: float | None
    dispatch_bytes: int
    combine_bytes: int
    max_rel_error: float | None  # the harness step's output against the raw kernel's, on the valid rows
    error: str | None = None  # status "error": what was raised, here or on the ranks that stopped the policy
    comm_raw_dispatch_variant: str | None = None  # the fastest raw collective for dispatch's bytes
    comm_raw_combine_variant: str | None = None  # and for combine's
    # the yardstick (gates); comm_ratio above stays as a diagnostic
    comm_yardstick: CommYardstick | None = None
    comm_graph_error: str | None = None  # why dispatch/combine did not capture in a CUDA graph, where they did not
    kernels: list[KernelTime] = []  # noqa: RUF012 - a pydantic field, copied per instance; per kernel GPU time of one replayed (or eager) dispatch + combine


class BenchRankRecord(RankHeader):
    record_kind: Literal["bench-rank"] = "bench-rank"
    scenario_name: str
    num_ranks: int
    comm_backend: str  # the dispatch/combine backend: symm-mem, nccl or gloo
    experts_backend: str
    versions: Versions
    hardware: Hardware
    policies: list[BenchPolicy]
    num_rounds: int
    complete: bool = True  # False: the record so far, sent after a policy; the final record replaces it


class CpuCost(Record):
    """One CPU-side probe. `clock` says what median_s and samples_s are: "cpu", the CPU seconds of this process or
    of the child command (user + system; what a loaded machine does not stretch), or "wall". Only gated probes can
    fail the bench; within_target is True for the others, which are shown against their target."""

    name: str
    median_s: float
    samples_s: list[float]
    target_s: float
    within_target: bool
    clock: Literal["cpu", "wall"] = "wall"
    gated: bool = True
    wall_median_s: float | None = None  # the wall seconds beside a CPU-time probe, shown, never gated


class BenchPolicySummary(Record):
    policy: str
    num_ranks_ok: int
    experts_raw_variant: str | None
    experts_ratio_min: float | None
    experts_ratio_median: float | None
    comm_ratio_min: float | None  # the raw-collective ratio: a diagnostic, not gating
    experts_tflops_min: float | None
    experts_tflops_max: float | None
    fraction_of_fp8_peak_max: float | None
    harness_comm_busbw_gbps_min: float | None
    raw_a2a_busbw_gbps_max: float | None
    max_rel_error: float | None
    comm_bound_ratio_min: float | None = None  # bound / measured dispatch + combine, the smallest over ranks
    comm_timing: str | None = None  # "graph" or "eager"
    dispatch_us_max: float | None = None  # the yardstick's measured dispatch, the slowest rank
    combine_us_max: float | None = None
    dispatch_bound_us_max: float | None = None
    combine_bound_us_max: float | None = None


class BenchReport(RunHeader):
    record_kind: Literal["bench"] = "bench"
    scenario_name: str
    num_ranks: int  # ranks whose record the report aggregates; 0 with --cpu-only
    experts_backend: str | None
    versions: Versions | None
    device_name: str | None
    command: list[str]
    thresholds: dict[str, float]
    policies: list[BenchPolicySummary]
    legacy_over_fixed_experts_time: float | None  # expected ~1: the fix changes memory, not speed
    cpu_costs: list[CpuCost]
    failures: list[str]
    ok: bool


class BenchFile(Record):
    """bench.json: the report and the per-rank records it aggregates."""

    report: BenchReport
    ranks: list[BenchRankRecord]
