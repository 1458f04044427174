"""`harness compare BASELINE CURRENT`: the regression gate.

BASELINE and CURRENT are run directories (their report.json, or the records collected in memory when there is
none yet) or report.json files; both a run's or both a matrix's. Per policy (and per matrix cell) it compares:

    metric                      from report.json (policy summary)       default threshold    worse when
    outcome                     outcome                                  exact                fit -> oom / error
    contract_total_bytes        contract_total_bytes                     0 %  (computed)      higher
    workspace_delta_avg_bytes   workspace_delta_bytes.avg                2 %                  higher
    workspace_delta_max_bytes   workspace_delta_bytes.max                2 %                  higher
    allocator_peak_bytes        allocator_allocated_peak_bytes.max       2 %                  higher
    max_error                   max_rel_error.max                        0.01 absolute        higher
    dispatch_us / experts_us / combine_us   <name>.max                   10 %                 higher
    experts_tflops              experts_tflops.min                       10 %                 lower
    dispatch_busbw_gbps / combine_busbw_gbps  <name>.min                 10 %                 lower

A change counts only beyond its threshold (strictly): the defaults sit above the noise floor of repeated runs
(NVML deltas repeat to the byte on an idle GPU, timings within a few percent). `--threshold METRIC=PCT`
overrides one metric or a group (memory, time, throughput); max_error's threshold is an absolute difference.

Exit codes: 0 no regression; 1 a regression; 2 error (missing or corrupt input, a run against a matrix, or
scenarios that differ in both hash and name: comparing those says nothing).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from harness.report.collect import EXIT_ERROR, EXIT_FAILED, EXIT_OK, REPORT_SCHEMA_VERSION

Verdict = Literal["regression", "improvement", "unchanged", "not compared"]


class CompareError(Exception):
    """Input that cannot be compared; the message says which file and why."""


@dataclass(frozen=True, kw_only=True)
class Metric:
    name: str
    key: str  # "/"-separated path under a policy summary of report.json
    unit: Literal["bytes", "us", "rel", "TFLOP/s", "GB/s"]
    group: Literal["memory", "error", "time", "throughput"]
    default_threshold: float
    threshold_kind: Literal["pct", "abs"]
    worse_when: Literal["higher", "lower"]


METRICS: dict[str, Metric] = {
    m.name: m
    for m in (
        # The contract is computed, not measured: any change is real, so its threshold is zero.
        Metric(name="contract_total_bytes", key="contract_total_bytes", unit="bytes", group="memory",
               default_threshold=0.0, threshold_kind="pct", worse_when="higher"),
        Metric(name="workspace_delta_avg_bytes", key="workspace_delta_bytes/avg", unit="bytes", group="memory",
               default_threshold=2.0, threshold_kind="pct", worse_when="higher"),
        Metric(name="workspace_delta_max_bytes", key="workspace_delta_bytes/max", unit="bytes", group="memory",
               default_threshold=2.0, threshold_kind="pct", worse_when="higher"),
        Metric(name="allocator_peak_bytes", key="allocator_allocated_peak_bytes/max", unit="bytes", group="memory",
               default_threshold=2.0, threshold_kind="pct", worse_when="higher"),
        # Errors near zero make percentages meaningless (0.001 -> 0.002 is +100 %): compare absolutely.
        Metric(name="max_error", key="max_rel_error/max", unit="rel", group="error",
               default_threshold=0.01, threshold_kind="abs", worse_when="higher"),
        Metric(name="dispatch_us", key="dispatch_us/max", unit="us", group="time",
               default_threshold=10.0, threshold_kind="pct", worse_when="higher"),
        Metric(name="experts_us", key="experts_us/max", unit="us", group="time",
               default_threshold=10.0, threshold_kind="pct", worse_when="higher"),
        Metric(name="combine_us", key="combine_us/max", unit="us", group="time",
               default_threshold=10.0, threshold_kind="pct", worse_when="higher"),
        Metric(name="experts_tflops", key="experts_tflops/min", unit="TFLOP/s", group="throughput",
               default_threshold=10.0, threshold_kind="pct", worse_when="lower"),
        Metric(name="dispatch_busbw_gbps", key="dispatch_busbw_gbps/min", unit="GB/s", group="throughput",
               default_threshold=10.0, threshold_kind="pct", worse_when="lower"),
        Metric(name="combine_busbw_gbps", key="combine_busbw_gbps/min", unit="GB/s", group="throughput",
               default_threshold=10.0, threshold_kind="pct", worse_when="lower"),
    )
}
GROUPS = ("memory", "error", "time", "throughput")
OUTCOME_RANK = {"fit": 0, "oom": 1, "error": 2}  # higher is worse


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
    threshold_kind: str
    verdict: Verdict
    note: str = ""


@dataclass(frozen=True, kw_only=True)
class Comparison:
    baseline_path: str
    current_path: str
    kind: str
    thresholds: dict[str, float]
    rows: tuple[Row, ...]
    warnings: tuple[str, ...] = field(default=())

    def count(self, verdict: Verdict) -> int:
        return sum(1 for r in self.rows if r.verdict == verdict)

    @property
    def exit_code(self) -> int:
        return EXIT_FAILED if self.count("regression") else EXIT_OK

    @property
    def status(self) -> str:
        return "OK" if self.exit_code == EXIT_OK else "FAILED"

    def exit_reason(self) -> str:
        r, i, u, n = (self.count(v) for v in ("regression", "improvement", "unchanged", "not compared"))
        return f"{r} regression(s), {i} improvement(s), {u} unchanged, {n} not compared"

    def to_json(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "exit_code": self.exit_code,
            "exit_reason": self.exit_reason(),
            "kind": self.kind,
            "baseline": self.baseline_path,
            "current": self.current_path,
            "warnings": list(self.warnings),
            "thresholds": {name: {"value": value, "kind": METRICS[name].threshold_kind, "worse_when": METRICS[name].worse_when}
                           for name, value in self.thresholds.items()},
            "num_regressions": self.count("regression"),
            "num_improvements": self.count("improvement"),
            "num_unchanged": self.count("unchanged"),
            "num_not_compared": self.count("not compared"),
            "rows": [_row_json(r) for r in self.rows],
        }


def _row_json(row: Row) -> dict[str, Any]:
    data = asdict(row)
    for key in ("change_pct", "change_abs"):
        if isinstance(data[key], float) and not math.isfinite(data[key]):
            data[key] = None  # JSON has no infinity; a change from zero is stated in the note
    return data


# ---------------------------------------------------------------------------------------------------------------
# Inputs


def parse_thresholds(specs: list[str], ignore: list[str] | None = None) -> dict[str, float]:
    """Default thresholds with `METRIC=PCT` / `GROUP=PCT` overrides applied, without the metrics or groups in
    `ignore`; CompareError names what is allowed."""
    thresholds = {name: m.default_threshold for name, m in METRICS.items()}
    allowed = f"metrics: {', '.join(METRICS)}; groups: {', '.join(GROUPS)}"
    for name in ignore or []:
        if name not in METRICS and name not in GROUPS:
            raise CompareError(f"--ignore {name!r}: unknown metric or group; allowed {allowed}")
        for target in [name] if name in METRICS else [n for n, m in METRICS.items() if m.group == name]:
            thresholds.pop(target, None)
    for spec in specs:
        name, sep, raw = spec.partition("=")
        name = name.strip()
        if not sep:
            raise CompareError(f"--threshold {spec!r}: expected METRIC=PCT ({allowed})")
        if name == "outcome":
            raise CompareError("--threshold outcome: the outcome (fit/oom) is compared exactly and takes no threshold")
        if name not in METRICS and name not in GROUPS:
            raise CompareError(f"--threshold {spec!r}: unknown metric {name!r}; allowed {allowed}")
        try:
            value = float(raw.strip().removesuffix("%"))
        except ValueError:
            raise CompareError(f"--threshold {spec!r}: {raw!r} is not a number") from None
        if not math.isfinite(value) or value < 0:
            raise CompareError(f"--threshold {spec!r}: the threshold must be a finite number >= 0")
        targets = [name] if name in METRICS else [n for n, m in METRICS.items() if m.group == name]
        for target in targets:
            if target in thresholds:
                thresholds[target] = value
    return thresholds


def load_report(path: Path) -> dict[str, Any]:
    """A report dict from a report.json file, a directory holding one, or a run directory (collected in memory)."""
    path = Path(path)
    if path.is_dir():
        if (path / "report.json").is_file():
            path = path / "report.json"
        elif (path / "run.json").is_file():
            from harness.report.collect import collect

            return collect(path, write=False).report
        else:
            raise CompareError(f"{path}: neither report.json nor run.json here; run `harness collect {path}` or give a report.json")
    if not path.exists():
        raise CompareError(f"{path}: no such file or directory")
    try:
        data = json.loads(path.read_text())
    except OSError as exc:
        raise CompareError(f"{path}: cannot read: {exc.strerror}") from None
    except json.JSONDecodeError as exc:
        raise CompareError(f"{path}: corrupt JSON ({exc.msg} at line {exc.lineno})") from None
    if not isinstance(data, dict) or "report_schema_version" not in data or data.get("kind") not in ("run", "matrix"):
        raise CompareError(f"{path}: not a harness report (no report_schema_version / kind)")
    if data["report_schema_version"] > REPORT_SCHEMA_VERSION:
        raise CompareError(f"{path}: report schema version {data['report_schema_version']} is newer than this harness "
                           f"reads ({REPORT_SCHEMA_VERSION}); upgrade the harness")
    needed = ("policies", "scenario") if data["kind"] == "run" else ("cells",)
    missing = [k for k in needed if k not in data]
    if missing:
        raise CompareError(f"{path}: corrupt report: missing {', '.join(missing)}")
    return data


# ---------------------------------------------------------------------------------------------------------------
# Comparing


def _lookup(summary: dict[str, Any], key: str) -> Any:
    value: Any = summary
    for part in key.split("/"):
        if not isinstance(value, dict):
            return None
        value = value.get(part)
    return value


def compare_metric(metric: Metric, baseline: float | None, current: float | None, threshold: float) -> tuple[Verdict, float | None, float | None, str]:
    """verdict, change in percent, absolute change, note."""
    if baseline is None or current is None:
        side = "baseline" if baseline is None else "current"
        if baseline is None and current is None:
            side = "either report"
        return "not compared", None, None, f"not in {side}"
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
    return ("regression" if worse else "improvement"), change_pct, change_abs, note


def compare_outcome(baseline: str | None, current: str | None) -> Verdict:
    if baseline is not None and current is None:
        return "regression"  # results that vanish (the run or cell failed) must not pass the gate
    if baseline is None or current is None:
        return "not compared"
    if baseline == current:
        return "unchanged"
    return "regression" if OUTCOME_RANK.get(current, 3) > OUTCOME_RANK.get(baseline, 3) else "improvement"


def _compare_policies(cell: str | None, base_policies: list[dict[str, Any]], cur_policies: list[dict[str, Any]],
                      thresholds: dict[str, float]) -> list[Row]:
    rows: list[Row] = []
    base_by = {p["policy"]: p for p in base_policies}
    cur_by = {p["policy"]: p for p in cur_policies}
    order = list(base_by) + [p for p in cur_by if p not in base_by]
    for policy in order:
        base, cur = base_by.get(policy), cur_by.get(policy)
        if base is None or cur is None:
            side = "baseline" if base is None else "current"
            rows.append(Row(cell=cell, policy=policy, metric="policy", baseline=None, current=None, change_pct=None,
                            change_abs=None, threshold=None, threshold_kind="exact", verdict="not compared",
                            note=f"policy not in {side}"))
            continue
        rows.append(Row(cell=cell, policy=policy, metric="outcome", baseline=base.get("outcome"), current=cur.get("outcome"),
                        change_pct=None, change_abs=None, threshold=None, threshold_kind="exact",
                        verdict=compare_outcome(base.get("outcome"), cur.get("outcome")),
                        note=(f"OOM ranks {base.get('num_oom')} -> {cur.get('num_oom')}" if cur.get("outcome")
                              else "no result in current")))
        for name, metric in METRICS.items():
            if name not in thresholds:  # ignored (--ignore): e.g. times across different machines
                continue
            b, c = _lookup(base, metric.key), _lookup(cur, metric.key)
            verdict, pct, diff, note = compare_metric(metric, b, c, thresholds[name])
            rows.append(Row(cell=cell, policy=policy, metric=name, baseline=b, current=c, change_pct=pct, change_abs=diff,
                            threshold=thresholds[name], threshold_kind=metric.threshold_kind, verdict=verdict, note=note))
    return rows


def _scenario_check(what: str, base: dict[str, Any], cur: dict[str, Any]) -> str | None:
    """A warning when hashes differ but names match; CompareError when both differ."""
    if base.get("hash") == cur.get("hash"):
        return None
    if base.get("name") == cur.get("name"):
        return (f"{what}scenario {base.get('name')!r} changed (hash {base.get('hash')} -> {cur.get('hash')}): "
                "compared by name; check that the change is intended")
    raise CompareError(
        f"{what}different scenarios: baseline {base.get('name')!r} (hash {base.get('hash')}) vs current "
        f"{cur.get('name')!r} (hash {cur.get('hash')}); compare runs of one scenario (same name or same hash)")


def compare_reports(baseline: dict[str, Any], current: dict[str, Any], *, thresholds: dict[str, float] | None = None,
                    baseline_path: str = "baseline", current_path: str = "current") -> Comparison:
    """Compare two report dicts (both runs or both matrices); CompareError when they cannot be compared."""
    thresholds = thresholds or parse_thresholds([])
    if baseline["kind"] != current["kind"]:
        raise CompareError(f"cannot compare a {baseline['kind']} report ({baseline_path}) with a {current['kind']} "
                           f"report ({current_path})")
    warnings: list[str] = []
    rows: list[Row] = []
    for label, report in (("baseline", baseline), ("current", current)):
        if report.get("exit_code") == EXIT_ERROR:
            warnings.append(f"the {label} report has errors ({report.get('exit_reason')}): its aggregates may miss ranks")
    if baseline["kind"] == "run":
        warning = _scenario_check("", baseline["scenario"], current["scenario"])
        if warning:
            warnings.append(warning)
        rows = _compare_policies(None, baseline["policies"], current["policies"], thresholds)
    else:
        if baseline.get("name") != current.get("name"):
            warnings.append(f"matrix names differ: {baseline.get('name')!r} vs {current.get('name')!r}; cells compared by name")
        base_cells = {c["name"]: c for c in baseline["cells"]}
        cur_cells = {c["name"]: c for c in current["cells"]}
        for name in list(base_cells) + [n for n in cur_cells if n not in base_cells]:
            b, c = base_cells.get(name), cur_cells.get(name)
            if b is None or c is None:
                side = "baseline" if b is None else "current"
                rows.append(Row(cell=name, policy="", metric="cell", baseline=None, current=None, change_pct=None,
                                change_abs=None, threshold=None, threshold_kind="exact", verdict="not compared",
                                note=f"cell not in {side}"))
                continue
            warning = _scenario_check(f"cell {name}: ", b["scenario"], c["scenario"])
            if warning:
                warnings.append(warning)
            rows += _compare_policies(name, b["policies"], c["policies"], thresholds)
    return Comparison(baseline_path=baseline_path, current_path=current_path, kind=baseline["kind"],
                      thresholds=dict(thresholds), rows=tuple(rows), warnings=tuple(warnings))


# ---------------------------------------------------------------------------------------------------------------
# Output


def _fmt_value(metric: str, value: Any) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, str):
        return value
    spec = METRICS.get(metric)
    if spec is None:
        return str(value)
    if spec.unit == "bytes":
        return f"{value / 2**30:.4g} GiB" if abs(value) >= 2**30 else f"{value / 2**20:.4g} MiB"
    if spec.unit == "rel":
        return f"{value:.3g}"
    return f"{value:.1f} {spec.unit}"


def _fmt_change(row: Row) -> str:
    if row.change_pct is None:
        return "" if row.metric != "outcome" else f"{row.baseline} -> {row.current}"
    if row.threshold_kind == "abs":
        return f"{row.change_abs:+.3g}"
    if math.isinf(row.change_pct):
        return "from zero"
    return f"{row.change_pct:+.1f}%"


def _fmt_threshold(row: Row) -> str:
    if row.threshold is None:
        return "exact"
    return f"{row.threshold:g}" + ("" if row.threshold_kind == "abs" else "%")


def render_comparison(comparison: Comparison) -> Any:
    """A rich renderable: what changed beyond its threshold (and what could not be compared), then the footer."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    parts: list[Any] = [Text(f"compare: {comparison.baseline_path} (baseline) vs {comparison.current_path} (current)", style="bold")]
    thresholds = ", ".join(f"{n} {v:g}{'' if METRICS[n].threshold_kind == 'abs' else '%'}" for n, v in comparison.thresholds.items())
    parts.append(Text(f"# thresholds: {thresholds}; outcome exact", style="dim"))
    for warning in comparison.warnings:
        parts.append(Text(f"WARNING: {warning}", style="yellow"))
    changed = [r for r in comparison.rows if r.verdict in ("regression", "improvement") or
               (r.verdict == "not compared" and r.metric in ("policy", "cell", "outcome"))]
    if changed:
        table = Table(title="what changed", title_justify="left")
        lead = ["cell"] if comparison.kind == "matrix" else []
        for name in lead + ["policy", "metric", "baseline", "current", "change", "threshold", "verdict", "note"]:
            table.add_column(name, justify="right" if name in ("baseline", "current", "change", "threshold") else "left")
        for r in changed:
            style = {"regression": "red", "improvement": "green"}.get(r.verdict, "yellow")
            cells = ([r.cell or ""] if lead else []) + [
                r.policy, r.metric, _fmt_value(r.metric, r.baseline), _fmt_value(r.metric, r.current), _fmt_change(r),
                _fmt_threshold(r), r.verdict, r.note]
            table.add_row(*cells, style=style)
        parts.append(table)
    else:
        parts.append(Text("nothing changed beyond its threshold"))
    parts.append(Text(f"{comparison.status} (exit {comparison.exit_code}): {comparison.exit_reason()}",
                      style="bold green" if comparison.exit_code == EXIT_OK else "bold red"))
    return Group(*parts)


def compare_command(ns: argparse.Namespace) -> int:
    """`harness compare BASELINE CURRENT [--threshold METRIC=PCT ...] [--json]`."""
    from harness.core.console import make_console

    try:
        thresholds = parse_thresholds(list(ns.threshold or []), list(getattr(ns, "ignore", None) or []))
        baseline = load_report(ns.baseline)
        current = load_report(ns.current)
        comparison = compare_reports(baseline, current, thresholds=thresholds,
                                     baseline_path=str(ns.baseline), current_path=str(ns.current))
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
