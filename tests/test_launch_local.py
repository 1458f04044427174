"""The local launcher and `harness run`, as subprocesses of the real CLI on real gloo groups (CPU).

Faults come from the launchers' test hook HARNESS_INJECT_FAULT (harness/launch/faults.py); every run is bounded
by a subprocess timeout and its wall time is asserted against the scenario's bounds.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel
from rich.console import Console

from cli_utils import run_cli_inproc
from harness.cli import main as cli_main
from harness.core.events import PolicyDone, PolicyStarted, Ready
from harness.core.records import rank_record_path, read_record
from harness.launch import FAULT_ENV, LaunchError, parse_fault_spec
from harness.launch.local import TERMINATE_GRACE_S, LocalLauncher
from harness.launch.run import RanksRequest, run_ranks
from harness.launch.rundir import make_run_id
from launch_helpers import REPO_DIR, cpu_load, harness_env, rank_files, report_policies, run_cli, tiny_scenario
from scenario_utils import tiny
from verdicts import collected_checks

# Bounds are the scenario's own (launch.collective_timeout_s) or the launcher's (TERMINATE_GRACE_S) plus this
# margin for the driver itself on a loaded 2-core machine: its 0.2 s poll, reading a pipe, writing a record,
# and the scheduler's delays with a second CPU-heavy process beside it.
DRIVER_MARGIN_S = 10.0


# --------------------------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_default_run_is_smoke_on_cpu_with_a_record_per_rank(smoke_run) -> None:
    run, out = smoke_run, smoke_run.out  # `harness run --launcher local --out OUT` (tests/conftest.py)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "no scenario given: running smoke.yaml" in run.stdout
    manifest = read_record(out / "run.json")
    assert manifest.record_kind == "run" and manifest.scenario_name == "smoke" and manifest.launcher == "local"
    # The recorded command is the one that ran, every option set (here --launcher and --out) included.
    assert manifest.num_ranks == 2 and manifest.command == ["harness", "run", "--launcher", "local", "--out", str(out)]
    assert run.command == manifest.command
    files = rank_files(out)
    assert sorted(files.records) == [0, 1] and not files.failures
    records = files.records.values()
    assert all(r.comm_backend == "gloo" and r.complete and r.warmup == "full" for r in records)
    assert {r.run_id for r in records} == {manifest.run_id}
    for record in records:
        # Every policy measured from the same warmed state: baselines within the rounding the record states.
        memories = [p.memory for p in record.policies if p.memory is not None]
        assert len(memories) == len(record.policies)
        baselines = [m.baseline_bytes for m in memories]
        rounding = memories[0].allocator_rounding_bytes
        assert rounding is not None and max(baselines) - min(baselines) <= rounding, (baselines, rounding)
        for policy in record.policies:
            t = policy.timings
            assert t is not None and t.experts_min_us is not None and t.experts_max_us is not None
            assert t.dispatch_min_us is not None and t.dispatch_max_us is not None
            assert t.experts_min_us <= t.experts_us <= t.experts_max_us
            assert t.dispatch_min_us <= t.dispatch_us <= t.dispatch_max_us
    assert (out / "report.json").exists()
    placement = json.loads((out / "launch.json").read_text())
    assert [r["rank"] for r in placement["ranks"]] == [0, 1]
    assert f"results: {out}" in run.stdout
    print(f"local smoke: harness run -> report in {run.wall_s:.1f} s")


@pytest.mark.slow
def test_rank_killed_after_its_first_policy_keeps_both_ranks_first_results(tmp_path: Path) -> None:
    # The smoke run through the real CLI; rank 1 dies (os._exit) the moment its record so far for legacy is sent.
    out = tmp_path / "run"
    run = run_cli(
        "scenarios/smoke.yaml",
        "--out",
        str(out),
        env=harness_env(**{FAULT_ENV: "rank=1,kind=die,after=policy-done:legacy"}),
    )
    assert run.returncode == 2, run.stdout[-3000:] + run.stderr[-3000:]
    assert "harness: rank 1 on" in run.stderr and "died: exit code 1" in run.stderr
    assert "finished: legacy (kept in its record); lost: fixed, lower-bound" in run.stderr
    files = rank_files(out)
    checks = collected_checks(out)
    for rank in (0, 1):  # both ranks' legacy results survive, in records marked as records so far
        record = files.records[rank]
        assert not record.complete and [p.policy for p in record.policies] == ["legacy"]
        assert record.policies[0].status == "ok" and checks[rank, "legacy"].correctness.outcome == "pass"
    dead = files.failures[1]
    assert dead.cause == "died: exit code 1"  # told by its exit, not by a timeout
    assert dead.finished_policies == ["legacy"] and dead.lost_policies == ["fixed", "lower-bound"]
    # Rank 0's next collective failed on the closed connection: its own failure names the same loss.
    survivor = files.failures[0]
    assert survivor.cause.startswith("error: ") and survivor.lost_policies == ["fixed", "lower-bound"]
    shown = report_policies(out)
    assert shown[0]["legacy"] == "ok" and shown[1]["legacy"] == "ok"
    assert "died: exit code 1" in (out / "report.json").read_text()


@pytest.mark.slow
def test_killed_rank_is_dead_not_hung_on_a_loaded_machine(tmp_path: Path) -> None:
    scenario = tiny_scenario(tmp_path, collective_timeout_s=10)
    out = tmp_path / "run"
    with cpu_load():
        run = run_cli(str(scenario), "--out", str(out), env=harness_env(**{FAULT_ENV: "rank=1,kind=die,after=ready"}))
    assert run.returncode == 2, run.stdout[-3000:] + run.stderr[-3000:]
    files = rank_files(out)
    failure = files.failures[1]
    assert failure.cause == "died: exit code 1" and failure.node
    assert failure.finished_policies == [] and failure.lost_policies == ["legacy", "fixed"]
    assert "rank 1 on" in run.stderr and "died: exit code 1" in run.stderr
    assert "died: exit code 1" in (out / "report.json").read_text()
    assert 0 in files.ranks  # rank 0 has a record or its own failure, never nothing


@pytest.mark.slow
def test_hung_rank_is_bounded_by_the_collective_timeout_and_other_records_are_kept(tmp_path: Path) -> None:
    # The hang comes after rank 1's last collective, so rank 0 finishes: its record must survive the hang.
    timeout_s = 5.0
    scenario = tiny_scenario(tmp_path, collective_timeout_s=timeout_s)
    out = tmp_path / "run"
    with cpu_load():
        run = run_cli(str(scenario), "--out", str(out), env=harness_env(**{FAULT_ENV: "rank=1,kind=hang,after=done"}))
    assert run.returncode == 2, run.stdout[-3000:] + run.stderr[-3000:]
    files = rank_files(out)
    finished = files.records[0]
    assert finished.complete and not files.failures.get(0)
    hung = files.failures[1]
    assert hung.cause.startswith("hung: no result within") and f"collective_timeout_s = {timeout_s:g} s" in hung.detail
    # Rank 1's record so far holds both policies (it hung after them); nothing was lost.
    assert [p.policy for p in files.records[1].policies] == ["legacy", "fixed"] and hung.lost_policies == []
    # The driver waited collective_timeout_s after rank 0's record, and not much longer.
    waited_s = hung.at - finished.finished_at
    assert timeout_s <= waited_s <= timeout_s + DRIVER_MARGIN_S, waited_s
    assert "hung: no result within" in (out / "report.json").read_text()


def _start_run(scenario: Path, out: Path, fault: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "harness", "run", str(scenario), "--out", str(out)],
        cwd=REPO_DIR,
        env=harness_env(**{FAULT_ENV: fault}),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def _wait_for(paths: list[Path], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and not all(p.exists() for p in paths):
        time.sleep(0.2)
    assert all(p.exists() for p in paths), f"not written within {timeout_s:g} s: {[p for p in paths if not p.exists()]}"


@pytest.mark.slow
def test_ctrl_c_cleans_up_rank_processes_and_keeps_what_arrived(tmp_path: Path) -> None:
    scenario = tiny_scenario(tmp_path, collective_timeout_s=60)
    out = tmp_path / "run"
    # Rank 1 hangs once it is up, so the run is certainly in flight when the terminal's Ctrl-C arrives.
    proc = _start_run(scenario, out, "rank=1,kind=hang,after=ready")
    try:
        _wait_for([out / "launch.json"], 60)
        time.sleep(5)  # ranks up, rank 1 hanging
        os.killpg(proc.pid, signal.SIGINT)  # what a terminal sends: the driver and every rank get SIGINT
        stdout, stderr = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
    assert proc.returncode == 130, stdout[-2000:] + stderr[-2000:]
    assert stderr.count("harness: interrupted") == 1, stderr
    # Only the driver takes the Ctrl-C: no rank prints Python's traceback or torch's C++ backtrace.
    for trace in ("Traceback", "frame #", "c10::", "terminate called", "KeyboardInterrupt"):
        assert trace not in stdout + stderr, (trace, stderr[-3000:])
    pids = [r["pid"] for r in json.loads((out / "launch.json").read_text())["ranks"]]
    alive = [pid for pid in pids if _alive(pid)]
    assert not alive, f"rank processes left running: {alive}"
    files = rank_files(out)
    assert files.ranks == [0, 1]
    assert any(f.cause.startswith("interrupted") for f in files.failures.values())


@pytest.mark.slow
def test_sigterm_to_the_driver_is_handled_like_ctrl_c(tmp_path: Path) -> None:
    scenario = tiny_scenario(tmp_path, collective_timeout_s=60)
    out = tmp_path / "run"
    # Rank 1 hangs after legacy, so both ranks have sent legacy's record so far and rank 0 waits in fixed.
    proc = _start_run(scenario, out, "rank=1,kind=hang,after=policy-done:legacy")
    try:
        _wait_for([rank_record_path(out, 0), rank_record_path(out, 1)], 120)
        started = time.monotonic()
        proc.send_signal(signal.SIGTERM)  # to the driver alone, as a CI runner or `kill` does
        stdout, stderr = proc.communicate(timeout=TERMINATE_GRACE_S + 30)
        stop_s = time.monotonic() - started
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
    assert proc.returncode == 128 + signal.SIGTERM, stdout[-2000:] + stderr[-2000:]
    assert stderr.count("harness: interrupted") == 1 and "(SIGTERM)" in stderr, stderr
    # The driver stops its ranks within the launcher's grace (SIGTERM, then SIGKILL), plus the driver's margin.
    assert stop_s <= TERMINATE_GRACE_S + DRIVER_MARGIN_S, stop_s
    pids = [r["pid"] for r in json.loads((out / "launch.json").read_text())["ranks"]]
    assert not [pid for pid in pids if _alive(pid)], "rank processes left running"
    files = rank_files(out)
    for rank in (0, 1):
        assert [p.policy for p in files.records[rank].policies] == ["legacy"]
        failure = files.failures[rank]
        assert failure.cause.startswith("interrupted")
        assert failure.finished_policies == ["legacy"] and failure.lost_policies == ["fixed"]


def _alive(pid: int, wait_s: float = 2.0) -> bool:
    """Whether the process still runs (a zombie has ended), after up to wait_s for it to go."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            state = Path(f"/proc/{pid}/status").read_text().split("State:")[1].split()[0]
        except (OSError, IndexError):
            return False
        if state == "Z":
            return False
        if time.monotonic() >= deadline:
            return True
        time.sleep(0.1)


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
    """smoke expects an outcome of each of its three policies; `--policies` keeps only the expectations of the
    policies it keeps, so a run of fewer policies is not failed for the ones it left out."""
    from harness.launch.overrides import ScenarioOverrides, load_with_overrides

    smoke = REPO_DIR / "scenarios" / "smoke.yaml"
    assert load_with_overrides(smoke, {}).expect.outcomes == {"legacy": "fit", "fixed": "fit", "lower-bound": "fit"}
    narrowed = load_with_overrides(smoke, ScenarioOverrides(policies="fixed").dotted())
    assert narrowed.policies == ["fixed"] and narrowed.expect.outcomes == {"fixed": "fit"}
    two = load_with_overrides(smoke, ScenarioOverrides(policies="lower-bound, legacy").dotted())
    assert two.policies == ["lower-bound", "legacy"] and two.expect.outcomes == {"legacy": "fit", "lower-bound": "fit"}
    assert narrowed.expect.max_error == two.expect.max_error == 0.06  # the other expectations stay as they were
    # The command takes it: a dry run of the narrowed scenario plans and launches nothing.
    code = cli_main(["run", "scenarios/smoke.yaml", "--policies", "fixed", "--dry-run", "--out", str(tmp_path / "r")])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert "would launch: local launcher" in captured.out and not (tmp_path / "r").exists()


def test_dry_run_shows_the_plan_and_the_launch_and_runs_nothing(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    out = tmp_path / "run"
    code = cli_main(
        [
            "run",
            "scenarios/smoke.yaml",
            "--launcher",
            "ray",
            "--placement-strategy",
            "SPREAD",
            "--dry-run",
            "--out",
            str(out),
        ]
    )
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
    from harness.launch.ray_launcher import CONNECT_TIMEOUT_S

    # refused by the harness's own connect probe (its bound named), not left to Ray's minute-long GCS wait
    assert f"cannot reach the Ray cluster's GCS at {address} within {CONNECT_TIMEOUT_S:g} s" in run.stderr
    assert "Traceback" not in run.stderr
    assert not (tmp_path / "run").exists()


def test_out_dir_holding_a_run_is_refused(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    (tmp_path / "ranks").mkdir()
    code = cli_main(["run", "scenarios/smoke.yaml", "--out", str(tmp_path)])
    assert code == 2 and "already holds a run" in capsys.readouterr().err


def test_malformed_fault_hook_is_refused_before_launch(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv(FAULT_ENV, "rank=1,kind=explode")
    assert cli_main(["run", "scenarios/smoke.yaml", "--dry-run"]) == 2
    assert "kind must be die, hang or stop" in capsys.readouterr().err


def test_fault_spec_parsing() -> None:
    header: dict[str, Any] = {"run_id": "r", "scenario_hash": "h", "rank": 3}
    spec = parse_fault_spec("rank=3,kind=hang,after=policy:fixed")
    assert spec is not None and spec.rank == 3 and spec.kind == "hang"
    assert spec.matches(PolicyStarted(**header, policy="fixed"))
    assert not spec.matches(PolicyStarted(**header, policy="legacy"))
    done = parse_fault_spec("rank=3,kind=die,after=policy-done:legacy")
    assert done is not None and done.matches(PolicyDone(**header, policy="legacy", status="ok", record={}))
    assert not done.matches(PolicyStarted(**header, policy="legacy"))
    ready = parse_fault_spec("rank=0,kind=die")
    assert ready is not None and ready.matches(Ready(**header, backend="reference"))
    assert parse_fault_spec("") is None
    with pytest.raises(LaunchError, match="rank= and kind= are required"):
        parse_fault_spec("kind=die")


def test_run_id_is_utc_time_and_scenario_name() -> None:
    import datetime

    now = datetime.datetime(2026, 11, 30, 5, 6, 7, tzinfo=datetime.UTC)
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


@pytest.mark.slow
def test_matrix_runs_every_cell_past_a_failed_one(tmp_path: Path) -> None:
    # The first cell asks for a GPU backend on a CPU-only machine and cannot run; the second must still run.
    import yaml

    base = yaml.safe_load(tiny_scenario(tmp_path).read_text())
    base.pop("name")
    matrix = tmp_path / "two-cells.yaml"
    matrix.write_text(
        yaml.safe_dump(
            {
                "matrix": {
                    "name": "two-cells",
                    "base": base,
                    "axes": {"experts_backend": ["torch-cutlass", "reference"]},
                }
            },
            sort_keys=False,
        )
    )
    out = tmp_path / "matrix"
    run = run_cli_inproc("run", str(matrix), "--out", str(out), base_env=harness_env())
    assert run.returncode == 2, run.stdout[-3000:] + run.stderr[-3000:]
    assert "needs GPUs" in run.stderr
    cells = sorted(p for p in out.iterdir() if p.is_dir())
    assert len(cells) == 1, f"only the reference cell runs: {cells}"
    assert rank_files(cells[0]).ranks == [0, 1]
    report = json.loads((out / "report.json").read_text())
    assert len(json.dumps(report)) > 0 and (out / "junit.xml").exists()


# --------------------------------------------------------------------------------------------------------------
# The kernels: resolved once on the driver, handed to every rank in the RankEntry.


class _KernelsSeen(BaseModel):
    rank: int
    path: str | None
    sha256: str | None
    origin: str | None


def _report_kernels(scenario, info, run_dir, progress, *, kernels=None) -> _KernelsSeen:
    """A rank entry that reports the kernels it was handed, and nothing else (no process group)."""
    return _KernelsSeen(
        rank=info.rank,
        path=str(kernels.path) if kernels else None,
        sha256=kernels.sha256 if kernels else None,
        origin=kernels.origin if kernels else None,
    )


def _ranks_request(tmp_path: Path, ops_library: Path) -> RanksRequest:
    scenario = tiny(**{"parallel.num_ranks": 2, "experts_backend": "vllm-ops", "vllm.ops_library": str(ops_library)})
    return RanksRequest(
        scenario=scenario,
        run_id=make_run_id("kernels"),
        run_dir=tmp_path / "run",
        device_type="cpu",
        main=_report_kernels,
        record_model=_KernelsSeen,
        policies=(),
        title="kernels",
    )


def test_every_rank_gets_the_kernels_the_driver_resolved(tmp_path: Path) -> None:
    library = tmp_path / "_C.abi3.so"
    library.write_bytes(b"not a real library: only its bytes and sha256 travel")
    output = io.StringIO()
    console = Console(file=output, width=200)
    launcher = LocalLauncher()
    try:
        ran = run_ranks(_ranks_request(tmp_path, library), launcher=launcher, console=console)
    finally:
        launcher.close()
    assert ran.ok and sorted(ran.records) == [0, 1]
    sha256 = hashlib.sha256(library.read_bytes()).hexdigest()
    for rank, seen in ran.records.items():
        assert (seen.rank, seen.path, seen.sha256, seen.origin) == (
            rank,
            str(library.resolve()),
            sha256,
            f"file {library.resolve()}",
        )
    assert f"kernels: vLLM (release unknown) {library.name} (sha256 {sha256[:12]}" in output.getvalue()


def test_kernels_that_cannot_be_had_start_no_rank_and_fail_each_in_one_line(tmp_path: Path) -> None:
    missing = tmp_path / "absent.so"
    launcher = LocalLauncher()
    try:
        ran = run_ranks(
            _ranks_request(tmp_path, missing), launcher=launcher, console=Console(file=io.StringIO(), width=200)
        )
    finally:
        launcher.close()
    assert not ran.ok and ran.records == {}
    assert [(f.rank, f.cause) for f in ran.outcome.failures] == [
        (r, f"kernels unavailable: vllm.ops_library {missing}: no such file") for r in (0, 1)
    ]
    assert sorted(p.name for p in (tmp_path / "run" / "ranks").iterdir()) == [
        "rank-00000.failed.json",
        "rank-00001.failed.json",
    ]


def test_no_rank_module_resolves_kernels_itself():
    """The ranks take the driver's KernelsLibrary: nothing on the rank side locates or fetches a release."""
    harness_dir = Path(__file__).resolve().parents[1] / "harness"
    rank_side = [
        *sorted((harness_dir / "rank").rglob("*.py")),
        harness_dir / "bench" / "rank.py",
        harness_dir / "launch" / "rank_side.py",
    ]
    assert [p.name for p in rank_side if "resolve_kernels" in p.read_text()] == []
