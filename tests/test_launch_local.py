"""The local launcher and `harness run`, as subprocesses of the real CLI on real gloo groups (CPU).

Faults come from the launchers' test hook HARNESS_INJECT_FAULT (harness/launch/__init__.py); every run is bounded
by a subprocess timeout and its wall time is asserted against the scenario's bounds.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from launch_helpers import REPO_DIR, harness_env, rank_files, run_cli, tiny_scenario

from harness.cli import main as cli_main
from harness.launch import FAULT_ENV, LaunchError, parse_fault_spec
from harness.core.records import RankFailure, RankRecord, read_record
from harness.launch.run import make_run_id

# Startup of a run on this 2-core machine: the driver's imports, two spawned ranks importing torch, the report.
STARTUP_ALLOWANCE_S = 30.0


# --------------------------------------------------------------------------------------------------------------


def test_default_run_is_smoke_on_cpu_with_a_record_per_rank(tmp_path: Path) -> None:
    out = tmp_path / "run"
    run = run_cli("--launcher", "local", "--out", str(out))
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "no scenario given: running smoke.yaml" in run.stdout
    manifest = read_record(out / "run.json")
    assert manifest.record_kind == "run" and manifest.scenario_name == "smoke" and manifest.launcher == "local"
    assert manifest.num_ranks == 2 and manifest.command[:2] == ["harness", "run"]
    records = rank_files(out)
    assert sorted(records) == [0, 1]
    assert all(isinstance(r, RankRecord) and r.comm_backend == "gloo" for r in records.values())
    assert {r.run_id for r in records.values()} == {manifest.run_id}
    assert (out / "report.json").exists()
    placement = json.loads((out / "launch.json").read_text())
    assert [r["rank"] for r in placement["ranks"]] == [0, 1]
    assert f"results: {out}" in run.stdout
    print(f"local smoke: harness run -> report in {run.wall_s:.1f} s")


def test_killed_rank_ends_the_run_with_a_partial_report(tmp_path: Path) -> None:
    scenario = tiny_scenario(tmp_path, collective_timeout_s=10)
    out = tmp_path / "run"
    run = run_cli(str(scenario), "--out", str(out), env=harness_env(**{FAULT_ENV: "rank=1,kind=die,after=ready"}))
    assert run.returncode == 2, run.stdout[-3000:] + run.stderr[-3000:]
    assert run.wall_s < 10 + STARTUP_ALLOWANCE_S
    failure = rank_files(out)[1]
    assert isinstance(failure, RankFailure)
    assert failure.cause == "died: exit code 1" and failure.node
    assert "rank 1 on" in run.stderr and "died: exit code 1" in run.stderr
    report = (out / "report.json").read_text()
    assert "died: exit code 1" in report
    assert 0 in rank_files(out)  # rank 0 has a record or its own failure, never nothing


def test_hung_rank_is_bounded_and_other_records_are_kept(tmp_path: Path) -> None:
    # The hang comes after rank 1's last collective, so rank 0 finishes: its record must survive the hang.
    scenario = tiny_scenario(tmp_path, collective_timeout_s=5)
    out = tmp_path / "run"
    run = run_cli(str(scenario), "--out", str(out), env=harness_env(**{FAULT_ENV: "rank=1,kind=hang,after=done"}))
    assert run.returncode == 2, run.stdout[-3000:] + run.stderr[-3000:]
    assert run.wall_s < 5 + STARTUP_ALLOWANCE_S
    ranks = rank_files(out)
    assert isinstance(ranks[0], RankRecord)
    assert isinstance(ranks[1], RankFailure) and ranks[1].cause.startswith("hung: no result within")
    assert "collective_timeout_s = 5 s" in ranks[1].detail
    assert "hung: no result within" in (out / "report.json").read_text()


def test_ctrl_c_cleans_up_rank_processes_and_keeps_what_arrived(tmp_path: Path) -> None:
    scenario = tiny_scenario(tmp_path, collective_timeout_s=60)
    out = tmp_path / "run"
    # Rank 1 hangs once it is up, so the run is certainly in flight when the terminal's Ctrl-C arrives.
    proc = subprocess.Popen(
        [sys.executable, "-m", "harness", "run", str(scenario), "--out", str(out)], cwd=REPO_DIR,
        env=harness_env(**{FAULT_ENV: "rank=1,kind=hang,after=ready"}), stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not (out / "launch.json").exists():
            time.sleep(0.2)
        assert (out / "launch.json").exists(), "the run did not start within 60 s"
        time.sleep(5)  # ranks up, rank 1 hanging
        os.killpg(proc.pid, signal.SIGINT)  # what a terminal sends: the driver and every rank get SIGINT
        stdout, stderr = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
    assert proc.returncode == 130, stdout[-2000:] + stderr[-2000:]
    assert "interrupted" in stderr
    pids = [r["pid"] for r in json.loads((out / "launch.json").read_text())["ranks"]]
    time.sleep(0.5)
    alive = [pid for pid in pids if Path(f"/proc/{pid}").exists() and "zombie" not in _proc_state(pid)]
    assert not alive, f"rank processes left running: {alive}"
    ranks = rank_files(out)
    assert sorted(ranks) == [0, 1]
    assert any(isinstance(r, RankFailure) and r.cause.startswith("interrupted") for r in ranks.values())


def _proc_state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/status").read_text().split("State:")[1].splitlines()[0].lower()
    except (OSError, IndexError):
        return "gone (zombie)"


# ---- usage errors and the plan: no ranks are started -----------------------------------------------------------


def test_bad_override_is_a_clear_usage_error(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code = cli_main(["run", "scenarios/smoke.yaml", "--num-ranks", "3", "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert code == 2
    assert "parallel.num_dispatchers (4) must be a multiple of parallel.num_ranks (3)" in err
    assert "--num-ranks" in err and "Traceback" not in err
    assert not (tmp_path / "run").exists()


def test_unknown_policy_override_names_the_allowed_ones(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code = cli_main(["run", "scenarios/smoke.yaml", "--policies", "fixed,bogus", "--dry-run"])
    err = capsys.readouterr().err
    assert code == 2 and "unknown policy 'bogus'" in err and "Traceback" not in err


def test_policies_override_narrows_expectations(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code = cli_main(["run", "scenarios/smoke.yaml", "--policies", "fixed", "--dry-run", "--out", str(tmp_path / "r")])
    assert code == 0, capsys.readouterr().err


def test_dry_run_shows_the_plan_and_the_launch_and_runs_nothing(capsys: pytest.CaptureFixture[str],
                                                               tmp_path: Path) -> None:
    out = tmp_path / "run"
    code = cli_main(["run", "scenarios/smoke.yaml", "--launcher", "ray", "--placement-strategy", "SPREAD",
                     "--dry-run", "--out", str(out)])
    stdout = capsys.readouterr().out
    assert code == 0
    assert "workspace per GPU" in stdout and "legacy" in stdout
    assert "would launch: ray launcher" in stdout and "2 bundles of" in stdout and "SPREAD" in stdout
    assert not out.exists()


def test_unreachable_ray_address_fails_fast(tmp_path: Path) -> None:
    from harness.rank.distributed import free_port

    address = f"127.0.0.1:{free_port()}"  # nothing listens there
    run = run_cli("scenarios/smoke.yaml", "--address", address, "--out", str(tmp_path / "run"), timeout_s=60)
    assert run.returncode == 2
    assert f"cannot reach the Ray cluster's GCS at {address}" in run.stderr and "Traceback" not in run.stderr
    assert run.wall_s < 20
    assert not (tmp_path / "run").exists()


def test_out_dir_holding_a_run_is_refused(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    (tmp_path / "ranks").mkdir()
    code = cli_main(["run", "scenarios/smoke.yaml", "--out", str(tmp_path)])
    assert code == 2 and "already holds a run" in capsys.readouterr().err


def test_malformed_fault_hook_is_refused_before_launch(monkeypatch: pytest.MonkeyPatch,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv(FAULT_ENV, "rank=1,kind=explode")
    assert cli_main(["run", "scenarios/smoke.yaml", "--dry-run"]) == 2
    assert "kind must be die or hang" in capsys.readouterr().err


def test_fault_spec_parsing() -> None:
    spec = parse_fault_spec("rank=3,kind=hang,after=policy:fixed")
    assert spec is not None and spec.rank == 3 and spec.kind == "hang"
    assert spec.matches({"rank": 3, "event": "policy", "policy": "fixed"})
    assert not spec.matches({"rank": 3, "event": "policy", "policy": "legacy"})
    assert parse_fault_spec("rank=0,kind=die").after == "ready"  # type: ignore[union-attr]
    assert parse_fault_spec("") is None
    with pytest.raises(LaunchError, match="rank= and kind= are required"):
        parse_fault_spec("kind=die")


def test_run_id_is_utc_time_and_scenario_name() -> None:
    import datetime

    now = datetime.datetime(2026, 11, 30, 5, 6, 7, tzinfo=datetime.timezone.utc)
    assert make_run_id("smoke", now=now) == "20261130-050607-smoke"


# ---- the launch/ folder ----------------------------------------------------------------------------------------


def test_cluster_config_passes_rays_own_validation() -> None:
    import copy

    import yaml
    from ray.autoscaler._private.util import prepare_config, validate_config

    config = yaml.safe_load((REPO_DIR / "launch" / "cluster.yaml").read_text())
    prepared = prepare_config(copy.deepcopy(config))
    validate_config(prepared)
    assert prepared["provider"]["type"] == "local" and len(prepared["provider"]["worker_ips"]) == config["max_workers"]


def test_job_runtime_env_is_valid_and_keeps_multicast_off() -> None:
    import yaml
    from ray.runtime_env import RuntimeEnv

    from harness.rank.distributed import SAFE_NCCL_ENV

    data = yaml.safe_load((REPO_DIR / "launch" / "runtime_env.yaml").read_text())
    env = RuntimeEnv(**data)
    assert env["env_vars"] == SAFE_NCCL_ENV
    assert "results/" in env["excludes"]


# ---- matrices ----------------------------------------------------------------------------------------------------


def test_matrix_runs_every_cell_past_a_failed_one(tmp_path: Path) -> None:
    # The first cell asks for a GPU backend on a CPU-only machine and cannot run; the second must still run.
    import yaml

    base = yaml.safe_load(tiny_scenario(tmp_path).read_text())
    base.pop("name")
    matrix = tmp_path / "two-cells.yaml"
    matrix.write_text(yaml.safe_dump({"matrix": {
        "name": "two-cells", "base": base, "axes": {"experts_backend": ["torch-cutlass", "reference"]},
    }}, sort_keys=False))
    out = tmp_path / "matrix"
    run = run_cli(str(matrix), "--out", str(out))
    assert run.returncode == 2, run.stdout[-3000:] + run.stderr[-3000:]
    assert "needs GPUs" in run.stderr
    cells = sorted(p for p in out.iterdir() if p.is_dir())
    assert len(cells) == 1, f"only the reference cell runs: {cells}"
    assert sorted(rank_files(cells[0])) == [0, 1]
    report = json.loads((out / "report.json").read_text())
    assert len(json.dumps(report)) > 0 and (out / "junit.xml").exists()
