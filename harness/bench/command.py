"""`harness bench`: the rank-side bench through the local launcher, the CPU-side costs, the aggregation against the
scenario's thresholds, bench.json and bench.md. Exit 0 at or above the thresholds, 1 below one, 2 on errors.

Progress goes to the console step by step (ranks up, each policy, each CPU-cost probe). Output goes to --out, by
default results/bench/<run-id>/ (ignored by git; the committed GPU benches keep hardware names).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console

from harness.bench.aggregate import summarize
from harness.bench.cpu_costs import PROBES, cpu_costs
from harness.bench.markdown import render_markdown
from harness.bench.rank import bench_policies, bench_rank_main
from harness.bench.records import BenchFile, BenchRankRecord, BenchReport, CpuCost
from harness.core.console import make_console
from harness.core.errors import BadInput, InfrastructureError
from harness.core.exits import EXIT_ERROR, EXIT_FAILED, EXIT_OK
from harness.core.records import write_record, write_text_atomic
from harness.launch.overrides import ScenarioOverrides
from harness.launch.sink import describe_failure
from harness.scenario.schema import Scenario

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class BenchRequest:
    """One `harness bench`: the scenario and its overrides, what to measure, where to write, and the command that
    asked for it (recorded in bench.json)."""

    scenario: str | None = None  # a file, or a name in scenarios/; None: the embedded default
    overrides: ScenarioOverrides = field(default_factory=ScenarioOverrides)
    out: Path | None = None
    json: bool = False
    cpu_only: bool = False
    no_cpu_costs: bool = False
    repeats: int = 3  # samples of each repeated CPU-side probe
    probes: tuple[str, ...] | None = None  # the CPU-side probes to run (cpu_costs.PROBES); None: all
    command: tuple[str, ...] = ("harness", "bench")


def _load(request: BenchRequest, num_gpus: int) -> Scenario:
    from harness.launch.overrides import default_scenario_path, load_with_overrides
    from harness.scenario.schema import resolve_scenario_path

    path = resolve_scenario_path(request.scenario) if request.scenario else default_scenario_path(num_gpus)
    return load_with_overrides(path, request.overrides.dotted())


def _run_ranks(
    scenario: Scenario, *, run_id: str, out: Path, num_gpus: int, console: Console
) -> list[BenchRankRecord] | int:
    """The rank-side bench on local processes (harness.launch.run.run_ranks): the records, or an exit code when it
    could not run."""
    from harness.launch.local import LocalLauncher
    from harness.launch.run import RanksRequest, run_ranks
    from harness.launch.rundir import choose_run_dir
    from harness.scenario.fit import can_run, resolve_device

    device_type = resolve_device(scenario, num_gpus)
    reason = can_run(scenario, device_type=device_type, num_gpus=num_gpus)
    if reason is not None:
        raise BadInput(f"{scenario.name} cannot run here: {reason}")
    policies = tuple(bench_policies(scenario))
    console.print(
        f"{run_id}: {scenario.summary()}\nbench: {scenario.parallel.num_ranks} rank(s) on {device_type}, "
        f"policies {', '.join(policies)}, {scenario.bench.iterations} interleaved rounds each",
        highlight=False,
        markup=False,
    )
    request = RanksRequest(
        scenario=scenario,
        run_id=run_id,
        run_dir=choose_run_dir(out / "ranks-run", run_id),
        device_type=device_type,
        main=bench_rank_main,
        record_model=BenchRankRecord,
        policies=policies,
        title=f"{scenario.name}: bench",
    )
    launcher = LocalLauncher()
    try:
        ran = run_ranks(request, launcher=launcher, console=console)
    finally:
        launcher.close()
    if not ran.ok:
        for failure in ran.outcome.failures:
            log.warning(describe_failure(failure))
        if ran.outcome.error:
            raise InfrastructureError(ran.outcome.error)
        return EXIT_ERROR
    return list(ran.records.values())


def _report(
    scenario: Scenario, *, run_id: str, command: list[str], records: list[BenchRankRecord], costs: list[CpuCost]
) -> BenchReport:
    summaries, ratio, failures = summarize(records, scenario) if records else ([], None, [])
    over = [f"CPU-side: {c.name} took {c.median_s:.3f} s (target {c.target_s} s)" for c in costs if not c.within_target]
    first = records[0] if records else None
    return BenchReport(
        run_id=run_id,
        scenario_name=scenario.name or "",
        scenario_hash=scenario.scenario_hash,
        num_ranks=len(records),
        experts_backend=first.experts_backend if first else None,
        versions=first.versions if first else None,
        device_name=first.hardware.device_name if first else None,
        command=command,
        thresholds={
            "bench.experts_ratio_min": scenario.bench.experts_ratio_min,
            "bench.comm_bound_ratio_min": scenario.bench.comm_bound_ratio_min,
        },
        policies=summaries,
        legacy_over_fixed_experts_time=ratio,
        cpu_costs=costs,
        failures=failures + over,
        ok=not failures and not over,
    )


def bench_command(request: BenchRequest) -> int:
    """Entry of `harness bench`: 0 at or above the thresholds, 1 below one, 2 on errors."""
    from harness.launch.run import local_gpu_count
    from harness.launch.rundir import make_run_id
    from harness.scenario.sections import REPO_DIR

    console = make_console(stderr=request.json)  # with --json, stdout holds the report alone; progress goes to stderr
    num_gpus = local_gpu_count()
    scenario = _load(request, num_gpus)  # ScenarioError, LaunchError: one line from harness.cli.main
    run_id = make_run_id(f"bench-{scenario.name}")
    out: Path = request.out or (REPO_DIR / "results" / "bench" / run_id)
    records: list[BenchRankRecord] = []
    if not request.cpu_only:
        ran = _run_ranks(scenario, run_id=run_id, out=out, num_gpus=num_gpus, console=console)
        if isinstance(ran, int):
            return ran
        records = ran
    costs: list[CpuCost] = []
    if not request.no_cpu_costs:
        console.print("bench: CPU-side costs (each probe runs the real commands)", highlight=False, markup=False)
        costs = cpu_costs(
            repeats=request.repeats,
            probes=request.probes or PROBES,
            progress=lambda line: console.print(f"bench: {line}", highlight=False, markup=False),
        )
    report = _report(scenario, run_id=run_id, command=list(request.command), records=records, costs=costs)
    write_record(out / "bench.json", BenchFile(report=report, ranks=records))
    markdown = render_markdown(report, records)
    write_text_atomic(out / "bench.md", markdown)
    if request.json:
        print(json.dumps(report.model_dump(mode="json"), indent=1))
    else:
        console.print(markdown, markup=False, highlight=False)
        console.print(f"bench: {out}", highlight=False, markup=False)
    return EXIT_OK if report.ok else EXIT_FAILED
