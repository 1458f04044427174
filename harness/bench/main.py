"""`harness bench`: what the harness costs on top of the raw kernels and raw NCCL, measured in one run.

Per rank and per policy, in one process group, interleaved round by round (A B C ... A B C ...) so clock and
thermal drift hit every variant alike:

    experts:harness      the backend's step on the policy's workspace views (what `harness run` times)
    experts:raw-vllm     vLLM's ops (cutlass_moe_mm pair, silu_and_mul, per-token quant) with every argument
                         prebuilt and no harness code around them                       (when the library loads)
    experts:raw-torch    torch._scaled_grouped_mm over all experts, no chunking, no copies into mm1/mm2 views (sm90+)
    experts:raw-reference  the reference math on the valid rows, no workspace views     (CPU)
    dispatch:harness     quantize + pack + counts + all_to_all_single + unpack into (E, M, K)
    combine:harness      gather + all_to_all_single + weighted sum
    a2a:raw-dispatch     all_to_all_single of the same rows and words with the same splits
    a2a:raw-combine      likewise for the combine payload

Ratios are raw time / harness time (1.0: the harness adds nothing). Thresholds come from the scenario's
`bench` section; below one the command exits 1.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import torch
import torch.distributed as dist
import torch.nn.functional as F

from harness.rank.combine import combine
from harness.rank.dispatch import dispatch
from harness.rank.distributed import RankInfo, init_rank, shutdown_rank
from harness.core.environment import collect_hardware, collect_versions
from harness.rank.experts import Workspace, useful_flops
from harness.sizing.plan import policy_shapes
from harness.rank.experts.reference import expert_forward
from harness.rank.quant import quantize_per_token
from harness.core.events import Done, PolicyStarted, RankEvent, Ready
from harness.core.records import SCHEMA_VERSION, Hardware, RankHeader, Record, Versions
from harness.scenario.schema import Scenario
from harness.rank.timing import StageTimer

H200_FP8_DENSE_TFLOPS = 1979.0  # vendor datasheet, dense (no sparsity)
BENCH_POLICIES = ("legacy", "fixed")


class VariantStats(Record):
    name: str
    median_us: float
    min_us: float
    max_us: float
    num_samples: int


class BenchPolicy(Record):
    policy: str
    status: Literal["ok", "oom"]
    variants: list[VariantStats]
    experts_raw_variant: str | None
    experts_ratio: float | None  # raw / harness
    comm_ratio: float | None  # (raw dispatch + raw combine) / (harness dispatch + harness combine)
    experts_tflops: float | None
    experts_tflops_fraction_of_peak: float | None
    raw_a2a_busbw_gbps: float | None
    harness_comm_busbw_gbps: float | None
    dispatch_bytes: int
    combine_bytes: int
    max_rel_error: float | None  # the harness step's output against the raw kernel's, on the valid rows


class BenchRankRecord(RankHeader):
    record_kind: Literal["bench-rank"] = "bench-rank"
    scenario_name: str
    num_ranks: int
    comm_backend: str
    experts_backend: str
    versions: Versions
    hardware: Hardware
    policies: list[BenchPolicy]
    num_rounds: int


def _stats(name: str, samples: list[float]) -> VariantStats:
    kept = samples[1:] if len(samples) > 1 else samples  # the first round warms caches and lazy inits
    return VariantStats(name=name, median_us=statistics.median(kept), min_us=min(kept), max_us=max(kept),
                        num_samples=len(kept))


def _raw_torch(setup: Any, workspace: Workspace) -> Callable[[], torch.Tensor]:
    b, w, out = setup.buffers, setup.weights, workspace.out
    E, M = b.expert_x.shape[:2]
    I = w.w2.shape[2]
    x_scale = b.expert_x_scale.reshape(E, M)
    w1t, w2t = w.w1.transpose(-2, -1), w.w2.transpose(-2, -1)

    def run() -> torch.Tensor:
        h = torch._scaled_grouped_mm(b.expert_x, w1t, x_scale, w.w1_scale, out_dtype=torch.bfloat16)
        q, s = quantize_per_token(F.silu(h[..., :I]) * h[..., I:])
        # The batched contract ends with the result in `out`, as vLLM's copy of mm2_out does.
        return out.copy_(torch._scaled_grouped_mm(q, w2t, s.squeeze(-1), w.w2_scale, out_dtype=torch.bfloat16))

    return run


def _raw_vllm(setup: Any, workspace: Workspace) -> Callable[[], torch.Tensor]:
    ops = torch.ops._C
    b, w, ws = setup.buffers, setup.weights, workspace
    E, M, K = b.expert_x.shape
    I = w.w2.shape[2]
    dev = b.expert_x.device
    offsets32 = torch.empty((E,), dtype=torch.int32, device=dev)
    ps1 = torch.empty((E, 3), dtype=torch.int32, device=dev)
    ps2 = torch.empty((E, 3), dtype=torch.int32, device=dev)
    ops.get_cutlass_batched_moe_mm_data(offsets32, ps1, ps2, b.expert_num_tokens, E, M, I, K)
    offsets = offsets32.to(torch.int64)
    sk = torch.full((E,), K, dtype=torch.int64, device=dev)
    s2i = torch.full((E,), 2 * I, dtype=torch.int64, device=dev)
    si = torch.full((E,), I, dtype=torch.int64, device=dev)
    a1q, a1q_scale = b.expert_x.reshape(E * M, K), b.expert_x_scale.reshape(E * M, 1)
    act_scale = torch.empty((E * M, 1), dtype=torch.float32, device=dev)
    mm1, act, quant, mm2, out = ws.mm1_out, ws.act_out, ws.quant_out, ws.mm2_out, ws.out

    def run() -> torch.Tensor:
        ops.cutlass_moe_mm(mm1, a1q, w.w1, a1q_scale, w.w1_scale, offsets, ps1, sk, sk, s2i, True, True)
        ops.silu_and_mul(act, mm1)
        ops.dynamic_per_token_scaled_fp8_quant(quant, act, act_scale, None)
        ops.cutlass_moe_mm(mm2, quant, w.w2, act_scale, w.w2_scale, offsets, ps2, si, si, sk, True, True)
        return out.copy_(mm2.view(E, M, K))  # vLLM's batched path ends with this copy too

    return run


def _raw_reference(setup: Any) -> Callable[[], torch.Tensor]:
    b, w = setup.buffers, setup.weights
    E, M, K = b.expert_x.shape
    out = torch.empty((E, M, K), dtype=torch.bfloat16, device=b.expert_x.device)

    def run() -> torch.Tensor:
        for e, n in enumerate(b.expert_num_tokens.tolist()):
            if n:
                out[e, :n] = expert_forward(b.expert_x[e, :n], b.expert_x_scale[e, :n], w.w1[e], w.w1_scale[e],
                                            w.w2[e], w.w2_scale[e])
        return out

    return run


def _raw_experts(setup: Any, workspace: Workspace) -> tuple[str, Callable[[], torch.Tensor]]:
    name = setup.backend.name
    if name == "vllm-ops":
        return "experts:raw-vllm", _raw_vllm(setup, workspace)
    if name == "torch-cutlass":
        return "experts:raw-torch", _raw_torch(setup, workspace)
    return "experts:raw-reference", _raw_reference(setup)


def _valid_rel_error(a: torch.Tensor, b: torch.Tensor, counts: list[int]) -> float:
    worst = 0.0
    for e, n in enumerate(counts):
        if n:
            x, y = a[e, :n].float(), b[e, :n].float()
            worst = max(worst, float((x - y).abs().max() / y.abs().max().clamp_min(1e-30)))
    return worst


def bench_policy(setup: Any, policy: str, num_rounds: int) -> BenchPolicy:
    """Interleave every variant `num_rounds` times on one policy's workspace."""
    s, device, acc = setup.scenario, setup.device, setup.accountant
    shapes = policy_shapes(policy, s.sizing_args())
    try:
        workspace = Workspace.allocate(
            shapes, acc, dtype=getattr(torch, s.model.workspace_dtype), num_local_experts=s.num_local_experts,
            max_slots_per_expert=setup.layout.max_slots_per_expert, hidden_size=setup.layout.hidden_size,
            intermediate_size=s.model.intermediate_size or 0,
        )
        ok = True
    except torch.OutOfMemoryError:
        workspace, ok = None, False
    flags = torch.tensor([0 if ok else 1], dtype=torch.int32, device=device)
    dist.all_reduce(flags)
    if int(flags.item()):
        if workspace is not None:
            workspace.release(acc)
        return BenchPolicy(policy=policy, status="oom", variants=[], experts_raw_variant=None, experts_ratio=None,
                           comm_ratio=None, experts_tflops=None, experts_tflops_fraction_of_peak=None,
                           raw_a2a_busbw_gbps=None, harness_comm_busbw_gbps=None, dispatch_bytes=0, combine_bytes=0,
                           max_rel_error=None)
    assert workspace is not None
    b = setup.buffers
    handle = dispatch(setup.tokens, setup.routing, setup.layout, b, setup.quantize)  # splits the raw a2a reuses
    raw_name, raw_experts = _raw_experts(setup, workspace)
    K = setup.layout.hidden_size
    num_send, num_recv = handle.num_send_rows, handle.num_recv_rows
    row_bytes = setup.layout.row_bytes

    def harness_experts() -> torch.Tensor:
        return setup.backend.apply(expert_x=b.expert_x, expert_x_scale=b.expert_x_scale,
                                   expert_num_tokens=b.expert_num_tokens, weights=setup.weights, workspace=workspace)

    def raw_dispatch() -> None:
        for recv, send in ((b.recv_x, b.send_x), (b.recv_meta, b.send_meta)):
            dist.all_to_all_single(recv[:num_recv], send[:num_send],
                                   output_split_sizes=handle.recv_splits, input_split_sizes=handle.send_splits)

    def raw_combine() -> None:
        dist.all_to_all_single(b.combine_recv[:num_send], b.combine_send[:num_recv],
                               output_split_sizes=handle.send_splits, input_split_sizes=handle.recv_splits)

    # Experts first: raw-vllm writes the same views the harness step uses, so compare before reuse.
    counts = [int(c) for c in b.expert_num_tokens.tolist()]
    harness_out = harness_experts().clone()
    raw_out = raw_experts()
    rel_error = _valid_rel_error(harness_out, raw_out, counts)
    del harness_out, raw_out
    state: dict[str, Any] = {"handle": handle}

    def harness_dispatch() -> None:
        state["handle"] = dispatch(setup.tokens, setup.routing, setup.layout, b, setup.quantize)

    def harness_combine() -> None:
        combine(workspace.out, state["handle"], setup.layout, b)

    variants: list[tuple[str, Callable[[], Any], bool]] = [
        ("dispatch:harness", harness_dispatch, True),
        ("a2a:raw-dispatch", raw_dispatch, True),
        ("experts:harness", harness_experts, False),
        (raw_name, raw_experts, False),
        ("combine:harness", harness_combine, True),
        ("a2a:raw-combine", raw_combine, True),
    ]
    samples: dict[str, list[float]] = {name: [] for name, _, _ in variants}
    timer = StageTimer(device)
    for _ in range(num_rounds):
        for name, fn, collective in variants:
            if collective:  # start every rank together, so the time is the exchange, not the skew
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                dist.barrier()
            started = timer.start()
            fn()
            timer.stop(name, started)
            samples[name].append(timer.elapsed_us()[name])
    stats = [_stats(name, samples[name]) for name, _, _ in variants]
    by = {v.name: v.median_us for v in stats}
    flops = useful_flops(b.expert_num_tokens, hidden_size=K, intermediate_size=s.model.intermediate_size or 0)
    tflops = flops / (by["experts:harness"] * 1e6)
    P = setup.layout.num_ranks
    bus = (P - 1) / P
    dispatch_bytes, combine_bytes = num_send * row_bytes, num_recv * K * 2
    raw_comm_us = by["a2a:raw-dispatch"] + by["a2a:raw-combine"]
    harness_comm_us = by["dispatch:harness"] + by["combine:harness"]
    comm_bytes = dispatch_bytes + combine_bytes
    workspace.release(acc)
    del workspace
    return BenchPolicy(
        policy=policy, status="ok", variants=stats, experts_raw_variant=raw_name,
        experts_ratio=by[raw_name] / by["experts:harness"],
        comm_ratio=raw_comm_us / harness_comm_us,
        experts_tflops=tflops,
        experts_tflops_fraction_of_peak=tflops / H200_FP8_DENSE_TFLOPS if device.type == "cuda" else None,
        raw_a2a_busbw_gbps=comm_bytes / (raw_comm_us * 1e3) * bus,
        harness_comm_busbw_gbps=comm_bytes / (harness_comm_us * 1e3) * bus,
        dispatch_bytes=dispatch_bytes, combine_bytes=combine_bytes, max_rel_error=rel_error,
    )


def bench_rank_main(scenario: Scenario, info: RankInfo, run_dir: Path,
                    progress: Callable[[RankEvent], None] | None = None) -> BenchRankRecord:
    """The bench counterpart of harness.rank.lifecycle.rank_main: same setup, interleaved variants per policy."""
    from harness.rank.memory import release_cached
    from harness.rank.lifecycle import setup_rank

    device = init_rank(info)
    try:
        setup = setup_rank(scenario, info, device, run_dir, 0)
        if progress:
            progress(setup.event(Ready, backend=setup.backend.name))
        policies = [p for p in scenario.policies if p in BENCH_POLICIES] or list(BENCH_POLICIES)
        results = []
        for policy in policies:
            if progress:
                progress(setup.event(PolicyStarted, policy=policy))
            release_cached(device)
            results.append(bench_policy(setup, policy, scenario.bench.iterations))
        record = BenchRankRecord(
            run_id=info.run_id, scenario_name=scenario.name or "", scenario_hash=scenario.scenario_hash,
            rank=info.rank, num_ranks=info.world_size, comm_backend=info.comm_backend,
            experts_backend=setup.backend.name, versions=collect_versions(
                vllm_kernels=setup.backend.kernels if setup.backend.name == "vllm-ops" else None),
            hardware=collect_hardware(device), policies=results, num_rounds=scenario.bench.iterations,
        )
        if progress:
            progress(setup.event(Done))
        return record
    finally:
        shutdown_rank()


def time_call(fn: Callable[[], Any], *, repeat: int) -> list[float]:
    """Wall-clock seconds of `repeat` calls (CPU-side costs)."""
    out = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


# ---------------------------------------------------------------------------------------------------------------
# Driver: CPU-side costs, the rank-side bench through the launchers, aggregation, thresholds, reports.

CPU_TARGETS_S = {
    "plan (in process)": 0.05,
    "harness plan (command)": 3.0,
    "run to first rank ready (local)": 20.0,
    "run to first rank ready (ray)": 40.0,
    "collect 1024 rank records": 2.0,
}


class CpuCost(Record):
    name: str
    median_s: float
    samples_s: list[float]
    target_s: float
    within_target: bool


class BenchPolicySummary(Record):
    policy: str
    num_ranks_ok: int
    experts_raw_variant: str | None
    experts_ratio_min: float | None
    experts_ratio_median: float | None
    comm_ratio_min: float | None
    experts_tflops_min: float | None
    experts_tflops_max: float | None
    fraction_of_fp8_peak_max: float | None
    harness_comm_busbw_gbps_min: float | None
    raw_a2a_busbw_gbps_max: float | None
    max_rel_error: float | None


class BenchReport(Record):
    schema_version: int = SCHEMA_VERSION
    record_kind: Literal["bench"] = "bench"
    run_id: str
    scenario_name: str
    scenario_hash: str
    num_ranks: int
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


def _min(values: list[float]) -> float | None:
    return min(values) if values else None


def _max(values: list[float]) -> float | None:
    return max(values) if values else None


def summarize(records: list[BenchRankRecord], scenario: Scenario) -> tuple[list[BenchPolicySummary], float | None, list[str]]:
    """Per-policy aggregates over ranks, the legacy/fixed time ratio, and the threshold failures."""
    thresholds = scenario.bench
    summaries, failures = [], []
    policies = sorted({p.policy for r in records for p in r.policies}, key=lambda p: BENCH_POLICIES.index(p)
                      if p in BENCH_POLICIES else 99)
    experts_us: dict[str, list[float]] = {}
    for policy in policies:
        rows = [p for r in records for p in r.policies if p.policy == policy and p.status == "ok"]
        experts = [p.experts_ratio for p in rows if p.experts_ratio is not None]
        comm = [p.comm_ratio for p in rows if p.comm_ratio is not None]
        tflops = [p.experts_tflops for p in rows if p.experts_tflops is not None]
        experts_us[policy] = [v.median_us for p in rows for v in p.variants if v.name == "experts:harness"]
        summary = BenchPolicySummary(
            policy=policy, num_ranks_ok=len(rows), experts_raw_variant=rows[0].experts_raw_variant if rows else None,
            experts_ratio_min=_min(experts), experts_ratio_median=statistics.median(experts) if experts else None,
            comm_ratio_min=_min(comm), experts_tflops_min=_min(tflops), experts_tflops_max=_max(tflops),
            fraction_of_fp8_peak_max=_max([p.experts_tflops_fraction_of_peak for p in rows
                                           if p.experts_tflops_fraction_of_peak is not None]),
            harness_comm_busbw_gbps_min=_min([p.harness_comm_busbw_gbps for p in rows
                                              if p.harness_comm_busbw_gbps is not None]),
            raw_a2a_busbw_gbps_max=_max([p.raw_a2a_busbw_gbps for p in rows if p.raw_a2a_busbw_gbps is not None]),
            max_rel_error=_max([p.max_rel_error for p in rows if p.max_rel_error is not None]),
        )
        summaries.append(summary)
        if summary.experts_ratio_min is not None and summary.experts_ratio_min < thresholds.experts_ratio_min:
            failures.append(f"{policy}: experts step at {summary.experts_ratio_min:.3f} of the raw kernel "
                            f"(threshold bench.experts_ratio_min = {thresholds.experts_ratio_min})")
        if summary.comm_ratio_min is not None and summary.comm_ratio_min < thresholds.comm_busbw_ratio_min:
            failures.append(f"{policy}: dispatch + combine at {summary.comm_ratio_min:.3f} of raw all_to_all_single "
                            f"(threshold bench.comm_busbw_ratio_min = {thresholds.comm_busbw_ratio_min})")
    ratio = None
    if experts_us.get("legacy") and experts_us.get("fixed"):
        ratio = statistics.median(experts_us["legacy"]) / statistics.median(experts_us["fixed"])
    return summaries, ratio, failures


def render_markdown(report: BenchReport, records: list[BenchRankRecord]) -> str:
    v = report.versions
    lines = [
        f"# harness bench: {report.scenario_name} ({report.run_id})",
        "",
        f"# scenario hash {report.scenario_hash}, {report.num_ranks} rank(s), experts backend "
        f"{report.experts_backend}, device {report.device_name}",
    ]
    if v is not None:
        lines.append(f"# harness {v.harness}, torch {v.torch}, CUDA {v.cuda}, NCCL {v.nccl}, driver {v.driver}"
                     + (f", vLLM kernels {v.vllm_kernels}" if v.vllm_kernels else ""))
    lines += [f"# command: {' '.join(report.command)}",
              "# thresholds: " + ", ".join(f"{k} {val}" for k, val in report.thresholds.items()),
              "", "## Per rank (medians over interleaved rounds, first round dropped)", "",
              "| rank | policy | variant | median | min | max | samples |",
              "|---:|---|---|---:|---:|---:|---:|",
              "| | | | us | us | us | |"]
    for r in records:
        for p in r.policies:
            for s in p.variants:
                lines.append(f"| {r.rank} | {p.policy} | {s.name} | {s.median_us:.1f} | {s.min_us:.1f} | "
                             f"{s.max_us:.1f} | {s.num_samples} |")
    lines += ["", "## Ratios (raw / harness; 1.0 = the harness adds nothing), aggregated over ranks", "",
              "| policy | ranks | raw experts | experts ratio (min) | comm ratio (min) | TFLOP/s (min..max) | "
              "of FP8 peak (max) | harness busbw (min) | raw busbw (max) | max rel err |",
              "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|",
              "| | | | | | TFLOP/s | | GB/s | GB/s | |"]

    def f(x: float | None, fmt: str) -> str:
        return "n/a" if x is None else format(x, fmt)

    for s in report.policies:
        lines.append(
            f"| {s.policy} | {s.num_ranks_ok} | {s.experts_raw_variant} | {f(s.experts_ratio_min, '.3f')} | "
            f"{f(s.comm_ratio_min, '.3f')} | {f(s.experts_tflops_min, '.1f')}..{f(s.experts_tflops_max, '.1f')} | "
            f"{f(s.fraction_of_fp8_peak_max, '.2%')} | {f(s.harness_comm_busbw_gbps_min, '.1f')} | "
            f"{f(s.raw_a2a_busbw_gbps_max, '.1f')} | {f(s.max_rel_error, '.4f')} |")
    lines += ["", f"legacy / fixed experts time: {f(report.legacy_over_fixed_experts_time, '.3f')} "
              "(the fix changes memory, not speed: expected about 1)", ""]
    if report.cpu_costs:
        lines += ["## CPU-side costs", "", "| what | median | target | |", "|---|---:|---:|---|", "| | s | s | |"]
        for c in report.cpu_costs:
            lines.append(f"| {c.name} | {c.median_s:.3f} | {c.target_s:.2f} | {'ok' if c.within_target else 'OVER'} |")
        lines.append("")
    for failure in report.failures:
        lines.append(f"- below threshold: {failure}")
    lines += ["", "OK" if report.ok else "FAILED", ""]
    return "\n".join(lines)


def _subprocess_s(args: list[str], *, cwd: Path, timeout_s: float = 300) -> float:
    import subprocess
    import sys

    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "harness", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout_s)
    if done.returncode not in (0, 1):
        raise RuntimeError(f"harness {' '.join(args)} exited {done.returncode}: {done.stderr.strip()[-400:]}")
    return time.perf_counter() - t0


def _first_ready_s(run_dir: Path, command_started_at: float) -> float:
    """Seconds from starting the `harness run` command (interpreter, imports, Ray start included) to the first
    rank's ready_at."""
    from harness.core.records import RankRecord, read_record

    ready = [r.ready_at for p in sorted((run_dir / "ranks").glob("rank-*.json"))
             if isinstance(r := read_record(p), RankRecord) and r.ready_at is not None]
    if not ready:
        raise RuntimeError(f"{run_dir}: no rank reported ready")
    return min(ready) - command_started_at


def cpu_costs(*, repeats: int = 3, with_ray: bool = True) -> list[CpuCost]:
    """plan latency, time from `harness run` to the first rank ready (local, Ray), the collector on 1024 records."""
    import json
    import subprocess
    import sys
    import tempfile

    from harness.sizing.plan import make_plan
    from harness.scenario.schema import REPO_DIR, load_scenario

    pr = load_scenario("deepseek-v3-dp32-pr55579")
    results: dict[str, list[float]] = {}
    results["plan (in process)"] = time_call(lambda: make_plan(pr), repeat=20)
    results["harness plan (command)"] = [
        _subprocess_s(["plan", "deepseek-v3-dp32-pr55579", "--json"], cwd=REPO_DIR) for _ in range(repeats)]
    with tempfile.TemporaryDirectory() as tmp:
        for launcher in ("local", "ray") if with_ray else ("local",):
            samples = []
            for i in range(repeats if launcher == "local" else 1):
                out = Path(tmp) / f"{launcher}-{i}"
                started_at = time.time()
                _subprocess_s(["run", "smoke", "--launcher", launcher, "--out", str(out)], cwd=REPO_DIR)
                samples.append(_first_ready_s(out, started_at))
            results[f"run to first rank ready ({launcher})"] = samples
    bench_collect = REPO_DIR / "benchmarks" / "bench_collect.py"
    if bench_collect.exists():
        done = subprocess.run([sys.executable, str(bench_collect), "--repeats", "3", "--json"], capture_output=True,
                              text=True, timeout=600, cwd=REPO_DIR)
        if done.returncode in (0, 1) and done.stdout.strip():
            results["collect 1024 rank records"] = json.loads(done.stdout.strip().splitlines()[-1])["timings_s"]
    return [
        CpuCost(name=name, median_s=statistics.median(v), samples_s=v, target_s=CPU_TARGETS_S[name],
                within_target=statistics.median(v) <= CPU_TARGETS_S[name])
        for name, v in results.items()
    ]


def bench_command(ns: Any) -> int:
    """Entry of `harness bench`: 0 at or above the thresholds, 1 below one, 2 on errors."""
    import sys

    from harness.core.console import make_console

    from harness.launch import LaunchError, LaunchPlan, RankEntry, RunSink
    from harness.launch.local import LocalLauncher
    from harness.rank.lifecycle import can_run, resolve_device
    from harness.core.records import write_json_atomic, write_text_atomic
    from harness.launch.run import (choose_run_dir, default_scenario_path, load_with_overrides, local_gpu_count,
                             make_run_id, scenario_overrides)
    from harness.scenario.schema import REPO_DIR, ScenarioError, resolve_scenario_path

    console = make_console()
    command = ["harness", "bench", *sys.argv[2:]] if len(sys.argv) > 1 and sys.argv[1] == "bench" else ["harness", "bench"]
    try:
        num_gpus = local_gpu_count()
        path = resolve_scenario_path(ns.scenario) if ns.scenario else default_scenario_path(num_gpus)
        ns.placement_strategy = None
        scenario = load_with_overrides(path, scenario_overrides(ns))
    except (ScenarioError, LaunchError) as exc:
        print(f"harness: error: {exc}", file=sys.stderr)
        return 2
    run_id = make_run_id(f"bench-{scenario.name}")
    out = ns.out or (REPO_DIR / "results" / "bench" / run_id)
    records: list[BenchRankRecord] = []
    if not ns.cpu_only:
        device_type = resolve_device(scenario, num_gpus)
        reason = can_run(scenario, device_type=device_type, num_gpus=num_gpus)
        if reason is not None:
            print(f"harness: error: {scenario.name} cannot run here: {reason}", file=sys.stderr)
            return 2
        launcher = LocalLauncher()
        rank_dir = choose_run_dir(out / "ranks-run", run_id)
        plan = LaunchPlan(scenario=scenario, run_id=run_id, run_dir=rank_dir, device_type=device_type,
                          entry=RankEntry(main=bench_rank_main, record_model=BenchRankRecord))
        sink = RunSink.for_plan(plan)
        console.print(f"{run_id}: {scenario.summary()}; {plan.num_ranks} rank(s) on {device_type}", highlight=False)
        outcome = launcher.launch(plan, sink)
        launcher.close()
        if not outcome.ok:
            for failure in outcome.failures:
                print(f"harness: rank {failure.rank}: {failure.cause}", file=sys.stderr)
            if outcome.error:
                print(f"harness: error: {outcome.error}", file=sys.stderr)
            return 2
        records = [sink.records[r] for r in sorted(sink.records)]  # type: ignore[misc]
    costs = [] if ns.no_cpu_costs else cpu_costs()
    summaries, ratio, failures = summarize(records, scenario) if records else ([], None, [])
    over = [f"CPU-side: {c.name} took {c.median_s:.3f} s (target {c.target_s} s)" for c in costs
            if not c.within_target]
    report = BenchReport(
        run_id=run_id, scenario_name=scenario.name or "", scenario_hash=scenario.scenario_hash,
        num_ranks=len(records), experts_backend=records[0].experts_backend if records else None,
        versions=records[0].versions if records else None,
        device_name=records[0].hardware.device_name if records else None, command=command,
        thresholds={"bench.experts_ratio_min": scenario.bench.experts_ratio_min,
                    "bench.comm_busbw_ratio_min": scenario.bench.comm_busbw_ratio_min},
        policies=summaries, legacy_over_fixed_experts_time=ratio, cpu_costs=costs, failures=failures + over,
        ok=not failures and not over,
    )
    out.mkdir(parents=True, exist_ok=True)
    write_json_atomic(out / "bench.json", {"report": report.model_dump(mode="json"),
                                           "ranks": [r.model_dump(mode="json") for r in records]})
    markdown = render_markdown(report, records)
    write_text_atomic(out / "bench.md", markdown)
    if ns.json:
        print(json.dumps(report.model_dump(mode="json"), indent=1))
    else:
        console.print(markdown, markup=False, highlight=False)
        console.print(f"bench: {out}", highlight=False)
    return 0 if report.ok else 1
