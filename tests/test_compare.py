"""The regression gate: exit codes 0 / 1 / 2, direction-aware thresholds, exact outcomes, clear errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from report_records import make_scenario, write_run

from harness.cli import main
from harness.report.collect import collect
from harness.report.compare import METRICS, CompareError, compare_metric, compare_reports, load_report, parse_thresholds


def run(tmp_path: Path, name: str, overrides=None, **sections) -> Path:
    run_dir = write_run(tmp_path / name, make_scenario(**sections), overrides=overrides)
    collect(run_dir)
    return run_dir


def compare_json(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict]:
    code = main(["compare", *argv, "--json"])
    return code, json.loads(capsys.readouterr().out)


def test_identical_runs_pass(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base, cur = run(tmp_path, "base"), run(tmp_path, "cur")
    code, data = compare_json(capsys, str(base), str(cur))
    assert code == 0 and data["status"] == "OK" and data["num_regressions"] == 0
    assert data["num_unchanged"] == 2 * (1 + len(METRICS))
    assert main(["compare", str(base), str(cur)]) == 0
    assert "nothing changed beyond its threshold" in capsys.readouterr().out


def test_workspace_growth_is_a_regression(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = run(tmp_path, "base")
    contract_bytes = 2 * 4 * 128 * 128 * 2  # fixed at D=4: common + ws2, both (E, M, 128) bf16
    cur = run(tmp_path, "cur", overrides={0: {"fixed": {"workspace_delta_bytes": int(contract_bytes * 1.5)}}})
    code, data = compare_json(capsys, str(base), str(cur))
    assert code == 1 and data["status"] == "FAILED"
    regressed = {(r["policy"], r["metric"]) for r in data["rows"] if r["verdict"] == "regression"}
    assert regressed == {("fixed", "workspace_delta_avg_bytes"), ("fixed", "workspace_delta_max_bytes")}
    row = next(r for r in data["rows"] if r["metric"] == "workspace_delta_max_bytes" and r["policy"] == "fixed")
    assert row["change_pct"] == pytest.approx((row["current"] - row["baseline"]) / row["baseline"] * 100)
    # the same change passes under a wider memory threshold (a group override)
    assert main(["compare", str(base), str(cur), "--threshold", "memory=60"]) == 0
    # ...and fails again when the one metric is tightened
    assert main(["compare", str(base), str(cur), "--threshold", "memory=60", "--threshold", "workspace_delta_max_bytes=10%"]) == 1
    capsys.readouterr()


def test_fit_to_oom_is_a_regression_and_oom_to_fit_an_improvement(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    fits = run(tmp_path, "fits")
    ooms = run(tmp_path, "ooms", overrides={1: {"legacy": {"status": "oom"}}})
    code, data = compare_json(capsys, str(fits), str(ooms))
    assert code == 1
    outcome = next(r for r in data["rows"] if r["policy"] == "legacy" and r["metric"] == "outcome")
    assert (outcome["baseline"], outcome["current"], outcome["verdict"]) == ("fit", "oom", "regression")
    code, data = compare_json(capsys, str(ooms), str(fits))
    assert code == 0
    outcome = next(r for r in data["rows"] if r["policy"] == "legacy" and r["metric"] == "outcome")
    assert outcome["verdict"] == "improvement"


def test_throughput_direction(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = run(tmp_path, "base")
    slower = run(tmp_path, "slower", overrides={1: {"fixed": {"experts_tflops": 500.0}}})
    quicker = {"fixed": {"experts_tflops": 2000.0, "experts_us": 50.0}}
    faster = run(tmp_path, "faster", overrides={0: quicker, 1: quicker})
    one_rank_faster = run(tmp_path, "one", overrides={1: quicker})
    code, data = compare_json(capsys, str(base), str(slower))
    assert code == 1
    assert [(r["policy"], r["metric"]) for r in data["rows"] if r["verdict"] == "regression"] == [("fixed", "experts_tflops")]
    code, data = compare_json(capsys, str(base), str(faster))
    assert code == 0  # more TFLOP/s and less time are better
    improved = {(r["policy"], r["metric"]) for r in data["rows"] if r["verdict"] == "improvement"}
    assert improved == {("fixed", "experts_tflops"), ("fixed", "experts_us")}
    # one fast rank changes neither the max time nor the min throughput over ranks
    code, data = compare_json(capsys, str(base), str(one_rank_faster))
    assert code == 0 and data["num_improvements"] == 0


def test_compare_metric_rules() -> None:
    memory, error, tflops = METRICS["workspace_delta_avg_bytes"], METRICS["max_error"], METRICS["experts_tflops"]
    assert compare_metric(memory, 100, 102, 2.0)[0] == "unchanged"  # at the threshold: not beyond it
    assert compare_metric(memory, 100, 103, 2.0)[0] == "regression"
    assert compare_metric(memory, 100, 90, 2.0)[0] == "improvement"
    assert compare_metric(tflops, 100.0, 85.0, 10.0)[0] == "regression"
    assert compare_metric(tflops, 100.0, 120.0, 10.0)[0] == "improvement"
    assert compare_metric(error, 0.001, 0.009, 0.01)[0] == "unchanged"  # +800 %, but absolutely small
    assert compare_metric(error, 0.01, 0.03, 0.01)[0] == "regression"
    verdict, pct, _, note = compare_metric(memory, 0, 4096, 2.0)
    assert verdict == "regression" and pct == float("inf") and note == "from zero"
    assert compare_metric(memory, None, 5, 2.0)[0] == "not compared"
    assert compare_metric(METRICS["contract_total_bytes"], 1000, 1001, 0.0)[0] == "regression"  # computed: exact


def test_report_json_files_and_same_name_changed_hash(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = run(tmp_path, "base")
    # same scenario name, one more policy: the hash changes, the comparison goes on with a warning
    cur = run(tmp_path, "cur", policies=["legacy", "fixed", "lower-bound"],
              expect={"outcomes": {"legacy": "fit", "fixed": "fit"}, "memory_tolerance_pct": 1.0})
    code, data = compare_json(capsys, str(base / "report.json"), str(cur / "report.json"))
    assert code == 0
    assert any("changed (hash" in w and "compared by name" in w for w in data["warnings"])
    assert any(r["policy"] == "lower-bound" and r["note"] == "policy not in baseline" for r in data["rows"])


def test_errors_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = run(tmp_path, "base")
    assert main(["compare", str(tmp_path / "missing"), str(base)]) == 2
    assert "no such file or directory" in capsys.readouterr().err

    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["compare", str(base), str(empty)]) == 2
    assert "neither report.json nor run.json" in capsys.readouterr().err

    corrupt = tmp_path / "corrupt.json"
    corrupt.write_text('{"report_schema_version": 1, "kind": "run", "polic')
    assert main(["compare", str(base), str(corrupt)]) == 2
    assert "corrupt JSON" in capsys.readouterr().err

    assert main(["compare", str(base), str(base), "--threshold", "wall_time=5"]) == 2
    err = capsys.readouterr().err
    assert "unknown metric 'wall_time'" in err and "workspace_delta_avg_bytes" in err and "throughput" in err
    assert main(["compare", str(base), str(base), "--threshold", "memory"]) == 2
    assert "expected METRIC=PCT" in capsys.readouterr().err
    assert main(["compare", str(base), str(base), "--threshold", "time=-1"]) == 2
    capsys.readouterr()

    other = write_run(tmp_path / "other", make_scenario(name="another-scenario"))
    code, data = compare_json(capsys, str(base), str(other))  # no report.json yet: collected in memory
    assert code == 2 and "different scenarios" in data["exit_reason"]
    assert not (other / "report.json").exists()


def test_parse_thresholds() -> None:
    thresholds = parse_thresholds(["time=25", "experts_us=5%", "max_error=0.05"])
    assert thresholds["dispatch_us"] == 25.0 and thresholds["combine_us"] == 25.0
    assert thresholds["experts_us"] == 5.0 and thresholds["max_error"] == 0.05
    assert thresholds["workspace_delta_avg_bytes"] == 2.0
    with pytest.raises(CompareError, match="compared exactly"):
        parse_thresholds(["outcome=1"])


def test_run_against_matrix_is_an_error(tmp_path: Path) -> None:
    base = load_report(run(tmp_path, "base"))
    matrix = {"report_schema_version": 1, "kind": "matrix", "cells": []}
    with pytest.raises(CompareError, match="cannot compare a run report"):
        compare_reports(base, matrix)


def test_newer_report_schema_is_an_error(tmp_path: Path) -> None:
    path = run(tmp_path, "base") / "report.json"
    data = json.loads(path.read_text())
    data["report_schema_version"] = 99
    path.write_text(json.dumps(data))
    with pytest.raises(CompareError, match="newer than this harness reads"):
        load_report(path)


def test_matrices_compare_per_cell(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from harness.report.matrix import collect_matrix
    from harness.scenario.matrix import load_matrix
    from harness.scenario.schema import REPO_DIR

    matrix = load_matrix(REPO_DIR / "scenarios/matrix/cpu-ci.yaml")
    first, second = matrix.cells()
    for name, overrides, cells in (("base", None, (first, second)), ("same", None, (first, second)),
                                   ("oom", {0: {"legacy": {"status": "oom"}}}, (first, second)), ("gone", None, (first,))):
        for cell in cells:
            write_run(tmp_path / name / cell.name, cell.scenario, overrides=overrides, device_kind="cpu")
        collect_matrix(tmp_path / name, matrix.cells(), matrix=matrix)
    base = str(tmp_path / "base")
    assert main(["compare", base, str(tmp_path / "same")]) == 0
    capsys.readouterr()
    code, data = compare_json(capsys, base, str(tmp_path / "oom"))
    assert code == 1
    assert {(r["cell"], r["policy"]) for r in data["rows"] if r["verdict"] == "regression"} == {
        (first.name, "legacy"), (second.name, "legacy")}
    # a cell whose run vanished: its results are gone, which must not pass the gate
    code, data = compare_json(capsys, base, str(tmp_path / "gone"))
    assert code == 1
    gone = [r for r in data["rows"] if r["verdict"] == "regression"]
    assert {(r["cell"], r["metric"], r["note"]) for r in gone} == {
        (second.name, "outcome", "no result in current")}
    assert any("has errors" in w for w in data["warnings"])
