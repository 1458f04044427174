"""What report.html's run and matrix pages share: the page's CSS, colours, matplotlib figure helpers, the
breakdown plot, and HTML table cells that carry `data-json` pointers into report.json (see harness.report.html)."""

from __future__ import annotations

import base64
import html
import io
import json
from collections.abc import Callable
from typing import Any

from harness.report.markdown import (
    GIB,
    MAX_LISTED,
    MAX_PROBLEMS_LISTED,
    MIB,
    Cell,
    byte_unit,
    failure_row,
    policy_table,
    problem_row,
)
from harness.report.model import MatrixReport, Report

BREAKDOWN_RANKS_MAX = 16
# "comm": DeepEP low-latency's buffer (the comm category); "oom-held": what an OOM'd policy's workspace held
# before its failing allocation (harness.report.evidence.held_bytes), else drawn as part of "other".
BREAKDOWN_PARTS = ("weights", "dispatch", "comm", "common", "ws2", "combine", "ballast", "scratch", "oom-held", "other")
PART_LABELS = {
    "scratch": "scratch (the experts backend's temporaries, at most)",
    "comm": "comm (DeepEP low-latency buffer)",
    "oom-held": "workspace held before the OOM",
}
OTHER_LABEL = {"cuda": "other (context, NCCL, allocator cache)", "cpu": "other (interpreter, libraries, heap)"}
OOM_COLOR = "#c00000"

CSS = """
body { font-family: "DejaVu Sans", Arial, sans-serif; margin: 24px; color: #1b1b1b; background: #fff; }
h1 { font-size: 22px; margin-bottom: 8px; }
h2 { font-size: 17px; margin-top: 28px; border-bottom: 1px solid #ddd; padding-bottom: 4px; }
pre.header { background: #f5f5f5; padding: 10px; font-size: 12px; overflow-x: auto; white-space: pre-wrap; }
table { border-collapse: collapse; font-size: 12px; margin: 8px 0; }
th, td { border: 1px solid #ccc; padding: 3px 6px; }
th { background: #eef1f5; white-space: normal; vertical-align: bottom; }
table.policies th, table.ranks th { max-width: 7em; }
tr.units td, tr.agg td { color: #666; font-style: italic; background: #fafafa; }
td.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
td { white-space: nowrap; }
td.message { white-space: normal; min-width: 24em; max-width: 60em; }
table.components td, table.ooms td { white-space: normal; }
table.components td.message { min-width: 14em; max-width: 26em; }
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
_PART_COLORS = (
    "#8c8c8c",
    "#1f77b4",
    "#17becf",
    "#d62728",
    "#ff7f0e",
    "#2ca02c",
    "#9467bd",
    "#e377c2",
    "#f4a3a3",
    "#d9d9d9",
)


def byte_scale(report: Report) -> tuple[str, int]:
    unit, _ = byte_unit(report)
    return unit, GIB if unit == "GiB" else MIB


def policy_color(policy: str, order: list[str]) -> str:
    if policy in _COLORS:
        return _COLORS[policy]
    others = [p for p in order if p not in _COLORS]
    return _FALLBACK_COLORS[others.index(policy) % len(_FALLBACK_COLORS)] if policy in others else "#7f7f7f"


def new_figure(width_in: float, height_in: float) -> Any:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width_in, height_in), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def png_base64(fig: Any) -> str:
    buf = io.BytesIO()
    # No "Software" metadata: the PNG bytes then depend only on the data, so two collects write the same file.
    fig.savefig(buf, format="png", metadata={"Software": None})
    return base64.b64encode(buf.getvalue()).decode("ascii")


def breakdown_parts(b: Any) -> dict[str, float]:
    return {
        "weights": b.weights_bytes,
        "dispatch": b.dispatch_bytes,
        "common": b.common_bytes,
        "ws2": b.ws2_bytes,
        "combine": b.combine_bytes,
        "ballast": b.ballast_bytes,
        "scratch": b.scratch_bytes,
        "other": b.other_bytes,
        "comm": b.comm_bytes,
        "oom-held": 0.0,
    }


def average_parts(bars: list[dict[str, float]]) -> dict[str, float]:
    return {part: sum(b.get(part, 0.0) for b in bars) / len(bars) for part in BREAKDOWN_PARTS}


def plot_breakdown(
    labels: list[str],
    bars: list[dict[str, float]],
    title: str,
    budget: int | None = None,
    device_kind: str | None = None,
) -> str | None:
    if not bars:
        return None
    # At least 8.5 in wide: the title and the legend beside the axes must fit (a narrow figure cut the title).
    fig = new_figure(min(18.0, max(8.5, 5.5 + 0.55 * len(bars))), 4.6)
    ax = fig.add_subplot()
    largest = max([sum(max(v, 0.0) for v in bar.values()) for bar in bars] + [budget or 0])
    unit, scale = ("GiB", GIB) if largest >= GIB else ("MiB", MIB)
    bottoms = [0.0] * len(bars)
    xs = list(range(len(bars)))
    for part, color in zip(BREAKDOWN_PARTS, _PART_COLORS, strict=True):
        # "other" can be negative on CPU RSS (pages returned to the OS): a stacked bar cannot show that, so it is
        # drawn as zero; the tables keep the number.
        heights = [max(bar.get(part, 0.0), 0.0) / scale for bar in bars]
        if part in ("comm", "oom-held") and not any(heights):
            continue  # no such bytes on any bar: no legend entry for them
        label = (
            OTHER_LABEL["cpu" if device_kind == "cpu" else "cuda"] if part == "other" else PART_LABELS.get(part, part)
        )
        ax.bar(xs, heights, 0.7, bottom=bottoms, color=color, label=label, edgecolor="white", linewidth=0.5)
        bottoms = [b + h for b, h in zip(bottoms, heights, strict=True)]
    if budget is not None:
        ax.axhline(budget / scale, color=OOM_COLOR, linewidth=2, label="memory budget")
    ax.set_xticks(xs)
    # A label fits under its bar when its characters (about 0.075 in each at 8 pt) are narrower than the bar
    # pitch; else every label turns (30 degrees, anchored at its bar), so neighbours never run together.
    pitch_in = ax.get_position().width * fig.get_figwidth() / max(len(bars), 1)
    longest = max(len(label) for label in labels)
    if len(bars) > 24:
        ax.set_xticklabels(labels, fontsize=7, rotation=90)
    elif longest * 0.075 > pitch_in * 0.9:
        ax.set_xticklabels(labels, fontsize=8, rotation=30, ha="right", rotation_mode="anchor")
    else:
        ax.set_xticklabels(labels, fontsize=8)
    ax.set_ylabel(unit)
    ax.set_title(title, fontsize=11, loc="left")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.grid(axis="y", alpha=0.3)
    return png_base64(fig)


def esc(text: Any) -> str:
    return html.escape(str(text), quote=True)


def td(cell: Cell, extra_class: str = "") -> str:
    css = " ".join(c for c in (cell.css, extra_class) if c)
    if cell.pointer is None:
        classes = f"{'num ' if cell.numeric else ''}{css}".strip()
        attr = f' class="{classes}"' if classes else ""
        return f"<td{attr}>{esc(cell.text)}</td>"
    classes = f"num {css}".strip()
    value = json.dumps(cell.value)
    return f'<td class="{classes}" data-json="{esc(cell.pointer)}" data-value="{esc(value)}">{esc(cell.text)}</td>'


def num_cell(pointer: str, value: Any, text: str) -> Cell:
    return Cell(text=text, pointer=pointer if value is not None else None, value=value, numeric=True)


def table(headers: list[str], rows: list[list[str]], *, css_class: str = "", units: list[str] | None = None) -> str:
    out = [f'<table class="{css_class}">' if css_class else "<table>", "<thead><tr>"]
    out += [f"<th>{esc(h)}</th>" for h in headers]
    out.append("</tr></thead><tbody>")
    if units is not None:
        out.append('<tr class="units">' + "".join(f"<td>{esc(u)}</td>" for u in units) + "</tr>")
    out += ["<tr>" + "".join(row) + "</tr>" for row in rows]
    out.append("</tbody></table>")
    return "".join(out)


def policy_table_html(report: Report) -> str:
    headers, units, aggregations, rows = policy_table(report)
    out = ['<div class="scroll"><table class="policies" id="policy-table"><thead><tr>']
    out += [f"<th>{esc(h)}</th>" for h in headers]
    out.append("</tr></thead><tbody>")
    out.append('<tr class="units">' + "".join(f"<td>{esc(u)}</td>" for u in units) + "</tr>")
    out.append('<tr class="agg">' + "".join(f"<td>{esc(a)}</td>" for a in aggregations) + "</tr>")
    out += ["<tr>" + "".join(td(c) for c in row) + "</tr>" for row in rows]
    out.append("</tbody></table></div>")
    return "".join(out)


def _listing(
    report: Report,
    items: list,
    limit: int,
    row: Callable[[Any, bool], list[str]],
    message: Callable[[Any], str],
    *,
    anchor: str,
    title: str,
    headers: list[str],
) -> str:
    """A section listing the first `limit` items, one row each with its message last, in full."""
    if not items:
        return ""
    matrix = isinstance(report, MatrixReport)
    rows = [
        [td(Cell(text=c)) for c in row(item, matrix)[:-1]] + [td(Cell(text=message(item)), "message")]
        for item in items[:limit]
    ]
    more = f"<p>... and {len(items) - limit} more in report.json and junit.xml</p>" if len(items) > limit else ""
    return f'<h2 id="{anchor}">{title} ({len(items)})</h2>' + table((["cell"] if matrix else []) + headers, rows) + more


def problems_html(report: Report) -> str:
    return _listing(
        report,
        report.problems,
        MAX_PROBLEMS_LISTED,
        problem_row,
        lambda p: p.cause,
        anchor="problems",
        title="Problems",
        headers=["kind", "rank", "file", "cause"],
    )


def failures_html(report: Report) -> str:
    return _listing(
        report,
        report.check_failures,
        MAX_LISTED,
        failure_row,
        lambda f: f.message,
        anchor="failed-checks",
        title="Failed checks",
        headers=["rank", "policy", "check", "outcome", "message"],
    )


def figure(png: str | None, caption: str, fig_id: str) -> str:
    if png is None:
        return f'<p id="{fig_id}">{esc(caption)}: nothing to plot (no measurements).</p>'
    return (
        f'<figure id="{fig_id}"><img alt="{esc(caption)}" src="data:image/png;base64,{png}">'
        f"<figcaption>{esc(caption)}</figcaption></figure>"
    )


def other_note(report: Report) -> str:
    cpu = report.hardware.device_kind == "cpu"
    where = (
        "the process's RSS less the harness's own allocations: the interpreter, torch's libraries and the "
        "heap's free but resident pages"
        if cpu
        else "the process's device memory (NVML) less the harness's own allocations: the CUDA context (hundreds of "
        "MiB), NCCL's buffers, and the caching allocator's cache (reserved segments not in use)"
    )
    return (
        f'<p class="note" id="other-note"><b>other</b> = {esc(where)}. The other parts are the harness\'s exact '
        "allocations: weights, dispatch buffers, common (ws13 and out alias it), ws2, combine buffers and the "
        "ballast that stands for weights and KV cache.</p>"
    )
