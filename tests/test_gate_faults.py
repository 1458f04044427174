"""Faults that come from the filesystem while a command works, not before: a cache that fills up or is read-only
while a wheel is extracted, and an output directory that fills up while a run writes. Each ends in one line naming
the path and exit 2; no staging folder is left behind, and the records written before the fault are kept.

Every filesystem is a small tmpfs the test mounts (root only, as in CI; skipped with the reason otherwise) and
unmounts in a finalizer. The run cases stop a rank at a chosen point with the fault hook (HARNESS_INJECT_FAULT
kind=stop: the rank sends itself SIGSTOP), fill the disk while the run cannot move past that point, then let the
rank go on (SIGCONT): the disk fills at the same point of the run every time, whatever the machine's load.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cli_utils import REPO_DIR, harness_env, run_cli_inproc
from fs_utils import fill, free_bytes, mount_tmpfs, one_line_exit_2, remount_read_only
from test_vllm_source import METADATA, make_wheel

from harness.core.records import RankRecord
from harness.launch import FAULT_ENV
from harness.launch.rundir import CLAIM_FILE, RUN_DIR_MIN_FREE_BYTES
from harness.scenario.schema import load_scenario

SMOKE = load_scenario("smoke")
# A refusal or a small extraction is an interpreter start and a few MB of work: the scenario's own launch bound
# (the time a run may take to start its ranks) is far more than it needs, loaded or not.
START_BOUND_S = SMOKE.launch.placement_timeout_s
RUN_BOUND_S = SMOKE.launch.placement_timeout_s + SMOKE.launch.rank_timeout_s  # the run's own bounds, start to end
PAGE = os.sysconf("SC_PAGE_SIZE")  # tmpfs counts space in pages
BASELINE = REPO_DIR / "results" / "baselines" / "cpu-smoke"  # a measured run of the smoke scenario

WHEEL = "vllm-0.9.9-cp38-abi3-linux_x86_64.whl"
MOE = "vllm/model_executor/layers/fused_moe"
MEMBER_BYTES = 300_000  # each of the wheel's four fused_moe/*.py, 1.2 MB in all: more than the cache's 512 KiB


def _wheel(tmp_path: Path) -> Path:
    """A valid wheel (RECORD with every member's sha256 and size) that compresses to a few kB."""
    members = {"vllm-0.9.9.dist-info/METADATA": METADATA}
    members |= {f"{MOE}/m{i}.py": b"x = 1\n" * (MEMBER_BYTES // 6) for i in range(4)}
    return make_wheel(tmp_path / WHEEL, members)


def _commands(wheel: Path) -> dict[str, tuple[str, ...]]:
    return {"audit": ("vllm", "audit", "--vllm-wheel", str(wheel)),
            "plan": ("plan", "smoke", "--vllm-wheel", str(wheel))}


def _files_under(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if not p.is_dir()]


@pytest.mark.parametrize("command", ["audit", "plan"])
def test_a_cache_that_fills_during_extraction_is_one_line_and_leaves_no_staging(tmp_path, request, command) -> None:
    cache = mount_tmpfs(tmp_path / "cache", request, size="512k")
    wheel = _wheel(tmp_path)
    result = run_cli_inproc(*_commands(wheel)[command], env={"HARNESS_CACHE_DIR": str(cache)})
    one_line_exit_2(result, str(cache / "vllm" / "0.9.9"), "No space left on device")
    assert not list(cache.rglob("*.partial-*")) and _files_under(cache) == []  # the staging folder went with it
    assert free_bytes(cache) == 512 << 10


@pytest.mark.parametrize("command", ["audit", "plan"])
def test_a_read_only_cache_is_one_line(tmp_path, request, command) -> None:
    cache = mount_tmpfs(tmp_path / "cache", request)
    remount_read_only(cache)  # chmod does not stop root; a read-only mount does
    wheel = _wheel(tmp_path)
    result = run_cli_inproc(*_commands(wheel)[command], env={"HARNESS_CACHE_DIR": str(cache)})
    one_line_exit_2(result, str(cache), "Read-only file system")
    assert _files_under(cache) == []


# ---- a disk that fills during `harness run` -------------------------------------------------------------------


def _rank_pid(out: Path, rank: int) -> int | None:
    try:
        placement = json.loads((out / "launch.json").read_text())
    except (OSError, ValueError):  # not written yet
        return None
    return next(r["pid"] for r in placement["ranks"] if r["rank"] == rank)


def _stopped(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] == "T"  # the state field, after the command name in parentheses


def _run_until_stopped(tmp_path: Path, fs: Path, fault: str, *wanted: str):
    """`harness run smoke --out fs/out` with rank 1 stopped at `fault`'s point; returns (process, out, rank 1's
    pid) once rank 1 is stopped and every file of `wanted` (relative to out) is there."""
    out = fs / "out"
    logs = (open(tmp_path / "stdout", "w"), open(tmp_path / "stderr", "w"))
    proc = subprocess.Popen([sys.executable, "-m", "harness", "run", "smoke", "--out", str(out)], cwd=REPO_DIR,
                            env=harness_env() | {FAULT_ENV: f"rank=1,kind=stop,after={fault}"},
                            stdout=logs[0], stderr=logs[1], start_new_session=True)
    for log in logs:
        log.close()
    deadline = time.monotonic() + RUN_BOUND_S
    pid = None
    while time.monotonic() < deadline and proc.poll() is None:
        pid = pid or _rank_pid(out, 1)
        if pid is not None and _stopped(pid) and all((out / name).exists() for name in wanted):
            return proc, out, pid
        time.sleep(0.02)
    _end(proc, pid)
    pytest.fail(f"rank 1 did not stop at {fault} (exit {proc.returncode}): {(tmp_path / 'stderr').read_text()[-3000:]}")


def _end(proc: subprocess.Popen, pid: int | None) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    if pid is not None and _stopped(pid):
        os.kill(pid, signal.SIGKILL)


def _go_on(tmp_path: Path, proc: subprocess.Popen, pid: int) -> subprocess.CompletedProcess[str]:
    """SIGCONT to the stopped rank, then the run's end (bounded by its own timeouts)."""
    os.kill(pid, signal.SIGCONT)
    try:
        proc.wait(timeout=RUN_BOUND_S)
    finally:
        _end(proc, pid)
    return subprocess.CompletedProcess(proc.args, proc.returncode, (tmp_path / "stdout").read_text(),
                                       (tmp_path / "stderr").read_text())


def _records(out: Path) -> dict[int, RankRecord]:
    return {rank: RankRecord.model_validate_json((out / "ranks" / f"rank-{rank:05d}.json").read_text())
            for rank in (0, 1)}


def _left_behind(out: Path) -> list[str]:
    """What a run must not leave: its claim, or a temporary file of an atomic write."""
    return sorted(p.name for p in out.rglob("*") if p.name == CLAIM_FILE or p.name.endswith(".tmp"))


def _collect_a_copy(out: Path, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """The run's records copied off the full disk, collected there."""
    copy = tmp_path / "copy"
    copy.mkdir()
    for name in ("run.json", "launch.json"):
        shutil.copy2(out / name, copy / name)
    shutil.copytree(out / "ranks", copy / "ranks")
    return run_cli_inproc("collect", str(copy))


def _pages(size: int) -> int:
    return math.ceil(size / PAGE) * PAGE


@pytest.mark.slow
def test_a_disk_that_fills_before_the_reports_keeps_every_record(tmp_path, request) -> None:
    """The probe at the start passes (9 MiB free, RUN_DIR_MIN_FREE_BYTES asked). Rank 1 stops once it is ready,
    before any record exists; the disk is then filled but for room for the ranks' records and not the reports.

    The room is sized from the committed CPU baseline, a measured run of this scenario: each rank's record is
    replaced atomically (the old one and the new one at once), so both ranks take at most 4 records' pages, given
    a quarter more than the baseline's largest record. The reports (report.json, .md, .html, junit.xml) take
    more than that room on their own, so the run's end is refused deterministically, after the last record."""
    record_bytes = max(p.stat().st_size for p in (BASELINE / "ranks").glob("rank-*.json"))
    room = 4 * _pages(record_bytes * 5 // 4)
    reports = sum(_pages((BASELINE / name).stat().st_size) for name in ("report.json", "report.md", "report.html",
                                                                        "junit.xml"))
    assert reports > room, (reports, room)  # the premise: the reports cannot fit where the records do
    fs = mount_tmpfs(tmp_path / "fs", request, size=f"{RUN_DIR_MIN_FREE_BYTES + (1 << 20)}")
    proc, out, pid = _run_until_stopped(tmp_path, fs, "ready", "run.json", "launch.json")
    assert not (out / "ranks").exists() or not any((out / "ranks").iterdir())
    fill(fs, leave_bytes=room)
    result = _go_on(tmp_path, proc, pid)
    # As `harness collect` does: the verdict and the report on stdout, then the one line saying the reports could
    # not be written, and where; nothing on stderr.
    assert result.returncode == 2 and "Traceback" not in result.stdout + result.stderr, result.stdout[-3000:]
    said = [line for line in result.stdout.splitlines() if "No space left on device" in line]
    assert len(said) == 1 and said[0].startswith(f"ERROR (exit 2): cannot write the reports into {out}: "), said
    assert result.stderr == ""
    records = _records(out)
    for rank, record in records.items():  # every rank's final record, every policy in it
        assert record.complete and [p.policy for p in record.policies] == list(SMOKE.policies), rank
    assert _left_behind(out) == [] and not (out / "status.json").exists()
    collected = _collect_a_copy(out, tmp_path)
    assert collected.returncode in (0, 1) and "Traceback" not in collected.stdout + collected.stderr, (
        collected.returncode, collected.stdout[-3000:], collected.stderr[-3000:])
    report = json.loads((tmp_path / "copy" / "report.json").read_text())
    assert report["problems"] == [] and report["hardware"]["num_ranks_reported"] == 2


@pytest.mark.slow
def test_a_disk_that_fills_between_policies_keeps_the_first_policys_records(tmp_path, request) -> None:
    """Rank 1 stops once its record so far for legacy is sent; rank 0 cannot finish fixed without it, so both
    ranks' legacy records are on disk and nothing else is written until rank 1 goes on. The disk is filled to
    the last byte there: fixed's record so far is refused.

    A copy of the records collects with legacy's results and says, as an error (exit 2, not a regression), that
    the ranks' final records never came: the run did not end, and no record on a full disk could say why."""
    fs = mount_tmpfs(tmp_path / "fs", request, size=f"{RUN_DIR_MIN_FREE_BYTES + (1 << 20)}")
    proc, out, pid = _run_until_stopped(tmp_path, fs, "policy-done:legacy", "ranks/rank-00000.json",
                                        "ranks/rank-00001.json")
    fill(fs)
    result = _go_on(tmp_path, proc, pid)
    err = one_line_exit_2(result, "No space left on device (ENOSPC)")
    assert f"{out}/ranks/rank-0000" in err, err
    for rank, record in _records(out).items():  # legacy's results, as the driver wrote them before the fault
        assert not record.complete and [p.policy for p in record.policies] == ["legacy"], rank
        assert record.policies[0].status == "ok"
    assert _left_behind(out) == []
    collected = _collect_a_copy(out, tmp_path)
    assert collected.returncode == 2 and "Traceback" not in collected.stdout + collected.stderr
    report = json.loads((tmp_path / "copy" / "report.json").read_text())
    assert sorted(p["kind"] for p in report["problems"]) == ["incomplete", "incomplete"], report["problems"]
    assert "legacy" in collected.stdout and "fit (expected fit): pass" in collected.stdout
