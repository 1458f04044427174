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

from collections.abc import Mapping
from typing import Any

from harness.core.units import human_bytes
from harness.report.evidence import (
    COMPONENT_HEADERS,
    COMPONENT_NOTE,
    OOM_HEADERS,
    component_rows,
    held_bytes,
    oom_entries,
    oom_table_rows,
    workspace_room,
)
from harness.report.html_base import (
    BREAKDOWN_RANKS_MAX,
    CSS,
    OOM_COLOR,
    average_parts,
    breakdown_parts,
    byte_scale,
    esc,
    failures_html,
    figure,
    new_figure,
    num_cell,
    other_note,
    plot_breakdown,
    png_base64,
    policy_color,
    policy_table_html,
    problems_html,
    table,
    td,
)
from harness.report.html_matrix import cell_plots_note, matrix_body
from harness.report.markdown import (
    NA,
    RANK_TABLE_MAX,
    Cell,
    baseline_table,
    byte_unit,
    checks_line,
    fmt_error,
    fmt_us,
    footer_line,
    header_lines,
    title_line,
)
from harness.report.model import MatrixReport, Report, RunReport

PER_RANK_BARS_MAX = 64


def _oom_bar(ax: Any, x: float, height: float, width: float, status: str | None) -> None:
    """A bar that cannot be missed: red cross-hatching as tall as what the policy asked for, labelled OOM."""
    label = {"oom": "OOM", "error": "stopped"}.get(status or "", NA)
    color = OOM_COLOR if status == "oom" else "#7f7f7f"
    if height > 0:
        ax.bar([x], [height], width, fill=False, hatch="xx", edgecolor=color, linewidth=1.5)
    ax.annotate(
        label,
        (x, height),
        xytext=(0, 3),
        textcoords="offset points",
        ha="center",
        va="bottom",
        fontsize=10,
        fontweight="bold",
        color="white",
        bbox={"boxstyle": "round,pad=0.2", "facecolor": color, "edgecolor": color},
    )


def _per_rank_bars(ax: Any, report: RunReport, k: int, policy: str, xs: list[float], width: float, scale: int) -> None:
    color = policy_color(policy, [p.policy for p in report.policies])
    entries = [r.policy(policy) for r in report.ranks]
    contract = [(e.contract_total_bytes if e else 0) / scale for e in entries]
    measured = [e.workspace_delta_bytes if e is not None and e.status == "ok" else None for e in entries]
    ax.bar(xs, contract, width, color=color, alpha=0.35, hatch="//", edgecolor=color, label=f"{policy} contract")
    ax.bar(
        [x + width for x in xs], [(v or 0) / scale for v in measured], width, color=color, label=f"{policy} measured"
    )
    for x, v, e, c, rank in zip(xs, measured, entries, contract, report.ranks, strict=True):
        if v is None:  # OOM, stopped or not measured: say so rather than draw a zero
            held = held_bytes(report, rank, e) if e is not None else 0
            if held:  # what it did allocate before the OOM, solid under the hatch of what it asked for
                ax.bar([x + width], [held / scale], width, color=OOM_COLOR, alpha=0.45)
            _oom_bar(ax, x + width, c, width, e.status if e else None)


def _summary_bars(ax: Any, report: RunReport, k: int, policy: str, xs: list[float], width: float, scale: int) -> None:
    color = policy_color(policy, [p.policy for p in report.policies])
    summary = report.policies[k]
    ax.bar(
        xs,
        [(summary.contract_total_bytes or 0) / scale],
        width,
        color=color,
        alpha=0.35,
        hatch="//",
        edgecolor=color,
        label=f"{policy} contract",
    )
    agg = summary.workspace_delta_bytes
    if agg is not None:
        ax.bar(
            [xs[0] + width],
            [agg.avg / scale],
            width,
            color=color,
            yerr=[[(agg.avg - agg.min) / scale], [(agg.max - agg.avg) / scale]],
            capsize=4,
            label=f"{policy} measured (avg, min..max over {agg.num_ranks} ranks)",
        )
    if summary.num_oom:
        _oom_bar(ax, xs[0] + width, (summary.contract_total_bytes or 0) / scale, width, "oom")


def plot_workspace_per_rank(report: RunReport) -> str | None:
    """Contract vs measured workspace per rank and policy, the lower bound and the budget as lines; base64 PNG."""
    policies = [p.policy for p in report.policies]
    if not report.ranks or not policies:
        return None
    unit, scale = byte_scale(report)
    per_rank = len(report.ranks) <= PER_RANK_BARS_MAX
    groups: list[Any] = [r.rank for r in report.ranks] if per_rank else ["all ranks"]
    width = 0.8 / (2 * len(policies))
    fig = new_figure(min(18.0, 6.5 + 0.35 * len(groups) * len(policies)), 4.4)
    ax = fig.add_subplot()
    for k, policy in enumerate(policies):
        xs = [g + 2 * k * width for g in range(len(groups))]
        (_per_rank_bars if per_rank else _summary_bars)(ax, report, k, policy, xs, width, scale)
    lower_bound = report.policies[0].lower_bound_bytes
    if lower_bound:
        ax.axhline(lower_bound / scale, color="#1f77b4", linestyle="--", linewidth=1, label="lower bound (live set)")
    room = workspace_room(report)
    if room is not None:
        less = "the baseline in use" if report.scenario.memory_method == "nvml" else "the harness's other tensors"
        ax.axhline(
            room / scale, color=OOM_COLOR, linewidth=2, label=f"memory budget less {less} (room for a workspace)"
        )
    if any(p.num_oom for p in report.policies):
        ax.bar([0], [0], 0, fill=False, hatch="xx", edgecolor=OOM_COLOR, label="OOM: what the policy asked for")
        if per_rank and any(held_bytes(report, r, e) for r in report.ranks for e in r.policies):
            ax.bar([0], [0], 0, color=OOM_COLOR, alpha=0.45, label="OOM: what it allocated before the OOM")
    ax.set_xticks([g + (len(policies) * 2 - 1) * width / 2 for g in range(len(groups))])
    ax.set_xticklabels(
        [f"rank {g}" if per_rank else g for g in groups],
        rotation=90 if len(groups) > 16 else 0,
        fontsize=7 if len(groups) > 16 else 9,
    )
    ax.set_ylim(top=ax.get_ylim()[1] * 1.12)  # room above the tallest bar for its OOM label
    ax.set_ylabel(f"workspace per rank ({unit})")
    method = (report.scenario.memory_method or "").upper()
    ax.set_title(f"workspace per rank: contract vs measured ({method or 'not measured'})", fontsize=11)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.grid(axis="y", alpha=0.3)
    return png_base64(fig)


def _breakdown_bars(report: RunReport) -> tuple[list[str], list[dict[str, float]], str]:
    """Labels and per-part bytes for the breakdown plot, per rank x policy or averaged over ranks."""
    labels: list[str] = []
    bars: list[dict[str, float]] = []
    if len(report.ranks) <= BREAKDOWN_RANKS_MAX:
        for rank in report.ranks:
            for entry in rank.policies:
                if entry.breakdown is not None:
                    labels.append(f"r{rank.rank} {entry.policy}")
                    bars.append(_with_held(breakdown_parts(entry.breakdown), held_bytes(report, rank, entry)))
        return labels, bars, "per rank"
    for summary in report.policies:
        found = [
            _with_held(breakdown_parts(e.breakdown), held_bytes(report, r, e))
            for r in report.ranks
            for e in r.policies
            if e.policy == summary.policy and e.breakdown is not None
        ]
        if found:
            labels.append(summary.policy)
            bars.append(average_parts(found))
    return labels, bars, f"average over {len(report.ranks)} ranks"


def _with_held(parts: dict[str, float], held: int) -> dict[str, float]:
    """An OOM'd policy's first workspace block, moved out of `other`: the device's peak saw it, the accountant had
    already released it when the breakdown was taken."""
    moved = min(float(held), max(parts["other"], 0.0))
    return {**parts, "oom-held": moved, "other": parts["other"] - moved}


def _ooms_html(report: RunReport) -> str:
    entries = oom_entries(report)
    if not entries:
        return ""
    rows = [
        [td(Cell(text=c)) for c in row[:-1]] + [td(Cell(text=row[-1]), "message")] for row in oom_table_rows(entries)
    ]
    return (
        f'<h2 id="ooms">OOMs ({sum(len(e.ranks) for e in entries)} rank x policy)</h2><div class="scroll">'
        + table(OOM_HEADERS, rows, css_class="ooms")
        + "</div>"
        + '<p class="note">held before = the policy\'s workspace bytes already allocated when the allocation '
        "failed (its first block, when the second failed); free = what the allocator (GPU) or the budget (CPU) "
        "had left. The message is the allocator's own, as a vLLM issue would quote it.</p>"
    )


def _components_html(report: RunReport) -> str:
    if not report.components:
        return ""
    rows = []
    for c, row in zip(report.components, component_rows(report), strict=True):
        css = {"fail": "fail", "pass": ""}.get(c.expectation, "skip")
        cells = [td(Cell(text=t)) for t in row[:7]]
        cells.append(td(Cell(text=row[7]), "oom" if c.verdicts != ["consistent"] else ""))
        cells += [
            td(Cell(text=row[8])),
            td(Cell(text=row[9]), f"message {css}".strip()),
            td(Cell(text=row[10]), "message"),
        ]
        rows.append(cells)
    return (
        '<h2 id="components">Layer components</h2><div class="scroll">'
        + table(COMPONENT_HEADERS, rows, css_class="components")
        + "</div>"
        + f'<p class="note">{esc(COMPONENT_NOTE)}</p>'
    )


def _rank_table_html(report: RunReport) -> str:
    shown = report.ranks[:RANK_TABLE_MAX]
    unit, fmt_bytes = byte_unit(report)
    headers = [
        "rank",
        "node",
        "device",
        "policy",
        "status",
        f"contract {unit}",
        f"ws delta {unit}",
        f"alloc peak {unit}",
        "max error rel",
        "dispatch time us",
        "experts time us",
        "combine time us",
        "expectation",
        "correctness",
        "memory",
        "baseline",
    ]
    rows = []
    for i, rank in enumerate(shown):
        for j, e in enumerate(rank.policies):
            p = f"/ranks/{i}/policies/{j}"
            cells = [
                td(num_cell(f"/ranks/{i}/rank", rank.rank, str(rank.rank))),
                td(Cell(text=rank.hostname)),
                td(Cell(text=rank.device_name)),
                td(Cell(text=e.policy)),
                td(Cell(text=e.status), {"oom": "oom", "error": "fail"}.get(e.status, "")),
                td(num_cell(f"{p}/contract_total_bytes", e.contract_total_bytes, fmt_bytes(e.contract_total_bytes))),
                td(num_cell(f"{p}/workspace_delta_bytes", e.workspace_delta_bytes, fmt_bytes(e.workspace_delta_bytes))),
                td(
                    num_cell(
                        f"{p}/allocator_allocated_peak_bytes",
                        e.allocator_allocated_peak_bytes,
                        fmt_bytes(e.allocator_allocated_peak_bytes),
                    )
                ),
                td(num_cell(f"{p}/max_rel_error", e.max_rel_error, fmt_error(e.max_rel_error))),
                td(num_cell(f"{p}/dispatch_us", e.dispatch_us, fmt_us(e.dispatch_us))),
                td(num_cell(f"{p}/experts_us", e.experts_us, fmt_us(e.experts_us))),
                td(num_cell(f"{p}/combine_us", e.combine_us, fmt_us(e.combine_us))),
            ]
            cells += [
                f'<td class="{c.outcome}" title="{esc(c.message)}">{esc(c.outcome)}</td>' for _, c in e.checks.items()
            ]
            rows.append(cells)
    out = '<div class="scroll">' + table(headers, rows, css_class="ranks") + "</div>"
    if len(report.ranks) > len(shown):
        out += (
            f"<p>{len(report.ranks) - len(shown)} more ranks in report.json; the plots and the policy table "
            "aggregate all of them.</p>"
        )
    return out


def _baselines_html(report: RunReport) -> str:
    if not any(e.baseline_bytes is not None for r in report.ranks for e in r.policies):
        return ""
    headers, units, rows = baseline_table(report)
    return (
        '<h2 id="baselines">Memory baselines per rank</h2><div class="scroll">'
        + table(headers, [[td(c) for c in row] for row in rows], css_class="baselines", units=units)
        + "</div>"
        + '<p class="note">Each policy is measured from the memory in use when it starts (its baseline). The '
        "baseline check fails when a policy's baseline differs from the rank's first policy's by more than "
        "the allocator's rounding (the units row): one-time setup inside a policy's window would inflate its "
        "peak and could decide fit or OOM.</p>"
    )


def _run_body(report: RunReport) -> list[str]:
    budget = report.scenario.memory_budget_bytes
    cpu = report.scenario.memory_method != "nvml"
    in_use = "the harness's other tensors (weights, buffers)" if cpu else "the baseline in use"
    budget_text = (
        f"the red line is the memory budget ({human_bytes(budget)}) less {in_use}"
        if budget is not None and workspace_room(report) is not None
        else "no memory budget in this scenario"
    )
    breakdown_budget = (
        "; the red line is the memory budget, which on CPU covers the harness's own tensors (every part but other)"
        if cpu
        else "; the red line is the memory budget"
    )
    labels, bars, how = _breakdown_bars(report)
    return [
        figure(
            plot_workspace_per_rank(report),
            f"per rank: contract (hatched) vs measured (solid); OOM marked in red; {budget_text}",
            "plot-per-rank",
        ),
        figure(
            plot_breakdown(
                labels, bars, f"breakdown of the exact allocations ({how})", budget, report.hardware.device_kind
            ),
            f"breakdown: weights, dispatch, comm, common, ws2, combine, ballast, other ({how})"
            + (breakdown_budget if budget else ""),
            "plot-breakdown",
        ),
        other_note(report),
        _baselines_html(report),
        "<h2>Per rank</h2>",
        _rank_table_html(report),
    ]


def render_html(report: Report, *, plots: bool = True, cells: Mapping[str, RunReport] | None = None) -> str:
    """report.html for a run or a matrix report. `plots=False` (a matrix cell's page) draws no figure: matplotlib
    costs about 0.2 s a figure, which a matrix would pay per cell; the matrix's page plots every cell. `cells`: a
    matrix's cells' whole reports by name, for the breakdown (per-rank figures its report.json does not hold)."""
    status_class = "ok" if report.exit_code == 0 else "failed"
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f'<meta name="harness-generation" content="{esc(report.generation)}">',
        f"<title>{esc(title_line(report))}</title><style>{CSS}</style></head><body>",
        f"<h1>{esc(title_line(report))}</h1>",
        f'<p class="status {status_class}" id="status-top">{esc(footer_line(report))}</p>',
        '<pre class="header" id="header">' + "\n".join(esc(f"# {line}") for line in header_lines(report)) + "</pre>",
    ]
    if isinstance(report, RunReport) and report.scenario.emulated:
        s = report.scenario
        memory = "CPU memory" if report.hardware.device_kind == "cpu" else "GPU memory"
        parts.append(
            f'<p class="emulated">D={s.num_dispatchers} is emulated on {s.num_ranks} physical rank(s): '
            f"{memory} is sized for D, traffic flows among the physical ranks.</p>"
        )
    parts += [
        "<h2>Per policy</h2>",
        policy_table_html(report),
        '<p class="note">Units in the second row, the aggregation over ranks in the third. GiB = 2<sup>30</sup> '
        "bytes, MiB = 2<sup>20</sup> bytes; report.json holds the bytes. outcome = fit or oom on any rank "
        "against the scenario's expectation; ws delta = measured workspace delta; x fixed = contract / fixed "
        "contract; n/a = no rank has the figure (bus bandwidth with one physical rank: nothing crosses a "
        "link).</p>",
    ]
    if isinstance(report, RunReport):
        parts += [_ooms_html(report), _components_html(report)]
    parts.append("<h2>Plots</h2>")
    if isinstance(report, MatrixReport):
        parts += matrix_body(report, cells or {})
    elif plots:
        parts += _run_body(report)
    else:
        parts += [
            cell_plots_note(),
            other_note(report),
            _baselines_html(report),
            "<h2>Per rank</h2>",
            _rank_table_html(report),
        ]
    parts += [
        problems_html(report),
        failures_html(report),
        f'<p id="checks">{esc(checks_line(report))}</p>',
        f'<p class="status {status_class}" id="status">{esc(footer_line(report))}</p>',
        "</body></html>",
    ]
    return "\n".join(p for p in parts if p) + "\n"
