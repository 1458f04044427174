"""`harness bench`: the rank-side bench through the local launcher, the CPU-side costs, the aggregation against the
scenario's thresholds, bench.json and bench.md. Exit 0 at or above the thresholds, 1 below one, 2 on errors.

Progress goes to the console step by step (ranks up, each policy, each CPU-cost probe). Output goes to --out, by
default results/bench/<run-id>/ (ignored by git; the committed GPU benches keep hardware names).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from rich.console import Console

from harness.bench.aggregate import summarize
from harness.bench.cpu_costs import cpu_costs
from harness.bench.markdown import render_markdown
from harness.bench.rank import bench_policies, bench_rank_main
from harness.bench.records import BenchFile, BenchRankRecord, BenchReport, CpuCost
from harness.core.console import make_console
from harness.core.exits import EXIT_ERROR, EXIT_FAILED, EXIT_OK
from harness.core.records import write_record, write_text_atomic
from harness.launch import LaunchError, LaunchPlan, RankEntry, RunSink, describe_failure, sigterm_as_interrupt
from harness.scenario.schema import Scenario, ScenarioError

_VALUE_OPTIONS = ("out", "experts_backend", "device", "num_ranks", "policies", "vllm_version", "vllm_wheel",
                  "vllm_src", "vllm_ops_library")
_FLAGS = ("cpu_only", "no_cpu_costs", "json")


def command_line(ns: argparse.Namespace) -> list[str]:
    """The `harness bench` command as a user would type it, from the parsed arguments (never sys.argv)."""
    argv = ["harness", "bench"] + ([str(ns.scenario)] if ns.scenario is not None else [])
    for name in _VALUE_OPTIONS:
        value = getattr(ns, name, None)
        if value is not None:
            argv += [f"--{name.replace('_', '-')}", str(value)]
    return argv + [f"--{name.replace('_', '-')}" for name in _FLAGS if getattr(ns, name, False)]


def _error(message: str) -> int:
    print(f"harness: error: {message}", file=sys.stderr)
    return EXIT_ERROR


def _load(ns: argparse.Namespace, num_gpus: int) -> Scenario:
    from harness.launch.run import default_scenario_path, load_with_overrides, scenario_overrides
    from harness.scenario.schema import resolve_scenario_path

    path = resolve_scenario_path(ns.scenario) if ns.scenario else default_scenario_path(num_gpus)
    return load_with_overrides(path, scenario_overrides(ns))


def _run_ranks(scenario: Scenario, *, run_id: str, out: Path, num_gpus: int,
               console: Console) -> list[BenchRankRecord] | int:
    """The rank-side bench on local processes: the records, or an exit code when it could not run."""
    from harness.launch.local import LocalLauncher
    from harness.launch.run import RunProgress, choose_run_dir
    from harness.scenario.fit import can_run, resolve_device

    device_type = resolve_device(scenario, num_gpus)
    reason = can_run(scenario, device_type=device_type, num_gpus=num_gpus)
    if reason is not None:
        return _error(f"{scenario.name} cannot run here: {reason}")
    policies = tuple(bench_policies(scenario))
    plan = LaunchPlan(scenario=scenario, run_id=run_id, run_dir=choose_run_dir(out / "ranks-run", run_id),
                      device_type=device_type,
                      entry=RankEntry(main=bench_rank_main, record_model=BenchRankRecord, policies=policies))
    console.print(f"{run_id}: {scenario.summary()}\nbench: {plan.num_ranks} rank(s) on {device_type}, policies "
                  f"{', '.join(policies)}, {scenario.bench.iterations} interleaved rounds each", highlight=False,
                  markup=False)
    progress = RunProgress(console=console, title=f"{scenario.name}: bench", num_ranks=plan.num_ranks,
                           num_policies=len(policies))
    sink = RunSink.for_plan(plan, listener=progress)
    launcher = LocalLauncher()
    try:
        with progress.shown(), sigterm_as_interrupt():
            outcome = launcher.launch(plan, sink)
    finally:
        launcher.close()
    if not outcome.ok:
        for failure in outcome.failures:
            print(f"harness: {describe_failure(failure)}", file=sys.stderr)
        return _error(outcome.error) if outcome.error else EXIT_ERROR
    return [sink.records[r] for r in sorted(sink.records)]


def _report(scenario: Scenario, *, run_id: str, command: list[str], records: list[BenchRankRecord],
            costs: list[CpuCost]) -> BenchReport:
    summaries, ratio, failures = summarize(records, scenario) if records else ([], None, [])
    over = [f"CPU-side: {c.name} took {c.median_s:.3f} s (target {c.target_s} s)" for c in costs if not c.within_target]
    first = records[0] if records else None
    return BenchReport(
        run_id=run_id, scenario_name=scenario.name or "", scenario_hash=scenario.scenario_hash,
        num_ranks=len(records), experts_backend=first.experts_backend if first else None,
        versions=first.versions if first else None, device_name=first.hardware.device_name if first else None,
        command=command,
        thresholds={"bench.experts_ratio_min": scenario.bench.experts_ratio_min,
                    "bench.comm_busbw_ratio_min": scenario.bench.comm_busbw_ratio_min},
        policies=summaries, legacy_over_fixed_experts_time=ratio, cpu_costs=costs, failures=failures + over,
        ok=not failures and not over,
    )


def bench_command(ns: argparse.Namespace) -> int:
    """Entry of `harness bench`: 0 at or above the thresholds, 1 below one, 2 on errors."""
    from harness.launch.run import local_gpu_count, make_run_id
    from harness.scenario.schema import REPO_DIR

    console = make_console(stderr=ns.json)  # with --json, stdout holds the report alone; progress goes to stderr
    num_gpus = local_gpu_count()
    try:
        scenario = _load(ns, num_gpus)
    except (ScenarioError, LaunchError) as exc:
        return _error(str(exc))
    run_id = make_run_id(f"bench-{scenario.name}")
    out: Path = ns.out or (REPO_DIR / "results" / "bench" / run_id)
    records: list[BenchRankRecord] = []
    if not ns.cpu_only:
        ran = _run_ranks(scenario, run_id=run_id, out=out, num_gpus=num_gpus, console=console)
        if isinstance(ran, int):
            return ran
        records = ran
    costs: list[CpuCost] = []
    if not ns.no_cpu_costs:
        console.print("bench: CPU-side costs (each probe runs the real commands)", highlight=False, markup=False)
        costs = cpu_costs(progress=lambda line: console.print(f"bench: {line}", highlight=False, markup=False))
    report = _report(scenario, run_id=run_id, command=command_line(ns), records=records, costs=costs)
    write_record(out / "bench.json", BenchFile(report=report, ranks=records))
    markdown = render_markdown(report, records)
    write_text_atomic(out / "bench.md", markdown)
    if ns.json:
        print(json.dumps(report.model_dump(mode="json"), indent=1))
    else:
        console.print(markdown, markup=False, highlight=False)
        console.print(f"bench: {out}", highlight=False, markup=False)
    return EXIT_OK if report.ok else EXIT_FAILED
