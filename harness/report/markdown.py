"""Renderings of a report dict (harness.report.collect.build_report, harness.report.matrix.build_matrix_report): Markdown, JUnit
XML and the terminal summary. HTML lives in harness.report.html.

Every number shown is formatted here from the report dict, never recomputed, so report.json and each rendering
agree. `policy_table` is the one definition of the per-policy table: fixed columns, a units row and a row naming
the aggregation over ranks (nccl-tests style); Markdown, HTML and the terminal all draw it.
"""

from __future__ import annotations

import datetime
import json
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from typing import Any
from collections.abc import Callable

from harness.core.records import write_text_atomic  # noqa: F401 - collect writes its outputs through it

GIB = 2**30
MAX_LISTED = 50  # failed checks listed in Markdown; junit.xml and report.json hold all of them
MAX_PROBLEMS_LISTED = 200  # problems listed in Markdown/HTML/terminal (a 1024-rank run that died whole stays readable)




# ---------------------------------------------------------------------------------------------------------------
# report.json


def render_json(report: dict[str, Any]) -> str:
    """report.json text: indented like `json.dump(indent=1)`, but one line per rank.

    A 1024-rank report holds ~600k values; indenting each with the pure-Python encoder costs a second, while
    one compact line per rank goes through the C encoder and still diffs well in a committed baseline.
    """
    return _json_text(report, 0, None) + "\n"


_ONE_LINE_PER_ITEM = ("ranks",)


def _json_text(value: Any, level: int, key: str | None) -> str:
    pad, end = " " * (level + 1), " " * level
    if isinstance(value, dict) and value:
        items = [f"{pad}{json.dumps(k)}: {_json_text(v, level + 1, k)}" for k, v in value.items()]
        return "{\n" + ",\n".join(items) + "\n" + end + "}"
    if isinstance(value, list) and value and key in _ONE_LINE_PER_ITEM:
        return "[\n" + ",\n".join(pad + json.dumps(v) for v in value) + "\n" + end + "]"
    if isinstance(value, list) and value:
        return "[\n" + ",\n".join(pad + _json_text(v, level + 1, None) for v in value) + "\n" + end + "]"
    return json.dumps(value)


# ---------------------------------------------------------------------------------------------------------------
# Formatting: bytes are stored, GiB are shown.


MIB = 2**20


def fmt_gib(value: float | int | None) -> str:
    return "n/a" if value is None else f"{value / GIB:.4g}"


def fmt_mib(value: float | int | None) -> str:
    return "n/a" if value is None else f"{value / MIB:.4g}"


def byte_unit(report: dict[str, Any]) -> tuple[str, Callable[[Any], str]]:
    """GiB, or MiB when every contract is below 1 GiB (CPU scenarios): 0.0009766 GiB helps no reader.

    The unit is chosen from the report alone, so it is the same on every rendering, and the units row names it.
    """
    if report["kind"] == "matrix":
        summaries = [p for c in report["cells"] for p in c["policies"]]
    else:
        summaries = report["policies"]
    largest = max((p.get("contract_total_bytes") or 0 for p in summaries), default=0)
    return ("MiB", fmt_mib) if 0 < largest < GIB else ("GiB", fmt_gib)


def fmt_ratio(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}"


def fmt_error(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3g}"


def fmt_us(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1f}"


def fmt_rate(value: float | None) -> str:
    # Four significant digits: 1027 TFLOP/s on an H200 and 0.01234 on a CPU both stay readable.
    return "n/a" if value is None else f"{value:.4g}"


def fmt_int(value: int | None) -> str:
    return "n/a" if value is None else str(value)


def fmt_time(unix_s: float | None) -> str:
    """A timestamp taken from a record, in UTC; never "now", so a second collect writes the same bytes."""
    if unix_s is None:
        return "n/a"
    return datetime.datetime.fromtimestamp(unix_s, tz=datetime.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def resolve_pointer(report: dict[str, Any], pointer: str) -> Any:
    """The value at a JSON pointer ("/policies/0/workspace_delta_bytes/avg"); the HTML test uses it too."""
    value: Any = report
    for part in pointer.strip("/").split("/"):
        value = value[int(part)] if isinstance(value, list) else value[part]
    return value


# ---------------------------------------------------------------------------------------------------------------
# The per-policy table


@dataclass(frozen=True, kw_only=True)
class Column:
    header: str
    unit: str
    aggregation: str  # how ranks are combined: "min", "avg", "max", "count", or "" when the value is per scenario
    key: str  # path under a policy summary, "/"-separated
    fmt: Callable[[Any], str]
    numeric: bool = True


@dataclass(frozen=True, kw_only=True)
class Cell:
    text: str
    pointer: str | None = None  # JSON pointer into the report, for numeric cells
    value: Any = None
    numeric: bool = False  # right-aligned, also when it shows n/a


def policy_columns(report: dict[str, Any]) -> list[Column]:
    method = _memory_method(report)
    unit, fmt_bytes = byte_unit(report)
    measured_unit = {"nvml": f"{unit} NVML", "rss": f"{unit} RSS"}.get(method or "", unit)
    return [
        Column(header="policy", unit="", aggregation="", key="policy", fmt=str, numeric=False),
        Column(header="contract", unit=unit, aggregation="", key="contract_total_bytes", fmt=fmt_bytes),
        Column(header="lower bound", unit=unit, aggregation="", key="lower_bound_bytes", fmt=fmt_bytes),
        Column(header="x fixed", unit="ratio", aggregation="", key="ratio_to_fixed", fmt=fmt_ratio),
        Column(header="ws delta", unit=measured_unit, aggregation="min", key="workspace_delta_bytes/min", fmt=fmt_bytes),
        Column(header="ws delta", unit=measured_unit, aggregation="avg", key="workspace_delta_bytes/avg", fmt=fmt_bytes),
        Column(header="ws delta", unit=measured_unit, aggregation="max", key="workspace_delta_bytes/max", fmt=fmt_bytes),
        Column(header="alloc peak", unit=unit, aggregation="max", key="allocator_allocated_peak_bytes/max", fmt=fmt_bytes),
        Column(header="OOM", unit="ranks", aggregation="count", key="num_oom", fmt=fmt_int),
        Column(header="max error", unit="rel", aggregation="max", key="max_rel_error/max", fmt=fmt_error),
        Column(header="dispatch", unit="us", aggregation="max", key="dispatch_us/max", fmt=fmt_us),
        Column(header="experts", unit="us", aggregation="max", key="experts_us/max", fmt=fmt_us),
        Column(header="combine", unit="us", aggregation="max", key="combine_us/max", fmt=fmt_us),
        Column(header="experts", unit="TFLOP/s", aggregation="min", key="experts_tflops/min", fmt=fmt_rate),
        Column(header="dispatch busbw", unit="GB/s", aggregation="min", key="dispatch_busbw_gbps/min", fmt=fmt_rate),
        Column(header="combine busbw", unit="GB/s", aggregation="min", key="combine_busbw_gbps/min", fmt=fmt_rate),
    ]


MATRIX_LEAD_COLUMNS = ("cell", "model", "D", "E", "T")


def _lookup(summary: dict[str, Any], key: str) -> tuple[bool, Any]:
    value: Any = summary
    for part in key.split("/"):
        if value is None:
            return False, None
        value = value.get(part)
    return value is not None, value


def _summary_row(summary: dict[str, Any], pointer: str, columns: list[Column]) -> list[Cell]:
    row = []
    for column in columns:
        present, value = _lookup(summary, column.key)
        if column.numeric and present:
            row.append(Cell(text=column.fmt(value), pointer=f"{pointer}/{column.key}", value=value, numeric=True))
        else:
            row.append(Cell(text=column.fmt(value) if present else "n/a", numeric=column.numeric))
    return row


def policy_table(report: dict[str, Any]) -> tuple[list[str], list[str], list[str], list[list[Cell]]]:
    """headers, units, aggregations, rows; a matrix report gets leading cell/model/D/E/T columns."""
    columns = policy_columns(report)
    headers = [c.header for c in columns]
    units = [c.unit for c in columns]
    aggregations = [c.aggregation or "-" for c in columns]
    aggregations[0] = "over ranks"
    rows: list[list[Cell]] = []
    if report["kind"] == "matrix":
        headers = list(MATRIX_LEAD_COLUMNS) + headers
        units = ["", "", "", "", ""] + units
        aggregations = ["", "", "", "", ""] + aggregations
        for i, cell in enumerate(report["cells"]):
            s = cell["scenario"]
            lead = [
                Cell(text=cell["name"]),
                Cell(text=str(s.get("model_preset") or f"K={s.get('hidden_size')} I={s.get('intermediate_size')}")),
                Cell(text=fmt_int(s.get("num_dispatchers")), pointer=f"/cells/{i}/scenario/num_dispatchers",
                     value=s.get("num_dispatchers")),
                Cell(text=fmt_int(s.get("num_local_experts")), pointer=f"/cells/{i}/scenario/num_local_experts",
                     value=s.get("num_local_experts")),
                Cell(text=fmt_int(s.get("max_tokens_per_rank")), pointer=f"/cells/{i}/scenario/max_tokens_per_rank",
                     value=s.get("max_tokens_per_rank")),
            ]
            if not cell["policies"]:
                rows.append(lead + [Cell(text=f"no results: {cell['exit_reason']}")] + [Cell(text="") for _ in columns[1:]])
            for j, summary in enumerate(cell["policies"]):
                rows.append(lead + _summary_row(summary, f"/cells/{i}/policies/{j}", columns))
    else:
        for j, summary in enumerate(report["policies"]):
            rows.append(_summary_row(summary, f"/policies/{j}", columns))
    return headers, units, aggregations, rows


def _memory_method(report: dict[str, Any]) -> str | None:
    if report["kind"] == "matrix":
        return next((c["scenario"].get("memory_method") for c in report["cells"] if c["scenario"].get("memory_method")), None)
    return report["scenario"].get("memory_method")


# ---------------------------------------------------------------------------------------------------------------
# Header lines (shared by Markdown, HTML and the terminal)


def _versions_line(versions: dict[str, Any]) -> list[str]:
    names = (("harness", "harness"), ("python", "python"), ("torch", "torch"), ("cuda", "CUDA"), ("nccl", "NCCL"),
             ("driver", "driver"), ("ray", "Ray"))
    first = " | ".join(f"{label} {versions.get(key) or 'n/a'}" for key, label in names)
    second = f"vLLM source: {versions.get('vllm_source') or 'none'} | vLLM kernels: {versions.get('vllm_kernels') or 'none'}"
    return [first, second]


def _hardware_line(hw: dict[str, Any]) -> str:
    if not hw:
        return "hardware: unknown (no records)"
    names = ", ".join(hw.get("device_names") or []) or "unknown device"
    total = hw.get("device_total_bytes")
    memory = f" ({fmt_gib(total['max'])} GiB)" if total else ""
    caps = f", sm {', '.join(hw['device_capabilities'])}" if hw.get("device_capabilities") else ""
    expected = hw.get("num_ranks_expected")
    of = f" of {expected} launched" if expected is not None else ""
    nodes = ", ".join(hw.get("nodes") or [])
    launcher = f"; launcher {hw['launcher']}" if hw.get("launcher") else ""
    return (f"hardware: {hw.get('num_ranks_reported', 0)} rank(s) reported{of} on {hw.get('num_nodes', 0)} node(s) "
            f"[{nodes}]: {names}{memory} ({hw.get('device_kind') or 'n/a'}{caps}){launcher}")


def _shape_line(s: dict[str, Any]) -> str:
    if s.get("hidden_size") is None:
        return f"D={s.get('num_dispatchers')} P={s.get('num_ranks')} (shapes unknown: the scenario could not be parsed)"
    model = s.get("model_preset") or "explicit shapes"
    return (f"model {model}: D={s['num_dispatchers']} P={s['num_ranks']} E={s['num_local_experts']} "
            f"T={s['max_tokens_per_rank']} M={s['M']} K={s['hidden_size']} I={s['intermediate_size']} N={s['N']} "
            f"top_k={s['top_k']} experts={s['num_experts']} {s['workspace_dtype']}; routing {s['routing']}, "
            f"{s['num_tokens_per_dispatcher']} tokens per dispatcher")


def _emulation_line(s: dict[str, Any]) -> str:
    if s.get("emulated"):
        return (f"D={s.get('num_dispatchers')} is EMULATED on P={s.get('num_ranks')} physical rank(s): buffers and "
                "workspaces are sized for D (each GPU's memory equals a real D-rank deployment's); traffic flows among P")
    return f"D={s.get('num_dispatchers')} is real: one physical rank per dispatcher (not emulated)"


def _measurement_line(s: dict[str, Any]) -> str:
    return (f"measurement: {s.get('measurement_method') or 'n/a'}; {s.get('memory_label') or 'no memory measured'}; "
            f"experts backend {s.get('experts_backend') or 'n/a'}; comm {s.get('comm_backend') or 'n/a'}; "
            f"memory tolerance {s.get('memory_tolerance_pct', 'n/a')}%")


def header_lines(report: dict[str, Any]) -> list[str]:
    """The `#` header: versions, hardware, scenario parameters, emulation, measurement method."""
    lines = _versions_line(report.get("versions") or {})
    for name, values in sorted((report.get("version_mismatches") or {}).items()):
        lines.append(f"WARNING: ranks disagree on {name}: {', '.join(values)}")
    lines.append(_hardware_line(report.get("hardware") or {}))
    if report["kind"] == "matrix":
        lines.append(f"matrix: {report['name']} ({report.get('path') or 'inline'}): {report['num_valid']} of "
                     f"{report['num_combinations']} combinations valid, {len(report['cells'])} cell(s) run")
        for key, values in report.get("axes", {}).items():
            lines.append(f"  axis {key}: {', '.join(_short(v) for v in values)}")
        emulated = [c["name"] for c in report["cells"] if c["scenario"].get("emulated")]
        if emulated:
            lines.append(f"D is EMULATED (fewer physical ranks than dispatchers) in: {', '.join(emulated)}")
        return lines
    s = report["scenario"]
    if s.get("name") is None and s.get("hash") is None:
        lines.append("scenario: unknown (no readable run.json and no readable record)")
    else:
        lines.append(f"scenario: {s.get('name')} (hash {s.get('hash')}) {s.get('path') or ''}".rstrip())
    if s.get("num_dispatchers") is not None:
        lines.append(_shape_line(s))
        lines.append(_emulation_line(s))
    lines.append(_measurement_line(s))
    expected = s.get("expected_outcomes")
    if expected:
        lines.append("expected: " + ", ".join(f"{k} {v}" for k, v in expected.items()))
    lines.append(f"run: {report.get('run_id')}; started {fmt_time(report.get('started_at'))}; "
                 f"last rank finished {fmt_time(report.get('finished_at'))}")
    if report.get("scenario_problem"):
        lines.append(f"WARNING: {report['scenario_problem']}")
    return lines


def _short(value: Any) -> str:
    return "[" + ", ".join(map(str, value)) + "]" if isinstance(value, list) else str(value)


def footer_line(report: dict[str, Any]) -> str:
    return f"{report['status']} (exit {report['exit_code']}): {report['exit_reason']}"


def title_line(report: dict[str, Any]) -> str:
    if report["kind"] == "matrix":
        return f"MoE workspace matrix report: {report['name']}"
    return f"MoE workspace report: {report['scenario'].get('name') or report.get('run_id') or 'unknown run'}"


# ---------------------------------------------------------------------------------------------------------------
# Markdown


def _md_escape(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _md_table(headers: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(_md_escape(h) for h in headers) + " |",
             "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(_md_escape(c) for c in row) + " |" for row in rows]
    return lines


def render_markdown(report: dict[str, Any]) -> str:
    """report.md: for a Buildkite annotation or a GitHub step summary."""
    out = [f"## {title_line(report)}", "", "```"]
    out += [f"# {line}" for line in header_lines(report)]
    out += ["```", ""]
    headers, units, aggregations, rows = policy_table(report)
    out += _md_table(headers, [units, aggregations] + [[c.text for c in row] for row in rows])
    out.append("")
    out.append("Row 2 gives the units, row 3 how ranks are aggregated; report.json holds the bytes these are "
               "rendered from. ws delta = measured workspace delta; x fixed = contract / fixed contract.")
    out.append("")

    if report["kind"] == "matrix":
        out += _md_matrix_sections(report)
    problems = report["problems"]
    if problems:
        out += [f"### Problems ({len(problems)})", ""]
        out += _md_table(["kind", "rank", "file", "cause"] if report["kind"] == "run" else ["cell", "kind", "rank", "file", "cause"],
                         [_problem_row(p, report["kind"]) for p in problems[:MAX_PROBLEMS_LISTED]])
        if len(problems) > MAX_PROBLEMS_LISTED:
            out.append(f"\n... and {len(problems) - MAX_PROBLEMS_LISTED} more in report.json and junit.xml")
        out.append("")
    failures = report["check_failures"]
    if failures:
        out += [f"### Failed checks ({len(failures)})", ""]
        shown = failures[:MAX_LISTED]
        lead = ["cell"] if report["kind"] == "matrix" else []
        out += _md_table(lead + ["rank", "policy", "check", "outcome", "message"],
                         [([f["cell"]] if lead else []) + [str(f["rank"]), f["policy"], f["check"], f["outcome"], f["message"]]
                          for f in shown])
        if len(failures) > len(shown):
            out.append(f"\n... and {len(failures) - len(shown)} more in report.json and junit.xml")
        out.append("")
    if report["kind"] == "matrix" and report.get("skipped"):
        out += [f"### Skipped combinations ({len(report['skipped'])} of {report['num_combinations']})", ""]
        out += _md_table(["combination", "reason"], [[s["name"], s["reason"]] for s in report["skipped"]])
        out.append("")
    c = report["checks"]
    out.append(f"checks: {c['num_pass']} passed, {c['num_fail']} failed, {c['num_error']} errors, {c['num_skip']} skipped")
    out.append("")
    out.append(f"**{footer_line(report)}**")
    return "\n".join(out) + "\n"


def _problem_row(p: dict[str, Any], kind: str) -> list[str]:
    row = [p["kind"], "" if p["rank"] is None else str(p["rank"]), p["path"] or "", p["cause"]]
    return ([p.get("cell", "")] + row) if kind == "matrix" else row


def _md_matrix_sections(report: dict[str, Any]) -> list[str]:
    out = ["### Cells", ""]
    out += _md_table(["cell", "status", "exit", "checks passed", "failed", "errors", "reason"],
                     [[c["name"], c["status"], str(c["exit_code"]), str(c["checks"]["num_pass"]), str(c["checks"]["num_fail"]),
                       str(c["checks"]["num_error"]), c["exit_reason"]] for c in report["cells"]])
    out.append("")
    return out


# ---------------------------------------------------------------------------------------------------------------
# JUnit XML


def _suite_counts(suite: ET.Element) -> None:
    cases = suite.findall("testcase")
    suite.set("tests", str(len(cases)))
    suite.set("failures", str(sum(1 for c in cases if c.find("failure") is not None)))
    suite.set("errors", str(sum(1 for c in cases if c.find("error") is not None)))
    suite.set("skipped", str(sum(1 for c in cases if c.find("skipped") is not None)))


def _add_run_cases(suite: ET.Element, report: dict[str, Any], prefix: str) -> None:
    for rank in report["ranks"]:
        for entry in rank["policies"]:
            for check, result in entry["checks"].items():
                case = ET.SubElement(suite, "testcase", classname=f"{prefix}.rank-{rank['rank']:05d}.{entry['policy']}", name=check)
                outcome = result["outcome"]
                if outcome == "fail":
                    ET.SubElement(case, "failure", message=result["message"], type=check).text = result["message"]
                elif outcome == "error":
                    ET.SubElement(case, "error", message=result["message"], type=check).text = result["message"]
                elif outcome == "skip":
                    ET.SubElement(case, "skipped", message=result["message"])
                else:
                    ET.SubElement(case, "system-out").text = result["message"]
    for problem in report["problems"]:
        if problem["kind"] == "policy-error":
            continue  # already an <error> on that rank's checks
        where = f"rank-{problem['rank']:05d}" if problem["rank"] is not None else (problem["path"] or "run")
        case = ET.SubElement(suite, "testcase", classname=f"{prefix}.problems", name=f"{where} {problem['kind']}")
        ET.SubElement(case, "error", message=problem["cause"], type=problem["kind"]).text = problem["cause"]


def render_junit(report: dict[str, Any]) -> str:
    """junit.xml: one testcase per rank x policy x check, and one erroring testcase per problem."""
    root = ET.Element("testsuites", name=title_line(report))
    if report["kind"] == "matrix":
        for cell in report["cells"]:
            suite = ET.SubElement(root, "testsuite", name=cell["name"])
            props = ET.SubElement(suite, "properties")
            ET.SubElement(props, "property", name="scenario_hash", value=str(cell["scenario"].get("hash")))
            _add_run_cases(suite, cell, cell["name"])
            _suite_counts(suite)
    else:
        name = str(report["scenario"].get("name"))
        suite = ET.SubElement(root, "testsuite", name=name)
        props = ET.SubElement(suite, "properties")
        for key in ("hash", "num_dispatchers", "num_ranks", "num_local_experts", "max_tokens_per_rank", "emulated"):
            ET.SubElement(props, "property", name=f"scenario.{key}", value=str(report["scenario"].get(key)))
        ET.SubElement(props, "property", name="run_id", value=str(report.get("run_id")))
        _add_run_cases(suite, report, name)
        _suite_counts(suite)
    for attr in ("tests", "failures", "errors", "skipped"):
        root.set(attr, str(sum(int(s.get(attr, "0")) for s in root.findall("testsuite"))))
    ET.indent(root, space=" ")
    return '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"


# ---------------------------------------------------------------------------------------------------------------
# Terminal


def render_summary(report: dict[str, Any]) -> Any:
    """A rich renderable for `harness collect` / `harness run`: header, the policy table, problems, footer."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    parts: list[Any] = [Text(title_line(report), style="bold")]
    parts += [Text(f"# {line}", style="dim") for line in header_lines(report)]
    headers, units, aggregations, rows = policy_table(report)
    table = Table(title_justify="left")
    for header in headers:
        table.add_column(header, justify="left" if header in ("policy", "cell", "model") else "right")
    table.add_row(*units, style="dim")
    table.add_row(*aggregations, style="dim")
    for row in rows:
        table.add_row(*(c.text for c in row))
    parts.append(table)
    for p in report["problems"][:MAX_PROBLEMS_LISTED]:
        where = f"[{p['cell']}] " if p.get("cell") else ""
        parts.append(Text(f"{where}{p['kind']}: {p['cause']}", style="red"))
    if len(report["problems"]) > MAX_PROBLEMS_LISTED:
        parts.append(Text(f"... and {len(report['problems']) - MAX_PROBLEMS_LISTED} more problems in report.json"))
    for f in report["check_failures"][:MAX_LISTED]:
        where = f"[{f['cell']}] " if f.get("cell") else ""
        parts.append(Text(f"{where}rank {f['rank']} {f['policy']} {f['check']} {f['outcome']}: {f['message']}", style="yellow"))
    if len(report["check_failures"]) > MAX_LISTED:
        parts.append(Text(f"... and {len(report['check_failures']) - MAX_LISTED} more failed checks in report.json"))
    parts.append(Text(footer_line(report), style="bold green" if report["exit_code"] == 0 else "bold red"))
    return Group(*parts)
