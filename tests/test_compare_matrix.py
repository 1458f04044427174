"""compare of collected matrices: the matrix report.json references its cells (their summaries, the sha256 of their
own report.json and of matrix.json), compare reads the summaries and checks every file it trusts by its bytes, and
the result is the one the whole reports (a version-2 report.json embedding every rank) give."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from report_records import rank_record, write_run

from harness.cli import main
from harness.core.records import rank_record_path, write_record
from harness.report.compare import load_report
from harness.report.matrix import collect_matrix
from harness.report.model import content_digest
from harness.report.write import REPORT_FILES
from harness.scenario.matrix import load_matrix
from harness.scenario.sections import REPO_DIR

MATRIX = REPO_DIR / "scenarios/matrix/cpu-ci.yaml"


def _matrix(tmp_path: Path, name: str, *, overrides=None, cells=None) -> Path:
    matrix = load_matrix(MATRIX)
    for cell in cells if cells is not None else matrix.cells():
        write_run(tmp_path / name / cell.name, cell.scenario, overrides=overrides, device_kind="cpu")
    collect_matrix(tmp_path / name, matrix.cells(), matrix=matrix)
    return tmp_path / name


def _compare(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict]:
    code = main(["compare", *argv, "--json"])
    data = json.loads(capsys.readouterr().out)
    return code, {k: v for k, v in data.items() if k not in ("baseline", "current")}


def _error(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    """compare's one-line error (exit 2)."""
    assert main(["compare", *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("harness: error: "), err
    return err


def _as_version_2(matrix_dir: Path) -> None:
    """Rewrite matrix_dir's report.json as a version-2 harness wrote it: every cell's whole report (its own
    report.json's data, ranks and all) embedded, no sha256 of any file, the digest over that."""
    data = json.loads((matrix_dir / "report.json").read_text())
    for cell in data["cells"]:
        if cell.pop("report_sha256") is not None:
            whole = json.loads((matrix_dir / cell["name"] / "report.json").read_text())
            cell["report"] = {**whole, "content_digest": None}
        else:  # never ran: no file; version 2 had its report with no ranks
            cell["report"] = {**cell["report"], "ranks": []}
        cell["report"]["report_schema_version"] = 2
    data.pop("manifest_sha256")
    data["report_schema_version"] = 2
    data.pop("content_digest")
    data["content_digest"] = content_digest(data)
    (matrix_dir / "report.json").write_text(json.dumps(data, indent=1) + "\n")


def test_the_matrix_report_holds_summaries_and_compares_as_the_whole_reports(tmp_path: Path, capsys) -> None:
    base = _matrix(tmp_path, "base")
    cur = _matrix(tmp_path, "cur", overrides={0: {"legacy": {"status": "oom"}}, 1: {"fixed": {"experts_us": 1.0}}})
    data = json.loads((cur / "report.json").read_text())
    assert data["report_schema_version"] == 3 and all("ranks" not in c["report"] for c in data["cells"])
    assert load_report(cur).source == "report.json"  # verified by bytes, then against the report its records give
    code, referenced = _compare(capsys, str(base), str(cur))
    assert code == 1 and referenced["num_regressions"] > 0

    # the records collected in memory (no report.json at all) give the same comparison
    in_memory = {name: tmp_path / f"{name}-records" for name in ("base", "cur")}
    for name, where in in_memory.items():
        shutil.copytree(tmp_path / name, where)
        for output in REPORT_FILES:  # records only: report.json alone deleted is a tampered directory
            (where / output).unlink(missing_ok=True)
    assert load_report(in_memory["cur"]).source == "records (collected in memory)"
    assert _compare(capsys, str(in_memory["base"]), str(in_memory["cur"])) == (code, referenced)

    # and so do version-2 reports, each embedding every cell's whole report (the format this one replaces)
    for name in ("base", "cur"):
        shutil.copytree(tmp_path / name, tmp_path / f"{name}-v2")
        _as_version_2(tmp_path / f"{name}-v2")
    loaded = load_report(tmp_path / "cur-v2")
    assert loaded.source == "records (collected in memory: report.json is of schema version 2)"
    assert _compare(capsys, str(tmp_path / "base-v2"), str(tmp_path / "cur-v2")) == (code, referenced)
    assert _compare(capsys, str(tmp_path / "base-v2"), str(cur)) == (code, referenced)


def test_an_edited_cell_report_is_refused(tmp_path: Path, capsys) -> None:
    base, cur = _matrix(tmp_path, "base"), _matrix(tmp_path, "cur")
    cell = json.loads((cur / "report.json").read_text())["cells"][1]["name"]
    path = cur / cell / "report.json"
    data = json.loads(path.read_text())
    fixed = next(p for p in data["policies"] if p["policy"] == "fixed")
    fixed["workspace_delta_bytes"]["max"] //= 2
    data["content_digest"] = content_digest(data)  # an edit that even recomputes the cell file's own digest
    path.write_text(json.dumps(data, indent=1) + "\n")
    err = _error(capsys, str(base), str(cur))
    assert f"{path}: not the report the matrix report was collected with (its sha256 differs" in err
    assert f"run `harness collect {cur}`" in err
    # collecting the matrix again restores the cell's report from its records, and the gate passes
    assert main(["collect", str(cur)]) == 0
    assert main(["compare", str(base), str(cur)]) == 0
    capsys.readouterr()
    path.unlink()
    assert "not the report the matrix report was collected with (missing" in _error(capsys, str(base), str(cur))


def test_a_changed_record_under_a_cell_is_refused_naming_the_cell(tmp_path: Path, capsys) -> None:
    base, cur = _matrix(tmp_path, "base"), _matrix(tmp_path, "cur")
    first = load_matrix(MATRIX).cells()[0]
    collected_as = json.loads((cur / first.name / "report.json").read_text())["generation"]
    write_record(rank_record_path(cur / first.name, 1),
                 rank_record(first.scenario, 1, run_id=collected_as.partition("@")[0], device_kind="cpu",
                             overrides={"fixed": {"experts_us": 1.0}}))
    err = _error(capsys, str(base), str(cur))
    assert "its records are now another" in err and f"cell {first.name} was collected as {collected_as}" in err


def test_a_changed_matrix_json_collects_the_matrix_again(tmp_path: Path, capsys) -> None:
    base, cur = _matrix(tmp_path, "base"), _matrix(tmp_path, "cur")
    manifest = json.loads((cur / "matrix.json").read_text())
    # the same content in other bytes: the records are collected again in memory, and their generation is the same
    (cur / "matrix.json").write_text(json.dumps(manifest))
    loaded = load_report(cur)
    assert loaded.source.startswith("records (collected in memory: its inputs changed")
    assert main(["compare", str(base), str(cur)]) == 0
    capsys.readouterr()
    # a cell dropped from matrix.json: the matrix is no longer the one report.json was collected from
    (cur / "matrix.json").write_text(json.dumps({**manifest, "cells": manifest["cells"][:1]}))
    assert "its records are now" in _error(capsys, str(base), str(cur))


def test_a_cell_that_never_ran_is_verified_from_the_matrix_report(tmp_path: Path, capsys) -> None:
    first, second = load_matrix(MATRIX).cells()
    base, cur = _matrix(tmp_path, "base"), _matrix(tmp_path, "cur", cells=[first])
    cells = {c["name"]: c for c in json.loads((cur / "report.json").read_text())["cells"]}
    assert cells[second.name]["report_sha256"] is None and cells[first.name]["report_sha256"].startswith("sha256:")
    assert load_report(cur).source == "report.json"
    code, data = _compare(capsys, str(base), str(cur))
    assert code == 1 and {(r["cell"], r["note"]) for r in data["rows"] if r["verdict"] == "regression"} == {
        (second.name, "no result in current")}
    # the cell's records appear after the matrix was collected: its report.json is stale
    write_run(cur / second.name, second.scenario, device_kind="cpu")
    err = _error(capsys, str(base), str(cur))
    assert f"cell {second.name} was collected as" in err and "its records are now another" in err


@pytest.mark.parametrize("name", ["../base", "/tmp", "a/b", ".."])
def test_an_unsafe_cell_name_in_a_matrix_report_is_refused(tmp_path: Path, capsys, name: str) -> None:
    base, cur = _matrix(tmp_path, "base"), _matrix(tmp_path, "cur")
    data = json.loads((cur / "report.json").read_text())
    data["cells"][0]["name"] = name
    data["content_digest"] = content_digest(data)  # a crafted report: even its digest agrees
    (cur / "report.json").write_text(json.dumps(data, indent=1) + "\n")
    assert "is not a safe directory name" in _error(capsys, str(base), str(cur))


def test_the_committed_version_2_matrix_reads_and_collects_again_to_the_same_comparison(tmp_path: Path,
                                                                                         capsys) -> None:
    """results/ keeps matrices collected before the cells were referenced: with their records beside them, the
    report is re-derived from the records once its verdict agrees, and the same records collected again (as
    version 3) compare exactly as they did."""
    committed = REPO_DIR / "results/h200/1xh200-matrix-nightly-releases"
    baseline = REPO_DIR / "results/baselines/h200/1xh200-matrix-nightly-releases"
    loaded = load_report(committed)
    assert loaded.report.report_schema_version == 3
    assert loaded.source == "records (collected in memory: report.json is of schema version 2)"
    code, as_committed = _compare(capsys, str(baseline), str(committed))
    assert code == 0 and as_committed["num_unchanged"] > 0
    again = tmp_path / committed.name  # the matrix's run id is its directory's name
    shutil.copytree(committed, again)
    assert main(["collect", str(again)]) == 0
    capsys.readouterr()
    data = json.loads((again / "report.json").read_text())
    assert data["report_schema_version"] == 3 and data["generation"] == loaded.report.generation
    assert _compare(capsys, str(baseline), str(again)) == (code, as_committed)
