"""No finished result is lost: a two-cell matrix killed at every moment of its run (a policy, a cell's collect, the
next cell's launch, the matrix collect; SIGKILL, SIGTERM and Ctrl-C) and resumed each time ends with every cell
that had completed kept as it was. The driver kills itself at a named moment (HARNESS_KILL_AT), so no step races
a timer; each resume is itself killed at the next moment."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from cli_utils import run_harness
from report_records import make_scenario, write_run
from scenario_utils import TINY

from harness.core.killpoints import KILL_ENV, KillSpecError, parse_kill_spec
from harness.launch.rundir import CLAIM_FILE, _clear_dead_run, records_ended
from harness.scenario.schema import parse_scenario

BOUND_S = 2 * parse_scenario(TINY, path="<tiny>").launch.rank_timeout_s


def _matrix_file(tmp_path: Path) -> Path:
    base = {k: v for k, v in TINY.items() if k != "name"}
    path = tmp_path / "tiny-matrix.yaml"
    path.write_text(yaml.safe_dump({"matrix": {"name": "tiny-matrix", "base": base, "axes": {"seed": [0, 1]}}}))
    return path


def _ranks(cell: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted((cell / "ranks").iterdir())}


def _temporaries(out: Path) -> list[str]:
    return sorted(str(p.relative_to(out)) for p in out.rglob(".*.tmp"))


def _step(matrix: Path, out: Path, kill: str | None, *, resume: bool = True) -> tuple[int, str]:
    args = ["run", str(matrix), "--out", str(out)] + (["--resume"] if resume else [])
    result = run_harness(*args, timeout_s=BOUND_S, env={KILL_ENV: kill} if kill else None)
    text = result.stdout + result.stderr
    assert "Traceback" not in text and "Fatal Python error" not in text, text[-3000:]
    return result.returncode, text


def test_a_matrix_killed_at_every_moment_keeps_every_completed_cell(tmp_path: Path) -> None:
    matrix, out = _matrix_file(tmp_path), tmp_path / "out"

    # 1. SIGKILL once the first cell's first policy is on disk: the cell is interrupted, its records not final
    code, _ = _step(matrix, out, "policy-done", resume=False)
    assert code == -9
    first, second = (out / c["name"] for c in json.loads((out / "matrix.json").read_text())["cells"])
    assert (first / "run.json").exists() and not records_ended(first)

    # 2. resumed, and SIGKILLed while the first cell's collect writes report.json: its records are final
    code, text = _step(matrix, out, "write:report.json")
    assert code == -9 and f"cell {first.name}: interrupted; run again (--resume)" in text
    assert records_ended(first) and [t.partition(".report.json.")[0] for t in _temporaries(out)] == [f"{first.name}/"]
    assert (first / CLAIM_FILE).exists() and not (first / "report.json").exists()
    first_ranks, first_run = _ranks(first), (first / "run.json").read_bytes()

    # 3. resumed: the first cell is collected again, never run again; SIGKILL as the second cell launches
    code, text = _step(matrix, out, "launch")
    assert code == -9 and f"cell {first.name}: its records are complete; collected again" in text
    assert _ranks(first) == first_ranks and (first / "run.json").read_bytes() == first_run
    verdict = json.loads((first / "report.json").read_text())["exit_code"]
    assert verdict in (0, 1) and run_harness("status", str(first)).returncode == verdict  # a verdict, not an error
    assert not (first / CLAIM_FILE).exists()
    assert not any(p.name.startswith(".report.json.") for p in first.iterdir())
    first_report = (first / "report.json").read_bytes()
    assert (second / "run.json").exists() and not (second / "ranks").exists()

    # 4. resumed: the second cell runs again; SIGTERM while its collect writes status.json (the last report):
    #    handled as during the launch, one line, exit 143, its temporary and its claim gone
    code, text = _step(matrix, out, "write:status.json,signal=TERM")
    assert code == 143 and "harness: interrupted (SIGTERM)" in text
    assert f"cell {first.name}: already run" in text and (first / "report.json").read_bytes() == first_report
    assert records_ended(second) and _temporaries(out) == [] and not (second / CLAIM_FILE).exists()
    second_ranks = _ranks(second)

    # 5. resumed: the second cell is collected again; Ctrl-C as the matrix collect starts: exit 130, one line
    code, text = _step(matrix, out, "matrix-collect,signal=INT")
    assert code == 130 and text.count("harness: interrupted") == 1
    assert f"--out {out} --resume` finishes the matrix, finished cells kept" in text
    assert f"cell {second.name}: its records are complete; collected again" in text
    assert _ranks(second) == second_ranks and not (out / "status.json").exists()

    # 6. resumed: both cells kept; SIGKILL while the matrix's own report.json is written
    code, text = _step(matrix, out, "write:report.json")
    assert code == -9 and f"cell {second.name}: already run" in text
    assert [t for t in _temporaries(out) if "/" not in t] != [] and not (out / "report.json").exists()

    # 7. resumed to the end: every cell as it completed, the matrix reported, nothing left behind
    code, text = _step(matrix, out, None)
    report = json.loads((out / "report.json").read_text())
    assert code == report["exit_code"] and report["cells"][0]["report"]["exit_code"] == verdict, text[-3000:]
    assert _ranks(first) == first_ranks and (first / "report.json").read_bytes() == first_report
    assert _ranks(second) == second_ranks and _temporaries(out) == []
    assert not list(out.rglob(CLAIM_FILE))
    assert run_harness("status", str(out)).returncode == code  # the second cell's verdict is its own run's
    assert report["cells"][0]["report"]["problems"] == []


def test_a_dead_runs_temporaries_go_with_its_claim_and_final_records_stay(tmp_path: Path) -> None:
    """What _clear_dead_run removes: a partial run's records and every writer's temporaries; a run whose records
    are final keeps them (it is collected again)."""
    run_dir = write_run(tmp_path / "run", make_scenario())
    run_id = json.loads((run_dir / "run.json").read_text())["run_id"]
    strays = [run_dir / ".report.json.abc.tmp", run_dir / ".status.json.x.tmp",
              run_dir / "ranks/.rank-00000.json.q.tmp"]
    for stray in strays:
        stray.write_text("{")
    assert records_ended(run_dir)
    _clear_dead_run(run_dir, run_id)
    assert not any(p.exists() for p in strays)
    assert (run_dir / "run.json").exists() and len(list((run_dir / "ranks").iterdir())) == 2
    # a rank without its final record: the run is not ended, and everything it left is cleared
    (run_dir / "ranks/rank-00001.json").unlink()
    assert not records_ended(run_dir)
    (run_dir / ".report.md.z.tmp").write_text("x")
    _clear_dead_run(run_dir, run_id)
    assert sorted(p.name for p in run_dir.iterdir()) == []


@pytest.mark.parametrize("cause,ended", [("died: exit code 1", True), ("interrupted: the run was stopped", False)])
def test_a_failed_rank_ends_a_run_and_an_interrupted_one_does_not(tmp_path: Path, cause: str, ended: bool) -> None:
    run_dir = write_run(tmp_path / "run", make_scenario(), failed_ranks={1: cause})
    assert records_ended(run_dir) is ended


@pytest.mark.parametrize("text", ["nowhere", "launch,nth=0", "launch,signal=HUP", "write:../x", "launch,x=1"])
def test_a_malformed_kill_hook_is_named(text: str) -> None:
    with pytest.raises(KillSpecError, match=KILL_ENV):
        parse_kill_spec(text)


def test_a_malformed_kill_hook_is_refused_before_the_run(tmp_path: Path) -> None:
    result = run_harness("run", str(_matrix_file(tmp_path)), "--out", str(tmp_path / "o"), env={KILL_ENV: "nowhere"})
    assert result.returncode == 2 and result.stderr.count("\n") == 1 and KILL_ENV in result.stderr
    assert not (tmp_path / "o").exists()


def test_a_single_runs_final_records_are_never_replaced_by_a_run_into_its_out(tmp_path: Path) -> None:
    """A run killed while it collected (its claim left, naming a dead pid) keeps its records: a new run into the
    same --out is refused, pointing at `harness collect`, and the killed writer's temporary is cleared."""
    import socket

    from harness.launch.contract import LaunchError
    from harness.launch.rundir import check_out_dir

    run_dir = write_run(tmp_path / "run", make_scenario())
    run_id = json.loads((run_dir / "run.json").read_text())["run_id"]
    (run_dir / CLAIM_FILE).write_text(f"pid 999999999 on {socket.gethostname()} since 2026-01-01T00:00:00+00:00, "
                                      f"run {run_id}\n")
    (run_dir / ".report.json.k.tmp").write_text("{")
    records = {p.name: p.read_bytes() for p in (run_dir / "ranks").iterdir()}
    with pytest.raises(LaunchError, match="records are complete .*harness collect"):
        check_out_dir(run_dir)
    assert {p.name: p.read_bytes() for p in (run_dir / "ranks").iterdir()} == records
    assert (run_dir / "run.json").exists() and not (run_dir / ".report.json.k.tmp").exists()
    assert not (run_dir / CLAIM_FILE).exists()
