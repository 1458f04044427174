"""The combined report of a regression matrix: every cell collected (its own reports written), then one report.

harness.scenario.matrix expands a matrix file into cells; harness.launch.run runs them; this module collects them,
goes on past a cell that failed or never ran, and writes one report.json/md/html and junit.xml into MATRIX_DIR.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from harness.core.contract import BUILTIN_POLICIES, builtin_shapes
from harness.report.collect import (
    AGGREGATION,
    EXIT_ERROR,
    EXIT_FAILED,
    EXIT_OK,
    REPORT_SCHEMA_VERSION,
    CollectResult,
    LoadedRun,
    Problem,
    build_report,
    collect,
    write_report,
)
from harness.scenario.matrix import (
    MATRIX_MANIFEST,
    MATRIX_MANIFEST_VERSION,
    Matrix,
    MatrixCell,
    MatrixError,
    display_path,
    jsonable,
    write_matrix_manifest,
)
from harness.scenario.schema import Scenario, parse_scenario


def _planned_contracts(scenario: Scenario) -> dict[str, int]:
    """Contract bytes of the builtin policies, known without running: they stand in for a cell that failed."""
    args = scenario.sizing_args()
    return {p: builtin_shapes(p, args).total_bytes for p in scenario.policies if p in BUILTIN_POLICIES}


def _cell_report(matrix_dir: Path, cell: MatrixCell) -> dict[str, Any]:
    cell_dir = matrix_dir / cell.name
    if cell_dir.is_dir():
        report = collect(cell_dir, scenario_hint=cell.scenario).report
    else:
        missing = Problem(kind="missing-cell", path=f"{cell.name}/",
                          cause=f"cell {cell.name}: no run directory (the cell's run did not start or wrote nothing)")
        loaded = LoadedRun(run_dir=cell_dir, manifest=None, records=(), failures=(), problems=(missing,))
        report = build_report(loaded, scenario_hint=cell.scenario)
    return {"name": cell.name, "dir": f"{cell.name}/", "axis_values": jsonable(cell.axis_values),
            "planned_contracts": _planned_contracts(cell.scenario), **report}


def collect_matrix(matrix_dir: Path, cells: Sequence[MatrixCell], *, matrix: Matrix | None = None) -> CollectResult:
    """Collect every cell (writing its own reports), then write the combined report into `matrix_dir`.

    A cell that failed, ran partly or never ran is reported with its problems; the others are still collected.
    Pass `matrix` to have the skipped combinations and "N of M valid" in the report.
    """
    matrix_dir = Path(matrix_dir)
    matrix_dir.mkdir(parents=True, exist_ok=True)
    write_matrix_manifest(matrix_dir, cells, matrix=matrix)
    cell_reports = [_cell_report(matrix_dir, cell) for cell in cells]
    skipped = [{"name": s.name, "axis_values": jsonable(s.axis_values), "reason": s.reason}
               for s in (matrix.skipped() if matrix else [])]
    report = build_matrix_report(
        cell_reports,
        name=(matrix.name if matrix else None) or matrix_dir.name,
        description=matrix.description if matrix else "",
        path=display_path(matrix.path) if matrix else None,
        axes=jsonable(matrix.axes) if matrix else {},
        skipped=skipped,
        num_combinations=matrix.expansion().num_combinations if matrix else len(cells),
    )
    outputs = write_report(matrix_dir, report)
    return CollectResult(run_dir=matrix_dir, report=report, outputs=outputs)


def recollect_matrix(matrix_dir: Path, *, progress: Callable[[str], None] | None = None) -> CollectResult:
    """`harness collect MATRIX_DIR`: collect again from matrix.json, as `collect_matrix` did after the run.

    `progress` gets one line per cell before it is collected (a cell's reports take about a second).
    """
    path = Path(matrix_dir) / MATRIX_MANIFEST
    try:
        data = json.loads(path.read_text())
        if data.get("schema_version", 0) > MATRIX_MANIFEST_VERSION:
            raise MatrixError(f"{path}: schema version {data['schema_version']} is newer than this harness reads "
                              f"({MATRIX_MANIFEST_VERSION}); upgrade the harness to read it")
        cells = [MatrixCell(name=c["name"], axis_values=c["axis_values"],
                            scenario=parse_scenario(c["scenario"], path=f"{path}[{c['name']}]")) for c in data["cells"]]
    except (OSError, json.JSONDecodeError, KeyError, TypeError) as exc:
        raise MatrixError(f"{path}: cannot read the matrix manifest: {exc}") from None
    skipped = data.get("skipped", [])
    cell_reports = []
    for i, cell in enumerate(cells, 1):
        if progress is not None:
            progress(f"collecting cell {i}/{len(cells)}: {cell.name}")
        cell_reports.append(_cell_report(Path(matrix_dir), cell))
    report = build_matrix_report(
        cell_reports,
        name=data.get("name") or Path(matrix_dir).name,
        description=data.get("description", ""),
        path=data.get("path"),
        axes=data.get("axes", {}),
        skipped=skipped,
        num_combinations=data.get("num_combinations", len(cells) + len(skipped)),
    )
    outputs = write_report(Path(matrix_dir), report)
    return CollectResult(run_dir=Path(matrix_dir), report=report, outputs=outputs)


def build_matrix_report(cell_reports: list[dict[str, Any]], *, name: str, description: str, path: str | None,
                        axes: dict[str, Any], skipped: list[dict[str, Any]], num_combinations: int) -> dict[str, Any]:
    """The combined report: every cell's run report (name, dir, axis values added) plus totals across cells."""
    counts = {f"num_{o}": sum(c["checks"][f"num_{o}"] for c in cell_reports) for o in ("pass", "fail", "skip", "error")}
    problems = [{"cell": c["name"], **p} for c in cell_reports for p in c["problems"]]
    failures = [{"cell": c["name"], **f} for c in cell_reports for f in c["check_failures"]]
    if not cell_reports:
        problems.append({"cell": "", "kind": "no-records", "rank": None, "path": None, "cause": "the matrix has no cells"})
    exit_code = EXIT_ERROR if problems else (EXIT_FAILED if counts["num_fail"] else EXIT_OK)
    cells_failed = [c["name"] for c in cell_reports if c["exit_code"] != EXIT_OK]
    if exit_code == EXIT_OK:
        reason = f"all {len(cell_reports)} cells passed ({counts['num_pass']} checks, {counts['num_skip']} skipped)"
    else:
        reason = (f"{len(cells_failed)} of {len(cell_reports)} cells did not pass ({', '.join(cells_failed)}); "
                  f"{len(problems)} problem(s), {counts['num_fail']} failed check(s)")
    first = next((c for c in cell_reports if c["ranks"]), cell_reports[0] if cell_reports else None)
    hardware = [c["hardware"] for c in cell_reports if c["ranks"]]
    mismatches: dict[str, set[str]] = {}
    versions_seen: dict[str, set[str]] = {}
    for c in cell_reports:
        if not c["ranks"]:
            continue
        for key, value in c["versions"].items():
            versions_seen.setdefault(key, set()).add(str(value))
        for key, values in c["version_mismatches"].items():
            mismatches.setdefault(key, set()).update(values)
    for key, values in versions_seen.items():
        if len(values) > 1:
            mismatches.setdefault(key, set()).update(values)
    return {
        "report_schema_version": REPORT_SCHEMA_VERSION,
        "kind": "matrix",
        "name": name,
        "description": description,
        "path": path,
        "status": "OK" if exit_code == EXIT_OK else "FAILED",
        "exit_code": exit_code,
        "exit_reason": reason,
        "axes": axes,
        "num_combinations": num_combinations,
        "num_valid": len(cell_reports),
        "skipped": skipped,
        "versions": first["versions"] if first else {},
        "version_mismatches": {k: sorted(v) for k, v in sorted(mismatches.items())},
        "hardware": _merge_hardware(hardware),
        "aggregation": dict(AGGREGATION),
        "checks": counts,
        "check_failures": failures,
        "problems": problems,
        "cells": cell_reports,
    }


def _merge_hardware(sections: list[dict[str, Any]]) -> dict[str, Any]:
    """The hardware every cell ran on: devices and nodes united, ranks summed over the cells."""
    if not sections:
        return {}
    totals = [s["device_total_bytes"] for s in sections if s.get("device_total_bytes")]
    return {
        "device_kind": sections[0]["device_kind"],
        "device_names": sorted({n for s in sections for n in s["device_names"]}),
        "device_total_bytes": {"min": min(t["min"] for t in totals), "avg": sum(t["avg"] for t in totals) / len(totals),
                               "max": max(t["max"] for t in totals), "num_ranks": sum(t["num_ranks"] for t in totals)}
        if totals else None,
        "device_capabilities": sorted({c for s in sections for c in s["device_capabilities"]}),
        "num_ranks_expected": sum(s["num_ranks_expected"] or 0 for s in sections),
        "num_ranks_reported": sum(s["num_ranks_reported"] for s in sections),
        "num_rank_failures": sum(s["num_rank_failures"] for s in sections),
        "num_nodes": len({n for s in sections for n in s["nodes"]}),
        "nodes": sorted({n for s in sections for n in s["nodes"]}),
        "launcher": sections[0]["launcher"],
    }
