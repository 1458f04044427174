"""The combined report of a regression matrix: every cell collected once (its own reports written), then one report.

harness.scenario.matrix expands a matrix file into cells; harness.launch.run runs them and collects each as it
finishes; this module builds the combined report from those cells' typed reports (reading only the cells no call
collected), goes on past a cell that failed or never ran, and writes one report.json/md/html and junit.xml into
MATRIX_DIR. No record is read for it.

The matrix's report.json references its cells rather than embedding them: each MatrixCell holds the cell's
RunSummary (its report less the per-rank entries, which stay in the cell's own report.json) and the sha256 of that
report.json's bytes; the matrix holds the sha256 of matrix.json. compare reads the summaries and checks the cells'
files and records by hashing their bytes (harness.report.compare_load), never parsing a cell's report.
A cell's name becomes a directory under MATRIX_DIR, so one read back from matrix.json must be a safe single path
component: anything else is refused before any file is read or written.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from harness.core.contract import BUILTIN_POLICIES, builtin_shapes
from harness.core.exits import EXIT_ERROR, EXIT_FAILED, EXIT_OK
from harness.report.build import build_report, generation_of
from harness.report.collect import CollectResult, collect, write_outputs
from harness.report.load import MAX_RECORD_BYTES, LoadedRun, read_contained
from harness.report.model import (
    Aggregate,
    CheckCounts,
    HardwareInfo,
    MatrixCell,
    MatrixReport,
    Problem,
    RunReport,
    SkippedCombination,
    dump_json,
    with_digest,
)
from harness.report.write import file_sha256, output_generations
from harness.scenario.matrix import (
    MATRIX_MANIFEST,
    MATRIX_MANIFEST_VERSION,
    Matrix,
    MatrixError,
    display_path,
    jsonable,
    write_matrix_manifest,
)
from harness.scenario.matrix import MatrixCell as ScenarioCell
from harness.scenario.schema import Scenario, ScenarioError, parse_stored_scenario

_SAFE_NAME_RE = re.compile(r"^[A-Za-z0-9._+-]{1,200}$")


def check_cell_name(name: object, where: str) -> str:
    """A cell name that is one safe path component (no separator, not "." or ".."); MatrixError otherwise."""
    if not isinstance(name, str) or not _SAFE_NAME_RE.match(name) or name in (".", ".."):
        raise MatrixError(f"{where}: cell name {str(name)[:80]!r} is not a safe directory name "
                          "(letters, digits, '.', '_', '+', '-'; not '.' or '..')")
    return name


def _planned_contracts(scenario: Scenario) -> dict[str, int]:
    """Contract bytes of the builtin policies, known without running: they stand in for a cell that failed."""
    args = scenario.sizing_args()
    return {p: builtin_shapes(p, args).total_bytes for p in scenario.policies if p in BUILTIN_POLICIES}


def matrix_cell(cell: ScenarioCell, report: RunReport, report_sha256: str | None = None) -> MatrixCell:
    """A cell of the combined report from the cell's collected report (the one its own report.json holds, whose
    bytes hash to `report_sha256`): its summary, without the ranks."""
    name = check_cell_name(cell.name, MATRIX_MANIFEST)
    return MatrixCell(name=name, dir=f"{name}/", axis_values=jsonable(cell.axis_values),
                      planned_contracts=_planned_contracts(cell.scenario), report=report, report_sha256=report_sha256)


def _cell_report(matrix_dir: Path, cell: ScenarioCell, *,
                 write: bool | Literal["stale", "expected"]) -> tuple[RunReport, str | None]:
    """Collect one cell: its whole report and the sha256 of its report.json (None: none written). write="stale":
    write its reports only when they are not what collect writes now (a cell run by an earlier call keeps its
    files; one whose records changed since, whose report.json was edited, or whose reports are missing or of
    another generation gets them rewritten). write="expected": nothing written; the sha256 is that of the
    report.json collect writes from these records (what a matrix report collected from them names)."""
    name = check_cell_name(cell.name, str(matrix_dir / MATRIX_MANIFEST))
    cell_dir = matrix_dir / name
    if not (cell_dir.is_dir() and not cell_dir.is_symlink()):
        what = "is a link, not read" if cell_dir.is_symlink() else "no run directory (the cell's run did not start)"
        missing = Problem(kind="missing-cell", path=f"{name}/", cause=f"cell {name}: {what}")
        loaded = LoadedRun(run_dir=cell_dir, manifest=None, records=(), failures=(), problems=(missing,),
                           input_hash="")
        return build_report(loaded, scenario_hint=cell.scenario), None
    result = collect(cell_dir, scenario_hint=cell.scenario, write=write is True, plots=False)
    report = result.report
    assert isinstance(report, RunReport)
    if write is not True:
        if write not in ("stale", "expected"):
            return report, None
        report = with_digest(report)
        assert isinstance(report, RunReport)
        sha = file_sha256(dump_json(report).encode())
        if write == "expected":
            return report, sha
        on_disk = read_contained(cell_dir.resolve(), cell_dir / "report.json", limit=4 * MAX_RECORD_BYTES)
        if set(output_generations(cell_dir).values()) == {report.generation} and isinstance(on_disk, bytes) \
                and file_sha256(on_disk) == sha:
            return report, sha
        result = write_outputs(cell_dir, report, plots=False)
    return report, result.report_sha256


def _manifest_sha256(matrix_dir: Path) -> str | None:
    raw = read_contained(matrix_dir.resolve(), matrix_dir / MATRIX_MANIFEST, limit=MAX_RECORD_BYTES)
    return file_sha256(raw) if isinstance(raw, bytes) else None


def collect_matrix(matrix_dir: Path, cells: Sequence[ScenarioCell], *, matrix: Matrix | None = None,
                   collected: Mapping[str, CollectResult] | None = None) -> CollectResult:
    """The combined report of every cell, written into `matrix_dir`; each cell collected once.

    `collected` maps a cell's name to what its run already collected and wrote (harness run collects each cell as
    it finishes): that report is used as it is, no record is read again. Any other cell (run by an earlier call,
    or never) is collected here; its own reports are written only when they are missing or not what collect
    writes now. A cell that failed, ran partly or never ran is reported with its problems; the others still are.
    Pass `matrix` to have the skipped combinations and "N of M valid" in the report.
    """
    matrix_dir = Path(matrix_dir)
    matrix_dir.mkdir(parents=True, exist_ok=True)
    write_matrix_manifest(matrix_dir, cells, matrix=matrix)
    collected = collected or {}
    entries: list[MatrixCell] = []
    whole: dict[str, RunReport] = {}
    for cell in cells:
        done = collected.get(cell.name)
        if done is not None and isinstance(done.report, RunReport):
            report, sha = done.report, done.report_sha256
        else:
            report, sha = _cell_report(matrix_dir, cell, write="stale")
        entries.append(matrix_cell(cell, report, sha))
        whole[cell.name] = report
    report = build_matrix_report(
        entries,
        run_id=matrix_dir.name,
        name=(matrix.name if matrix else None) or matrix_dir.name,
        description=matrix.description if matrix else "",
        path=display_path(matrix.path) if matrix else None,
        axes=jsonable(matrix.axes) if matrix else {},
        skipped=[SkippedCombination(name=s.name, axis_values=jsonable(s.axis_values), reason=s.reason)
                 for s in (matrix.skipped() if matrix else [])],
        num_combinations=matrix.expansion().num_combinations if matrix else len(cells),
        manifest_sha256=_manifest_sha256(matrix_dir),
    )
    return write_outputs(matrix_dir, report, cell_reports=whole)


def _read_matrix_manifest(matrix_dir: Path, names: Collection[str] | None = None
                          ) -> tuple[dict[str, Any], list[ScenarioCell], str]:
    """matrix.json's data, its cells (those in `names` only, when given: each scenario is parsed) and the sha256 of
    its bytes; MatrixError (one line) for anything unreadable or unsafe."""
    path = matrix_dir / MATRIX_MANIFEST
    raw = read_contained(matrix_dir.resolve(), path, limit=MAX_RECORD_BYTES)
    if isinstance(raw, tuple):
        raise MatrixError(f"{path}: {raw[1]}")
    try:
        data = json.loads(raw.decode("utf-8"))
        if not isinstance(data, dict):
            raise TypeError("not a JSON object")
        if data.get("schema_version", 0) > MATRIX_MANIFEST_VERSION:
            raise MatrixError(f"{path}: schema version {data['schema_version']} is newer than this harness reads "
                              f"({MATRIX_MANIFEST_VERSION}); upgrade the harness to read it")
        cells = [ScenarioCell(name=check_cell_name(c["name"], str(path)), axis_values=c["axis_values"],
                              scenario=parse_stored_scenario(c["scenario"], path=f"{path}[{c['name']}]"))
                 for c in data["cells"] if names is None or c["name"] in names]
    except MatrixError:
        raise
    except ScenarioError as exc:
        raise MatrixError(str(exc)) from None
    except (UnicodeDecodeError, ValueError, RecursionError, KeyError, TypeError) as exc:
        raise MatrixError(f"{path}: cannot read the matrix manifest: {type(exc).__name__}: {exc}"[:300]) from None
    return data, cells, file_sha256(raw)


def recollect_matrix(matrix_dir: Path, *, write: bool | Literal["expected"] = True,
                     progress: Callable[[str], None] | None = None) -> CollectResult:
    """`harness collect MATRIX_DIR`: collect again from matrix.json, as `collect_matrix` did after the run.

    `progress` gets one line per cell before it is collected (a cell's reports take about a second).
    `write=False` collects in memory and writes nothing (compare's check of a matrix report against its records);
    it then keeps each cell's summary only, so its memory is one cell's records and the summaries.
    `write="expected"` too, with each cell's report_sha256 that of the report.json collect writes for it: the
    matrix report its records give, to be held against the one on disk (harness.report.compare_load).
    """
    matrix_dir = Path(matrix_dir)
    data, cells, manifest_sha256 = _read_matrix_manifest(matrix_dir)
    entries: list[MatrixCell] = []
    whole: dict[str, RunReport] = {}
    for i, cell in enumerate(cells, 1):
        if progress is not None:
            progress(f"collecting cell {i}/{len(cells)}: {cell.name}")
        report, sha = _cell_report(matrix_dir, cell, write=write)
        entries.append(matrix_cell(cell, report, sha))
        if write is True:
            whole[cell.name] = report
    try:
        skipped = [SkippedCombination.model_validate(s) for s in data.get("skipped", [])]
        report = build_matrix_report(
            entries,
            run_id=matrix_dir.name, name=str(data.get("name") or matrix_dir.name),
            description=str(data.get("description") or ""), path=data.get("path"), axes=data.get("axes") or {},
            skipped=skipped, num_combinations=int(data.get("num_combinations", len(cells) + len(skipped))),
            manifest_sha256=manifest_sha256,
        )
    except (ValueError, TypeError) as exc:  # pydantic's ValidationError is a ValueError
        raise MatrixError(f"{matrix_dir / MATRIX_MANIFEST}: cannot read the matrix manifest: "
                          f"{str(exc).splitlines()[0]}") from None
    if write is not True:
        return CollectResult(run_dir=matrix_dir, report=report)
    return write_outputs(matrix_dir, report, cell_reports=whole)


def cells_in_memory(matrix_dir: Path, names: Collection[str]) -> Iterator[tuple[str, RunReport]]:
    """The named cells that matrix.json has, each collected in memory as `harness collect MATRIX_DIR` would collect
    it (its scenario read from matrix.json, read once), nothing written; one cell's records at a time. MatrixError:
    matrix.json unreadable."""
    _, cells, _ = _read_matrix_manifest(Path(matrix_dir), names=set(names))
    for cell in cells:
        yield cell.name, _cell_report(Path(matrix_dir), cell, write=False)[0]


def _matrix_exit(cells: list[MatrixCell], counts: CheckCounts, problems: list[Problem]) -> tuple[int, str]:
    exit_code = EXIT_ERROR if problems else (EXIT_FAILED if counts.num_fail else EXIT_OK)
    if exit_code == EXIT_OK:
        return exit_code, f"all {len(cells)} cells passed ({counts.num_pass} checks, {counts.num_skip} skipped)"
    failed = [c.name for c in cells if c.report.exit_code != EXIT_OK]
    return exit_code, (f"{len(failed)} of {len(cells)} cells did not pass ({', '.join(failed)}); "
                       f"{len(problems)} problem(s), {counts.num_fail} failed check(s)")


def _matrix_versions(cells: list[MatrixCell]) -> tuple[Any, dict[str, list[str]]]:
    """The first cell's versions, and every field on which cells (or ranks within one) disagree."""
    ran = [c.report for c in cells if c.report.hardware.num_ranks_reported and c.report.versions is not None]
    mismatches: dict[str, set[str]] = {}
    for report in ran:
        for key, values in report.version_mismatches.items():
            mismatches.setdefault(key, set()).update(values)
    if ran:
        assert ran[0].versions is not None
        for key in type(ran[0].versions).model_fields:
            seen = {str(getattr(r.versions, key)) for r in ran}
            if len(seen) > 1:
                mismatches.setdefault(key, set()).update(seen)
    return (ran[0].versions if ran else None), {k: sorted(v) for k, v in sorted(mismatches.items())}


def build_matrix_report(cells: list[MatrixCell], *, run_id: str, name: str, description: str, path: str | None,
                        axes: dict[str, Any], skipped: list[SkippedCombination], num_combinations: int,
                        manifest_sha256: str | None = None) -> MatrixReport:
    """The combined report: every cell's run summary plus totals across cells. A cell ran when it has a record
    (hardware.num_ranks_reported: one RankEntry per record in its own report)."""
    counts = CheckCounts()
    for cell in cells:
        counts = counts.plus(cell.report.checks)
    problems = [p.model_copy(update={"cell": c.name}) for c in cells for p in c.report.problems]
    failures = [f.model_copy(update={"cell": c.name}) for c in cells for f in c.report.check_failures]
    if not cells:
        problems.append(Problem(kind="no-records", cell="", cause="the matrix has no cells"))
    exit_code, reason = _matrix_exit(cells, counts, problems)
    versions, mismatches = _matrix_versions(cells)
    digest = hashlib.sha256(json.dumps([c.report.generation for c in cells]).encode()).hexdigest()
    return MatrixReport(
        run_id=run_id, generation=generation_of(run_id, digest), name=name, description=description, path=path,
        status="OK" if exit_code == EXIT_OK else "FAILED", exit_code=exit_code, exit_reason=reason, axes=axes,
        num_combinations=num_combinations, num_valid=len(cells), skipped=skipped, versions=versions,
        version_mismatches=mismatches,
        hardware=_merge_hardware([c.report.hardware for c in cells if c.report.hardware.num_ranks_reported]),
        checks=counts, check_failures=failures, problems=problems, cells=cells, manifest_sha256=manifest_sha256,
    )


def _merge_hardware(sections: list[HardwareInfo]) -> HardwareInfo:
    """The hardware every cell ran on: devices and nodes united, ranks summed over the cells."""
    if not sections:
        return HardwareInfo()
    totals = [s.device_total_bytes for s in sections if s.device_total_bytes is not None]
    nodes = sorted({n for s in sections for n in s.nodes})
    return HardwareInfo(
        device_kind=sections[0].device_kind,
        device_names=sorted({n for s in sections for n in s.device_names}),
        device_total_bytes=Aggregate(min=min(t.min for t in totals), avg=sum(t.avg for t in totals) / len(totals),
                                     max=max(t.max for t in totals), num_ranks=sum(t.num_ranks for t in totals))
        if totals else None,
        device_capabilities=sorted({c for s in sections for c in s.device_capabilities}),
        num_ranks_expected=sum(s.num_ranks_expected or 0 for s in sections),
        num_ranks_reported=sum(s.num_ranks_reported for s in sections),
        num_rank_failures=sum(s.num_rank_failures for s in sections),
        num_nodes=len(nodes), nodes=nodes, launcher=sections[0].launcher,
    )
