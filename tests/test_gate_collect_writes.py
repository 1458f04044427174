"""collect writes only into a run or matrix directory, and never over a file it did not write."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.cli import main
from harness.report.collect import collect
from harness.report.write import REPORT_FILES
from report_records import make_scenario, write_run


@pytest.mark.parametrize("where", ["empty", "parent of the runs"])
def test_collect_refuses_a_directory_that_is_not_a_run(tmp_path: Path, capsys, where: str) -> None:
    target = tmp_path / "empty"
    target.mkdir()
    if where == "parent of the runs":
        write_run(tmp_path / "runs" / "a", make_scenario())
        target = tmp_path / "runs"
    before = sorted(p.name for p in target.iterdir())
    assert main(["collect", str(target)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not a run or matrix directory (no run.json or matrix.json)" in err
    assert sorted(p.name for p in target.iterdir()) == before
    assert not any((target / name).exists() for name in REPORT_FILES)


def test_collect_never_overwrites_a_users_own_report(tmp_path: Path, capsys) -> None:
    run_dir = write_run(tmp_path / "run", make_scenario())
    mine = "# my notes on this run\n"
    (run_dir / "report.md").write_text(mine)
    assert main(["collect", str(run_dir)]) == 2
    out = capsys.readouterr().out
    assert "not an output of collect" in " ".join(out.split())
    assert (run_dir / "report.md").read_text() == mine
    assert not (run_dir / "report.json").exists()
    # once it is moved away, collect writes, and its own outputs (stamped) are rewritten on the next collect
    (run_dir / "report.md").rename(tmp_path / "mine.md")
    assert collect(run_dir).exit_code == 0
    assert collect(run_dir).exit_code == 0 and collect(run_dir).write_error is None


def test_collect_in_python_writes_nothing_outside_a_run_directory(tmp_path: Path) -> None:
    result = collect(tmp_path)
    assert result.outputs == () and list(tmp_path.iterdir()) == []
