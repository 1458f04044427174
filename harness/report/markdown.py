"""Renderings of a typed report (harness.report.model): Markdown and the terminal summary. HTML lives in
harness.report.html, JUnit XML in harness.report.junit.

Every number shown is formatted here from the report, never recomputed, so report.json and each rendering agree.
`policy_table` is the one definition of the per-policy table: unique column headers, a units row and a row naming
the aggregation over ranks (nccl-tests style); Markdown, HTML and the terminal all draw it.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from harness.report.model import (
    Aggregate,
    CheckFailure,
    MatrixReport,
    PolicySummary,
    Problem,
    RankEntry,
    Report,
    RunReport,
    ScenarioInfo,
)
from harness.report.evidence import (
    COMPONENT_HEADERS, COMPONENT_NOTE, MAX_OOM_ROWS, OOM_HEADERS, budget_line, component_lines, component_rows,
    oom_entries, oom_table_rows,
)

GIB = 2**30
MIB = 2**20
MAX_LISTED = 50  # failed checks listed in Markdown; junit.xml and report.json hold all of them
MAX_PROBLEMS_LISTED = 200  # problems listed in Markdown/HTML/terminal (a 1024-rank run that died whole stays readable)
RANK_TABLE_MAX = 64  # per-rank rows in report.md and report.html; report.json holds every rank
MATRIX_ROWS_MAX = 64  # a matrix's rows per table (cell x policy, cells, correctness); report.json holds all

NA = "n/a"  # the one spelling of "no value": no rank has the figure, or it does not apply

# ---------------------------------------------------------------------------------------------------------------
# Formatting: bytes are stored, GiB or MiB are shown.


def fmt_gib(value: float | int | None) -> str:
    return NA if value is None else f"{value / GIB:.4g}"


def fmt_mib(value: float | int | None) -> str:
    return NA if value is None else f"{value / MIB:.4g}"


def byte_unit(report: Report) -> tuple[str, Callable[[Any], str]]:
    """GiB, or MiB when every contract is below 1 GiB (CPU scenarios): 0.0009766 GiB helps no reader.

    The unit is chosen from the report alone, so it is the same on every rendering, and the units row names it.
    """
    largest = max((p.contract_total_bytes or 0 for p in _all_summaries(report)), default=0)
    return ("MiB", fmt_mib) if 0 < largest < GIB else ("GiB", fmt_gib)


def _all_summaries(report: Report) -> list[PolicySummary]:
    if isinstance(report, MatrixReport):
        return [p for c in report.cells for p in c.report.policies]
    return list(report.policies)


def fmt_ratio(value: float | None) -> str:
    return NA if value is None else f"{value:.2f}"


def fmt_error(value: float | None) -> str:
    return NA if value is None else f"{value:.3g}"


def fmt_us(value: float | None) -> str:
    return NA if value is None else f"{value:.1f}"


def fmt_rate(value: float | None) -> str:
    # Four significant digits: 1027 TFLOP/s on an H200 and 0.01234 on a CPU both stay readable.
    return NA if value is None else f"{value:.4g}"


def fmt_int(value: int | None) -> str:
    return NA if value is None else str(value)


def fmt_baseline_mib(value: float | int | None) -> str:
    # Baselines are GBs on a GPU, while their differences that matter are MiB: one decimal of MiB shows both.
    return NA if value is None else f"{value / MIB:.1f}"


def fmt_time(unix_s: float | None) -> str:
    """A timestamp taken from a record, in UTC; never "now", so a second collect writes the same bytes."""
    if unix_s is None:
        return NA
    return datetime.datetime.fromtimestamp(unix_s, tz=datetime.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def outcome_text(summary: PolicySummary) -> str:
    """Outcome against the expectation at a glance: `oom (expected oom): pass`."""
    outcome = summary.outcome or "no result"
    # memory.deployment_ballast: the KV cache the deployment starts with on this policy's workspace
    kv = f"; KV cache {summary.deployment_kv_tokens} tokens" if summary.deployment_kv_tokens else ""
    if summary.expected_outcome is None:
        return f"{outcome} (no expectation){kv}"
    verdict = {"pass": "pass", "fail": "FAIL", "error": "ERROR", "skip": "skip"}[summary.expectation]
    return f"{outcome} (expected {summary.expected_outcome}): {verdict}{kv}"


# ---------------------------------------------------------------------------------------------------------------
# The per-policy table


@dataclass(frozen=True, kw_only=True)
class Column:
    header: str  # unique within the table
    unit: str
    aggregation: str  # how ranks are combined: "min", "avg", "max", "count", "any rank", or "" per scenario
    field: str  # the PolicySummary attribute
    agg: str | None = None  # the Aggregate attribute (min/avg/max) when the field is an Aggregate
    fmt: Callable[[Any], str] = str
    numeric: bool = True

    def value(self, summary: PolicySummary) -> Any:
        value = getattr(summary, self.field)
        if self.agg is not None:
            return getattr(value, self.agg) if isinstance(value, Aggregate) else None
        return value

    def pointer(self, prefix: str) -> str:
        """Where report.json holds the value: the page's data-json, for the browser test."""
        return f"{prefix}/{self.field}" + (f"/{self.agg}" if self.agg else "")


@dataclass(frozen=True, kw_only=True)
class Cell:
    text: str
    pointer: str | None = None  # JSON pointer into report.json, for numeric cells
    value: Any = None
    numeric: bool = False  # right-aligned, also when it shows n/a
    css: str = ""  # HTML class: "fail", "oom", ...


def memory_unit(report: Report, unit: str) -> str:
    method = _memory_method(report)
    return {"nvml": f"{unit} NVML", "rss": f"{unit} RSS"}.get(method or "", unit)


def policy_columns(report: Report) -> list[Column]:
    unit, fmt_bytes = byte_unit(report)
    measured = memory_unit(report, unit)
    return [
        Column(header="policy", unit="", aggregation="", field="policy", numeric=False),
        Column(header="outcome", unit="vs expected", aggregation="any rank", field="outcome", numeric=False),
        Column(header="contract", unit=unit, aggregation="", field="contract_total_bytes", fmt=fmt_bytes),
        Column(header="lower bound", unit=unit, aggregation="", field="lower_bound_bytes", fmt=fmt_bytes),
        Column(header="x fixed", unit="ratio", aggregation="", field="ratio_to_fixed", fmt=fmt_ratio),
        Column(header="ws delta min", unit=measured, aggregation="min", field="workspace_delta_bytes", agg="min", fmt=fmt_bytes),
        Column(header="ws delta avg", unit=measured, aggregation="avg", field="workspace_delta_bytes", agg="avg", fmt=fmt_bytes),
        Column(header="ws delta max", unit=measured, aggregation="max", field="workspace_delta_bytes", agg="max", fmt=fmt_bytes),
        Column(header="alloc peak", unit=unit, aggregation="max", field="allocator_allocated_peak_bytes", agg="max", fmt=fmt_bytes),
        Column(header="OOM", unit="ranks", aggregation="count", field="num_oom", fmt=fmt_int),
        Column(header="max error", unit="rel", aggregation="max", field="max_rel_error", agg="max", fmt=fmt_error),
        Column(header="dispatch time", unit="us", aggregation="max", field="dispatch_us", agg="max", fmt=fmt_us),
        Column(header="experts time", unit="us", aggregation="max", field="experts_us", agg="max", fmt=fmt_us),
        Column(header="combine time", unit="us", aggregation="max", field="combine_us", agg="max", fmt=fmt_us),
        Column(header="experts rate", unit="TFLOP/s", aggregation="min", field="experts_tflops", agg="min", fmt=fmt_rate),
        Column(header="dispatch busbw", unit="GB/s", aggregation="min", field="dispatch_busbw_gbps", agg="min", fmt=fmt_rate),
        Column(header="combine busbw", unit="GB/s", aggregation="min", field="combine_busbw_gbps", agg="min", fmt=fmt_rate),
    ]


MATRIX_LEAD_COLUMNS = ("cell", "model", "D", "E", "T")


def _summary_row(summary: PolicySummary, prefix: str, columns: list[Column]) -> list[Cell]:
    row = []
    for column in columns:
        if column.field == "outcome":
            row.append(Cell(text=outcome_text(summary), css=_outcome_css(summary)))
            continue
        value = column.value(summary)
        if column.numeric and value is not None:
            row.append(Cell(text=column.fmt(value), pointer=column.pointer(prefix), value=value, numeric=True))
        else:
            row.append(Cell(text=column.fmt(value) if value is not None else NA, numeric=column.numeric))
    return row


def _outcome_css(summary: PolicySummary) -> str:
    if summary.expectation in ("fail", "error"):
        return "fail"
    return "oom" if summary.outcome == "oom" else ""


def _matrix_lead(i: int, s: ScenarioInfo, name: str) -> list[Cell]:
    model = s.model_preset or (f"K={s.hidden_size} I={s.intermediate_size}" if s.hidden_size else NA)
    return [
        Cell(text=name), Cell(text=model),
        Cell(text=fmt_int(s.num_dispatchers), pointer=f"/cells/{i}/report/scenario/num_dispatchers",
             value=s.num_dispatchers, numeric=True),
        Cell(text=fmt_int(s.num_local_experts), pointer=f"/cells/{i}/report/scenario/num_local_experts",
             value=s.num_local_experts, numeric=True),
        Cell(text=fmt_int(s.max_tokens_per_rank), pointer=f"/cells/{i}/report/scenario/max_tokens_per_rank",
             value=s.max_tokens_per_rank, numeric=True),
    ]


def policy_table(report: Report) -> tuple[list[str], list[str], list[str], list[list[Cell]]]:
    """headers, units, aggregations, rows; a matrix report gets leading cell/model/D/E/T columns."""
    columns = policy_columns(report)
    headers = [c.header for c in columns]
    units = [c.unit for c in columns]
    aggregations = [c.aggregation or "-" for c in columns]
    aggregations[0] = "over ranks"
    rows: list[list[Cell]] = []
    if isinstance(report, MatrixReport):
        lead = len(MATRIX_LEAD_COLUMNS)
        headers, units, aggregations = list(MATRIX_LEAD_COLUMNS) + headers, [""] * lead + units, [""] * lead + aggregations
        for i, cell in enumerate(report.cells):
            if len(rows) >= MATRIX_ROWS_MAX:
                left = sum(max(1, len(c.report.policies)) for c in report.cells[i:])
                rows.append([Cell(text=f"... {left} more rows ({len(report.cells) - i} cells) in report.json and "
                                       "the cells' own reports")] + [Cell(text="") for _ in headers[1:]])
                break
            lead_cells = _matrix_lead(i, cell.report.scenario, cell.name)
            if not cell.report.policies:
                rows.append(lead_cells + [Cell(text=f"no results: {cell.report.exit_reason}")]
                            + [Cell(text="") for _ in columns[1:]])
            for j, summary in enumerate(cell.report.policies):
                rows.append(lead_cells + _summary_row(summary, f"/cells/{i}/report/policies/{j}", columns))
    else:
        for j, summary in enumerate(report.policies):
            rows.append(_summary_row(summary, f"/policies/{j}", columns))
    return headers, units, aggregations, rows


def _memory_method(report: Report) -> str | None:
    if isinstance(report, MatrixReport):
        return next((c.report.scenario.memory_method for c in report.cells if c.report.scenario.memory_method), None)
    return report.scenario.memory_method


def table_legend(report: Report) -> str:
    """What the columns mean, for Markdown and the terminal (HTML says the same with markup)."""
    one_rank = isinstance(report, RunReport) and report.scenario.num_ranks == 1
    return ("Row 2 gives the units, row 3 how ranks are aggregated; report.json holds the bytes these are rendered "
            "from. outcome = fit or oom on any rank, against the scenario's expectation; ws delta = measured "
            "workspace delta; x fixed = contract / fixed contract; n/a = no rank has the figure"
            + (" (bus bandwidth with one physical rank: nothing crosses a link)." if one_rank else "."))


# ---------------------------------------------------------------------------------------------------------------
# Per-rank memory baselines (the baseline check)


def baseline_table(report: RunReport) -> tuple[list[str], list[str], list[list[Cell]]]:
    """Headers, units and rows of each policy's memory baseline per rank, with the rank's spread and check."""
    policies = [p.policy for p in report.policies]
    method = report.scenario.memory_method or ""
    headers = ["rank", *[f"{p} baseline" for p in policies], "spread", "check"]
    units = ["", *[f"MiB {method.upper()}".strip()] * len(policies), "MiB", f"allowed {fmt_baseline_mib(report.scenario.baseline_rounding_bytes)} MiB"]
    rows = []
    for i, rank in enumerate(report.ranks[:RANK_TABLE_MAX]):
        cells = [Cell(text=str(rank.rank), pointer=f"/ranks/{i}/rank", value=rank.rank, numeric=True)]
        values = []
        for name in policies:
            j = next((k for k, e in enumerate(rank.policies) if e.policy == name), None)
            value = rank.policies[j].baseline_bytes if j is not None else None
            if value is None:
                cells.append(Cell(text=NA, numeric=True))
                continue
            values.append(value)
            cells.append(Cell(text=fmt_baseline_mib(value), pointer=f"/ranks/{i}/policies/{j}/baseline_bytes",
                              value=value, numeric=True))
        cells.append(Cell(text=fmt_baseline_mib(max(values) - min(values)) if values else NA, numeric=True))
        cells.append(_rank_baseline_verdict(rank))
        rows.append(cells)
    return headers, units, rows


def _rank_baseline_verdict(rank: RankEntry) -> Cell:
    outcomes = [e.checks.baseline.outcome for e in rank.policies]
    verdict = "fail" if "fail" in outcomes else ("pass" if "pass" in outcomes else "skip")
    return Cell(text=verdict, css=verdict if verdict != "pass" else "")


# ---------------------------------------------------------------------------------------------------------------
# Header lines (shared by Markdown, HTML and the terminal)


def _versions_lines(report: Report) -> list[str]:
    v = report.versions
    if v is None:
        return ["versions: unknown (no records)"]
    names = (("harness", v.harness), ("python", v.python), ("torch", v.torch), ("CUDA", v.cuda), ("NCCL", v.nccl),
             ("driver", v.driver), ("Ray", v.ray))
    first = " | ".join(f"{label} {value or NA}" for label, value in names)
    return [first, f"vLLM source: {v.vllm_source or 'none'} | vLLM kernels: {v.vllm_kernels or 'none'}"]


def _hardware_line(report: Report) -> str:
    hw = report.hardware
    if not hw.num_ranks_reported and not hw.nodes:
        return "hardware: unknown (no records)"
    names = ", ".join(hw.device_names) or "unknown device"
    memory = f" ({fmt_gib(hw.device_total_bytes.max)} GiB)" if hw.device_total_bytes else ""
    caps = f", sm {', '.join(hw.device_capabilities)}" if hw.device_capabilities else ""
    of = f" of {hw.num_ranks_expected} launched" if hw.num_ranks_expected is not None else ""
    launcher = f"; launcher {hw.launcher}" if hw.launcher else ""
    return (f"hardware: {hw.num_ranks_reported} rank(s) reported{of} on {hw.num_nodes} node(s) "
            f"[{', '.join(hw.nodes)}]: {names}{memory} ({hw.device_kind or NA}{caps}){launcher}")


def _shape_line(s: ScenarioInfo) -> str:
    if s.hidden_size is None:
        return f"D={s.num_dispatchers} P={s.num_ranks} (shapes unknown: the scenario could not be parsed)"
    return (f"model {s.model_preset or 'explicit shapes'}: D={s.num_dispatchers} P={s.num_ranks} "
            f"E={s.num_local_experts} T={s.max_tokens_per_rank} M={s.M} K={s.hidden_size} I={s.intermediate_size} "
            f"N={s.N} top_k={s.top_k} experts={s.num_experts} {s.workspace_dtype}; routing {s.routing}, "
            f"{s.num_tokens_per_dispatcher} tokens per dispatcher")


def _emulation_line(s: ScenarioInfo, device_kind: str | None) -> str:
    if s.emulated:
        memory = "each rank's CPU memory" if device_kind == "cpu" else "each GPU's memory"
        return (f"D={s.num_dispatchers} is EMULATED on P={s.num_ranks} physical rank(s): buffers and workspaces are "
                f"sized for D ({memory} equals a real D-rank deployment's); traffic flows among P")
    return f"D={s.num_dispatchers} is real: one physical rank per dispatcher (not emulated)"


def _measurement_line(s: ScenarioInfo) -> str:
    tolerance = NA if s.memory_tolerance_pct is None else f"{s.memory_tolerance_pct:g}%"
    rounding = NA if s.baseline_rounding_bytes is None else f"{fmt_baseline_mib(s.baseline_rounding_bytes)} MiB"
    return (f"measurement: {s.measurement_method or NA}; {s.memory_label or 'no memory measured'}; experts backend "
            f"{s.experts_backend or NA}; comm {s.comm_backend or NA}; memory tolerance {tolerance}; "
            f"baselines equal within {rounding}")


def _warmup_line(report: RunReport) -> str:
    """Whether every policy could start from the same warmed state (the baseline check says whether it did)."""
    by_kind: dict[str, list[int]] = {}
    for rank in report.ranks:
        by_kind.setdefault(rank.warmup or "none", []).append(rank.rank)
    if set(by_kind) == {"none"}:
        return "warm-up pass: none recorded (records of an older harness)"
    if len(by_kind) == 1:
        return f"warm-up pass: {next(iter(by_kind))} on every rank"
    return "warm-up pass: " + "; ".join(f"{kind} on rank(s) {_rank_list(ranks)}" for kind, ranks in sorted(by_kind.items()))


def _rank_list(ranks: list[int]) -> str:
    return ", ".join(map(str, ranks[:16])) + (f" and {len(ranks) - 16} more" if len(ranks) > 16 else "")


def _matrix_header(report: MatrixReport) -> list[str]:
    lines = [f"matrix: {report.name} ({report.path or 'inline'}): {report.num_valid} of {report.num_combinations} "
             f"combinations valid, {len(report.cells)} cell(s) run"]
    lines += [f"  axis {key}: {', '.join(_short(v) for v in values)}" for key, values in report.axes.items()]
    emulated = [c.name for c in report.cells if c.report.scenario.emulated]
    if emulated:
        named = ", ".join(emulated[:8]) + (f" and {len(emulated) - 8} more" if len(emulated) > 8 else "")
        lines.append(f"D is EMULATED (fewer physical ranks than dispatchers) in {len(emulated)} of "
                     f"{len(report.cells)} cells: {named}")
    return lines


def _run_header(report: RunReport) -> list[str]:
    s = report.scenario
    lines = []
    if s.name is None and s.hash is None:
        lines.append("scenario: unknown (no readable run.json and no readable record)")
    else:
        lines.append(f"scenario: {s.name} (hash {s.hash}) {s.path or ''}".rstrip())
    if s.num_dispatchers is not None:
        lines += [_shape_line(s), _emulation_line(s, report.hardware.device_kind)]
    lines.append(_measurement_line(s))
    lines.append(budget_line(s, report.hardware.device_kind))
    if report.ranks:
        lines.append(_warmup_line(report))
    if s.expected_outcomes:
        lines.append("expected: " + ", ".join(f"{k} {v}" for k, v in s.expected_outcomes.items()))
    lines.append(f"run: {report.run_id}; started {fmt_time(report.started_at)}; "
                 f"last rank finished {fmt_time(report.finished_at)}")
    if report.scenario_problem:
        lines.append(f"WARNING: {report.scenario_problem}")
    return lines


def header_lines(report: Report) -> list[str]:
    """The `#` header: versions, hardware, scenario parameters, emulation, measurement method, generation."""
    lines = _versions_lines(report)
    lines += [f"WARNING: ranks disagree on {name}: {', '.join(values)}"
              for name, values in sorted(report.version_mismatches.items())]
    lines.append(_hardware_line(report))
    lines += _matrix_header(report) if isinstance(report, MatrixReport) else _run_header(report)
    lines.append(f"generation: {report.generation}")
    return lines


def _short(value: Any) -> str:
    return "[" + ", ".join(map(str, value)) + "]" if isinstance(value, list) else str(value)


def footer_line(report: Report) -> str:
    return f"{report.status} (exit {report.exit_code}): {report.exit_reason}"


def title_line(report: Report) -> str:
    if isinstance(report, MatrixReport):
        return f"MoE workspace matrix report: {report.name}"
    return f"MoE workspace report: {report.scenario.name or report.run_id or 'unknown run'}"


def checks_line(report: Report) -> str:
    c = report.checks
    return f"checks: {c.num_pass} passed, {c.num_fail} failed, {c.num_error} errors, {c.num_skip} skipped"


def problem_row(p: Problem, matrix: bool) -> list[str]:
    row = [p.kind, "" if p.rank is None else str(p.rank), p.path or "", p.cause]
    return ([p.cell or ""] + row) if matrix else row


def failure_row(f: CheckFailure, matrix: bool) -> list[str]:
    return ([f.cell or ""] if matrix else []) + [str(f.rank), f.policy, f.check, f.outcome, f.message]


# ---------------------------------------------------------------------------------------------------------------
# Markdown


def _md_escape(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _md_table(headers: list[str], rows: list[list[str]]) -> list[str]:
    """A Markdown table whose pipes line up in a terminal (`cat report.md`): each column padded to its widest cell."""
    cells = [[_md_escape(h) for h in headers]] + [[_md_escape(c) for c in row] for row in rows]
    widths = [max(3, *(len(row[i]) for row in cells if i < len(row))) for i in range(len(headers))]

    def line(row: list[str]) -> str:
        return "| " + " | ".join(c.ljust(w) for c, w in zip(row, widths)) + " |"

    return [line(cells[0]), "|" + "|".join("-" * (w + 2) for w in widths) + "|"] + [line(r) for r in cells[1:]]


def _md_components(report: RunReport) -> list[str]:
    if not report.components:
        return []
    out = ["### Layer components", ""] + _md_table(COMPONENT_HEADERS, component_rows(report))
    return out + ["", COMPONENT_NOTE, ""]


def _md_ooms(report: Report, cells: Mapping[str, RunReport]) -> list[str]:
    """Each OOM with the allocator's message, the stage, the bytes asked for and held, and the budget; a matrix's
    with the cell each happened in (from the cells' whole reports in `cells`)."""
    if isinstance(report, MatrixReport):
        per_cell = [(c.name, oom_entries(cells[c.name])) for c in report.cells if c.name in cells]
        entries = [e for _, found in per_cell for e in found]
        rows = [[name, *row] for name, found in per_cell for row in oom_table_rows(found)][:MAX_OOM_ROWS]
        headers = ["cell", *OOM_HEADERS]
    else:
        entries = oom_entries(report)
        rows, headers = oom_table_rows(entries), OOM_HEADERS
    if not entries:
        return []
    out = [f"### OOMs ({sum(len(e.ranks) for e in entries)} rank x policy)", ""]
    out += _md_table(headers, rows)
    if len(entries) > MAX_OOM_ROWS:
        out.append(f"\n... and {len(entries) - MAX_OOM_ROWS} more distinct OOMs in report.json")
    snapshots = sorted({e.snapshot_file for e in entries if e.snapshot_file})
    if snapshots:
        out += ["", "Allocator snapshots (torch.cuda.memory._snapshot): " + ", ".join(snapshots[:8])
                + (f" and {len(snapshots) - 8} more" if len(snapshots) > 8 else "")]
    out += ["", "held before = the policy's workspace bytes already allocated when the allocation failed (its first "
                "block, when the second failed); free = what the allocator (GPU) or the budget (CPU) had left.", ""]
    return out


def _md_listing(report: Report) -> list[str]:
    """Problems and failed checks, each table capped; report.json and junit.xml hold all of them."""
    matrix = isinstance(report, MatrixReport)
    lead = ["cell"] if matrix else []
    out: list[str] = []
    if report.problems:
        out += [f"### Problems ({len(report.problems)})", ""]
        out += _md_table(lead + ["kind", "rank", "file", "cause"],
                         [problem_row(p, matrix) for p in report.problems[:MAX_PROBLEMS_LISTED]])
        if len(report.problems) > MAX_PROBLEMS_LISTED:
            out.append(f"\n... and {len(report.problems) - MAX_PROBLEMS_LISTED} more in report.json and junit.xml")
        out.append("")
    if report.check_failures:
        out += [f"### Failed checks ({len(report.check_failures)})", ""]
        out += _md_table(lead + ["rank", "policy", "check", "outcome", "message"],
                         [failure_row(f, matrix) for f in report.check_failures[:MAX_LISTED]])
        if len(report.check_failures) > MAX_LISTED:
            out.append(f"\n... and {len(report.check_failures) - MAX_LISTED} more in report.json and junit.xml")
        out.append("")
    return out


def _md_baselines(report: RunReport) -> list[str]:
    if not any(e.baseline_bytes is not None for r in report.ranks for e in r.policies):
        return []
    headers, units, rows = baseline_table(report)
    out = ["### Memory baselines per rank", ""]
    out += _md_table(headers, [units] + [[c.text for c in row] for row in rows])
    if len(report.ranks) > RANK_TABLE_MAX:
        out.append(f"\n... and {len(report.ranks) - RANK_TABLE_MAX} more ranks in report.json")
    out += ["", "Each policy is measured from the memory in use when it starts (its baseline). The baseline check "
                "fails when a policy's baseline differs from the rank's first policy's by more than the allocator's "
                "rounding (the units row): one-time setup inside a policy's window would inflate its peak.", ""]
    return out


def correctness_rows(report: Report, cells: Mapping[str, RunReport] | None = None) -> list[list[str]]:
    """Per (cell,) rank x policy that ran the check: the kernels, the first diverging stage and where, the verdict.
    A matrix's rows come from its cells' whole reports in `cells` (its report.json holds their summaries)."""
    runs: list[tuple[str | None, RunReport]] = [(None, report)] if isinstance(report, RunReport) else \
        [(c.name, cells[c.name]) for c in report.cells if cells and c.name in cells]
    rows: list[list[str]] = []
    for cell, run in runs:
        if cell is not None and len(rows) >= MATRIX_ROWS_MAX:
            rows.append([f"... more in {cell}/report.md and the later cells' reports"] + [""] * (len(rows[0]) - 1))
            break
        for rank in run.ranks[:RANK_TABLE_MAX]:
            kernels = rank.kernels.release or rank.kernels.backend if rank.kernels else "-"
            for e in rank.policies:
                if not e.stages:
                    continue
                stage = next((s for s in e.stages if s.stage == e.first_diverging_stage), None)
                where = "-"
                if stage is not None and stage.first_wrong_row is not None:
                    slot = f" (expert {stage.first_wrong_expert}, slot {stage.first_wrong_slot})" \
                        if stage.first_wrong_expert is not None else ""
                    where = f"{stage.first_wrong_row}{slot}"
                wrong = f"{stage.num_rows_wrong} of {stage.num_rows_checked} ({stage.fraction_wrong:.1%})" \
                    if stage is not None else "0"
                check_s = f"{e.check_us / 1e6:.3g}" if e.check_us is not None else "-"
                rows.append(([cell] if cell is not None else []) + [
                    str(rank.rank), e.policy, str(kernels), e.first_diverging_stage or "none", wrong, where, check_s,
                    e.checks.correctness.outcome])
    return rows


def _md_correctness(report: Report, cells: Mapping[str, RunReport]) -> list[str]:
    rows = correctness_rows(report, cells)
    if not rows:
        return []
    lead = ["cell"] if isinstance(report, MatrixReport) else []
    out = ["### Correctness by stage", ""]
    out += _md_table(lead + ["rank", "policy", "kernels", "first diverging stage", "rows wrong",
                             "first wrong row", "check s", "verdict"], rows)
    out += ["", "Each stage of the data path (dispatch, gemm1, activation, quant, gemm2, combine) is checked against "
                "the reference applied to the previous stage's actual output (docs/kernels.md). A release in the "
                "scenario's expect.wrong_kernels passes when it is wrong exactly as stated.", ""]
    return out


def _md_matrix_cells(report: MatrixReport) -> list[str]:
    """The cells that did not pass first, then the others, up to MATRIX_ROWS_MAX."""
    shown = sorted(report.cells, key=lambda c: c.report.exit_code == 0)[:MATRIX_ROWS_MAX]
    passed = sum(1 for c in report.cells if c.report.exit_code == 0)
    out = [f"### Cells ({passed} of {len(report.cells)} passed)", ""]
    out += _md_table(["cell", "status", "exit", "checks passed", "failed", "errors", "reason"],
                     [[c.name, c.report.status, str(c.report.exit_code), str(c.report.checks.num_pass),
                       str(c.report.checks.num_fail), str(c.report.checks.num_error), c.report.exit_reason]
                      for c in shown])
    if len(report.cells) > len(shown):
        out.append(f"\n... and {len(report.cells) - len(shown)} more cells in report.json and the cells' own reports")
    out.append("")
    if report.skipped:
        out += [f"### Skipped combinations ({len(report.skipped)} of {report.num_combinations})", ""]
        out += _md_table(["combination", "reason"], [[s.name, s.reason] for s in report.skipped[:MATRIX_ROWS_MAX]])
        if len(report.skipped) > MATRIX_ROWS_MAX:
            out.append(f"\n... and {len(report.skipped) - MATRIX_ROWS_MAX} more in report.json")
        out.append("")
    return out


def render_markdown(report: Report, cells: Mapping[str, RunReport] | None = None) -> str:
    """report.md: for a Buildkite annotation or a GitHub step summary. `cells`: a matrix's cells' whole reports by
    name, for its per-rank sections (the OOMs, correctness by stage); a cell not in it shows its summary only."""
    cells = cells or {}
    out = [f"## {title_line(report)}", "", "```"]
    out += [f"# {line}" for line in header_lines(report)]
    out += ["```", ""]
    headers, units, aggregations, rows = policy_table(report)
    out += _md_table(headers, [units, aggregations] + [[c.text for c in row] for row in rows])
    out += ["", table_legend(report), ""]
    if isinstance(report, MatrixReport):
        out += _md_matrix_cells(report)
        out += _md_ooms(report, cells)
    else:
        out += _md_ooms(report, cells)
        out += _md_components(report)
        out += _md_baselines(report)
    out += _md_correctness(report, cells)
    out += _md_listing(report)
    out += [checks_line(report), "", f"**{footer_line(report)}**"]
    return "\n".join(out) + "\n"


# ---------------------------------------------------------------------------------------------------------------
# Terminal


def render_summary(report: Report) -> Any:
    """A rich renderable for `harness collect` / `harness run`: header, the policy table, problems, footer."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    parts: list[Any] = [Text(title_line(report), style="bold")]
    parts += [Text(f"# {line}", style="dim") for line in header_lines(report)]
    headers, units, aggregations, rows = policy_table(report)
    table = Table(title_justify="left")
    for header in headers:
        table.add_column(header, justify="left" if header in ("policy", "outcome", "cell", "model") else "right")
    table.add_row(*units, style="dim")
    table.add_row(*aggregations, style="dim")
    for row in rows:
        table.add_row(*(c.text for c in row))
    parts.append(table)
    if isinstance(report, RunReport):
        entries = oom_entries(report)
        parts += [Text(e.line(), style="yellow") for e in entries[:MAX_OOM_ROWS]]
        if len(entries) > MAX_OOM_ROWS:
            parts.append(Text(f"... and {len(entries) - MAX_OOM_ROWS} more distinct OOMs in report.json"))
        parts += [Text(line, style="yellow") for line in component_lines(report)]
    for p in report.problems[:MAX_PROBLEMS_LISTED]:
        parts.append(Text(f"{f'[{p.cell}] ' if p.cell else ''}{p.kind}: {p.cause}", style="red"))
    if len(report.problems) > MAX_PROBLEMS_LISTED:
        parts.append(Text(f"... and {len(report.problems) - MAX_PROBLEMS_LISTED} more problems in report.json"))
    for f in report.check_failures[:MAX_LISTED]:
        where = f"[{f.cell}] " if f.cell else ""
        parts.append(Text(f"{where}rank {f.rank} {f.policy} {f.check} {f.outcome}: {f.message}", style="yellow"))
    if len(report.check_failures) > MAX_LISTED:
        parts.append(Text(f"... and {len(report.check_failures) - MAX_LISTED} more failed checks in report.json"))
    parts.append(Text(footer_line(report), style="bold green" if report.exit_code == 0 else "bold red"))
    return Group(*parts)
