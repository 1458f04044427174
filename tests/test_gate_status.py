"""status.json carries the verdict beside the reports, so CI gets the real 0/1/2 back where a Ray job's own exit
code cannot carry it (`ray job submit` turns 2 into 1): `harness status DIR` exits with the recorded code."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_utils import run_cli_inproc
from report_records import make_scenario, write_run

from harness.cli import main
from harness.report.collect import collect


@pytest.mark.parametrize(("make", "code"), [
    (lambda d: write_run(d, make_scenario()), 0),
    (lambda d: write_run(d, make_scenario(), overrides={0: {"fixed": {"num_wrong_slots": 1}}}), 1),
    (lambda d: write_run(d, make_scenario(), failed_ranks={1: "killed by signal 9"}), 2),
])
def test_status_exits_with_the_recorded_verdict(tmp_path: Path, make, code: int) -> None:
    run_dir = make(tmp_path / "run")
    assert collect(run_dir).exit_code == code
    status = json.loads((run_dir / "status.json").read_text())
    report = json.loads((run_dir / "report.json").read_text())
    assert status == {"schema_version": 1, "record_kind": "status", "kind": "run", "run_id": report["run_id"],
                      "generation": report["generation"], "status": report["status"], "exit_code": code,
                      "exit_reason": report["exit_reason"]}
    result = run_cli_inproc("status", str(run_dir))
    assert result.returncode == code, result.stderr
    assert result.stdout == f"{run_dir}: {report['status']} (exit {code}): {report['exit_reason']}\n"


def test_status_without_or_with_a_stale_status_file_is_an_error(tmp_path: Path, capsys) -> None:
    run_dir = write_run(tmp_path / "run", make_scenario())
    assert main(["status", str(run_dir)]) == 2
    assert "status.json: missing; run `harness collect" in capsys.readouterr().err
    collect(run_dir)
    status = json.loads((run_dir / "status.json").read_text())
    (run_dir / "status.json").write_text(json.dumps(dict(status, generation="other@0")))
    assert main(["status", str(run_dir)]) == 2
    assert "is of generation other@0" in capsys.readouterr().err
    (run_dir / "status.json").write_text(json.dumps(dict(status, exit_code="0")))  # strict: a string is no code
    assert main(["status", str(run_dir)]) == 2
    assert "not a status file: exit_code" in capsys.readouterr().err


def test_compare_reads_the_status_file_too(tmp_path: Path, capsys) -> None:
    base = write_run(tmp_path / "base", make_scenario())
    cur = write_run(tmp_path / "cur", make_scenario(), overrides={0: {"fixed": {"num_wrong_slots": 1}}})
    collect(base), collect(cur)
    status = json.loads((cur / "status.json").read_text())
    (cur / "status.json").write_text(json.dumps(dict(status, exit_code=0, status="OK"), indent=1))
    assert main(["compare", str(base), str(cur)]) == 2
    assert "status.json records exit 0" in capsys.readouterr().err
