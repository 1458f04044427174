"""Reading the two sides of `harness compare`: report.json files (verified against the records they came from)
or run and matrix directories collected in memory.

What compare trusts is checked by hashing bytes, never by parsing a record again:
    report.json          its content_digest recomputed (a hand edit, the generation kept, is refused)
    its siblings         report.md/junit.xml/report.html/status.json of the same generation, status.json's verdict
    a run's records      run.json and ranks/*: their sha256 is the generation's content part (load.input_hash)
    a matrix             matrix.json's sha256 (MatrixReport.manifest_sha256); per cell, its records as a run's and
                         its own report.json's sha256 (MatrixCell.report_sha256). Only the matrix's report.json is
                         parsed: it holds each cell's summary, all that compare reads.
A cell whose records cannot be told by their bytes (it never ran, or has no run.json) is collected alone in
memory; a matrix whose matrix.json changed, or a report without a digest (an older harness's), is collected
again in memory as a whole, and then its generation must be the report's.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from harness.report.collect import collect
from harness.report.compare_metrics import CompareError
from harness.report.load import MAX_RECORD_BYTES, input_hash, read_contained
from harness.report.model import (
    MatrixCell, MatrixReport, Report, ReportFormatError, RunReport, content_digest, parse_report, with_digest,
)
from harness.report.status import STATUS_FILE, StatusError, read_status
from harness.report.write import file_sha256, output_generations
from harness.scenario.matrix import MATRIX_MANIFEST, MatrixError


@dataclass(frozen=True, kw_only=True)
class LoadedReport:
    """A report and where report.json held NaN or infinity: (cell or None, policy, PolicySummary field)."""

    report: Report
    non_finite: frozenset[tuple[str | None, str, str]] = frozenset()
    non_finite_elsewhere: tuple[str, ...] = ()  # JSON paths of non-finite values outside the policy summaries
    source: str = ""  # "report.json" or "records (collected in memory)"
    # report.json's content_digest: "verified" (it is what collect wrote), "absent" (an older harness's or another
    # writer's report) or "changed" (edited after collect); "" for a report collected in memory.
    digest: Literal["verified", "absent", "changed", ""] = ""


def _strip_non_finite(data: Any, path: tuple[Any, ...], found: list[tuple[Any, ...]]) -> Any:
    """`data` with every NaN/infinity replaced by None, and an aggregate holding one by None as a whole."""
    if isinstance(data, float) and not math.isfinite(data):
        found.append(path)
        return None
    if isinstance(data, dict):
        cleaned = {k: _strip_non_finite(v, (*path, k), found) for k, v in data.items()}
        if {"min", "avg", "max", "num_ranks"} <= set(cleaned) and any(cleaned[k] is None for k in ("min", "avg", "max")):
            return None
        return cleaned
    if isinstance(data, list):
        return [_strip_non_finite(v, (*path, i), found) for i, v in enumerate(data)]
    return data


def _locate_non_finite(data: dict[str, Any], found: list[tuple[Any, ...]]) -> tuple[set[tuple[str | None, str, str]], list[str]]:
    located: set[tuple[str | None, str, str]] = set()
    elsewhere: list[str] = []
    for path in found:
        cell, rest = None, path
        if len(path) > 3 and path[0] == "cells" and path[2] == "report":
            cell, rest = data["cells"][path[1]].get("name"), path[3:]
        if len(rest) >= 3 and rest[0] == "policies":
            summaries = data["policies"] if cell is None else data["cells"][path[1]]["report"]["policies"]
            located.add((cell, str(summaries[rest[1]].get("policy")), str(rest[2])))
        else:
            elsewhere.append("/".join(str(p) for p in path))
    return located, elsewhere


def _parse_report_file(path: Path) -> LoadedReport:
    raw = read_contained(path.parent.resolve(), path, limit=4 * MAX_RECORD_BYTES)
    if isinstance(raw, tuple):
        raise CompareError(f"{path}: {'no such file or directory' if raw[0] == 'missing' else raw[1]}")
    non_finite = False

    def number(text: str) -> float:  # NaN, Infinity, -Infinity, and a literal too large for a float (1e999)
        nonlocal non_finite
        value = float(text)
        non_finite = non_finite or not math.isfinite(value)
        return value

    try:  # json reads NaN and Infinity: they are found below
        data = json.loads(raw.decode("utf-8"), parse_float=number, parse_constant=number)
    except UnicodeDecodeError:
        raise CompareError(f"{path}: corrupt: not UTF-8 text") from None
    except json.JSONDecodeError as exc:
        raise CompareError(f"{path}: corrupt JSON ({exc.msg} at line {exc.lineno})") from None
    except (ValueError, RecursionError) as exc:
        raise CompareError(f"{path}: corrupt JSON ({type(exc).__name__})") from None
    found: list[tuple[Any, ...]] = []
    # Collect writes strict JSON, so the walk (a Python pass over every value) is needed only when there is one.
    cleaned = _strip_non_finite(data, (), found) if non_finite else data
    try:
        report = parse_report(cleaned, where=str(path))
    except ReportFormatError as exc:
        raise CompareError(str(exc)) from None
    located, elsewhere = _locate_non_finite(data, found) if isinstance(data, dict) else (set(), [])
    return LoadedReport(report=report, non_finite=frozenset(located), non_finite_elsewhere=tuple(elsewhere),
                        source="report.json", digest=_digest_state(data))


def _digest_state(data: dict[str, Any]) -> Literal["verified", "absent", "changed"]:
    """Whether report.json's data is what collect wrote: its content_digest recomputed over the rest."""
    written = data.get("content_digest")
    if written is None:
        return "absent"
    try:
        return "verified" if content_digest(data) == written else "changed"
    except (ValueError, TypeError):  # a NaN or infinity: collect writes strict JSON, so an edit put it there
        return "changed"


def _collect_in_memory(directory: Path, *, expected: bool = False, kind: str | None = None) -> Report:
    """The report the records under `directory` give now, nothing written. `expected`: a matrix's cells name the
    sha256 of the report.json collect writes for each, as the matrix report collected from them does. `kind`:
    what report.json says the directory is (a run's records are collected as a run's, run.json missing or not)."""
    from harness.report.matrix import recollect_matrix
    from harness.scenario.matrix import MatrixError

    if kind == "run" or (directory / "run.json").exists() or (directory / "run.json").is_symlink():
        return collect(directory, write=False).report
    try:
        return recollect_matrix(directory, write="expected" if expected else False).report
    except MatrixError as exc:
        raise CompareError(str(exc)) from None


def _check_siblings(directory: Path, loaded: LoadedReport) -> None:
    """report.json and its sibling reports must be one generation."""
    generation = loaded.report.generation
    for name, other in output_generations(directory).items():
        if other is not None and other != generation:
            raise CompareError(f"{directory}: {name} is of generation {other}, report.json of {generation}: a mixed "
                               f"set of outputs; run `harness collect {directory}`")


def _check_status(directory: Path, report: Report) -> None:
    """status.json, when there, must record the verdict report.json holds (CI reads the one, compare the other)."""
    if not (directory / STATUS_FILE).exists():
        return
    try:
        status = read_status(directory)
    except StatusError as exc:
        raise CompareError(str(exc)) from None
    if (status.generation, status.exit_code, status.status, status.kind) != \
            (report.generation, report.exit_code, report.status, report.kind):
        raise CompareError(f"{directory / STATUS_FILE} records exit {status.exit_code} ({status.status}) of generation "
                           f"{status.generation}, report.json exit {report.exit_code} ({report.status}) of "
                           f"{report.generation}: run `harness collect {directory}`")


def _records_unchanged(directory: Path, report: RunReport) -> bool:
    """Whether the records under `directory` are still the ones `report` was collected from, by their bytes alone
    (load.input_hash: no record is parsed); False when that cannot be told cheaply (the caller collects again)."""
    return (directory / "run.json").exists() and report.generation.rpartition("@")[2] == input_hash(directory)[:16]


def _real_dir(path: Path) -> bool:
    return path.is_dir() and not path.is_symlink()


def _cell_report_unchanged(directory: Path, cell: MatrixCell) -> None:
    """The cell's own report.json is still the one collect wrote (when the matrix report names its sha256);
    CompareError naming it otherwise."""
    if cell.report_sha256 is None:
        return
    cell_dir = directory / cell.name
    data = read_contained(directory.resolve(), cell_dir / "report.json", limit=4 * MAX_RECORD_BYTES)
    if not isinstance(data, bytes) or file_sha256(data) != cell.report_sha256:
        what = "its sha256 differs" if isinstance(data, bytes) else data[1]
        raise CompareError(f"{cell_dir / 'report.json'}: not the report the matrix report was collected with ({what}: "
                           f"edited, removed or collected again since): run `harness collect {directory}`")


def _matrix_unchanged(directory: Path, report: MatrixReport) -> bool:
    """Whether matrix.json and every cell's inputs are still what `report` was collected from, by their bytes, one
    cell at a time: its records (load.input_hash against its generation) and its own report.json. A cell that
    cannot be told by its bytes (it never ran, or has no run.json) is collected alone in memory. CompareError
    names a cell whose records or report changed. False: matrix.json changed, or no longer names a cell (the
    caller collects the whole matrix again)."""
    from harness.report.matrix import cells_in_memory, check_cell_name

    if report.manifest_sha256 is not None:
        manifest = read_contained(directory.resolve(), directory / MATRIX_MANIFEST, limit=MAX_RECORD_BYTES)
        if not isinstance(manifest, bytes) or file_sha256(manifest) != report.manifest_sha256:
            return False
    untold: dict[str, MatrixCell] = {}
    try:
        for cell in report.cells:
            cell_dir = directory / check_cell_name(cell.name, str(directory / "report.json"))
            if _real_dir(cell_dir) and (cell_dir / "run.json").exists() and \
                    cell.report.generation.rpartition("@")[2] == input_hash(cell_dir)[:16]:
                _cell_report_unchanged(directory, cell)
            else:
                untold[cell.name] = cell
        collected: set[str] = set()
        for name, fresh in cells_in_memory(directory, untold) if untold else ():
            collected.add(name)
            if fresh.generation != untold[name].report.generation:
                raise CompareError(
                    f"{directory}: report.json is of generation {report.generation} but its records are now another: "
                    f"cell {name} was collected as {untold[name].report.generation} and its records are now "
                    f"{fresh.generation} (changed, deleted or added since it was collected); run `harness collect "
                    f"{directory}`")
            _cell_report_unchanged(directory, untold[name])
    except MatrixError as exc:
        raise CompareError(str(exc)) from None
    return collected == set(untold)


def _verified(directory: Path, loaded: LoadedReport) -> LoadedReport:
    """A directory's report.json, checked before any number or verdict of it is used: one generation with its
    siblings and status.json's verdict, its content digest (an edited report.json is refused), its records' bytes
    (changed records are refused, naming the cell of a matrix), and then the report its records give now, held
    against it whole: a report.json rewritten after collect with its content digest recomputed (a public sha256)
    is refused, so no verdict is taken from report.json where records are present to re-derive it.

    Without records beside it (run.json, matrix.json), report.json is trusted as far as its digest and siblings go
    (docs/reports.md). A report of an older schema version or without a digest is replaced by the records'
    report, once their verdicts agree."""
    _check_siblings(directory, loaded)
    _check_status(directory, loaded.report)
    generation = loaded.report.generation
    if loaded.digest == "changed":
        raise CompareError(f"{directory / 'report.json'}: report.json was changed after collect (its content digest "
                           f"does not match its content): re-run `harness collect {directory}`")
    if not any((directory / n).exists() or (directory / n).is_symlink() for n in ("run.json", "matrix.json", "ranks")):
        return loaded  # no records beside it: trusted as far as its digest and siblings go (docs/reports.md)
    report = loaded.report
    inputs_told = False  # the inputs' bytes are those report.json was collected from
    if loaded.digest == "verified":
        if isinstance(report, MatrixReport) and (directory / MATRIX_MANIFEST).exists():
            inputs_told = _matrix_unchanged(directory, report)  # CompareError naming a changed cell
        elif isinstance(report, RunReport):
            inputs_told = _records_unchanged(directory, report)
    fresh = _collect_in_memory(directory, expected=True, kind=report.kind)
    if isinstance(fresh, MatrixReport) and fresh.generation.rpartition("@")[2] == generation.rpartition("@")[2]:
        # a matrix's run id is its directory's name when collected: a copy elsewhere is the same matrix
        fresh = fresh.model_copy(update={"run_id": report.run_id, "generation": generation})
    if fresh.generation != generation:
        raise CompareError(f"{directory}: report.json is of generation {generation} but its records are now "
                           f"{fresh.generation} (changed, deleted or added since it was collected); run `harness "
                           f"collect {directory}`")
    same_version = report.report_schema_version == fresh.report_schema_version
    if loaded.digest == "verified" and same_version:
        if isinstance(fresh, MatrixReport) and isinstance(report, MatrixReport):
            fresh = fresh.model_copy(update={"manifest_sha256": report.manifest_sha256})  # matrix.json's bytes alone
        if with_digest(fresh).content_digest != report.content_digest:
            raise CompareError(_not_its_records(directory, report, fresh))
        if inputs_told:
            return loaded
    elif (report.status, report.exit_code) != (fresh.status, fresh.exit_code):
        raise CompareError(_not_its_records(directory, report, fresh))
    why = ("its inputs changed in a way their bytes alone do not tell" if loaded.digest == "verified" and same_version
           else "report.json carries no content digest" if loaded.digest != "verified"
           else f"report.json is of schema version {report.report_schema_version}")
    return LoadedReport(report=fresh, source=f"records (collected in memory: {why})")


def _not_its_records(directory: Path, report: Report, fresh: Report) -> str:
    return (f"{directory / 'report.json'}: not the report its records give (it records {report.status}, exit "
            f"{report.exit_code}; its records give {fresh.status}, exit {fresh.exit_code}): rewritten after collect; "
            f"run `harness collect {directory}`")


def verify_directory(directory: Path) -> LoadedReport:
    """The one verification of a run or matrix directory that `harness compare` and `harness status` share: its
    report.json (or, without one, its records collected in memory) with every check `_verified` makes; a
    report.json deleted after collect (its stamped siblings, status.json among them, are still there) is refused.
    CompareError (one line) for anything that fails."""
    directory = Path(directory)
    if (directory / "report.json").exists() or (directory / "report.json").is_symlink():
        return _verified(directory, _parse_report_file(directory / "report.json"))
    left = [name for name, generation in output_generations(directory).items() if generation is not None]
    if left:
        raise CompareError(f"{directory / 'report.json'}: missing, while {left[0]} of generation "
                           f"{output_generations(directory)[left[0]]} that collect wrote with it is here (deleted "
                           f"after collect); run `harness collect {directory}`")
    if _has_records(directory):
        return LoadedReport(report=_collect_in_memory(directory), source="records (collected in memory)")
    raise CompareError(f"{directory}: neither report.json nor run.json nor matrix.json here; run `harness collect "
                       f"{directory}` or give a report.json")


def _has_records(directory: Path) -> bool:
    return any((directory / n).exists() or (directory / n).is_symlink() for n in ("run.json", "matrix.json"))


def load_report(path: Path) -> LoadedReport:
    """A report from a report.json file, a directory holding one (verified against its records and siblings), or
    a run or matrix directory without one (collected in memory, nothing written). A report.json file inside a
    run or matrix directory is that directory's."""
    path = Path(path)
    if path.name == "report.json" and path.is_file() and _has_records(path.parent):
        path = path.parent
    if path.is_dir():
        return verify_directory(path)
    if not path.exists():
        raise CompareError(f"{path}: no such file or directory")
    loaded = _parse_report_file(path)
    if loaded.digest == "changed":
        raise CompareError(f"{path}: report.json was changed after collect (its content digest does not match its "
                           "content): collect its run directory again, or compare the directory")
    return loaded
