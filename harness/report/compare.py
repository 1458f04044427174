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

Exit codes: 0 no regression; 1 a regression; 2 error (unreadable or inconsistent input, a run against a matrix,
problems in the current run's records, scenarios that differ in both hash and name).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from harness.core.exits import EXIT_ERROR, EXIT_FAILED, EXIT_OK
from harness.report.collect import collect
from harness.report.load import MAX_RECORD_BYTES, read_contained
from harness.report.model import (
    Aggregate,
    HardwareInfo,
    MatrixReport,
    PolicySummary,
    Report,
    ReportFormatError,
    RunReport,
    StageSpread,
    parse_report,
)
from harness.report.write import output_generations

Verdict = Literal["regression", "improvement", "unchanged", "not compared", "not gated"]
Group = Literal["memory", "error", "time", "throughput", "coverage"]
GROUPS: tuple[Group, ...] = ("memory", "error", "time", "throughput", "coverage")
OUTCOME_RANK = {"fit": 0, "oom": 1, "error": 2}  # higher is worse


class CompareError(Exception):
    """Input that cannot be compared; the message says which file and why, in one line."""


def _min(a: Aggregate | None) -> float | None:
    return None if a is None else a.min


def _avg(a: Aggregate | None) -> float | None:
    return None if a is None else a.avg


def _max(a: Aggregate | None) -> float | None:
    return None if a is None else a.max


@dataclass(frozen=True, kw_only=True)
class Metric:
    name: str
    field: str  # the PolicySummary field it reads (how a NaN found in report.json is traced to the metric)
    get: Callable[[PolicySummary], float | None]
    unit: Literal["bytes", "us", "rel", "TFLOP/s", "GB/s"]
    group: Group
    default_threshold: float
    threshold_kind: Literal["pct", "abs"]
    worse_when: Literal["higher", "lower"]
    stage: Literal["dispatch", "experts", "combine"] | None = None  # timings and throughputs: whose spread counts
    measured_memory: bool = False  # measured by NVML or RSS: not comparable across the two


METRICS: dict[str, Metric] = {
    m.name: m
    for m in (
        # The contract is computed, not measured: any change is real, so its threshold is zero.
        Metric(name="contract_total_bytes", field="contract_total_bytes", get=lambda s: s.contract_total_bytes,
               unit="bytes", group="memory", default_threshold=0.0, threshold_kind="pct", worse_when="higher"),
        Metric(name="workspace_delta_avg_bytes", field="workspace_delta_bytes", get=lambda s: _avg(s.workspace_delta_bytes),
               unit="bytes", group="memory", default_threshold=2.0, threshold_kind="pct", worse_when="higher",
               measured_memory=True),
        Metric(name="workspace_delta_max_bytes", field="workspace_delta_bytes", get=lambda s: _max(s.workspace_delta_bytes),
               unit="bytes", group="memory", default_threshold=2.0, threshold_kind="pct", worse_when="higher",
               measured_memory=True),
        Metric(name="allocator_peak_bytes", field="allocator_allocated_peak_bytes",
               get=lambda s: _max(s.allocator_allocated_peak_bytes), unit="bytes", group="memory",
               default_threshold=2.0, threshold_kind="pct", worse_when="higher", measured_memory=True),
        # Errors near zero make percentages meaningless (0.001 -> 0.002 is +100 %): compare absolutely.
        Metric(name="max_error", field="max_rel_error", get=lambda s: _max(s.max_rel_error), unit="rel", group="error",
               default_threshold=0.01, threshold_kind="abs", worse_when="higher"),
        Metric(name="dispatch_us", field="dispatch_us", get=lambda s: _max(s.dispatch_us), unit="us", group="time",
               default_threshold=10.0, threshold_kind="pct", worse_when="higher", stage="dispatch"),
        Metric(name="experts_us", field="experts_us", get=lambda s: _max(s.experts_us), unit="us", group="time",
               default_threshold=10.0, threshold_kind="pct", worse_when="higher", stage="experts"),
        Metric(name="combine_us", field="combine_us", get=lambda s: _max(s.combine_us), unit="us", group="time",
               default_threshold=10.0, threshold_kind="pct", worse_when="higher", stage="combine"),
        Metric(name="experts_tflops", field="experts_tflops", get=lambda s: _min(s.experts_tflops), unit="TFLOP/s",
               group="throughput", default_threshold=10.0, threshold_kind="pct", worse_when="lower", stage="experts"),
        Metric(name="dispatch_busbw_gbps", field="dispatch_busbw_gbps", get=lambda s: _min(s.dispatch_busbw_gbps),
               unit="GB/s", group="throughput", default_threshold=10.0, threshold_kind="pct", worse_when="lower",
               stage="dispatch"),
        Metric(name="combine_busbw_gbps", field="combine_busbw_gbps", get=lambda s: _min(s.combine_busbw_gbps),
               unit="GB/s", group="throughput", default_threshold=10.0, threshold_kind="pct", worse_when="lower",
               stage="combine"),
    )
}
EXACT = ("outcome", "num_ranks")  # compared exactly; num_ranks is in the coverage group


# ---------------------------------------------------------------------------------------------------------------
# Options


@dataclass(frozen=True, kw_only=True)
class Options:
    thresholds: dict[str, float]  # the gated metrics (ignored ones are absent)
    ignored: frozenset[str] = frozenset()  # metric names, "outcome", "num_ranks", "policy:X", "cell:X"
    gate_across_hardware: bool = False
    gate_cpu_timings: bool = False

    def ignores(self, what: str) -> bool:
        return what in self.ignored


def parse_options(specs: list[str], ignore: list[str] | None = None, *, gate_across_hardware: bool = False,
                  gate_cpu_timings: bool = False) -> Options:
    """Default thresholds with `METRIC=PCT` / `GROUP=PCT` overrides, less what `ignore` names; CompareError says
    what is allowed."""
    thresholds = parse_thresholds(specs, ignore)
    ignored: set[str] = set()
    for name in ignore or []:
        if name.startswith(("policy:", "cell:")) and name.partition(":")[2]:
            ignored.add(name)
        elif name in METRICS or name in EXACT:
            ignored.add(name)
        elif name in GROUPS:
            ignored.update(n for n, m in METRICS.items() if m.group == name)
            if name == "coverage":
                ignored.add("num_ranks")
    return Options(thresholds=thresholds, ignored=frozenset(ignored), gate_across_hardware=gate_across_hardware,
                   gate_cpu_timings=gate_cpu_timings)


def parse_thresholds(specs: list[str], ignore: list[str] | None = None) -> dict[str, float]:
    """Default thresholds with `METRIC=PCT` / `GROUP=PCT` overrides applied, without the metrics or groups in
    `ignore`; CompareError names what is allowed."""
    thresholds = {name: m.default_threshold for name, m in METRICS.items()}
    allowed = (f"metrics: {', '.join([*EXACT, *METRICS])}; groups: {', '.join(GROUPS)}; or policy:NAME, cell:NAME")
    for name in ignore or []:
        if name.startswith(("policy:", "cell:")) and name.partition(":")[2]:
            continue
        if name not in METRICS and name not in GROUPS and name not in EXACT:
            raise CompareError(f"--ignore {name!r}: unknown metric or group; allowed {allowed}")
        for target in [name] if name in METRICS else [n for n, m in METRICS.items() if m.group == name]:
            thresholds.pop(target, None)
    for spec in specs:
        name, sep, raw = spec.partition("=")
        name = name.strip()
        if not sep:
            raise CompareError(f"--threshold {spec!r}: expected METRIC=PCT ({allowed})")
        if name in EXACT:
            raise CompareError(f"--threshold {name}: compared exactly, it takes no threshold")
        if name not in METRICS and name not in GROUPS:
            raise CompareError(f"--threshold {spec!r}: unknown metric {name!r}; allowed {allowed}")
        try:
            value = float(raw.strip().removesuffix("%"))
        except ValueError:
            raise CompareError(f"--threshold {spec!r}: {raw!r} is not a number") from None
        if not math.isfinite(value) or value < 0:
            raise CompareError(f"--threshold {spec!r}: the threshold must be a finite number >= 0")
        for target in [name] if name in METRICS else [n for n, m in METRICS.items() if m.group == name]:
            if target in thresholds:
                thresholds[target] = value
    return thresholds


# ---------------------------------------------------------------------------------------------------------------
# Inputs


@dataclass(frozen=True, kw_only=True)
class LoadedReport:
    """A report and where report.json held NaN or infinity: (cell or None, policy, PolicySummary field)."""

    report: Report
    non_finite: frozenset[tuple[str | None, str, str]] = frozenset()
    non_finite_elsewhere: tuple[str, ...] = ()  # JSON paths of non-finite values outside the policy summaries
    source: str = ""  # "report.json" or "records (collected in memory)"


def _strip_non_finite(data: Any, path: tuple[Any, ...], found: list[tuple[Any, ...]]) -> Any:
    """`data` with every NaN/infinity replaced by None, and an aggregate holding one by None as a whole."""
    if isinstance(data, float) and not math.isfinite(data):
        found.append(path)
        return None
    if isinstance(data, dict):
        cleaned = {k: _strip_non_finite(v, (*path, k), found) for k, v in data.items()}
        if {"min", "avg", "max", "num_ranks"} <= set(cleaned) and any(cleaned[k] is None for k in ("min", "avg", "max")):
            return None
        return cleaned
    if isinstance(data, list):
        return [_strip_non_finite(v, (*path, i), found) for i, v in enumerate(data)]
    return data


def _locate_non_finite(data: dict[str, Any], found: list[tuple[Any, ...]]) -> tuple[set[tuple[str | None, str, str]], list[str]]:
    located: set[tuple[str | None, str, str]] = set()
    elsewhere: list[str] = []
    for path in found:
        cell, rest = None, path
        if len(path) > 3 and path[0] == "cells" and path[2] == "report":
            cell, rest = data["cells"][path[1]].get("name"), path[3:]
        if len(rest) >= 3 and rest[0] == "policies":
            summaries = data["policies"] if cell is None else data["cells"][path[1]]["report"]["policies"]
            located.add((cell, str(summaries[rest[1]].get("policy")), str(rest[2])))
        else:
            elsewhere.append("/".join(str(p) for p in path))
    return located, elsewhere


def _parse_report_file(path: Path) -> LoadedReport:
    raw = read_contained(path.parent.resolve(), path, limit=4 * MAX_RECORD_BYTES)
    if isinstance(raw, tuple):
        raise CompareError(f"{path}: {'no such file or directory' if raw[0] == 'missing' else raw[1]}")
    try:
        data = json.loads(raw.decode("utf-8"))  # json reads NaN and Infinity: they are found below
    except UnicodeDecodeError:
        raise CompareError(f"{path}: corrupt: not UTF-8 text") from None
    except json.JSONDecodeError as exc:
        raise CompareError(f"{path}: corrupt JSON ({exc.msg} at line {exc.lineno})") from None
    except (ValueError, RecursionError) as exc:
        raise CompareError(f"{path}: corrupt JSON ({type(exc).__name__})") from None
    found: list[tuple[Any, ...]] = []
    cleaned = _strip_non_finite(data, (), found)
    try:
        report = parse_report(cleaned, where=str(path))
    except ReportFormatError as exc:
        raise CompareError(str(exc)) from None
    located, elsewhere = _locate_non_finite(data, found) if isinstance(data, dict) else (set(), [])
    return LoadedReport(report=report, non_finite=frozenset(located), non_finite_elsewhere=tuple(elsewhere),
                        source="report.json")


def _collect_in_memory(directory: Path) -> Report:
    from harness.report.matrix import recollect_matrix
    from harness.scenario.matrix import MatrixError

    if (directory / "run.json").exists() or (directory / "run.json").is_symlink():
        return collect(directory, write=False).report
    try:
        return recollect_matrix(directory, write=False).report
    except MatrixError as exc:
        raise CompareError(str(exc)) from None


def _check_generations(directory: Path, loaded: LoadedReport) -> None:
    """report.json, its sibling reports and the records it came from must be one generation."""
    generation = loaded.report.generation
    for name, other in output_generations(directory).items():
        if other is not None and other != generation:
            raise CompareError(f"{directory}: {name} is of generation {other}, report.json of {generation}: a mixed "
                               f"set of outputs; run `harness collect {directory}`")
    has_records = any((directory / n).exists() for n in ("run.json", "matrix.json"))
    if has_records:
        fresh = _collect_in_memory(directory).generation
        if fresh != generation:
            raise CompareError(f"{directory}: report.json is of generation {generation} but its records are now "
                               f"{fresh} (changed, deleted or added since it was collected); run `harness collect "
                               f"{directory}`")


def load_report(path: Path) -> LoadedReport:
    """A report from a report.json file, a directory holding one (checked against its records and siblings), or a
    run or matrix directory without one (collected in memory, nothing written)."""
    path = Path(path)
    if path.is_dir():
        if (path / "report.json").exists():
            loaded = _parse_report_file(path / "report.json")
            _check_generations(path, loaded)
            return loaded
        if (path / "run.json").exists() or (path / "matrix.json").exists():
            return LoadedReport(report=_collect_in_memory(path), source="records (collected in memory)")
        raise CompareError(f"{path}: neither report.json nor run.json nor matrix.json here; run `harness collect "
                           f"{path}` or give a report.json")
    if not path.exists():
        raise CompareError(f"{path}: no such file or directory")
    return _parse_report_file(path)


# ---------------------------------------------------------------------------------------------------------------
# Comparing


@dataclass(frozen=True, kw_only=True)
class Row:
    cell: str | None
    policy: str
    metric: str
    baseline: Any
    current: Any
    change_pct: float | None
    change_abs: float | None
    threshold: float | None
    threshold_kind: str  # "pct", "abs" or "exact"
    verdict: Verdict
    note: str = ""


def compare_metric(metric: Metric, baseline: float | None, current: float | None, threshold: float,
                   noise_pct: float | None = None) -> tuple[Verdict, float | None, float | None, str]:
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


NO_SPREAD = "no per-stage min/max in the records: threshold alone"


def _stage_noise(metric: Metric, base: PolicySummary, cur: PolicySummary) -> tuple[float | None, str]:
    """The larger relative spread (%) of the metric's stage in the two runs, or None (threshold alone) and why."""
    if metric.stage is None:
        return None, ""
    spreads: list[StageSpread | None] = [base.timing_spread, cur.timing_spread]
    values = [s.of(metric.stage, rate=metric.group == "throughput") if s is not None else None for s in spreads]
    if any(v is None for v in values):
        return None, NO_SPREAD
    return 100.0 * max(v for v in values if v is not None), ""


def _metric_row(cell: str | None, policy: str, metric: Metric, base: PolicySummary, cur: PolicySummary,
                ctx: _Context) -> Row:
    threshold = ctx.options.thresholds[metric.name]
    b, c = metric.get(base), metric.get(cur)
    common = {"cell": cell, "policy": policy, "metric": metric.name, "baseline": b, "current": c,
              "threshold": threshold, "threshold_kind": metric.threshold_kind}
    if (cell, policy, metric.field) in ctx.cur_nan:
        return Row(**common, change_pct=None, change_abs=None, verdict="regression", note="NaN or infinity in current")
    if (cell, policy, metric.field) in ctx.base_nan:
        return Row(**common, change_pct=None, change_abs=None, verdict="not compared", note="NaN or infinity in baseline")
    timing = metric.group in ("time", "throughput")
    across = not ctx.options.gate_across_hardware and (
        (timing and ctx.cross_hardware) or (metric.measured_memory and ctx.cross_memory))
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
        rows.append(Row(cell=cell, policy=policy, metric="outcome", baseline=base.outcome, current=cur.outcome,
                        change_pct=None, change_abs=None, threshold=None, threshold_kind="exact",
                        verdict=compare_outcome(base.outcome, cur.outcome),
                        note=f"OOM ranks {base.num_oom} -> {cur.num_oom}" if cur.outcome else "no result in current"))
    if not ctx.options.ignores("num_ranks"):
        fewer = cur.num_ranks < base.num_ranks
        rows.append(Row(cell=cell, policy=policy, metric="num_ranks", baseline=base.num_ranks, current=cur.num_ranks,
                        change_pct=None, change_abs=float(cur.num_ranks - base.num_ranks), threshold=None,
                        threshold_kind="exact", verdict="regression" if fewer else "unchanged",
                        note="ranks with a result: fewer than the baseline's" if fewer else ""))
    return rows


def _missing_row(cell: str | None, policy: str, what: str, side: str, ctx: _Context) -> Row:
    ignored = ctx.options.ignores(f"{what}:{cell if what == 'cell' else policy}")
    verdict: Verdict = "not compared" if side == "baseline" or ignored else "regression"
    note = f"{what} not in {side}" + (" (ignored)" if ignored and side == "current" else "")
    return Row(cell=cell, policy=policy, metric=what, baseline=None, current=None, change_pct=None, change_abs=None,
               threshold=None, threshold_kind="exact", verdict=verdict, note=note)


def _compare_policies(cell: str | None, base: RunReport, cur: RunReport, ctx: _Context) -> list[Row]:
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
        rows += [_metric_row(cell, policy, m, b, c, ctx) for name, m in METRICS.items() if name in ctx.options.thresholds]
    return rows


def _scenario_check(what: str, base: RunReport, cur: RunReport) -> str | None:
    """A warning when hashes differ but names match; CompareError when both differ."""
    if base.scenario_hash == cur.scenario_hash:
        return None
    if base.scenario_name == cur.scenario_name:
        return (f"{what}scenario {base.scenario_name!r} changed (hash {base.scenario_hash} -> {cur.scenario_hash}): "
                "compared by name; check that the change is intended")
    raise CompareError(
        f"{what}different scenarios: baseline {base.scenario_name!r} (hash {base.scenario_hash}) vs current "
        f"{cur.scenario_name!r} (hash {cur.scenario_hash}); compare runs of one scenario (same name or same hash)")


def _hardware_text(hw: HardwareInfo) -> str:
    return f"{', '.join(hw.device_names) or 'unknown device'} ({hw.device_kind or 'n/a'})"


def _cross_hardware(base: Report, cur: Report) -> tuple[bool, bool]:
    """(different hardware, memory measured differently); unknown hardware on either side counts as the same."""
    b, c = base.hardware, cur.hardware
    if not b.device_names or not c.device_names:
        return False, False
    return (b.device_kind, b.device_names) != (c.device_kind, c.device_names), b.device_kind != c.device_kind


def _current_problems(current: Report) -> None:
    """Problems in the current run's records make the comparison meaningless: exit 2, naming them.

    A matrix cell that never ran is not one of them: its results are missing, which is a regression."""
    problems = [p for p in current.problems if p.kind != "missing-cell"]
    if problems:
        shown = "; ".join(f"{f'[{p.cell}] ' if p.cell else ''}{p.kind}: {p.cause}" for p in problems[:3])
        more = f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""
        raise CompareError(f"the current run's records have {len(problems)} problem(s): {shown}{more}")


@dataclass(frozen=True, kw_only=True)
class Comparison:
    baseline_path: str
    current_path: str
    kind: str
    options: Options
    rows: tuple[Row, ...]
    warnings: tuple[str, ...] = field(default=())
    hardware_note: str | None = None  # the one line saying what was not gated across hardware

    def count(self, verdict: Verdict) -> int:
        return sum(1 for r in self.rows if r.verdict == verdict)

    @property
    def exit_code(self) -> int:
        return EXIT_FAILED if self.count("regression") else EXIT_OK

    @property
    def status(self) -> str:
        return "OK" if self.exit_code == EXIT_OK else "FAILED"

    def exit_reason(self) -> str:
        counts = [f"{self.count(v)} {label}" for v, label in (
            ("regression", "regression(s)"), ("improvement", "improvement(s)"), ("unchanged", "unchanged"),
            ("not compared", "not compared"), ("not gated", "not gated"))]
        return ", ".join(counts)

    def hints(self) -> list[str]:
        groups = {METRICS[r.metric].group for r in self.rows if r.verdict == "regression" and r.metric in METRICS}
        if groups & {"time", "throughput"}:
            return ["hint: timings and throughputs depend on the machine and its load; `--ignore time --ignore "
                    "throughput` leaves them out, `--threshold time=PCT` widens them"]
        return []

    def to_json(self) -> dict[str, Any]:
        return {
            "status": self.status, "exit_code": self.exit_code, "exit_reason": self.exit_reason(), "kind": self.kind,
            "baseline": self.baseline_path, "current": self.current_path, "warnings": list(self.warnings),
            "hardware_note": self.hardware_note, "hints": self.hints(),
            "ignored": sorted(self.options.ignored), "gate_across_hardware": self.options.gate_across_hardware,
            "gate_cpu_timings": self.options.gate_cpu_timings,
            "thresholds": {name: {"value": value, "kind": METRICS[name].threshold_kind,
                                  "worse_when": METRICS[name].worse_when}
                           for name, value in self.options.thresholds.items()},
            "num_regressions": self.count("regression"), "num_improvements": self.count("improvement"),
            "num_unchanged": self.count("unchanged"), "num_not_compared": self.count("not compared"),
            "num_not_gated": self.count("not gated"),
            "rows": [_row_json(r) for r in self.rows],
        }


def _row_json(row: Row) -> dict[str, Any]:
    data = asdict(row)
    for key in ("change_pct", "change_abs"):
        if isinstance(data[key], float) and not math.isfinite(data[key]):
            data[key] = None  # JSON has no infinity; a change from zero is stated in the note
    return data


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


def compare_reports(baseline: Report | LoadedReport, current: Report | LoadedReport, *, options: Options | None = None,
                    baseline_path: str = "baseline", current_path: str = "current") -> Comparison:
    """Compare two reports (both runs or both matrices); CompareError when they cannot be compared."""
    base = baseline if isinstance(baseline, LoadedReport) else LoadedReport(report=baseline)
    cur = current if isinstance(current, LoadedReport) else LoadedReport(report=current)
    options = options or parse_options([])
    if base.report.kind != cur.report.kind:
        raise CompareError(f"cannot compare a {base.report.kind} report ({baseline_path}) with a {cur.report.kind} "
                           f"report ({current_path})")
    _current_problems(cur.report)
    warnings: list[str] = []
    if base.report.exit_code == EXIT_ERROR:
        warnings.append(f"the baseline report has errors ({base.report.exit_reason}): its aggregates may miss ranks")
    warnings += [f"NaN or infinity in the current report at {p}" for p in cur.non_finite_elsewhere]
    cross, cross_memory = _cross_hardware(base.report, cur.report)
    cpu_timings = base.report.hardware.device_kind == cur.report.hardware.device_kind == "cpu"
    ctx = _Context(options=options, cross_hardware=cross, cross_memory=cross_memory, cpu_timings=cpu_timings,
                   base_nan=base.non_finite, cur_nan=cur.non_finite)
    if isinstance(base.report, RunReport) and isinstance(cur.report, RunReport):
        warning = _scenario_check("", base.report, cur.report)
        warnings += [warning] if warning else []
        rows = _compare_policies(None, base.report, cur.report, ctx)
    else:
        assert isinstance(base.report, MatrixReport) and isinstance(cur.report, MatrixReport)
        rows = _compare_matrices(base.report, cur.report, ctx, warnings)
    note = None
    if cross:
        what = "timings, throughputs" + (" and measured memory (RSS vs NVML)" if cross_memory else "")
        gated = "gated anyway (--gate-across-hardware)" if options.gate_across_hardware else \
            "shown, not gated (--gate-across-hardware gates them)"
        note = (f"different hardware: baseline {_hardware_text(base.report.hardware)}, current "
                f"{_hardware_text(cur.report.hardware)}: {what} are {gated}")
    elif cpu_timings:
        gated = "gated (--gate-cpu-timings)" if options.gate_cpu_timings else \
            "shown, not gated (--gate-cpu-timings gates them)"
        note = ("CPU runs: timings and throughputs are wall-clock of the reference path on a shared host, beyond "
                f"what the runs' spread captures: {gated}")
    return Comparison(baseline_path=baseline_path, current_path=current_path, kind=base.report.kind, options=options,
                      rows=tuple(rows), warnings=tuple(warnings), hardware_note=note)


# ---------------------------------------------------------------------------------------------------------------
# Output


def _fmt_value(metric: str, value: Any) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, str) or metric not in METRICS:
        return str(value)
    spec = METRICS[metric]
    if spec.unit == "bytes":
        return f"{value / 2**30:.4g} GiB" if abs(value) >= 2**30 else f"{value / 2**20:.4g} MiB"
    if spec.unit == "rel":
        return f"{value:.3g}"
    return f"{value:.1f} {spec.unit}" if spec.unit == "us" else f"{value:.4g} {spec.unit}"


def _fmt_change(row: Row) -> str:
    if row.metric == "outcome":
        return f"{row.baseline or 'n/a'} -> {row.current or 'n/a'}"
    if row.metric in ("policy", "cell"):
        return ""
    if row.change_abs is None:
        return "n/a"
    if row.threshold_kind in ("abs", "exact") or row.change_pct is None:
        return f"{row.change_abs:+.3g}"
    if math.isinf(row.change_pct):
        return "from zero"
    return f"{row.change_pct:+.1f}%"


def _fmt_threshold(row: Row) -> str:
    if row.threshold is None:
        return "exact"
    return f"{row.threshold:g}" + ("" if row.threshold_kind == "abs" else "%")


def _short_note(note: str) -> str:
    """A row's note in the table: the spread fallback is said once above the table, not on every row."""
    return "; ".join(part for part in note.split("; ") if part != NO_SPREAD)


def render_comparison(comparison: Comparison) -> Any:
    """A rich renderable: what changed beyond its threshold (and what could not be compared), then the footer."""
    from rich.console import Group as RichGroup
    from rich.table import Table
    from rich.text import Text

    parts: list[Any] = [Text(f"compare: {comparison.baseline_path} (baseline) vs {comparison.current_path} (current)",
                             style="bold")]
    thresholds = ", ".join(f"{n} {v:g}{'' if METRICS[n].threshold_kind == 'abs' else '%'}"
                           for n, v in comparison.options.thresholds.items())
    parts.append(Text(f"# thresholds: {thresholds}; outcome and num_ranks exact; timings and throughputs also beyond "
                      "the runs' spread", style="dim"))
    if comparison.options.ignored:
        parts.append(Text(f"# ignored: {', '.join(sorted(comparison.options.ignored))}", style="dim"))
    if comparison.hardware_note:
        parts.append(Text(comparison.hardware_note, style="yellow"))
    parts += [Text(f"WARNING: {w}", style="yellow") for w in comparison.warnings]
    if any(NO_SPREAD in r.note for r in comparison.rows):
        parts.append(Text(f"timings and throughputs: {NO_SPREAD} (records of an older harness)", style="yellow"))
    shown = [r for r in comparison.rows if r.verdict in ("regression", "improvement", "not gated")
             or (r.verdict == "not compared" and r.metric in ("policy", "cell", "outcome"))]
    if shown:
        table = Table(title="what changed", title_justify="left")
        lead = ["cell"] if comparison.kind == "matrix" else []
        for name in lead + ["policy", "metric", "baseline", "current", "change", "threshold", "verdict", "note"]:
            table.add_column(name, justify="right" if name in ("baseline", "current", "change", "threshold") else "left")
        for r in shown:
            style = {"regression": "red", "improvement": "green", "not gated": "dim"}.get(r.verdict, "yellow")
            table.add_row(*(([r.cell or ""] if lead else []) + [
                r.policy, r.metric, _fmt_value(r.metric, r.baseline), _fmt_value(r.metric, r.current), _fmt_change(r),
                _fmt_threshold(r), r.verdict, _short_note(r.note)]), style=style)
        parts.append(table)
    else:
        parts.append(Text("nothing changed beyond its threshold"))
    parts += [Text(h, style="yellow") for h in (comparison.hints() if comparison.exit_code else [])]
    parts.append(Text(f"{comparison.status} (exit {comparison.exit_code}): {comparison.exit_reason()}",
                      style="bold green" if comparison.exit_code == EXIT_OK else "bold red"))
    return RichGroup(*parts)


def compare_command(ns: argparse.Namespace) -> int:
    """`harness compare BASELINE CURRENT [--threshold METRIC=PCT ...] [--ignore WHAT ...] [--json]`."""
    from harness.core.console import make_console

    try:
        options = parse_options(list(ns.threshold or []), list(getattr(ns, "ignore", None) or []),
                                gate_across_hardware=bool(getattr(ns, "gate_across_hardware", False)),
                                gate_cpu_timings=bool(getattr(ns, "gate_cpu_timings", False)))
        baseline = load_report(ns.baseline)
        current = load_report(ns.current)
        comparison = compare_reports(baseline, current, options=options, baseline_path=str(ns.baseline),
                                     current_path=str(ns.current))
    except CompareError as exc:
        if ns.json:
            print(json.dumps({"status": "FAILED", "exit_code": EXIT_ERROR, "exit_reason": f"error: {exc}"}, indent=1))
        print(f"harness: error: {exc}", file=sys.stderr)
        return EXIT_ERROR
    if ns.json:
        print(json.dumps(comparison.to_json(), indent=1))
    else:
        make_console().print(render_comparison(comparison))
    return comparison.exit_code
