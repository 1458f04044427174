"""The console rendering of a Comparison: what changed beyond its threshold, then the footer."""

from __future__ import annotations

import math
from typing import Any

from harness.core.exits import EXIT_OK
from harness.core.units import GIB, MIB
from harness.report.compare_metrics import METRICS, NO_SPREAD, Comparison, Row


def _fmt_value(metric: str, value: Any) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, str) or metric not in METRICS:
        return str(value)
    spec = METRICS[metric]
    if spec.unit == "bytes":
        return f"{value / GIB:.4g} GiB" if abs(value) >= GIB else f"{value / MIB:.4g} MiB"
    if spec.unit == "rel":
        return f"{value:.3g}"
    return f"{value:.1f} {spec.unit}" if spec.unit == "us" else f"{value:.4g} {spec.unit}"


def _is_bytes(row: Row) -> bool:
    return row.metric in METRICS and METRICS[row.metric].unit == "bytes"


def _fmt_pair(row: Row) -> tuple[str, str]:
    """Baseline and current as the table shows them; bytes that differ but round alike are shown exactly, so a
    changed byte reads as bytes (33554432 B -> 33554433 B), not as 32 MiB -> 32 MiB."""
    base, cur = _fmt_value(row.metric, row.baseline), _fmt_value(row.metric, row.current)
    if _is_bytes(row) and base == cur and row.baseline != row.current:
        return f"{int(row.baseline)} B", f"{int(row.current)} B"
    return base, cur


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
    if _is_bytes(row) and f"{row.change_pct:+.1f}" in ("+0.0", "-0.0"):
        return f"{row.change_abs:+.0f} B"
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

    parts: list[Any] = [
        Text(f"compare: {comparison.baseline_path} (baseline) vs {comparison.current_path} (current)", style="bold")
    ]
    thresholds = ", ".join(
        f"{n} {v:g}{'' if METRICS[n].threshold_kind == 'abs' else '%'}"
        for n, v in comparison.options.thresholds.items()
    )
    parts.append(
        Text(
            f"# thresholds: {thresholds}; outcome and num_ranks exact; timings and throughputs also beyond "
            "the runs' spread",
            style="dim",
        )
    )
    if comparison.options.ignored:
        parts.append(Text(f"# ignored: {', '.join(sorted(comparison.options.ignored))}", style="dim"))
    if comparison.hardware_note:
        parts.append(Text(comparison.hardware_note, style="yellow"))
    parts += [Text(f"WARNING: {w}", style="yellow") for w in comparison.warnings]
    if any(NO_SPREAD in r.note for r in comparison.rows):
        parts.append(Text(f"timings and throughputs: {NO_SPREAD} (records of an older harness)", style="yellow"))
    shown = [
        r
        for r in comparison.rows
        if r.verdict in ("regression", "improvement", "not gated")
        or (r.verdict == "not compared" and r.metric in ("policy", "cell", "outcome"))
    ]
    if shown:
        table = Table(title="what changed", title_justify="left")
        lead = ["cell"] if comparison.kind == "matrix" else []
        for name in [*lead, "policy", "metric", "baseline", "current", "change", "threshold", "verdict", "note"]:
            table.add_column(
                name, justify="right" if name in ("baseline", "current", "change", "threshold") else "left"
            )
        for r in shown:
            style = {"regression": "red", "improvement": "green", "not gated": "dim"}.get(r.verdict, "yellow")
            table.add_row(
                *(
                    ([r.cell or ""] if lead else [])
                    + [
                        r.policy,
                        r.metric,
                        *_fmt_pair(r),
                        _fmt_change(r),
                        _fmt_threshold(r),
                        r.verdict,
                        _short_note(r.note),
                    ]
                ),
                style=style,
            )
        parts.append(table)
    else:
        parts.append(Text("nothing changed beyond its threshold"))
    parts += [Text(h, style="yellow") for h in (comparison.hints() if comparison.exit_code else [])]
    parts.append(
        Text(
            f"{comparison.status} (exit {comparison.exit_code}): {comparison.exit_reason()}",
            style="bold green" if comparison.exit_code == EXIT_OK else "bold red",
        )
    )
    return RichGroup(*parts)
