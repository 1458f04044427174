"""report.html: one self-contained file (CSS inline, plots as base64 PNGs) rendered from the report dict.

Every numeric table cell carries `data-json` (a JSON pointer into report.json) and `data-value` (the value there,
as JSON), so a test can check in a real browser that what the page shows is what report.json holds.

Plots (matplotlib, Agg, no pyplot state):
    workspace per rank   contract vs measured workspace per policy, per rank up to PER_RANK_BARS_MAX ranks, then
                         one bar per policy with min..max whiskers (1024 ranks must render in well under a second)
    breakdown            the exact per-rank allocations stacked (weights, dispatch, common, ws2, combine, ballast,
                         other), per rank x policy up to BREAKDOWN_RANKS_MAX ranks, then averaged over ranks
    workspace against D  matrices only: contract (solid) and measured (dashed) bytes per policy against D
"""

from __future__ import annotations

import base64
import html
import io
import json
from typing import Any

from harness.report.markdown import (
    GIB,
    MAX_LISTED,
    MAX_PROBLEMS_LISTED,
    Cell,
    byte_unit,
    fmt_error,
    fmt_us,
    footer_line,
    header_lines,
    policy_table,
    title_line,
)

PER_RANK_BARS_MAX = 64
BREAKDOWN_RANKS_MAX = 16
BREAKDOWN_PARTS = ("weights", "dispatch", "common", "ws2", "combine", "ballast", "other")
RANK_TABLE_MAX = 64  # per-rank rows in the page; report.json holds every rank

_CSS = """
body { font-family: "DejaVu Sans", Arial, sans-serif; margin: 24px; color: #1b1b1b; background: #fff; }
h1 { font-size: 22px; margin-bottom: 8px; }
h2 { font-size: 17px; margin-top: 28px; border-bottom: 1px solid #ddd; padding-bottom: 4px; }
pre.header { background: #f5f5f5; padding: 10px; font-size: 12px; overflow-x: auto; white-space: pre-wrap; }
table { border-collapse: collapse; font-size: 12px; margin: 8px 0; }
th, td { border: 1px solid #ccc; padding: 3px 6px; }
th { background: #eef1f5; }
tr.units td, tr.agg td { color: #666; font-style: italic; background: #fafafa; }
td.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
td { white-space: nowrap; }
td.message { white-space: normal; }
.status { font-weight: bold; font-size: 16px; padding: 8px 12px; display: inline-block; border-radius: 4px; }
.status.ok { background: #e3f5e1; color: #185c12; }
.status.failed { background: #fbe3e1; color: #8a1c12; }
.emulated { font-weight: bold; color: #7a4b00; }
td.fail, td.error { background: #fbe3e1; }
td.skip { color: #777; }
figure { margin: 12px 0; }
div.scroll { overflow-x: auto; max-width: 100%; }
figcaption { font-size: 12px; color: #555; }
img { max-width: 100%; border: 1px solid #eee; }
"""

_COLORS = {"legacy": "#d62728", "fixed": "#2ca02c", "lower-bound": "#1f77b4"}
_FALLBACK_COLORS = ("#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf", "#bcbd22", "#7f7f7f")
_PART_COLORS = ("#8c8c8c", "#1f77b4", "#d62728", "#ff7f0e", "#2ca02c", "#9467bd", "#d9d9d9")


def _scale(report: dict[str, Any]) -> tuple[str, int]:
    unit, _ = byte_unit(report)
    return unit, GIB if unit == "GiB" else 2**20


def _policy_color(policy: str, order: list[str]) -> str:
    if policy in _COLORS:
        return _COLORS[policy]
    others = [p for p in order if p not in _COLORS]
    return _FALLBACK_COLORS[others.index(policy) % len(_FALLBACK_COLORS)] if policy in others else "#7f7f7f"


# ---------------------------------------------------------------------------------------------------------------
# Plots


def _new_figure(width_in: float, height_in: float) -> Any:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width_in, height_in), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _png_base64(fig: Any) -> str:
    buf = io.BytesIO()
    # No "Software" metadata: the PNG bytes then depend only on the data, so two collects write the same file.
    fig.savefig(buf, format="png", metadata={"Software": None})
    return base64.b64encode(buf.getvalue()).decode("ascii")


def plot_workspace_per_rank(report: dict[str, Any]) -> str | None:
    """Contract vs measured workspace per rank and policy, with the lower bound as a line; base64 PNG."""
    ranks = report["ranks"]
    policies = [p["policy"] for p in report["policies"]]
    if not ranks or not policies:
        return None
    lower_bound = report["policies"][0].get("lower_bound_bytes")
    unit, scale = _scale(report)
    per_rank = len(ranks) <= PER_RANK_BARS_MAX
    groups = [r["rank"] for r in ranks] if per_rank else ["all ranks"]
    width = 0.8 / (2 * len(policies))
    fig = _new_figure(min(18.0, 6.5 + 0.35 * len(groups) * len(policies)), 4.2)
    ax = fig.add_subplot()
    for k, policy in enumerate(policies):
        color = _policy_color(policy, policies)
        xs_contract = [g + 2 * k * width for g in range(len(groups))]
        xs_measured = [x + width for x in xs_contract]
        if per_rank:
            contract = [_entry(r, policy, "contract_total_bytes") for r in ranks]
            measured = [_entry(r, policy, "workspace_delta_bytes") if _entry(r, policy, "status") == "ok" else None
                        for r in ranks]
            ax.bar(xs_contract, [(v or 0) / scale for v in contract], width, color=color, alpha=0.35, hatch="//",
                   edgecolor=color, label=f"{policy} contract")
            ax.bar(xs_measured, [(v or 0) / scale for v in measured], width, color=color, label=f"{policy} measured")
            statuses = [_entry(r, policy, "status") for r in ranks]
            for x, v, status in zip(xs_measured, measured, statuses):
                if v is None:  # OOM or not measured: say so rather than draw a zero
                    ax.text(x, 0, {"oom": "OOM", "error": "stopped"}.get(status or "", "n/a"), rotation=90, ha="center", va="bottom",
                            fontsize=7, color="#8a1c12")
        else:
            summary = report["policies"][k]
            agg = summary.get("workspace_delta_bytes")
            ax.bar(xs_contract, [(summary.get("contract_total_bytes") or 0) / scale], width, color=color, alpha=0.35,
                   hatch="//", edgecolor=color, label=f"{policy} contract")
            if agg:
                ax.bar(xs_measured, [agg["avg"] / scale], width, color=color,
                       yerr=[[(agg["avg"] - agg["min"]) / scale], [(agg["max"] - agg["avg"]) / scale]], capsize=4,
                       label=f"{policy} measured (avg, min..max over {agg['num_ranks']} ranks)")
    if lower_bound:
        ax.axhline(lower_bound / scale, color="#1f77b4", linestyle="--", linewidth=1, label="lower bound (live set)")
    ax.set_xticks([g + (len(policies) * 2 - 1) * width / 2 for g in range(len(groups))])
    ax.set_xticklabels([f"rank {g}" if per_rank else g for g in groups], rotation=90 if len(groups) > 16 else 0,
                       fontsize=7 if len(groups) > 16 else 9)
    ax.set_ylabel(f"workspace per rank ({unit})")
    method = (report["scenario"].get("memory_method") or "").upper()
    ax.set_title(f"workspace per rank: contract vs measured ({method or 'not measured'})", fontsize=11)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.grid(axis="y", alpha=0.3)
    return _png_base64(fig)


def _entry(rank: dict[str, Any], policy: str, key: str) -> Any:
    for entry in rank["policies"]:
        if entry["policy"] == policy:
            return entry.get(key)
    return None


def _breakdown_bars(report: dict[str, Any]) -> tuple[list[str], list[dict[str, float]], str]:
    """Labels and per-part bytes for the breakdown plot, per rank x policy or averaged over ranks."""
    ranks = report["ranks"]
    policies = [p["policy"] for p in report["policies"]]
    labels: list[str] = []
    bars: list[dict[str, float]] = []
    if len(ranks) <= BREAKDOWN_RANKS_MAX:
        for rank in ranks:
            for entry in rank["policies"]:
                if entry.get("breakdown"):
                    labels.append(f"r{rank['rank']}\n{entry['policy']}")
                    bars.append({part: entry["breakdown"][f"{part}_bytes"] for part in BREAKDOWN_PARTS})
        return labels, bars, "per rank"
    for policy in policies:
        found = [e["breakdown"] for r in ranks for e in r["policies"] if e["policy"] == policy and e.get("breakdown")]
        if found:
            labels.append(policy)
            bars.append({part: sum(b[f"{part}_bytes"] for b in found) / len(found) for part in BREAKDOWN_PARTS})
    return labels, bars, f"average over {len(ranks)} ranks"


def plot_breakdown(labels: list[str], bars: list[dict[str, float]], title: str) -> str | None:
    if not bars:
        return None
    fig = _new_figure(min(18.0, 3.5 + 0.55 * len(bars)), 4.2)
    ax = fig.add_subplot()
    largest = max(sum(max(v, 0.0) for v in bar.values()) for bar in bars)
    unit, scale = ("GiB", GIB) if largest >= GIB else ("MiB", 2**20)
    bottoms = [0.0] * len(bars)
    xs = list(range(len(bars)))
    for part, color in zip(BREAKDOWN_PARTS, _PART_COLORS):
        # "other" is what the device shows beyond the harness's own allocations; on CPU RSS it can be negative
        # (pages returned to the OS). A stacked bar cannot show that, so it is drawn as zero; the tables keep it.
        heights = [max(bar[part], 0.0) / scale for bar in bars]
        ax.bar(xs, heights, 0.7, bottom=bottoms, color=color, label=part, edgecolor="white", linewidth=0.5)
        bottoms = [b + h for b, h in zip(bottoms, heights)]
    ax.set_xticks(xs)
    long_labels = max(len(line) for label in labels for line in label.split("\n")) > 12
    if len(bars) > 24:
        ax.set_xticklabels(labels, fontsize=7, rotation=90)
    elif long_labels:
        ax.set_xticklabels([label.replace("\n", " ") for label in labels], fontsize=8, rotation=30, ha="right")
    else:
        ax.set_xticklabels(labels, fontsize=7 if len(bars) > 12 else 9)
    ax.set_ylabel(unit)
    ax.set_title(title, fontsize=11)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.grid(axis="y", alpha=0.3)
    return _png_base64(fig)


def plot_workspace_against_d(report: dict[str, Any]) -> str | None:
    """Matrix: contract (solid) and measured average (dashed) workspace per policy against D, log-log."""
    series: dict[tuple[str, str], list[tuple[int, float | None, float | None]]] = {}
    # Cells that differ in anything but D and the policies (model, T, E, ...) get their own lines, labelled
    # with the axes that vary; an axis with one value would only lengthen every label.
    values_seen: dict[str, set[str]] = {}
    for cell in report["cells"]:
        for key, value in cell.get("axis_values", {}).items():
            values_seen.setdefault(key, set()).add(json.dumps(value, sort_keys=True))
    varying = [k for k, v in values_seen.items() if len(v) > 1 and k not in ("parallel.num_dispatchers", "policies")]
    for cell in report["cells"]:
        s = cell["scenario"]
        d = s.get("num_dispatchers")
        if d is None:
            continue
        group = ", ".join(f"{k.rsplit('.', 1)[-1]}={cell['axis_values'][k]}" for k in varying if k in cell["axis_values"])
        for summary in cell["policies"]:
            measured = (summary.get("workspace_delta_bytes") or {}).get("avg")
            series.setdefault((group, summary["policy"]), []).append((d, summary.get("contract_total_bytes"), measured))
        for policy, contract in (cell.get("planned_contracts") or {}).items():
            if not any(p["policy"] == policy for p in cell["policies"]):
                series.setdefault((group, policy), []).append((d, contract, None))
    if not series:
        return None
    policies = sorted({policy for _, policy in series})
    unit, scale = _scale(report)
    fig = _new_figure(10.5, 4.8)
    ax = fig.add_subplot()
    for (group, policy), points in sorted(series.items()):
        points.sort()
        color = _policy_color(policy, policies)
        label = f"{policy}" + (f" ({group})" if group else "")
        contract = [(d, c / scale) for d, c, _ in points if c]
        measured = [(d, m / scale) for d, _, m in points if m is not None and m > 0]
        if contract:
            ax.plot([d for d, _ in contract], [v for _, v in contract], "-o", color=color, label=f"{label} contract")
        if measured:
            ax.plot([d for d, _ in measured], [v for _, v in measured], "--s", color=color, alpha=0.7,
                    label=f"{label} measured avg")
    from matplotlib.ticker import FuncFormatter, LogLocator

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
    ax.set_ylabel(f"workspace per GPU ({unit})")
    ax.set_title("workspace against D per policy", fontsize=11)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return _png_base64(fig)


# ---------------------------------------------------------------------------------------------------------------
# HTML


def _esc(text: Any) -> str:
    return html.escape(str(text), quote=True)


def _td(cell: Cell, extra_class: str = "") -> str:
    if cell.pointer is None:
        classes = f"{'num ' if cell.numeric else ''}{extra_class}".strip()
        attr = f' class="{classes}"' if classes else ""
        return f"<td{attr}>{_esc(cell.text)}</td>"
    classes = f"num {extra_class}".strip()
    value = json.dumps(cell.value)
    return f'<td class="{classes}" data-json="{_esc(cell.pointer)}" data-value="{_esc(value)}">{_esc(cell.text)}</td>'


def _num(pointer: str, value: Any, text: str) -> Cell:
    return Cell(text=text, pointer=pointer if value is not None else None, value=value, numeric=True)


def _table(headers: list[str], rows: list[list[str]], *, css_class: str = "") -> str:
    out = [f'<table class="{css_class}">' if css_class else "<table>", "<thead><tr>"]
    out += [f"<th>{_esc(h)}</th>" for h in headers]
    out.append("</tr></thead><tbody>")
    for row in rows:
        out.append("<tr>" + "".join(row) + "</tr>")
    out.append("</tbody></table>")
    return "".join(out)


def _policy_table_html(report: dict[str, Any]) -> str:
    headers, units, aggregations, rows = policy_table(report)
    out = ['<div class="scroll"><table class="policies" id="policy-table"><thead><tr>']
    out += [f"<th>{_esc(h)}</th>" for h in headers]
    out.append("</tr></thead><tbody>")
    out.append('<tr class="units">' + "".join(f"<td>{_esc(u)}</td>" for u in units) + "</tr>")
    out.append('<tr class="agg">' + "".join(f"<td>{_esc(a)}</td>" for a in aggregations) + "</tr>")
    for row in rows:
        out.append("<tr>" + "".join(_td(c) for c in row) + "</tr>")
    out.append("</tbody></table></div>")
    return "".join(out)


def _rank_table_html(report: dict[str, Any], prefix: str = "") -> str:
    ranks = report["ranks"]
    shown = ranks[:RANK_TABLE_MAX]
    unit, fmt_gib = byte_unit(report)
    headers = ["rank", "node", "device", "policy", "status", f"contract {unit}", f"ws delta {unit}", f"alloc peak {unit}",
               "max error rel", "dispatch us", "experts us", "combine us", "expectation", "correctness", "memory"]
    rows = []
    for i, rank in enumerate(shown):
        for j, e in enumerate(rank["policies"]):
            p = f"{prefix}/ranks/{i}/policies/{j}"
            cells = [
                _td(_num(f"{prefix}/ranks/{i}/rank", rank["rank"], str(rank["rank"]))),
                _td(Cell(text=rank["hostname"])),
                _td(Cell(text=rank["device_name"])),
                _td(Cell(text=e["policy"])),
                _td(Cell(text=e["status"]), "fail" if e["status"] != "ok" else ""),
                _td(_num(f"{p}/contract_total_bytes", e["contract_total_bytes"], fmt_gib(e["contract_total_bytes"]))),
                _td(_num(f"{p}/workspace_delta_bytes", e["workspace_delta_bytes"], fmt_gib(e["workspace_delta_bytes"]))),
                _td(_num(f"{p}/allocator_allocated_peak_bytes", e["allocator_allocated_peak_bytes"],
                         fmt_gib(e["allocator_allocated_peak_bytes"]))),
                _td(_num(f"{p}/max_rel_error", e["max_rel_error"], fmt_error(e["max_rel_error"]))),
                _td(_num(f"{p}/dispatch_us", e["dispatch_us"], fmt_us(e["dispatch_us"]))),
                _td(_num(f"{p}/experts_us", e["experts_us"], fmt_us(e["experts_us"]))),
                _td(_num(f"{p}/combine_us", e["combine_us"], fmt_us(e["combine_us"]))),
            ]
            for check in ("expectation", "correctness", "memory"):
                result = e["checks"][check]
                cells.append(f'<td class="{result["outcome"]}" title="{_esc(result["message"])}">{_esc(result["outcome"])}</td>')
            rows.append(cells)
    out = '<div class="scroll">' + _table(headers, rows, css_class="ranks") + "</div>"
    if len(ranks) > len(shown):
        out += f"<p>{len(ranks) - len(shown)} more ranks in report.json; the plots and the policy table aggregate all of them.</p>"
    return out


def _problems_html(report: dict[str, Any]) -> str:
    problems = report["problems"]
    if not problems:
        return ""
    lead = ["cell"] if report["kind"] == "matrix" else []
    rows = [[_td(Cell(text=c)) for c in ([p.get("cell", "")] if lead else []) +
             [p["kind"], "" if p["rank"] is None else str(p["rank"]), p["path"] or ""]] + [_td(Cell(text=p["cause"]), "message")]
            for p in problems[:MAX_PROBLEMS_LISTED]]
    more = (f"<p>... and {len(problems) - MAX_PROBLEMS_LISTED} more in report.json and junit.xml</p>"
            if len(problems) > MAX_PROBLEMS_LISTED else "")
    return f'<h2 id="problems">Problems ({len(problems)})</h2>' + _table(lead + ["kind", "rank", "file", "cause"], rows) + more


def _failures_html(report: dict[str, Any]) -> str:
    failures = report["check_failures"]
    if not failures:
        return ""
    lead = ["cell"] if report["kind"] == "matrix" else []
    rows = [[_td(Cell(text=c)) for c in ([f["cell"]] if lead else []) + [str(f["rank"]), f["policy"], f["check"], f["outcome"]]]
            + [_td(Cell(text=f["message"]), "message")] for f in failures[:MAX_LISTED]]
    more = f"<p>... and {len(failures) - MAX_LISTED} more in report.json and junit.xml</p>" if len(failures) > MAX_LISTED else ""
    return (f'<h2 id="failed-checks">Failed checks ({len(failures)})</h2>'
            + _table(lead + ["rank", "policy", "check", "outcome", "message"], rows) + more)


def _figure(png: str | None, caption: str, fig_id: str) -> str:
    if png is None:
        return f'<p id="{fig_id}">{_esc(caption)}: nothing to plot (no measurements).</p>'
    return (f'<figure id="{fig_id}"><img alt="{_esc(caption)}" src="data:image/png;base64,{png}">'
            f"<figcaption>{_esc(caption)}</figcaption></figure>")


def render_html(report: dict[str, Any]) -> str:
    """report.html for a run or a matrix report."""
    status_class = "ok" if report["exit_code"] == 0 else "failed"
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{_esc(title_line(report))}</title><style>{_CSS}</style></head><body>",
        f"<h1>{_esc(title_line(report))}</h1>",
        f'<p class="status {status_class}" id="status-top">{_esc(footer_line(report))}</p>',
        '<pre class="header" id="header">' + "\n".join(_esc(f"# {line}") for line in header_lines(report)) + "</pre>",
    ]
    if report["kind"] == "run" and report["scenario"].get("emulated"):
        s = report["scenario"]
        parts.append(f'<p class="emulated">D={s.get("num_dispatchers")} is emulated on {s.get("num_ranks")} physical '
                     "rank(s): memory is sized for D, traffic flows among the physical ranks.</p>")
    parts.append("<h2>Per policy</h2>")
    parts.append(_policy_table_html(report))
    parts.append("<p>Units in the second row, the aggregation over ranks in the third. GiB = 2<sup>30</sup> bytes, "
                 "MiB = 2<sup>20</sup> bytes; report.json holds the bytes. ws delta = measured workspace delta; "
                 "x fixed = contract / fixed contract.</p>")
    parts.append("<h2>Plots</h2>")
    if report["kind"] == "matrix":
        parts.append(_figure(plot_workspace_against_d(report), "workspace against D per policy (contract solid, "
                             "measured average dashed)", "plot-workspace-vs-d"))
        labels, bars = [], []
        for cell in report["cells"]:
            cell_labels, cell_bars = _matrix_breakdown(cell)
            labels += cell_labels
            bars += cell_bars
        parts.append(_figure(plot_breakdown(labels, bars, "breakdown per cell and policy (average over ranks)"),
                             "breakdown of the exact allocations per cell and policy", "plot-breakdown"))
        parts.append(_cells_html(report))
    else:
        parts.append(_figure(plot_workspace_per_rank(report), "legacy, fixed and lower bound per rank: contract vs measured",
                             "plot-per-rank"))
        labels, bars, how = _breakdown_bars(report)
        parts.append(_figure(plot_breakdown(labels, bars, f"breakdown of the exact allocations ({how})"),
                             f"breakdown: weights, dispatch, common, ws2, combine, ballast, other ({how})", "plot-breakdown"))
        parts.append("<h2>Per rank</h2>")
        parts.append(_rank_table_html(report))
    parts.append(_problems_html(report))
    parts.append(_failures_html(report))
    c = report["checks"]
    parts.append(f'<p id="checks">checks: {c["num_pass"]} passed, {c["num_fail"]} failed, {c["num_error"]} errors, '
                 f'{c["num_skip"]} skipped</p>')
    parts.append(f'<p class="status {status_class}" id="status">{_esc(footer_line(report))}</p>')
    parts.append("</body></html>")
    return "\n".join(p for p in parts if p) + "\n"


def _matrix_breakdown(cell: dict[str, Any]) -> tuple[list[str], list[dict[str, float]]]:
    labels, bars = [], []
    for summary in cell["policies"]:
        found = [e["breakdown"] for r in cell["ranks"] for e in r["policies"]
                 if e["policy"] == summary["policy"] and e.get("breakdown")]
        if found:
            labels.append(f"{cell['name']}\n{summary['policy']}")
            bars.append({part: sum(b[f"{part}_bytes"] for b in found) / len(found) for part in BREAKDOWN_PARTS})
    return labels, bars


def _cells_html(report: dict[str, Any]) -> str:
    rows = []
    for i, cell in enumerate(report["cells"]):
        cls = "" if cell["exit_code"] == 0 else "fail"
        rows.append([
            _td(Cell(text=cell["name"])),
            _td(Cell(text=cell["status"]), cls),
            _td(_num(f"/cells/{i}/exit_code", cell["exit_code"], str(cell["exit_code"]))),
            _td(_num(f"/cells/{i}/checks/num_pass", cell["checks"]["num_pass"], str(cell["checks"]["num_pass"]))),
            _td(_num(f"/cells/{i}/checks/num_fail", cell["checks"]["num_fail"], str(cell["checks"]["num_fail"]))),
            _td(_num(f"/cells/{i}/checks/num_error", cell["checks"]["num_error"], str(cell["checks"]["num_error"]))),
            _td(Cell(text=cell["exit_reason"]), "message"),
            _td(Cell(text=cell["dir"])),
        ])
    out = "<h2>Cells</h2>" + _table(["cell", "status", "exit", "passed", "failed", "errors", "reason", "directory"], rows)
    if report.get("skipped"):
        skipped = [[_td(Cell(text=s["name"])), _td(Cell(text=s["reason"]), "message")] for s in report["skipped"]]
        out += (f"<h2>Skipped combinations ({len(report['skipped'])} of {report['num_combinations']})</h2>"
                + _table(["combination", "reason"], skipped))
    return out
