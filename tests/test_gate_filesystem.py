"""Filesystem and permission errors on every command are one line and exit 2, and --out is checked before any
work starts; claims of dead runs are taken over, live ones name how to clear them.

The full-disk and read-only cases mount a small tmpfs (root only, as in CI), unmounted in a finalizer."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from cli_utils import REPO_DIR, harness_env, run_cli_inproc
from fs_utils import fill, mount_tmpfs, one_line_exit_2, remount_read_only
from scenario_utils import TINY

from harness.launch import LaunchError
from harness.launch.rundir import CLAIM_FILE, choose_run_dir, claim_run_dir
from harness.scenario.schema import parse_scenario

# A refusal before any work is an interpreter start and the input checks: the scenario's own launch bound (the
# time a run may take to start its ranks) is far more than it needs, loaded or not.
START_BOUND_S = parse_scenario(TINY, path="<tiny>").launch.placement_timeout_s


@pytest.fixture
def read_only(tmp_path: Path, request: pytest.FixtureRequest) -> Path:
    fs = mount_tmpfs(tmp_path / "ro", request)
    (fs / "inside").mkdir()
    remount_read_only(fs)
    return fs


@pytest.fixture
def full(tmp_path: Path, request: pytest.FixtureRequest) -> Path:
    fs = mount_tmpfs(tmp_path / "full", request)
    fill(fs)
    return fs


def _tiny_yaml(tmp_path: Path, **launch) -> Path:
    data = dict(TINY, launch=launch) if launch else dict(TINY)
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.mark.parametrize("where", ["read-only", "full"])
def test_run_out_on_a_read_only_or_full_filesystem_is_refused_before_anything_runs(tmp_path, request, where) -> None:
    fs = request.getfixturevalue("read_only" if where == "read-only" else "full")
    for out in (fs / "new", fs / "inside") if where == "read-only" else (fs / "new",):
        result = run_cli_inproc("run", str(_tiny_yaml(tmp_path)), "--out", str(out))
        err = one_line_exit_2(result, f"--out {out}")
        if where == "read-only":  # access(2) sees a read-only filesystem; the probe write sees it too
            assert "is not writable by this user" in err or "Read-only file system" in err, err
        else:  # no access check sees a full disk: the probe write does
            assert "cannot create it (No space left on device)" in err, err
        assert "ranks up" not in result.stdout


def test_bench_out_read_only_is_refused_before_measuring(read_only: Path) -> None:
    result = run_cli_inproc("bench", "--cpu-only", "--out", str(read_only / "bench"))
    one_line_exit_2(result, str(read_only), "Read-only file system (EROFS)")


def test_layer_audit_out_read_only_is_refused_before_auditing(read_only: Path, tmp_path: Path) -> None:
    result = run_cli_inproc("vllm", "audit", "--layer", "--releases", "0.29.0", "--out", str(read_only / "audit"),
                            "--cache-dir", str(tmp_path / "cache"))
    one_line_exit_2(result, str(read_only), "Read-only file system (EROFS)")
    assert "auditing vllm" not in result.stderr and not (tmp_path / "cache").exists()


def test_stdout_on_a_full_device_is_one_line(full: Path) -> None:
    with open(full / "out.txt", "w") as stdout:
        result = subprocess.run([sys.executable, "-m", "harness", "scenarios"], cwd=REPO_DIR, env=harness_env(),
                                stdout=stdout, stderr=subprocess.PIPE, text=True, timeout=START_BOUND_S, check=False)
    result.stdout = ""
    one_line_exit_2(result, "No space left on device (ENOSPC)")


def test_stdout_closed_before_the_command_finished_is_one_line_not_a_pass() -> None:
    """`harness ... | head` where the reader went away: the command did not finish writing, so its verdict is not
    known; a gate piped that way must not pass, so it is exit 2 and one line, as for any output error."""
    read, write = os.pipe()
    os.close(read)  # the reader is gone before anything is written
    try:
        result = subprocess.run([sys.executable, "-m", "harness", "scenarios"], cwd=REPO_DIR, env=harness_env(),
                                stdout=write, stderr=subprocess.PIPE, text=True, timeout=START_BOUND_S,
                                check=False)
    finally:
        os.close(write)
    result.stdout = ""
    one_line_exit_2(result, "Broken pipe (EPIPE)")


def test_collect_into_a_read_only_run_is_one_line(read_only: Path, tmp_path: Path) -> None:
    from report_records import make_scenario, write_run

    run_dir = write_run(tmp_path / "run", make_scenario())
    subprocess.run(["mount", "-o", "remount,rw", str(read_only)], check=True)
    subprocess.run(["cp", "-r", str(run_dir), str(read_only / "run")], check=True)
    subprocess.run(["mount", "-o", "remount,ro", str(read_only)], check=True)
    result = run_cli_inproc("collect", str(read_only / "run"))
    assert result.returncode == 2 and "Traceback" not in result.stdout + result.stderr
    assert "cannot write the reports into" in result.stdout and "Read-only file system" in result.stdout


# ---- claims ------------------------------------------------------------------------------------------------------


def test_a_claim_of_a_dead_pid_on_this_host_is_taken_over(tmp_path: Path, capsys) -> None:
    out = tmp_path / "out"
    out.mkdir()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (out / CLAIM_FILE).write_text(f"pid {dead.pid} on {socket.gethostname()} since 2026-01-01T00:00:00+00:00, run r\n")
    claim = claim_run_dir(choose_run_dir(out, "r2"), "r2")
    err = capsys.readouterr().err
    assert f"its claim names pid {dead.pid} on {socket.gethostname()}, which is no longer running: taken over" in err
    assert f"pid {os.getpid()} " in (out / CLAIM_FILE).read_text()
    claim.release()


def test_an_empty_claim_is_taken_over_only_after_the_start_bound(tmp_path: Path, capsys) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / CLAIM_FILE).write_bytes(b"")  # its writer stopped between creating it and writing its line (ENOSPC)
    with pytest.raises(LaunchError, match="a run that is still starting"):
        choose_run_dir(out, "r", stale_after_s=3600)
    old = time.time() - 120
    os.utime(out / CLAIM_FILE, (old, old))
    choose_run_dir(out, "r", stale_after_s=60)
    err = capsys.readouterr().err
    assert "its claim file is empty and 12" in err and "beyond the 60 s a run takes to start: taken over" in err
    assert not (out / CLAIM_FILE).exists()


def test_a_live_claim_names_the_file_to_delete(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / CLAIM_FILE).write_text("pid 7 on another-host since 2026-01-01T00:00:00+00:00, run r\n")
    with pytest.raises(LaunchError) as info:
        choose_run_dir(out, "r")
    assert "check on another-host" in str(info.value) and f"delete {out / CLAIM_FILE}" in str(info.value)
    (out / CLAIM_FILE).write_text(f"pid {os.getpid()} on {socket.gethostname()} since t, run r\n")  # alive: us
    with pytest.raises(LaunchError, match="being written by another run"):
        choose_run_dir(out, "r")


@pytest.mark.slow
def test_sigkill_a_real_run_then_run_again_on_the_same_out(tmp_path: Path) -> None:
    scenario_path = _tiny_yaml(tmp_path)
    bound_s = parse_scenario(TINY, path="<tiny>").launch.rank_timeout_s
    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-m", "harness", "run", str(scenario_path), "--out", str(out)],
                            cwd=REPO_DIR, env=harness_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    deadline = time.monotonic() + bound_s
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            if (out / "run.json").exists() and (out / CLAIM_FILE).exists():
                break
            time.sleep(0.02)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert (out / CLAIM_FILE).exists() and (out / "run.json").exists()  # killed mid-run: the claim is left
    again = run_cli_inproc("run", str(scenario_path), "--out", str(out))
    assert "which is no longer running: taken over" in again.stderr, again.stderr[-3000:]
    # the run ran to the end into the same --out: every rank's record is there and no problem is reported (its
    # checks are TINY's business: two iterations without warm-up on a loaded CPU)
    assert again.returncode in (0, 1), again.stdout[-3000:] + again.stderr[-3000:]
    report = json.loads((out / "report.json").read_text())
    assert report["problems"] == [] and report["hardware"]["num_ranks_reported"] == TINY["parallel"]["num_ranks"]
    assert not (out / CLAIM_FILE).exists()
