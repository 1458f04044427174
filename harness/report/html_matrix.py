"""report.html's matrix page: workspace against D per policy, the breakdown per cell, and the table of cells.

The page's cost and size are bounded by the page, not by the number of cells (a matrix holds up to 1024):
    workspace against D   one line per group of cells x policy while there are at most GROUPS_DRAWN_MAX groups;
                          past that one panel per policy: the median over the groups and the min..max band
    heatmaps              past GROUPS_DRAWN_MAX groups: per policy, the median contract over D x the axis with
                          the most values, and the fraction of cells that passed on the same grid
    breakdown             the first BREAKDOWN_BARS_MAX cell x policy bars
    tables                the first CELL_ROWS_MAX cells (those that did not pass first); report.json and the
                          cells' own reports hold the rest
Each cell's own page draws no figure (harness.report.html's plots=False): the figures here stand for them.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Mapping
from typing import Any

from harness.report.html_base import (
    average_parts,
    breakdown_parts,
    byte_scale,
    esc,
    figure,
    new_figure,
    num_cell,
    other_note,
    plot_breakdown,
    png_base64,
    policy_color,
    table,
    td,
)
from harness.report.markdown import Cell
from harness.report.model import MatrixCell, MatrixReport, RunReport

GROUPS_DRAWN_MAX = 4
POLICIES_DRAWN_MAX = 6
HEATMAP_ROWS_MAX = 32
HEATMAP_LABELLED_MAX = 80  # grid squares with their value written in them; more would overlap
BREAKDOWN_BARS_MAX = 24
CELL_ROWS_MAX = 64


def varying_axes(report: MatrixReport) -> list[str]:
    """The axes whose values differ between cells, D and the policy list aside (in the matrix's order)."""
    values_seen: dict[str, set[str]] = {}
    for cell in report.cells:
        for key, value in cell.axis_values.items():
            values_seen.setdefault(key, set()).add(json.dumps(value, sort_keys=True))
    return [k for k, v in values_seen.items() if len(v) > 1 and k not in ("parallel.num_dispatchers", "policies")]


def d_series(report: MatrixReport) -> dict[tuple[str, str], list[tuple[int, int | None, float | None]]]:
    """(group, policy) -> [(D, contract, measured avg)]; cells that differ in more than D get their own group,
    labelled with the axes that vary (an axis with one value would only lengthen every label)."""
    varying = varying_axes(report)
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


def _log_axes(ax: Any, ds: list[int], unit: str, report: MatrixReport) -> None:
    from matplotlib.ticker import FuncFormatter, LogLocator

    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(ds)
    plain = FuncFormatter(lambda value, _: f"{value:g}")
    ax.xaxis.set_major_formatter(plain)
    ax.xaxis.set_minor_formatter(FuncFormatter(lambda value, _: ""))
    ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ax.yaxis.set_major_formatter(plain)
    ax.yaxis.set_minor_formatter(FuncFormatter(lambda value, _: ""))
    ax.set_xlabel("D (num_dispatchers)")
    ax.set_ylabel(f"workspace per {'rank' if report.hardware.device_kind == 'cpu' else 'GPU'} ({unit})")
    ax.grid(alpha=0.3, which="both")


def plot_workspace_against_d(report: MatrixReport) -> str | None:
    """Matrix: contract (solid) and measured average (dashed) workspace per policy against D, log-log; one line
    per group and policy up to GROUPS_DRAWN_MAX groups, else the median and min..max band over the groups."""
    series = d_series(report)
    if not series:
        return None
    if len({group for group, _ in series}) > GROUPS_DRAWN_MAX:
        return _plot_d_bands(report, series)
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
            ax.plot(
                [d for d, _ in measured],
                [v for _, v in measured],
                "--s",
                color=color,
                alpha=0.7,
                label=f"{label} measured avg",
            )
    _log_axes(ax, sorted({d for points in series.values() for d, _, _ in points}), unit, report)
    ax.set_title("workspace against D per policy", fontsize=11)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return png_base64(fig)


def _by_d(points: list[tuple[int, float]]) -> tuple[list[int], list[float], list[float], list[float]]:
    """D, and the min, median and max of the values at each D."""
    at: dict[int, list[float]] = {}
    for d, v in points:
        at.setdefault(d, []).append(v)
    ds = sorted(at)
    return ds, [min(at[d]) for d in ds], [statistics.median(at[d]) for d in ds], [max(at[d]) for d in ds]


def _plot_d_bands(
    report: MatrixReport, series: dict[tuple[str, str], list[tuple[int, int | None, float | None]]]
) -> str:
    """One panel per policy: the median over the groups of cells (solid: contract, dashed: measured) and the band
    from the least to the most any group needs."""
    policies = sorted({policy for _, policy in series})
    drawn = policies[:POLICIES_DRAWN_MAX]
    unit, scale = byte_scale(report)
    ncols = min(3, len(drawn))
    nrows = -(-len(drawn) // ncols)
    fig = new_figure(4.2 * ncols + 0.5, 3.4 * nrows + 0.9)
    axes = fig.subplots(nrows, ncols, squeeze=False, sharey=True)
    all_ds = sorted({d for points in series.values() for d, _, _ in points})
    num_groups = len({group for group, _ in series})
    for k, ax in enumerate(axes.flat):
        if k >= len(drawn):
            ax.set_visible(False)
            continue
        policy = drawn[k]
        color = policy_color(policy, policies)
        points = [p for (_, pol), pts in series.items() if pol == policy for p in pts]
        contract = _by_d([(d, c / scale) for d, c, _ in points if c])
        measured = _by_d([(d, m / scale) for d, _, m in points if m is not None and m > 0])
        if contract[0]:
            ax.fill_between(
                contract[0],
                contract[1],
                contract[3],
                color=color,
                alpha=0.18,
                linewidth=0,
                label="contract, min..max over the groups",
            )
            ax.plot(contract[0], contract[2], "-o", color=color, markersize=4, label="contract, median")
        if measured[0]:
            ax.plot(
                measured[0], measured[2], "--s", color="#333333", markersize=3, alpha=0.8, label="measured avg, median"
            )
        _log_axes(ax, all_ds, unit, report)
        ax.set_title(policy, fontsize=10, color=color)
        if k % ncols:
            ax.set_ylabel("")
    handles, labels = [], []
    for ax in axes.flat:  # one legend for the figure, below it: never cut off, never over a panel
        for h, lab in zip(*ax.get_legend_handles_labels(), strict=True):
            if lab not in labels:
                handles.append(h)
                labels.append(lab)
    fig.legend(handles, labels, loc="outside lower center", ncols=3, fontsize=8)
    more = f"; {len(policies) - len(drawn)} more policies in the tables" if len(policies) > len(drawn) else ""
    fig.suptitle(f"workspace against D per policy, over {num_groups} groups of cells{more}", fontsize=11)
    return png_base64(fig)


def _heatmap_grid(report: MatrixReport) -> tuple[str, list[str], int, list[int], list[MatrixCell]] | None:
    """The axis with the most values besides D (the rows), its first HEATMAP_ROWS_MAX values and how many it has,
    the Ds (the columns), and the cells that have a D."""
    varying = varying_axes(report)
    cells = [c for c in report.cells if c.report.scenario.num_dispatchers is not None]
    if not varying or not cells:
        return None
    values: dict[str, list[str]] = {}
    for key in varying:
        seen = values.setdefault(key, [])
        for c in cells:
            label = _axis_label(c.axis_values.get(key))
            if label not in seen:
                seen.append(label)
    row_axis = max(varying, key=lambda k: len(values[k]))
    ds = sorted({d for c in cells if (d := c.report.scenario.num_dispatchers) is not None})
    return row_axis, values[row_axis][:HEATMAP_ROWS_MAX], len(values[row_axis]), ds, cells


def _axis_label(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
    return text if len(text) <= 24 else text[:21] + "..."


def _short_bytes(value: float, scale: int) -> str:
    v = value / scale
    return f"{v:.3g}" if v < 1000 else f"{v:.0f}"


def plot_heatmaps(report: MatrixReport) -> str | None:
    """Past GROUPS_DRAWN_MAX groups: per policy, the median contract over D x the axis with the most values (the
    median over every other axis), and the fraction of cells that passed on the same grid."""
    import numpy as np
    from matplotlib.colors import LogNorm

    if len({group for group, _ in d_series(report)}) <= GROUPS_DRAWN_MAX:
        return None
    grid = _heatmap_grid(report)
    if grid is None:
        return None
    row_axis, rows, num_rows, ds, cells = grid
    policies = sorted(
        {p.policy for c in cells for p in c.report.policies} | {p for c in cells for p in c.planned_contracts}
    )
    drawn = policies[:POLICIES_DRAWN_MAX]
    unit, scale = byte_scale(report)
    row_of = {label: i for i, label in enumerate(rows)}
    col_of = {d: j for j, d in enumerate(ds)}
    contracts: dict[str, list[list[list[float]]]] = {p: [[[] for _ in ds] for _ in rows] for p in drawn}
    passed: list[list[list[float]]] = [[[] for _ in ds] for _ in rows]
    for c in cells:
        i = row_of.get(_axis_label(c.axis_values.get(row_axis)))
        if i is None:
            continue
        j = col_of[c.report.scenario.num_dispatchers or 0]
        passed[i][j].append(1.0 if c.report.exit_code == 0 else 0.0)
        for policy in drawn:
            summary = c.report.policy(policy)
            value = summary.contract_total_bytes if summary is not None else c.planned_contracts.get(policy)
            if value:
                contracts[policy][i][j].append(float(value))
    panels = [
        (p, np.array([[statistics.median(v) if v else np.nan for v in row] for row in contracts[p]])) for p in drawn
    ]
    share = np.array([[sum(v) / len(v) if v else np.nan for v in row] for row in passed])
    ncols = min(3, len(panels) + 1)
    nrows = -(-(len(panels) + 1) // ncols)
    fig = new_figure(4.4 * ncols + 0.5, max(2.6, 0.8 + 0.28 * len(rows)) * nrows + 0.8)
    axes = fig.subplots(nrows, ncols, squeeze=False)
    labelled = len(rows) * len(ds) <= HEATMAP_LABELLED_MAX
    for k, ax in enumerate(axes.flat):
        if k > len(panels):
            ax.set_visible(False)
            continue
        if k < len(panels):
            policy, data = panels[k]
            finite = data[np.isfinite(data)]
            if finite.size == 0:
                ax.set_visible(False)
                continue
            image = ax.imshow(
                data / scale,
                aspect="auto",
                cmap="viridis",
                norm=LogNorm(vmin=finite.min() / scale, vmax=max(finite.max(), finite.min() * 1.01) / scale),
            )
            fig.colorbar(image, ax=ax, label=f"contract ({unit}), median", shrink=0.9)
            ax.set_title(policy, fontsize=10)
            texts = [[_short_bytes(v, scale) if np.isfinite(v) else "" for v in row] for row in data]
        else:
            image = ax.imshow(share, aspect="auto", cmap="RdYlGn", vmin=0.0, vmax=1.0)
            fig.colorbar(image, ax=ax, label="share of cells that passed", shrink=0.9)
            ax.set_title("cells that passed", fontsize=10)
            texts = [[f"{v:.0%}" if np.isfinite(v) else "" for v in row] for row in share]
        ax.set_xticks(range(len(ds)), [str(d) for d in ds], fontsize=8, rotation=90 if len(ds) > 8 else 0)
        ax.set_yticks(range(len(rows)), rows, fontsize=7 if len(rows) > 12 else 8)
        ax.set_xlabel("D (num_dispatchers)", fontsize=9)
        if k % ncols == 0:
            ax.set_ylabel(row_axis, fontsize=9)
        else:
            ax.set_yticklabels([])
        if labelled:
            values = data / scale if k < len(panels) else share
            for i, row in enumerate(texts):
                for j, text in enumerate(row):
                    if text:  # dark text on a light square, light on a dark one (no box: a box per text is slow)
                        r, g, b, _ = image.cmap(image.norm(values[i, j]))
                        ax.text(
                            j,
                            i,
                            text,
                            ha="center",
                            va="center",
                            fontsize=6,
                            color="black" if 0.299 * r + 0.587 * g + 0.114 * b > 0.5 else "white",
                        )
    first = f" (its first {len(rows)} of {num_rows} values)" if num_rows > len(rows) else ""
    fig.suptitle(f"over D x {row_axis}{first} (median over the other axes)", fontsize=11)
    return png_base64(fig)


def cell_plots_note() -> str:
    """What a matrix cell's page shows where a run's page has its plots."""
    return (
        '<p class="note" id="plots-in-matrix">This run is a cell of a matrix: its plots are summarised with the '
        "other cells' on the matrix's page (../report.html). <code>harness collect</code> on this directory "
        "alone draws this cell's own plots here.</p>"
    )


def matrix_body(report: MatrixReport, cells: Mapping[str, RunReport]) -> list[str]:
    """The matrix page's figures and tables; the breakdown (per-rank figures) from the cells' whole reports."""
    labels: list[str] = []
    bars: list[dict[str, float]] = []
    whole = [cells[c.name] for c in report.cells if c.name in cells]
    total = sum(
        1
        for r in whole
        for p in r.policies
        if any(e.policy == p.policy and e.breakdown is not None for rank in r.ranks for e in rank.policies)
    )
    short = short_cell_names(report)
    for cell in report.cells:
        if len(bars) >= BREAKDOWN_BARS_MAX:
            break
        if cell.name not in cells:
            continue
        cell_labels, cell_bars = matrix_breakdown(cell, cells[cell.name], short[cell.name])
        labels += cell_labels
        bars += cell_bars
    labels, bars = labels[:BREAKDOWN_BARS_MAX], bars[:BREAKDOWN_BARS_MAX]
    shown = f" (the first {len(bars)} of {total}; report.json has every cell's)" if total > len(bars) else ""
    heatmaps = plot_heatmaps(report)
    return [
        figure(
            plot_workspace_against_d(report),
            "workspace against D per policy (contract solid, measured average dashed)",
            "plot-workspace-vs-d",
        ),
        figure(
            heatmaps,
            "median contract per policy and the share of cells that passed, over D and the axis with the most values",
            "plot-heatmaps",
        )
        if heatmaps
        else "",
        figure(
            plot_breakdown(
                labels,
                bars,
                f"breakdown per cell and policy (average over ranks){shown}",
                device_kind=report.hardware.device_kind,
            ),
            f"breakdown of the exact allocations per cell and policy{shown}; each cell named by what differs "
            "from the other cells' names",
            "plot-breakdown",
        ),
        other_note(report),
        cells_html(report),
    ]


def short_cell_names(report: MatrixReport) -> dict[str, str]:
    """Each cell's name less the parts every cell's name shares ("K512-I256_D2_T128" -> "D2"): tick labels that fit
    under a bar without collapsing the plot."""
    parts = [cell.name.split("_") for cell in report.cells]
    common = set.intersection(*(set(p) for p in parts)) if len(parts) > 1 else set()
    out = {}
    for cell, tokens in zip(report.cells, parts, strict=True):
        name = "_".join(t for t in tokens if t not in common) or cell.name
        out[cell.name] = name if len(name) <= 28 else name[:25] + "..."
    return out


def matrix_breakdown(
    cell: MatrixCell, report: RunReport, label: str | None = None
) -> tuple[list[str], list[dict[str, float]]]:
    """A cell's bars (one per policy, the average over its ranks) from its whole report."""
    labels, bars = [], []
    for summary in report.policies:
        found = [
            breakdown_parts(e.breakdown)
            for r in report.ranks
            for e in r.policies
            if e.policy == summary.policy and e.breakdown is not None
        ]
        if found:
            labels.append(f"{label or cell.name}\n{summary.policy}")
            bars.append(average_parts(found))
    return labels, bars


def more_note(shown: int, total: int, what: str, where: str = "report.json and the cells' own reports") -> str:
    """The line under a capped table: how many rows are left out and where they are."""
    if total <= shown:
        return ""
    return f'<p class="note more">{total - shown} more {esc(what)} in {esc(where)}.</p>'


def cells_html(report: MatrixReport) -> str:
    """The cells that did not pass first, then the others, up to CELL_ROWS_MAX rows."""
    order = sorted(range(len(report.cells)), key=lambda i: report.cells[i].report.exit_code == 0)
    rows = []
    for i in order[:CELL_ROWS_MAX]:
        cell = report.cells[i]
        r = cell.report
        rows.append(
            [
                td(Cell(text=cell.name)),
                td(Cell(text=r.status), "" if r.exit_code == 0 else "fail"),
                td(num_cell(f"/cells/{i}/report/exit_code", r.exit_code, str(r.exit_code))),
                td(num_cell(f"/cells/{i}/report/checks/num_pass", r.checks.num_pass, str(r.checks.num_pass))),
                td(num_cell(f"/cells/{i}/report/checks/num_fail", r.checks.num_fail, str(r.checks.num_fail))),
                td(num_cell(f"/cells/{i}/report/checks/num_error", r.checks.num_error, str(r.checks.num_error))),
                td(Cell(text=r.exit_reason), "message"),
                td(Cell(text=cell.dir)),
            ]
        )
    passed = sum(1 for c in report.cells if c.report.exit_code == 0)
    out = (
        f"<h2>Cells ({passed} of {len(report.cells)} passed)</h2>"
        + table(["cell", "status", "exit", "passed", "failed", "errors", "reason", "directory"], rows)
        + more_note(len(rows), len(report.cells), "cells")
    )
    if report.skipped:
        skipped = [[td(Cell(text=s.name)), td(Cell(text=s.reason), "message")] for s in report.skipped[:CELL_ROWS_MAX]]
        out += (
            f"<h2>Skipped combinations ({len(report.skipped)} of {report.num_combinations})</h2>"
            + table(["combination", "reason"], skipped)
            + more_note(len(skipped), len(report.skipped), "skipped combinations", "report.json")
        )
    return out
