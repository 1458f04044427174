"""What `harness compare` compares and what it produces: the metrics, the options (thresholds, --ignore), the
rows and the Comparison (harness.report.compare is the face)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any, Literal

from harness.core.errors import BadInput
from harness.core.exits import EXIT_FAILED, EXIT_OK
from harness.report.model import Aggregate, PolicySummary

Verdict = Literal["regression", "improvement", "unchanged", "not compared", "not gated"]
Group = Literal["memory", "error", "time", "throughput", "coverage"]
GROUPS: tuple[Group, ...] = ("memory", "error", "time", "throughput", "coverage")
OUTCOME_RANK = {"fit": 0, "oom": 1, "error": 2}  # higher is worse


class CompareError(BadInput):
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
        Metric(
            name="contract_total_bytes",
            field="contract_total_bytes",
            get=lambda s: s.contract_total_bytes,
            unit="bytes",
            group="memory",
            default_threshold=0.0,
            threshold_kind="pct",
            worse_when="higher",
        ),
        Metric(
            name="workspace_delta_avg_bytes",
            field="workspace_delta_bytes",
            get=lambda s: _avg(s.workspace_delta_bytes),
            unit="bytes",
            group="memory",
            default_threshold=2.0,
            threshold_kind="pct",
            worse_when="higher",
            measured_memory=True,
        ),
        Metric(
            name="workspace_delta_max_bytes",
            field="workspace_delta_bytes",
            get=lambda s: _max(s.workspace_delta_bytes),
            unit="bytes",
            group="memory",
            default_threshold=2.0,
            threshold_kind="pct",
            worse_when="higher",
            measured_memory=True,
        ),
        Metric(
            name="allocator_peak_bytes",
            field="allocator_allocated_peak_bytes",
            get=lambda s: _max(s.allocator_allocated_peak_bytes),
            unit="bytes",
            group="memory",
            default_threshold=2.0,
            threshold_kind="pct",
            worse_when="higher",
            measured_memory=True,
        ),
        # Errors near zero make percentages meaningless (0.001 -> 0.002 is +100 %): compare absolutely.
        Metric(
            name="max_error",
            field="max_rel_error",
            get=lambda s: _max(s.max_rel_error),
            unit="rel",
            group="error",
            default_threshold=0.01,
            threshold_kind="abs",
            worse_when="higher",
        ),
        Metric(
            name="dispatch_us",
            field="dispatch_us",
            get=lambda s: _max(s.dispatch_us),
            unit="us",
            group="time",
            default_threshold=10.0,
            threshold_kind="pct",
            worse_when="higher",
            stage="dispatch",
        ),
        Metric(
            name="experts_us",
            field="experts_us",
            get=lambda s: _max(s.experts_us),
            unit="us",
            group="time",
            default_threshold=10.0,
            threshold_kind="pct",
            worse_when="higher",
            stage="experts",
        ),
        Metric(
            name="combine_us",
            field="combine_us",
            get=lambda s: _max(s.combine_us),
            unit="us",
            group="time",
            default_threshold=10.0,
            threshold_kind="pct",
            worse_when="higher",
            stage="combine",
        ),
        Metric(
            name="experts_tflops",
            field="experts_tflops",
            get=lambda s: _min(s.experts_tflops),
            unit="TFLOP/s",
            group="throughput",
            default_threshold=10.0,
            threshold_kind="pct",
            worse_when="lower",
            stage="experts",
        ),
        Metric(
            name="dispatch_busbw_gbps",
            field="dispatch_busbw_gbps",
            get=lambda s: _min(s.dispatch_busbw_gbps),
            unit="GB/s",
            group="throughput",
            default_threshold=10.0,
            threshold_kind="pct",
            worse_when="lower",
            stage="dispatch",
        ),
        Metric(
            name="combine_busbw_gbps",
            field="combine_busbw_gbps",
            get=lambda s: _min(s.combine_busbw_gbps),
            unit="GB/s",
            group="throughput",
            default_threshold=10.0,
            threshold_kind="pct",
            worse_when="lower",
            stage="combine",
        ),
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
    allow_failed_baseline: bool = False  # compare against a baseline that failed its own checks (else exit 2)

    def ignores(self, what: str) -> bool:
        return what in self.ignored


def parse_options(
    specs: list[str],
    ignore: list[str] | None = None,
    *,
    gate_across_hardware: bool = False,
    gate_cpu_timings: bool = False,
    allow_failed_baseline: bool = False,
) -> Options:
    """Default thresholds with `METRIC=PCT` / `GROUP=PCT` overrides, less what `ignore` names; CompareError says
    what is allowed."""
    thresholds = parse_thresholds(specs, ignore)
    ignored: set[str] = set()
    for name in ignore or []:
        if (name.startswith(("policy:", "cell:")) and name.partition(":")[2]) or name in METRICS or name in EXACT:
            ignored.add(name)
        elif name in GROUPS:
            ignored.update(n for n, m in METRICS.items() if m.group == name)
            if name == "coverage":
                ignored.add("num_ranks")
    return Options(
        thresholds=thresholds,
        ignored=frozenset(ignored),
        gate_across_hardware=gate_across_hardware,
        gate_cpu_timings=gate_cpu_timings,
        allow_failed_baseline=allow_failed_baseline,
    )


def parse_thresholds(specs: list[str], ignore: list[str] | None = None) -> dict[str, float]:
    """Default thresholds with `METRIC=PCT` / `GROUP=PCT` overrides applied, without the metrics or groups in
    `ignore`; CompareError names what is allowed."""
    thresholds = {name: m.default_threshold for name, m in METRICS.items()}
    allowed = f"metrics: {', '.join([*EXACT, *METRICS])}; groups: {', '.join(GROUPS)}; or policy:NAME, cell:NAME"
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


NO_SPREAD = "no per-stage min/max in the records: threshold alone"
_ROW_FIELDS = fields(Row)


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
        verdicts: tuple[tuple[Verdict, str], ...] = (
            ("regression", "regression(s)"),
            ("improvement", "improvement(s)"),
            ("unchanged", "unchanged"),
            ("not compared", "not compared"),
            ("not gated", "not gated"),
        )
        counts = [f"{self.count(v)} {label}" for v, label in verdicts]
        own = [
            f"{f'[{r.cell}] ' if r.cell else ''}{r.policy} {r.metric.removeprefix('check:')}"
            for r in self.rows
            if r.metric.startswith("check:")
        ]
        failed = f"the current run failed its own checks ({', '.join(own)}); " if own else ""
        return failed + ", ".join(counts)

    def hints(self) -> list[str]:
        groups = {METRICS[r.metric].group for r in self.rows if r.verdict == "regression" and r.metric in METRICS}
        if groups & {"time", "throughput"}:
            return [
                "hint: timings and throughputs depend on the machine and its load; `--ignore time --ignore "
                "throughput` leaves them out, `--threshold time=PCT` widens them"
            ]
        return []

    def to_json(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "exit_code": self.exit_code,
            "exit_reason": self.exit_reason(),
            "kind": self.kind,
            "baseline": self.baseline_path,
            "current": self.current_path,
            "warnings": list(self.warnings),
            "hardware_note": self.hardware_note,
            "hints": self.hints(),
            "ignored": sorted(self.options.ignored),
            "gate_across_hardware": self.options.gate_across_hardware,
            "gate_cpu_timings": self.options.gate_cpu_timings,
            "allow_failed_baseline": self.options.allow_failed_baseline,
            "thresholds": {
                name: {"value": value, "kind": METRICS[name].threshold_kind, "worse_when": METRICS[name].worse_when}
                for name, value in self.options.thresholds.items()
            },
            "num_regressions": self.count("regression"),
            "num_improvements": self.count("improvement"),
            "num_unchanged": self.count("unchanged"),
            "num_not_compared": self.count("not compared"),
            "num_not_gated": self.count("not gated"),
            "rows": [_row_json(r) for r in self.rows],
        }


def _row_json(row: Row) -> dict[str, Any]:
    data = {f.name: getattr(row, f.name) for f in _ROW_FIELDS}  # flat values: asdict's deep copy is not needed
    for key in ("change_pct", "change_abs"):
        if isinstance(data[key], float) and not math.isfinite(data[key]):
            data[key] = None  # JSON has no infinity; a change from zero is stated in the note
    return data
