"""report.html's matrix page: workspace against D per policy, the breakdown per cell, and the table of cells."""

from __future__ import annotations

import json

from harness.report.html_base import (
    average_parts, breakdown_parts, byte_scale, figure, new_figure, num_cell, other_note, plot_breakdown,
    png_base64, policy_color, table, td,
)
from harness.report.markdown import Cell
from harness.report.model import MatrixCell, MatrixReport


def d_series(report: MatrixReport) -> dict[tuple[str, str], list[tuple[int, int | None, float | None]]]:
    """(group, policy) -> [(D, contract, measured avg)]; cells that differ in more than D get their own group,
    labelled with the axes that vary (an axis with one value would only lengthen every label)."""
    values_seen: dict[str, set[str]] = {}
    for cell in report.cells:
        for key, value in cell.axis_values.items():
            values_seen.setdefault(key, set()).add(json.dumps(value, sort_keys=True))
    varying = [k for k, v in values_seen.items() if len(v) > 1 and k not in ("parallel.num_dispatchers", "policies")]
    series: dict[tuple[str, str], list[tuple[int, int | None, float | None]]] = {}
    for cell in report.cells:
        d = cell.report.scenario.num_dispatchers
        if d is None:
            continue
        group = ", ".join(f"{k.rsplit('.', 1)[-1]}={cell.axis_values[k]}" for k in varying if k in cell.axis_values)
        for summary in cell.report.policies:
            measured = summary.workspace_delta_bytes.avg if summary.workspace_delta_bytes else None
            series.setdefault((group, summary.policy), []).append((d, summary.contract_total_bytes, measured))
        for policy, contract in cell.planned_contracts.items():
            if cell.report.policy(policy) is None:
                series.setdefault((group, policy), []).append((d, contract, None))
    return series


def plot_workspace_against_d(report: MatrixReport) -> str | None:
    """Matrix: contract (solid) and measured average (dashed) workspace per policy against D, log-log."""
    from matplotlib.ticker import FuncFormatter, LogLocator

    series = d_series(report)
    if not series:
        return None
    policies = sorted({policy for _, policy in series})
    unit, scale = byte_scale(report)
    fig = new_figure(10.5, 4.8)
    ax = fig.add_subplot()
    for (group, policy), points in sorted(series.items()):
        points.sort(key=lambda p: p[0])
        color = policy_color(policy, policies)
        label = policy + (f" ({group})" if group else "")
        contract = [(d, c / scale) for d, c, _ in points if c]
        measured = [(d, m / scale) for d, _, m in points if m is not None and m > 0]
        if contract:
            ax.plot([d for d, _ in contract], [v for _, v in contract], "-o", color=color, label=f"{label} contract")
        if measured:
            ax.plot([d for d, _ in measured], [v for _, v in measured], "--s", color=color, alpha=0.7,
                    label=f"{label} measured avg")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(sorted({d for points in series.values() for d, _, _ in points}))
    plain = FuncFormatter(lambda value, _: f"{value:g}")
    ax.xaxis.set_major_formatter(plain)
    ax.xaxis.set_minor_formatter(FuncFormatter(lambda value, _: ""))
    ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ax.yaxis.set_major_formatter(plain)
    ax.yaxis.set_minor_formatter(FuncFormatter(lambda value, _: ""))
    ax.set_xlabel("D (num_dispatchers)")
    ax.set_ylabel(f"workspace per {'rank' if report.hardware.device_kind == 'cpu' else 'GPU'} ({unit})")
    ax.set_title("workspace against D per policy", fontsize=11)
    ax.grid(alpha=0.3, which="both")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return png_base64(fig)


def matrix_body(report: MatrixReport) -> list[str]:
    labels: list[str] = []
    bars: list[dict[str, float]] = []
    for cell in report.cells:
        cell_labels, cell_bars = matrix_breakdown(cell)
        labels += cell_labels
        bars += cell_bars
    return [
        figure(plot_workspace_against_d(report), "workspace against D per policy (contract solid, measured average "
                "dashed)", "plot-workspace-vs-d"),
        figure(plot_breakdown(labels, bars, "breakdown per cell and policy (average over ranks)",
                               device_kind=report.hardware.device_kind),
                "breakdown of the exact allocations per cell and policy", "plot-breakdown"),
        other_note(report),
        cells_html(report),
    ]


def matrix_breakdown(cell: MatrixCell) -> tuple[list[str], list[dict[str, float]]]:
    labels, bars = [], []
    for summary in cell.report.policies:
        found = [breakdown_parts(e.breakdown) for r in cell.report.ranks for e in r.policies
                 if e.policy == summary.policy and e.breakdown is not None]
        if found:
            labels.append(f"{cell.name}\n{summary.policy}")
            bars.append(average_parts(found))
    return labels, bars


def cells_html(report: MatrixReport) -> str:
    rows = []
    for i, cell in enumerate(report.cells):
        r = cell.report
        rows.append([
            td(Cell(text=cell.name)), td(Cell(text=r.status), "" if r.exit_code == 0 else "fail"),
            td(num_cell(f"/cells/{i}/report/exit_code", r.exit_code, str(r.exit_code))),
            td(num_cell(f"/cells/{i}/report/checks/num_pass", r.checks.num_pass, str(r.checks.num_pass))),
            td(num_cell(f"/cells/{i}/report/checks/num_fail", r.checks.num_fail, str(r.checks.num_fail))),
            td(num_cell(f"/cells/{i}/report/checks/num_error", r.checks.num_error, str(r.checks.num_error))),
            td(Cell(text=r.exit_reason), "message"), td(Cell(text=cell.dir)),
        ])
    out = "<h2>Cells</h2>" + table(["cell", "status", "exit", "passed", "failed", "errors", "reason", "directory"], rows)
    if report.skipped:
        skipped = [[td(Cell(text=s.name)), td(Cell(text=s.reason), "message")] for s in report.skipped]
        out += (f"<h2>Skipped combinations ({len(report.skipped)} of {report.num_combinations})</h2>"
                + table(["combination", "reason"], skipped))
    return out
