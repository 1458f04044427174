"""`harness compare` is a sufficient CI gate: a current run that failed any of its own checks exits 1, naming
them, whatever the baseline says; a baseline that is not a passing run exits 2 in one line unless
--allow-failed-baseline."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from report_records import make_scenario, write_run

from harness.cli import main
from harness.report.collect import collect
from harness.scenario.sections import REPO_DIR

OOM_EXPECTED = {"outcomes": {"legacy": "oom", "fixed": "fit"}, "memory_tolerance_pct": 1.0}


def _run(tmp_path: Path, name: str, overrides=None, **sections) -> Path:
    run_dir = write_run(tmp_path / name, make_scenario(**sections), overrides=overrides)
    collect(run_dir)
    return run_dir


def _compare(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict, str]:
    code = main(["compare", *argv, "--json"])
    captured = capsys.readouterr()
    return code, json.loads(captured.out), captured.err


def _own_checks(data: dict) -> set[tuple[str | None, str, str]]:
    return {(r["cell"], r["policy"], r["metric"]) for r in data["rows"] if r["metric"].startswith("check:")}


def test_a_current_run_that_failed_its_expectation_fails_the_gate(tmp_path: Path, capsys) -> None:
    """legacy expected oom, got fit: collect exits 1, and so must compare, though fit is 'better' than oom."""
    legacy_oom = {r: {"legacy": {"status": "oom"}} for r in range(2)}
    base = _run(tmp_path, "base", overrides=legacy_oom, expect=OOM_EXPECTED)
    cur = _run(tmp_path, "cur", expect=OOM_EXPECTED)
    assert collect(cur, write=False).report.exit_code == 1
    code, data, _ = _compare(capsys, str(base), str(cur))
    assert code == 1 and data["status"] == "FAILED"
    assert _own_checks(data) == {(None, "legacy", "check:expectation")}
    assert "the current run failed its own checks (legacy expectation)" in data["exit_reason"]
    row = next(r for r in data["rows"] if r["metric"] == "check:expectation")
    assert "expected oom, got fit" in row["note"] and "rank(s) 0, 1" in row["note"]
    assert main(["compare", str(base), str(cur)]) == 1
    out = capsys.readouterr().out
    assert "check:expectation" in out and "failed its own checks" in out


@pytest.mark.parametrize(("overrides", "check"), [
    ({0: {"fixed": {"num_wrong_slots": 3}}}, "correctness"),  # wrong dispatch slots
    ({1: {"fixed": {"max_rel_error": 0.5}}}, "correctness"),
    ({0: {"fixed": {"workspace_delta_bytes": -4096}}}, "memory"),  # a negative workspace delta
    ({1: {"fixed": {"baseline_bytes": 1_000_000_001 + 512 * 2**20}}}, "baseline"),  # a shifted baseline
])
def test_every_failed_check_of_the_current_run_fails_the_gate(tmp_path: Path, capsys, overrides, check) -> None:
    base = _run(tmp_path, "base")
    cur = _run(tmp_path, "cur", overrides=overrides)
    assert collect(cur, write=False).report.exit_code == 1
    code, data, _ = _compare(capsys, str(base), str(cur))
    assert code == 1
    assert _own_checks(data) == {(None, "fixed", f"check:{check}")}


def test_a_matrix_cell_that_failed_its_checks_fails_the_gate(tmp_path: Path, capsys) -> None:
    from harness.report.matrix import collect_matrix
    from harness.scenario.matrix import load_matrix

    matrix = load_matrix(REPO_DIR / "scenarios/matrix/cpu-ci.yaml")
    first, second = matrix.cells()
    for name, overrides in (("base", None), ("cur", {1: {"fixed": {"num_wrong_slots": 2}}})):
        for cell in (first, second):
            write_run(tmp_path / name / cell.name, cell.scenario, device_kind="cpu",
                      overrides=overrides if cell is second else None)
        collect_matrix(tmp_path / name, matrix.cells(), matrix=matrix)
    code, data, _ = _compare(capsys, str(tmp_path / "base"), str(tmp_path / "cur"))
    assert code == 1
    assert _own_checks(data) == {(second.name, "fixed", "check:correctness")}
    # a cell the user leaves out is left out of the own checks too
    assert main(["compare", str(tmp_path / "base"), str(tmp_path / "cur"), "--ignore", f"cell:{second.name}"]) == 0
    capsys.readouterr()


def test_a_failed_baseline_is_refused_in_one_line_unless_allowed(tmp_path: Path, capsys) -> None:
    failed = _run(tmp_path, "failed", overrides={0: {"fixed": {"num_wrong_slots": 1}}})
    good = _run(tmp_path, "good")
    assert main(["compare", str(failed), str(good)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("harness: error: the baseline ")
    assert "is not a passing run (FAILED, exit 1: 1 check(s) failed)" in err and "--allow-failed-baseline" in err
    code, data, _ = _compare(capsys, str(failed), str(good), "--allow-failed-baseline")
    assert code == 0 and data["allow_failed_baseline"] is True
    assert any("not a passing run" in w for w in data["warnings"])


@pytest.mark.slow
def test_a_real_run_that_failed_its_expectation_fails_the_gate(tmp_path: Path, capsys) -> None:
    """A real `harness run` (TINY, two CPU ranks) whose scenario expects legacy to OOM: it fits, collect says
    FAILED, and compare (the run against itself, allowed as a baseline) fails on the run's own check."""
    import copy

    import yaml
    from cli_utils import run_cli_inproc
    from scenario_utils import TINY

    data = copy.deepcopy(TINY)
    data["expect"] = {"outcomes": {"legacy": "oom", "fixed": "fit"}}
    (tmp_path / "tiny.yaml").write_text(yaml.safe_dump(data))
    out = tmp_path / "run"
    ran = run_cli_inproc("run", str(tmp_path / "tiny.yaml"), "--out", str(out))
    assert ran.returncode == 1, ran.stdout[-3000:] + ran.stderr[-3000:]
    assert json.loads((out / "report.json").read_text())["status"] == "FAILED"
    assert main(["compare", str(out), str(out)]) == 2
    assert "is not a passing run" in capsys.readouterr().err
    code, data_out, _ = _compare(capsys, str(out), str(out), "--allow-failed-baseline")
    assert code == 1 and (None, "legacy", "check:expectation") in _own_checks(data_out)


def test_the_committed_cpu_baseline_still_passes(capsys) -> None:
    baseline = REPO_DIR / "results/baselines/cpu-smoke"
    assert main(["compare", str(baseline), str(baseline)]) == 0
    capsys.readouterr()
