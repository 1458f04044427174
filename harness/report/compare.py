"""`harness compare BASELINE CURRENT`: the regression gate, on the typed reports (harness.report.model).

BASELINE and CURRENT are run or matrix directories (their report.json, checked against the records it came from,
or the records collected in memory when there is no report.json yet) or report.json files. Per policy (and per
matrix cell) it compares:

    metric                      from the policy summary                  default threshold    worse when
    outcome                     outcome                                  exact                fit -> oom / error
    num_ranks                   num_ranks (ranks with a result)          exact                fewer
    contract_total_bytes        contract_total_bytes                     0 %  (computed)      higher
    workspace_delta_avg_bytes   workspace_delta_bytes.avg                2 %                  higher
    workspace_delta_max_bytes   workspace_delta_bytes.max                2 %                  higher
    allocator_peak_bytes        allocator_allocated_peak_bytes.max       2 %                  higher
    max_error                   max_rel_error.max                        0.01 absolute        higher
    dispatch_us / experts_us / combine_us   <stage>_us.max               10 %                 higher
    experts_tflops              experts_tflops.min                       10 %                 lower
    dispatch_busbw_gbps / combine_busbw_gbps  <name>.min                 10 %                 lower

Rules (docs/reports.md, "compare"):
  - Whatever the baseline has and the current run lacks is a regression: a policy, a metric, a matrix cell, ranks.
    `--ignore` names what may be missing or differ: a metric, a group (memory, error, time, throughput,
    coverage), `policy:NAME` or `cell:NAME`.
  - A NaN or infinity in the current report is a regression; one in the baseline leaves that metric uncompared.
  - Problems in the current run's records (unreadable, deleted, truncated, newer-schema, a rank that failed) exit 2,
    as does a report.json whose generation is not its records' or its sibling reports'.
  - Timings and throughputs regress only beyond BOTH the threshold and the spread the two runs measured:
    (max - min) / median of the stage's samples, the widest over ranks and the two runs. Records without
    per-stage min/max fall back to the threshold alone, and the row says so.
  - Different hardware in the two headers (device kind or name): timings, throughputs, and memory measured
    differently (CPU RSS against GPU NVML) are shown but not gated unless `--gate-across-hardware`.
  - Two CPU runs: timings and throughputs are wall-clock of the reference path on a shared host, where another
    process can slow one policy's every sample threefold; they are shown, not gated, unless `--gate-cpu-timings`.
  - The current run's own verdicts first: every check it failed in collect (harness.report.checks) is a
    regression, whatever the baseline says. A baseline that is not a passing run is an error unless
    `--allow-failed-baseline`.

Exit codes: 0 no regression; 1 a regression or a failed check of the current run; 2 error (a baseline that is
not a passing run, unreadable or inconsistent input, a run against a matrix,
problems in the current run's records, scenarios that differ in both hash and name).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.core.exits import EXIT_ERROR, EXIT_OK
from harness.report.compare_load import LoadedReport, load_report
from harness.report.compare_metrics import (
    EXACT,
    GROUPS,
    METRICS,
    NO_SPREAD,
    OUTCOME_RANK,
    CompareError,
    Comparison,
    Group,
    Metric,
    Options,
    Row,
    Verdict,
    parse_options,
    parse_thresholds,
)
from harness.report.compare_render import render_comparison
from harness.report.model import (
    CheckFailure,
    HardwareInfo,
    MatrixReport,
    PolicySummary,
    Report,
    RunReport,
    RunSummary,
    StageSpread,
)
from harness.scenario.limits import shown_text

__all__ = [
    "EXACT",
    "GROUPS",
    "METRICS",
    "CompareError",
    "CompareRequest",
    "Comparison",
    "Group",
    "LoadedReport",
    "Metric",
    "Options",
    "Row",
    "Verdict",
    "compare_command",
    "compare_metric",
    "compare_outcome",
    "compare_reports",
    "load_report",
    "parse_options",
    "parse_thresholds",
    "render_comparison",
]


def compare_metric(
    metric: Metric, baseline: float | None, current: float | None, threshold: float, noise_pct: float | None = None
) -> tuple[Verdict, float | None, float | None, str]:
    """verdict, change in percent, absolute change, note. A worse change is a regression only beyond the
    threshold and, when given, beyond `noise_pct` (the spread the runs measured)."""
    if baseline is None:
        return "not compared", None, None, "not in baseline" if current is not None else "in neither report"
    if current is None:
        return "regression", None, None, "missing in current"
    change_abs = current - baseline
    if baseline == 0:
        change_pct = 0.0 if current == 0 else math.copysign(math.inf, change_abs)
    else:
        change_pct = change_abs / abs(baseline) * 100.0
    worse = change_abs > 0 if metric.worse_when == "higher" else change_abs < 0
    size = abs(change_abs) if metric.threshold_kind == "abs" else abs(change_pct)
    note = "from zero" if baseline == 0 and current != 0 else ""
    if change_abs == 0 or size <= threshold:
        return "unchanged", change_pct, change_abs, note
    if noise_pct is not None and abs(change_pct) <= noise_pct:
        return "unchanged", change_pct, change_abs, f"within the runs' spread ({noise_pct:.3g}%)"
    return ("regression" if worse else "improvement"), change_pct, change_abs, note


def compare_outcome(baseline: str | None, current: str | None) -> Verdict:
    if baseline is not None and current is None:
        return "regression"  # results that vanish (the run or cell failed) must not pass the gate
    if baseline is None or current is None:
        return "not compared"
    if baseline == current:
        return "unchanged"
    return "regression" if OUTCOME_RANK.get(current, 3) > OUTCOME_RANK.get(baseline, 3) else "improvement"


@dataclass(frozen=True, kw_only=True)
class _Context:
    options: Options
    cross_hardware: bool
    cross_memory: bool  # the two measured memory differently (nvml vs rss)
    cpu_timings: bool  # both ran on CPUs: wall-clock timings of the reference path on a shared host
    base_nan: frozenset[tuple[str | None, str, str]]
    cur_nan: frozenset[tuple[str | None, str, str]]


def _stage_noise(metric: Metric, base: PolicySummary, cur: PolicySummary) -> tuple[float | None, str]:
    """The larger relative spread (%) of the metric's stage in the two runs, or None (threshold alone) and why."""
    if metric.stage is None:
        return None, ""
    spreads: list[StageSpread | None] = [base.timing_spread, cur.timing_spread]
    values = [s.of(metric.stage, rate=metric.group == "throughput") if s is not None else None for s in spreads]
    if any(v is None for v in values):
        return None, NO_SPREAD
    return 100.0 * max(v for v in values if v is not None), ""


def _metric_row(
    cell: str | None, policy: str, metric: Metric, base: PolicySummary, cur: PolicySummary, ctx: _Context
) -> Row:
    threshold = ctx.options.thresholds[metric.name]
    b, c = metric.get(base), metric.get(cur)
    common: dict[str, Any] = {
        "cell": cell,
        "policy": policy,
        "metric": metric.name,
        "baseline": b,
        "current": c,
        "threshold": threshold,
        "threshold_kind": metric.threshold_kind,
    }
    if (cell, policy, metric.field) in ctx.cur_nan:
        return Row(**common, change_pct=None, change_abs=None, verdict="regression", note="NaN or infinity in current")
    if (cell, policy, metric.field) in ctx.base_nan:
        return Row(
            **common, change_pct=None, change_abs=None, verdict="not compared", note="NaN or infinity in baseline"
        )
    timing = metric.group in ("time", "throughput")
    across = not ctx.options.gate_across_hardware and (
        (timing and ctx.cross_hardware) or (metric.measured_memory and ctx.cross_memory)
    )
    on_cpu = timing and ctx.cpu_timings and not ctx.options.gate_cpu_timings
    noise, why = _stage_noise(metric, base, cur)
    verdict, pct, diff, note = compare_metric(metric, b, c, threshold, noise)
    if (across or on_cpu) and verdict in ("regression", "improvement", "unchanged"):
        reason = "different hardware" if across else "CPU timing"
        verdict, note = "not gated", reason + (f"; {note}" if note else "")
    elif why and b is not None and c is not None:
        note = f"{note}; {why}" if note else why
    return Row(**common, change_pct=pct, change_abs=diff, verdict=verdict, note=note)


def _exact_rows(cell: str | None, policy: str, base: PolicySummary, cur: PolicySummary, ctx: _Context) -> list[Row]:
    rows = []
    if not ctx.options.ignores("outcome"):
        rows.append(
            Row(
                cell=cell,
                policy=policy,
                metric="outcome",
                baseline=base.outcome,
                current=cur.outcome,
                change_pct=None,
                change_abs=None,
                threshold=None,
                threshold_kind="exact",
                verdict=compare_outcome(base.outcome, cur.outcome),
                note=f"OOM ranks {base.num_oom} -> {cur.num_oom}" if cur.outcome else "no result in current",
            )
        )
    if not ctx.options.ignores("num_ranks"):
        fewer = cur.num_ranks < base.num_ranks
        rows.append(
            Row(
                cell=cell,
                policy=policy,
                metric="num_ranks",
                baseline=base.num_ranks,
                current=cur.num_ranks,
                change_pct=None,
                change_abs=float(cur.num_ranks - base.num_ranks),
                threshold=None,
                threshold_kind="exact",
                verdict="regression" if fewer else "unchanged",
                note="ranks with a result: fewer than the baseline's" if fewer else "",
            )
        )
    return rows


def _missing_row(cell: str | None, policy: str, what: str, side: str, ctx: _Context) -> Row:
    ignored = ctx.options.ignores(f"{what}:{cell if what == 'cell' else policy}")
    verdict: Verdict = "not compared" if side == "baseline" or ignored else "regression"
    note = f"{what} not in {side}" + (" (ignored)" if ignored and side == "current" else "")
    return Row(
        cell=cell,
        policy=policy,
        metric=what,
        baseline=None,
        current=None,
        change_pct=None,
        change_abs=None,
        threshold=None,
        threshold_kind="exact",
        verdict=verdict,
        note=note,
    )


def _compare_policies(cell: str | None, base: RunSummary, cur: RunSummary, ctx: _Context) -> list[Row]:
    rows: list[Row] = []
    order = [p.policy for p in base.policies] + [p.policy for p in cur.policies if base.policy(p.policy) is None]
    for policy in order:
        b, c = base.policy(policy), cur.policy(policy)
        if b is None or c is None:
            rows.append(_missing_row(cell, policy, "policy", "baseline" if b is None else "current", ctx))
            continue
        if ctx.options.ignores(f"policy:{policy}"):
            continue
        if c.num_ranks == 0 and b.num_ranks > 0:  # no rank has a result: one row says so, not one per metric
            rows += _exact_rows(cell, policy, b, c, ctx)[:1] or [_missing_row(cell, policy, "policy", "current", ctx)]
            continue
        rows += _exact_rows(cell, policy, b, c, ctx)
        rows += [
            _metric_row(cell, policy, m, b, c, ctx) for name, m in METRICS.items() if name in ctx.options.thresholds
        ]
    return rows


def _scenario_check(what: str, base: RunSummary, cur: RunSummary) -> str | None:
    """A warning when hashes differ but names match; CompareError when both differ."""
    if base.scenario_hash == cur.scenario_hash:
        return None
    if base.scenario_name == cur.scenario_name:
        return (
            f"{what}scenario {base.scenario_name!r} changed (hash {base.scenario_hash} -> {cur.scenario_hash}): "
            "compared by name; check that the change is intended"
        )
    raise CompareError(
        f"{what}different scenarios: baseline {base.scenario_name!r} (hash {base.scenario_hash}) vs current "
        f"{cur.scenario_name!r} (hash {cur.scenario_hash}); compare runs of one scenario (same name or same hash)"
    )


def _hardware_text(hw: HardwareInfo) -> str:
    return f"{', '.join(hw.device_names) or 'unknown device'} ({hw.device_kind or 'n/a'})"


def _cross_hardware(base: Report, cur: Report) -> tuple[bool, bool]:
    """(different hardware, memory measured differently); unknown hardware on either side counts as the same."""
    b, c = base.hardware, cur.hardware
    if not b.device_names or not c.device_names:
        return False, False
    return (b.device_kind, b.device_names) != (c.device_kind, c.device_names), b.device_kind != c.device_kind


def _own_check_rows(current: Report, options: Options) -> list[Row]:
    """The current run's own verdicts: every check it failed (the collector's, harness.report.checks) is a
    regression whatever the baseline says, one row per cell x policy x check naming the ranks and the first message.
    A policy or cell that `--ignore` names is left out, as everywhere else."""
    cells = [(None, current)] if isinstance(current, RunReport) else [(c.name, c.report) for c in current.cells]
    rows: list[Row] = []
    for cell, report in cells:
        if cell is not None and options.ignores(f"cell:{cell}"):
            continue
        grouped: dict[tuple[str, str], list[CheckFailure]] = {}
        for failure in report.check_failures:
            if failure.outcome == "fail" and not options.ignores(f"policy:{failure.policy}"):
                grouped.setdefault((failure.policy, failure.check), []).append(failure)
        for (policy, check), failures in grouped.items():
            ranks = sorted({f.rank for f in failures})
            shown = ", ".join(str(r) for r in ranks[:8]) + (f" and {len(ranks) - 8} more" if len(ranks) > 8 else "")
            rows.append(
                Row(
                    cell=cell,
                    policy=policy,
                    metric=f"check:{check}",
                    baseline=None,
                    current="fail",
                    change_pct=None,
                    change_abs=None,
                    threshold=None,
                    threshold_kind="exact",
                    verdict="regression",
                    note=f"the current run failed its own {check} check on rank(s) {shown}: {failures[0].message}",
                )
            )
    return rows


def _baseline_passes(baseline: Report, options: Options, where: str) -> str | None:
    """A baseline must be a passing run: one that failed its own checks (or had errors) is no reference. CompareError
    unless --allow-failed-baseline, which turns it into the returned warning."""
    if baseline.exit_code == EXIT_OK:
        return None
    if not options.allow_failed_baseline:
        raise CompareError(
            f"the baseline {where} is not a passing run ({baseline.status}, exit {baseline.exit_code}: "
            f"{baseline.exit_reason}); compare against a passing baseline, or pass "
            "--allow-failed-baseline to compare against it anyway"
        )
    return (
        f"the baseline is not a passing run ({baseline.exit_reason}), compared anyway (--allow-failed-baseline): "
        "its aggregates may miss ranks and its numbers may be wrong"
    )


MAX_CAUSES_SHOWN, MAX_CAUSE_CHARS = 10, 300  # compare's error: a line per problem, this many, this long at most


def _current_problems(current: Report) -> None:
    """Problems in the current run's records make the comparison meaningless: exit 2, naming them.

    A matrix cell that never ran is not one of them: its results are missing, which is a regression."""
    problems = [p for p in current.problems if p.kind != "missing-cell"]
    if problems:
        # One line per cause (its first line, control characters escaped): a rank's traceback stays in its record.
        lines = [
            shown_text(
                f"{f'[{p.cell}] ' if p.cell else ''}{p.kind}: {(p.cause.strip().splitlines() or [''])[0]}",
                MAX_CAUSE_CHARS,
            )
            for p in problems[:MAX_CAUSES_SHOWN]
        ]
        if len(problems) > MAX_CAUSES_SHOWN:
            lines.append(f"(and {len(problems) - MAX_CAUSES_SHOWN} more: `harness collect` lists them all)")
        raise CompareError(f"the current run's records have {len(problems)} problem(s):", details=tuple(lines))


def _compare_matrices(base: MatrixReport, cur: MatrixReport, ctx: _Context, warnings: list[str]) -> list[Row]:
    if base.name != cur.name:
        warnings.append(f"matrix names differ: {base.name!r} vs {cur.name!r}; cells compared by name")
    base_cells = {c.name: c for c in base.cells}
    cur_cells = {c.name: c for c in cur.cells}
    rows: list[Row] = []
    for name in list(base_cells) + [n for n in cur_cells if n not in base_cells]:
        b, c = base_cells.get(name), cur_cells.get(name)
        if b is None or c is None:
            rows.append(_missing_row(name, "", "cell", "baseline" if b is None else "current", ctx))
            continue
        if ctx.options.ignores(f"cell:{name}"):
            continue
        warning = _scenario_check(f"cell {name}: ", b.report, c.report)
        if warning:
            warnings.append(warning)
        rows += _compare_policies(name, b.report, c.report, ctx)
    return rows


def compare_reports(
    baseline: Report | LoadedReport,
    current: Report | LoadedReport,
    *,
    options: Options | None = None,
    baseline_path: str = "baseline",
    current_path: str = "current",
) -> Comparison:
    """Compare two reports (both runs or both matrices); CompareError when they cannot be compared."""
    base = baseline if isinstance(baseline, LoadedReport) else LoadedReport(report=baseline)
    cur = current if isinstance(current, LoadedReport) else LoadedReport(report=current)
    options = options or parse_options([])
    if base.report.kind != cur.report.kind:
        raise CompareError(
            f"cannot compare a {base.report.kind} report ({baseline_path}) with a {cur.report.kind} "
            f"report ({current_path})"
        )
    _current_problems(cur.report)
    warnings: list[str] = []
    failed_baseline = _baseline_passes(base.report, options, baseline_path)
    warnings += [failed_baseline] if failed_baseline else []
    warnings += [f"NaN or infinity in the current report at {p}" for p in cur.non_finite_elsewhere]
    cross, cross_memory = _cross_hardware(base.report, cur.report)
    cpu_timings = base.report.hardware.device_kind == cur.report.hardware.device_kind == "cpu"
    ctx = _Context(
        options=options,
        cross_hardware=cross,
        cross_memory=cross_memory,
        cpu_timings=cpu_timings,
        base_nan=base.non_finite,
        cur_nan=cur.non_finite,
    )
    if isinstance(base.report, RunReport) and isinstance(cur.report, RunReport):
        warning = _scenario_check("", base.report, cur.report)
        warnings += [warning] if warning else []
        rows = _compare_policies(None, base.report, cur.report, ctx)
    else:
        assert isinstance(base.report, MatrixReport) and isinstance(cur.report, MatrixReport)
        rows = _compare_matrices(base.report, cur.report, ctx, warnings)
    rows = _own_check_rows(cur.report, options) + rows
    note = None
    if cross:
        what = "timings, throughputs" + (" and measured memory (RSS vs NVML)" if cross_memory else "")
        gated = (
            "gated anyway (--gate-across-hardware)"
            if options.gate_across_hardware
            else "shown, not gated (--gate-across-hardware gates them)"
        )
        note = (
            f"different hardware: baseline {_hardware_text(base.report.hardware)}, current "
            f"{_hardware_text(cur.report.hardware)}: {what} are {gated}"
        )
    elif cpu_timings:
        gated = (
            "gated (--gate-cpu-timings)"
            if options.gate_cpu_timings
            else "shown, not gated (--gate-cpu-timings gates them)"
        )
        note = (
            "CPU runs: timings and throughputs are wall-clock of the reference path on a shared host, beyond "
            f"what the runs' spread captures: {gated}"
        )
    return Comparison(
        baseline_path=baseline_path,
        current_path=current_path,
        kind=base.report.kind,
        options=options,
        rows=tuple(rows),
        warnings=tuple(warnings),
        hardware_note=note,
    )


@dataclass(frozen=True, kw_only=True)
class CompareRequest:
    """One `harness compare BASELINE CURRENT`: the two inputs (run or matrix directories, or report.json files)
    and the gate's options, as the user wrote them (parse_options reads the thresholds and ignores)."""

    baseline: Path
    current: Path
    thresholds: tuple[str, ...] = ()  # "METRIC=PCT" or "GROUP=PCT"
    ignore: tuple[str, ...] = ()  # a metric, a group, policy:NAME or cell:NAME
    gate_across_hardware: bool = False
    gate_cpu_timings: bool = False
    allow_failed_baseline: bool = False
    json: bool = False


def compare_command(request: CompareRequest) -> int:
    """`harness compare BASELINE CURRENT [--threshold METRIC=PCT ...] [--ignore WHAT ...] [--json]`."""
    from harness.core.console import make_console

    try:
        options = parse_options(
            list(request.thresholds),
            list(request.ignore),
            gate_across_hardware=request.gate_across_hardware,
            gate_cpu_timings=request.gate_cpu_timings,
            allow_failed_baseline=request.allow_failed_baseline,
        )
        baseline = load_report(request.baseline)
        current = load_report(request.current)
        comparison = compare_reports(
            baseline, current, options=options, baseline_path=str(request.baseline), current_path=str(request.current)
        )
    except CompareError as exc:  # the one line comes from harness.cli.main
        if request.json:
            reason = "".join([f"error: {exc}", *(f"\n  {line}" for line in exc.details)])
            print(json.dumps({"status": "FAILED", "exit_code": EXIT_ERROR, "exit_reason": reason}, indent=1))
        raise
    if request.json:
        print(json.dumps(comparison.to_json(), indent=1))
    else:
        make_console().print(render_comparison(comparison))
    return comparison.exit_code
