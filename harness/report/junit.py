"""junit.xml of a typed report: one testcase per rank x policy x check (its OOM, when it had one, with the
expectation check), one erroring testcase per problem; suites and cases carry `time` in seconds."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections.abc import Mapping
from typing import Any

from harness.report.evidence import oom_entries
from harness.report.markdown import title_line
from harness.report.model import MatrixReport, Report, RunReport, RunSummary


def _suite_counts(suite: ET.Element) -> None:
    cases = suite.findall("testcase")
    suite.set("tests", str(len(cases)))
    suite.set("failures", str(sum(1 for c in cases if c.find("failure") is not None)))
    suite.set("errors", str(sum(1 for c in cases if c.find("error") is not None)))
    suite.set("skipped", str(sum(1 for c in cases if c.find("skipped") is not None)))


def _case_time(entry: Any, check: str) -> str:
    """A testcase's seconds: the correctness check's own time, the policy's measured stage medians for the others
    (what the record keeps; 0 when it has none)."""
    if check == "correctness" and entry.check_us is not None:
        return f"{entry.check_us / 1e6:.6f}"
    stages = [t for t in (entry.dispatch_us, entry.experts_us, entry.combine_us) if t is not None]
    return f"{sum(stages) / 1e6:.6f}" if check == "expectation" and stages else "0"


def _add_run_cases(suite: ET.Element, report: RunSummary, prefix: str) -> None:
    """The rank x policy x check cases of a whole report (a summary has none), then one case per problem."""
    ranks = report.ranks if isinstance(report, RunReport) else []
    ooms = (
        {(r, e.policy): e.line() for e in oom_entries(report) for r in e.ranks}
        if isinstance(report, RunReport) and ranks
        else {}
    )
    for rank in ranks:
        for entry in rank.policies:
            oom = ooms.get((rank.rank, entry.policy))
            for check, result in entry.checks.items():
                case = ET.SubElement(
                    suite,
                    "testcase",
                    classname=f"{prefix}.rank-{rank.rank:05d}.{entry.policy}",
                    name=check,
                    time=_case_time(entry, check),
                )
                # The OOM itself (message, stage, bytes asked for, budget) goes with the expectation check, where a
                # CI page shows it whether the OOM was expected or not.
                text = f"{result.message}\n{oom}" if oom and check == "expectation" else result.message
                if result.outcome == "fail":
                    ET.SubElement(case, "failure", message=result.message, type=check).text = text
                elif result.outcome == "error":
                    ET.SubElement(case, "error", message=result.message, type=check).text = text
                elif result.outcome == "skip":
                    ET.SubElement(case, "skipped", message=result.message)
                else:
                    ET.SubElement(case, "system-out").text = text
    for problem in report.problems:
        if problem.kind == "policy-error":
            continue  # already an <error> on that rank's checks
        where = f"rank-{problem.rank:05d}" if problem.rank is not None else (problem.path or "run")
        case = ET.SubElement(
            suite, "testcase", classname=f"{prefix}.problems", name=f"{where} {problem.kind}", time="0"
        )
        ET.SubElement(case, "error", message=problem.cause, type=problem.kind).text = problem.cause


def _properties(suite: ET.Element, values: dict[str, Any]) -> None:
    props = ET.SubElement(suite, "properties")
    for name, value in values.items():
        ET.SubElement(props, "property", name=name, value=str(value))


def _run_seconds(report: RunSummary) -> str:
    """The run's wall time from its manifest and records (never "now", so a second collect writes the same bytes)."""
    if report.started_at is None or report.finished_at is None:
        return "0"
    return f"{max(0.0, report.finished_at - report.started_at):.3f}"


def render_junit(report: Report, cells: Mapping[str, RunReport] | None = None) -> str:
    """junit.xml: one testcase per rank x policy x check, and one erroring testcase per problem. A matrix's cases
    come from its cells' whole reports in `cells` (by name); a cell not in it has its problems' cases only."""
    root = ET.Element("testsuites", name=title_line(report))
    if isinstance(report, MatrixReport):
        for cell in report.cells:
            suite = ET.SubElement(root, "testsuite", name=cell.name, time=_run_seconds(cell.report))
            _properties(
                suite,
                {
                    "generation": report.generation,
                    "cell_generation": cell.report.generation,
                    "scenario_hash": cell.report.scenario.hash,
                },
            )
            _add_run_cases(suite, (cells or {}).get(cell.name, cell.report), cell.name)
            _suite_counts(suite)
    else:
        s = report.scenario
        suite = ET.SubElement(root, "testsuite", name=str(s.name), time=_run_seconds(report))
        _properties(
            suite,
            {
                "generation": report.generation,
                "scenario.hash": s.hash,
                "memory.budget_bytes": s.memory_budget_bytes,
                "memory.ballast_bytes": s.ballast_bytes,
                "scenario.num_dispatchers": s.num_dispatchers,
                "scenario.num_ranks": s.num_ranks,
                "scenario.num_local_experts": s.num_local_experts,
                "scenario.max_tokens_per_rank": s.max_tokens_per_rank,
                "scenario.emulated": s.emulated,
                "run_id": report.run_id,
            },
        )
        _add_run_cases(suite, report, str(s.name))
        _suite_counts(suite)
    for attr in ("tests", "failures", "errors", "skipped"):
        root.set(attr, str(sum(int(s.get(attr, "0")) for s in root.findall("testsuite"))))
    root.set("time", f"{sum(float(s.get('time', '0')) for s in root.findall('testsuite')):.3f}")
    ET.indent(root, space=" ")
    return '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"
