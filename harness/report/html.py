"""report.html: one self-contained file (CSS inline, plots as base64 PNGs) rendered from the typed report.

Every numeric table cell carries `data-json` (a JSON pointer into report.json) and `data-value` (the value there,
as JSON), so a test can check in a real browser that what the page shows is what report.json holds.

Plots (matplotlib, Agg, no pyplot state):
    workspace per rank   contract vs measured workspace per policy, per rank up to PER_RANK_BARS_MAX ranks, then
                         one bar per policy with min..max whiskers (1024 ranks must render in well under a second).
                         An OOM is a red cross-hatched bar as tall as the contract it asked for, labelled OOM; the
                         memory budget less the baseline in use (the room a workspace has) is a red line.
    breakdown            the exact per-rank allocations stacked (weights, dispatch, common, ws2, combine, ballast,
                         other), per rank x policy up to BREAKDOWN_RANKS_MAX ranks, then averaged over ranks; the
                         memory budget is a red line on the same scale
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
    MIB,
    NA,
    RANK_TABLE_MAX,
    Cell,
    baseline_table,
    byte_unit,
    checks_line,
    failure_row,
    fmt_error,
    fmt_us,
    footer_line,
    header_lines,
    policy_table,
    problem_row,
    title_line,
)
from harness.report.model import MatrixCell, MatrixReport, Report, RunReport

PER_RANK_BARS_MAX = 64
BREAKDOWN_RANKS_MAX = 16
BREAKDOWN_PARTS = ("weights", "dispatch", "common", "ws2", "combine", "ballast", "scratch", "other")
OTHER_LABEL = {"cuda": "other (context, NCCL, allocator cache)", "cpu": "other (interpreter, libraries, heap)"}
OOM_COLOR = "#c00000"

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
td.fail, td.error { background: #fbe3e1; font-weight: bold; }
td.oom { background: #fde9d9; color: #8a1c12; font-weight: bold; }
td.skip { color: #777; }
figure { margin: 12px 0; }
div.scroll { overflow-x: auto; max-width: 100%; }
figcaption { font-size: 12px; color: #555; }
p.note { font-size: 12px; color: #333; max-width: 1100px; }
img { max-width: 100%; border: 1px solid #eee; }
"""

_COLORS = {"legacy": "#d62728", "fixed": "#2ca02c", "lower-bound": "#1f77b4"}
_FALLBACK_COLORS = ("#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf", "#bcbd22", "#7f7f7f")
_PART_COLORS = ("#8c8c8c", "#1f77b4", "#d62728", "#ff7f0e", "#2ca02c", "#9467bd", "#e377c2", "#d9d9d9")


def _scale(report: Report) -> tuple[str, int]:
    unit, _ = byte_unit(report)
    return unit, GIB if unit == "GiB" else MIB


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


def _room_under_budget(report: RunReport) -> int | None:
    """The memory budget less the lowest baseline in use: the most a workspace can take before it OOMs."""
    budget = report.scenario.memory_budget_bytes
    baselines = [p.baseline_bytes.min for p in report.policies if p.baseline_bytes is not None]
    if budget is None or not baselines or report.scenario.memory_method != "nvml":
        return None
    return int(budget - min(baselines))


def _oom_bar(ax: Any, x: float, height: float, width: float, status: str | None) -> None:
    """A bar that cannot be missed: red cross-hatching as tall as what the policy asked for, labelled OOM."""
    label = {"oom": "OOM", "error": "stopped"}.get(status or "", NA)
    color = OOM_COLOR if status == "oom" else "#7f7f7f"
    if height > 0:
        ax.bar([x], [height], width, fill=False, hatch="xx", edgecolor=color, linewidth=1.5)
    ax.annotate(label, (x, height), xytext=(0, 3), textcoords="offset points", ha="center", va="bottom",
                fontsize=10, fontweight="bold", color="white",
                bbox={"boxstyle": "round,pad=0.2", "facecolor": color, "edgecolor": color})


def _per_rank_bars(ax: Any, report: RunReport, k: int, policy: str, xs: list[float], width: float, scale: int) -> None:
    color = _policy_color(policy, [p.policy for p in report.policies])
    entries = [r.policy(policy) for r in report.ranks]
    contract = [(e.contract_total_bytes if e else 0) / scale for e in entries]
    measured = [e.workspace_delta_bytes if e is not None and e.status == "ok" else None for e in entries]
    ax.bar(xs, contract, width, color=color, alpha=0.35, hatch="//", edgecolor=color, label=f"{policy} contract")
    ax.bar([x + width for x in xs], [(v or 0) / scale for v in measured], width, color=color, label=f"{policy} measured")
    for x, v, e, c in zip(xs, measured, entries, contract):
        if v is None:  # OOM, stopped or not measured: say so rather than draw a zero
            _oom_bar(ax, x + width, c, width, e.status if e else None)


def _summary_bars(ax: Any, report: RunReport, k: int, policy: str, xs: list[float], width: float, scale: int) -> None:
    color = _policy_color(policy, [p.policy for p in report.policies])
    summary = report.policies[k]
    ax.bar(xs, [(summary.contract_total_bytes or 0) / scale], width, color=color, alpha=0.35, hatch="//",
           edgecolor=color, label=f"{policy} contract")
    agg = summary.workspace_delta_bytes
    if agg is not None:
        ax.bar([xs[0] + width], [agg.avg / scale], width, color=color,
               yerr=[[(agg.avg - agg.min) / scale], [(agg.max - agg.avg) / scale]], capsize=4,
               label=f"{policy} measured (avg, min..max over {agg.num_ranks} ranks)")
    if summary.num_oom:
        _oom_bar(ax, xs[0] + width, (summary.contract_total_bytes or 0) / scale, width, "oom")


def plot_workspace_per_rank(report: RunReport) -> str | None:
    """Contract vs measured workspace per rank and policy, the lower bound and the budget as lines; base64 PNG."""
    policies = [p.policy for p in report.policies]
    if not report.ranks or not policies:
        return None
    unit, scale = _scale(report)
    per_rank = len(report.ranks) <= PER_RANK_BARS_MAX
    groups: list[Any] = [r.rank for r in report.ranks] if per_rank else ["all ranks"]
    width = 0.8 / (2 * len(policies))
    fig = _new_figure(min(18.0, 6.5 + 0.35 * len(groups) * len(policies)), 4.4)
    ax = fig.add_subplot()
    for k, policy in enumerate(policies):
        xs = [g + 2 * k * width for g in range(len(groups))]
        (_per_rank_bars if per_rank else _summary_bars)(ax, report, k, policy, xs, width, scale)
    lower_bound = report.policies[0].lower_bound_bytes
    if lower_bound:
        ax.axhline(lower_bound / scale, color="#1f77b4", linestyle="--", linewidth=1, label="lower bound (live set)")
    room = _room_under_budget(report)
    if room is not None:
        ax.axhline(room / scale, color=OOM_COLOR, linewidth=2,
                   label="memory budget less the baseline in use (room for a workspace)")
    if any(p.num_oom for p in report.policies):
        ax.bar([0], [0], 0, fill=False, hatch="xx", edgecolor=OOM_COLOR, label="OOM: what the policy asked for")
    ax.set_xticks([g + (len(policies) * 2 - 1) * width / 2 for g in range(len(groups))])
    ax.set_xticklabels([f"rank {g}" if per_rank else g for g in groups], rotation=90 if len(groups) > 16 else 0,
                       fontsize=7 if len(groups) > 16 else 9)
    ax.set_ylim(top=ax.get_ylim()[1] * 1.12)  # room above the tallest bar for its OOM label
    ax.set_ylabel(f"workspace per rank ({unit})")
    method = (report.scenario.memory_method or "").upper()
    ax.set_title(f"workspace per rank: contract vs measured ({method or 'not measured'})", fontsize=11)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.grid(axis="y", alpha=0.3)
    return _png_base64(fig)


def _breakdown_bars(report: RunReport) -> tuple[list[str], list[dict[str, float]], str]:
    """Labels and per-part bytes for the breakdown plot, per rank x policy or averaged over ranks."""
    labels: list[str] = []
    bars: list[dict[str, float]] = []
    if len(report.ranks) <= BREAKDOWN_RANKS_MAX:
        for rank in report.ranks:
            for entry in rank.policies:
                if entry.breakdown is not None:
                    labels.append(f"r{rank.rank}\n{entry.policy}")
                    bars.append(_parts(entry.breakdown))
        return labels, bars, "per rank"
    for summary in report.policies:
        found = [e.breakdown for r in report.ranks for e in r.policies
                 if e.policy == summary.policy and e.breakdown is not None]
        if found:
            labels.append(summary.policy)
            bars.append(_average_parts([_parts(b) for b in found]))
    return labels, bars, f"average over {len(report.ranks)} ranks"


def _parts(b: Any) -> dict[str, float]:
    return {"weights": b.weights_bytes, "dispatch": b.dispatch_bytes, "common": b.common_bytes, "ws2": b.ws2_bytes,
            "combine": b.combine_bytes, "ballast": b.ballast_bytes, "scratch": b.scratch_bytes,
            "other": b.other_bytes}


def _average_parts(bars: list[dict[str, float]]) -> dict[str, float]:
    return {part: sum(b[part] for b in bars) / len(bars) for part in BREAKDOWN_PARTS}


def plot_breakdown(labels: list[str], bars: list[dict[str, float]], title: str, budget: int | None = None,
                   device_kind: str | None = None) -> str | None:
    if not bars:
        return None
    fig = _new_figure(min(18.0, 3.5 + 0.55 * len(bars)), 4.4)
    ax = fig.add_subplot()
    largest = max([sum(max(v, 0.0) for v in bar.values()) for bar in bars] + [budget or 0])
    unit, scale = ("GiB", GIB) if largest >= GIB else ("MiB", MIB)
    bottoms = [0.0] * len(bars)
    xs = list(range(len(bars)))
    for part, color in zip(BREAKDOWN_PARTS, _PART_COLORS):
        # "other" can be negative on CPU RSS (pages returned to the OS): a stacked bar cannot show that, so it is
        # drawn as zero; the tables keep the number.
        heights = [max(bar[part], 0.0) / scale for bar in bars]
        label = OTHER_LABEL["cpu" if device_kind == "cpu" else "cuda"] if part == "other" else part
        label = "scratch (the experts backend's temporaries, at most)" if part == "scratch" else label
        ax.bar(xs, heights, 0.7, bottom=bottoms, color=color, label=label,
               edgecolor="white", linewidth=0.5)
        bottoms = [b + h for b, h in zip(bottoms, heights)]
    if budget is not None:
        ax.axhline(budget / scale, color=OOM_COLOR, linewidth=2, label="memory budget")
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


def _d_series(report: MatrixReport) -> dict[tuple[str, str], list[tuple[int, int | None, float | None]]]:
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

    series = _d_series(report)
    if not series:
        return None
    policies = sorted({policy for _, policy in series})
    unit, scale = _scale(report)
    fig = _new_figure(10.5, 4.8)
    ax = fig.add_subplot()
    for (group, policy), points in sorted(series.items()):
        points.sort(key=lambda p: p[0])
        color = _policy_color(policy, policies)
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
    return _png_base64(fig)


# ---------------------------------------------------------------------------------------------------------------
# HTML


def _esc(text: Any) -> str:
    return html.escape(str(text), quote=True)


def _td(cell: Cell, extra_class: str = "") -> str:
    css = " ".join(c for c in (cell.css, extra_class) if c)
    if cell.pointer is None:
        classes = f"{'num ' if cell.numeric else ''}{css}".strip()
        attr = f' class="{classes}"' if classes else ""
        return f"<td{attr}>{_esc(cell.text)}</td>"
    classes = f"num {css}".strip()
    value = json.dumps(cell.value)
    return f'<td class="{classes}" data-json="{_esc(cell.pointer)}" data-value="{_esc(value)}">{_esc(cell.text)}</td>'


def _num(pointer: str, value: Any, text: str) -> Cell:
    return Cell(text=text, pointer=pointer if value is not None else None, value=value, numeric=True)


def _table(headers: list[str], rows: list[list[str]], *, css_class: str = "", units: list[str] | None = None) -> str:
    out = [f'<table class="{css_class}">' if css_class else "<table>", "<thead><tr>"]
    out += [f"<th>{_esc(h)}</th>" for h in headers]
    out.append("</tr></thead><tbody>")
    if units is not None:
        out.append('<tr class="units">' + "".join(f"<td>{_esc(u)}</td>" for u in units) + "</tr>")
    out += ["<tr>" + "".join(row) + "</tr>" for row in rows]
    out.append("</tbody></table>")
    return "".join(out)


def _policy_table_html(report: Report) -> str:
    headers, units, aggregations, rows = policy_table(report)
    out = ['<div class="scroll"><table class="policies" id="policy-table"><thead><tr>']
    out += [f"<th>{_esc(h)}</th>" for h in headers]
    out.append("</tr></thead><tbody>")
    out.append('<tr class="units">' + "".join(f"<td>{_esc(u)}</td>" for u in units) + "</tr>")
    out.append('<tr class="agg">' + "".join(f"<td>{_esc(a)}</td>" for a in aggregations) + "</tr>")
    out += ["<tr>" + "".join(_td(c) for c in row) + "</tr>" for row in rows]
    out.append("</tbody></table></div>")
    return "".join(out)


def _rank_table_html(report: RunReport) -> str:
    shown = report.ranks[:RANK_TABLE_MAX]
    unit, fmt_bytes = byte_unit(report)
    headers = ["rank", "node", "device", "policy", "status", f"contract {unit}", f"ws delta {unit}",
               f"alloc peak {unit}", "max error rel", "dispatch time us", "experts time us", "combine time us",
               "expectation", "correctness", "memory", "baseline"]
    rows = []
    for i, rank in enumerate(shown):
        for j, e in enumerate(rank.policies):
            p = f"/ranks/{i}/policies/{j}"
            cells = [
                _td(_num(f"/ranks/{i}/rank", rank.rank, str(rank.rank))), _td(Cell(text=rank.hostname)),
                _td(Cell(text=rank.device_name)), _td(Cell(text=e.policy)),
                _td(Cell(text=e.status), {"oom": "oom", "error": "fail"}.get(e.status, "")),
                _td(_num(f"{p}/contract_total_bytes", e.contract_total_bytes, fmt_bytes(e.contract_total_bytes))),
                _td(_num(f"{p}/workspace_delta_bytes", e.workspace_delta_bytes, fmt_bytes(e.workspace_delta_bytes))),
                _td(_num(f"{p}/allocator_allocated_peak_bytes", e.allocator_allocated_peak_bytes,
                         fmt_bytes(e.allocator_allocated_peak_bytes))),
                _td(_num(f"{p}/max_rel_error", e.max_rel_error, fmt_error(e.max_rel_error))),
                _td(_num(f"{p}/dispatch_us", e.dispatch_us, fmt_us(e.dispatch_us))),
                _td(_num(f"{p}/experts_us", e.experts_us, fmt_us(e.experts_us))),
                _td(_num(f"{p}/combine_us", e.combine_us, fmt_us(e.combine_us))),
            ]
            cells += [f'<td class="{c.outcome}" title="{_esc(c.message)}">{_esc(c.outcome)}</td>' for _, c in e.checks.items()]
            rows.append(cells)
    out = '<div class="scroll">' + _table(headers, rows, css_class="ranks") + "</div>"
    if len(report.ranks) > len(shown):
        out += (f"<p>{len(report.ranks) - len(shown)} more ranks in report.json; the plots and the policy table "
                "aggregate all of them.</p>")
    return out


def _baselines_html(report: RunReport) -> str:
    if not any(e.baseline_bytes is not None for r in report.ranks for e in r.policies):
        return ""
    headers, units, rows = baseline_table(report)
    return ('<h2 id="baselines">Memory baselines per rank</h2><div class="scroll">'
            + _table(headers, [[_td(c) for c in row] for row in rows], css_class="baselines", units=units) + "</div>"
            + '<p class="note">Each policy is measured from the memory in use when it starts (its baseline). The '
              "baseline check fails when a policy's baseline differs from the rank's first policy's by more than "
              "the allocator's rounding (the units row): one-time setup inside a policy's window would inflate its "
              "peak and could decide fit or OOM.</p>")


def _problems_html(report: Report) -> str:
    if not report.problems:
        return ""
    matrix = isinstance(report, MatrixReport)
    rows = [[_td(Cell(text=c)) for c in problem_row(p, matrix)[:-1]] + [_td(Cell(text=p.cause), "message")]
            for p in report.problems[:MAX_PROBLEMS_LISTED]]
    more = (f"<p>... and {len(report.problems) - MAX_PROBLEMS_LISTED} more in report.json and junit.xml</p>"
            if len(report.problems) > MAX_PROBLEMS_LISTED else "")
    return (f'<h2 id="problems">Problems ({len(report.problems)})</h2>'
            + _table((["cell"] if matrix else []) + ["kind", "rank", "file", "cause"], rows) + more)


def _failures_html(report: Report) -> str:
    if not report.check_failures:
        return ""
    matrix = isinstance(report, MatrixReport)
    rows = [[_td(Cell(text=c)) for c in failure_row(f, matrix)[:-1]] + [_td(Cell(text=f.message), "message")]
            for f in report.check_failures[:MAX_LISTED]]
    more = (f"<p>... and {len(report.check_failures) - MAX_LISTED} more in report.json and junit.xml</p>"
            if len(report.check_failures) > MAX_LISTED else "")
    return (f'<h2 id="failed-checks">Failed checks ({len(report.check_failures)})</h2>'
            + _table((["cell"] if matrix else []) + ["rank", "policy", "check", "outcome", "message"], rows) + more)


def _figure(png: str | None, caption: str, fig_id: str) -> str:
    if png is None:
        return f'<p id="{fig_id}">{_esc(caption)}: nothing to plot (no measurements).</p>'
    return (f'<figure id="{fig_id}"><img alt="{_esc(caption)}" src="data:image/png;base64,{png}">'
            f"<figcaption>{_esc(caption)}</figcaption></figure>")


def _other_note(report: Report) -> str:
    cpu = report.hardware.device_kind == "cpu"
    where = ("the process's RSS less the harness's own allocations: the interpreter, torch's libraries and the "
             "heap's free but resident pages" if cpu else
             "the process's device memory (NVML) less the harness's own allocations: the CUDA context (hundreds of "
             "MiB), NCCL's buffers, and the caching allocator's cache (reserved segments not in use)")
    return (f'<p class="note" id="other-note"><b>other</b> = {_esc(where)}. The other parts are the harness\'s exact '
            "allocations: weights, dispatch buffers, common (ws13 and out alias it), ws2, combine buffers and the "
            "ballast that stands for weights and KV cache.</p>")


def _run_body(report: RunReport) -> list[str]:
    budget = report.scenario.memory_budget_bytes
    budget_text = (f"the red line is the memory budget ({budget / GIB:.4g} GiB) less the baseline in use"
                   if _room_under_budget(report) is not None else "no memory budget in this scenario")
    labels, bars, how = _breakdown_bars(report)
    return [
        _figure(plot_workspace_per_rank(report), f"per rank: contract (hatched) vs measured (solid); OOM marked in "
                f"red; {budget_text}", "plot-per-rank"),
        _figure(plot_breakdown(labels, bars, f"breakdown of the exact allocations ({how})",
                               budget if report.scenario.memory_method == "nvml" else None,
                               report.hardware.device_kind),
                f"breakdown: weights, dispatch, common, ws2, combine, ballast, other ({how})"
                + ("; the red line is the memory budget" if budget and report.scenario.memory_method == "nvml" else ""),
                "plot-breakdown"),
        _other_note(report),
        _baselines_html(report),
        "<h2>Per rank</h2>",
        _rank_table_html(report),
    ]


def _matrix_body(report: MatrixReport) -> list[str]:
    labels: list[str] = []
    bars: list[dict[str, float]] = []
    for cell in report.cells:
        cell_labels, cell_bars = _matrix_breakdown(cell)
        labels += cell_labels
        bars += cell_bars
    return [
        _figure(plot_workspace_against_d(report), "workspace against D per policy (contract solid, measured average "
                "dashed)", "plot-workspace-vs-d"),
        _figure(plot_breakdown(labels, bars, "breakdown per cell and policy (average over ranks)",
                               device_kind=report.hardware.device_kind),
                "breakdown of the exact allocations per cell and policy", "plot-breakdown"),
        _other_note(report),
        _cells_html(report),
    ]


def render_html(report: Report) -> str:
    """report.html for a run or a matrix report."""
    status_class = "ok" if report.exit_code == 0 else "failed"
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f'<meta name="harness-generation" content="{_esc(report.generation)}">',
        f"<title>{_esc(title_line(report))}</title><style>{_CSS}</style></head><body>",
        f"<h1>{_esc(title_line(report))}</h1>",
        f'<p class="status {status_class}" id="status-top">{_esc(footer_line(report))}</p>',
        '<pre class="header" id="header">' + "\n".join(_esc(f"# {line}") for line in header_lines(report)) + "</pre>",
    ]
    if isinstance(report, RunReport) and report.scenario.emulated:
        s = report.scenario
        memory = "CPU memory" if report.hardware.device_kind == "cpu" else "GPU memory"
        parts.append(f'<p class="emulated">D={s.num_dispatchers} is emulated on {s.num_ranks} physical rank(s): '
                     f"{memory} is sized for D, traffic flows among the physical ranks.</p>")
    parts += ["<h2>Per policy</h2>", _policy_table_html(report),
              '<p class="note">Units in the second row, the aggregation over ranks in the third. GiB = 2<sup>30</sup> '
              "bytes, MiB = 2<sup>20</sup> bytes; report.json holds the bytes. outcome = fit or oom on any rank "
              "against the scenario's expectation; ws delta = measured workspace delta; x fixed = contract / fixed "
              "contract; n/a = no rank has the figure (bus bandwidth with one physical rank: nothing crosses a "
              "link).</p>", "<h2>Plots</h2>"]
    parts += _matrix_body(report) if isinstance(report, MatrixReport) else _run_body(report)
    parts += [_problems_html(report), _failures_html(report), f'<p id="checks">{_esc(checks_line(report))}</p>',
              f'<p class="status {status_class}" id="status">{_esc(footer_line(report))}</p>', "</body></html>"]
    return "\n".join(p for p in parts if p) + "\n"


def _matrix_breakdown(cell: MatrixCell) -> tuple[list[str], list[dict[str, float]]]:
    labels, bars = [], []
    for summary in cell.report.policies:
        found = [_parts(e.breakdown) for r in cell.report.ranks for e in r.policies
                 if e.policy == summary.policy and e.breakdown is not None]
        if found:
            labels.append(f"{cell.name}\n{summary.policy}")
            bars.append(_average_parts(found))
    return labels, bars


def _cells_html(report: MatrixReport) -> str:
    rows = []
    for i, cell in enumerate(report.cells):
        r = cell.report
        rows.append([
            _td(Cell(text=cell.name)), _td(Cell(text=r.status), "" if r.exit_code == 0 else "fail"),
            _td(_num(f"/cells/{i}/report/exit_code", r.exit_code, str(r.exit_code))),
            _td(_num(f"/cells/{i}/report/checks/num_pass", r.checks.num_pass, str(r.checks.num_pass))),
            _td(_num(f"/cells/{i}/report/checks/num_fail", r.checks.num_fail, str(r.checks.num_fail))),
            _td(_num(f"/cells/{i}/report/checks/num_error", r.checks.num_error, str(r.checks.num_error))),
            _td(Cell(text=r.exit_reason), "message"), _td(Cell(text=cell.dir)),
        ])
    out = "<h2>Cells</h2>" + _table(["cell", "status", "exit", "passed", "failed", "errors", "reason", "directory"], rows)
    if report.skipped:
        skipped = [[_td(Cell(text=s.name)), _td(Cell(text=s.reason), "message")] for s in report.skipped]
        out += (f"<h2>Skipped combinations ({len(report.skipped)} of {report.num_combinations})</h2>"
                + _table(["combination", "reason"], skipped))
    return out
