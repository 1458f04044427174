"""Helpers shared by the launcher tests: run the real CLI as a subprocess, write tiny scenarios, read records."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

import yaml

from harness.core.records import RankFailure, RankRecord, read_record
from harness.launch import FAULT_ENV
from harness.rank.distributed import SAFE_NCCL_ENV

REPO_DIR = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class CliRun:
    returncode: int
    stdout: str
    stderr: str
    wall_s: float


def harness_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ, **SAFE_NCCL_ENV)
    env["PYTHONPATH"] = str(REPO_DIR) + os.pathsep + env.get("PYTHONPATH", "")
    env.pop(FAULT_ENV, None)
    env.pop("RAY_ADDRESS", None)
    env.update(extra)
    return env


def run_cli(*args: str, env: dict[str, str] | None = None, timeout_s: float = 240) -> CliRun:
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "harness", "run", *args],
        cwd=REPO_DIR,
        env=env or harness_env(),
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )
    return CliRun(proc.returncode, proc.stdout, proc.stderr, time.monotonic() - started)


def tiny_scenario(tmp_path: Path, name: str = "tiny", *, num_ranks: int = 2, **launch: float | int | str) -> Path:
    """A scenario small enough for 2 cores (D = P, tiny shapes, gloo) with short bounds, so faults end in seconds."""
    data = {
        "name": name,
        "description": "launcher test: tiny shapes",
        "model": {"hidden_size": 128, "intermediate_size": 64, "num_experts": 4 * num_ranks, "top_k": 2},
        "parallel": {"num_dispatchers": num_ranks, "num_ranks": num_ranks, "max_tokens_per_rank": 16},
        "policies": ["legacy", "fixed"],
        "device": "cpu",
        "iterations": 2,
        "warmup": 1,
        # The placement bound is generous: a test with a CPU-heavy neighbour (cpu_load) on 2 cores saw Ray actors take
        # over 30 s to start. The fault bounds under test are the collective and rank timeouts, not this one.
        "launch": {"collective_timeout_s": 10, "rank_timeout_s": 180, "placement_timeout_s": 120, **launch},
    }
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


@dataclass(frozen=True)
class RankFiles:
    """What a run left in ranks/: records (final, or so far) and failures, each by rank."""

    records: dict[int, RankRecord]
    failures: dict[int, RankFailure]

    @property
    def ranks(self) -> list[int]:
        return sorted(set(self.records) | set(self.failures))


def rank_files(run_dir: Path) -> RankFiles:
    records: dict[int, RankRecord] = {}
    failures: dict[int, RankFailure] = {}
    for path in sorted((run_dir / "ranks").glob("rank-*.json")):
        record = read_record(path)
        if isinstance(record, RankFailure):
            assert path.name.endswith(".failed.json"), path
            failures[record.rank] = record
        else:
            assert isinstance(record, RankRecord), path
            records[record.rank] = record
    return RankFiles(records=records, failures=failures)


def report_policies(run_dir: Path) -> dict[int, dict[str, str]]:
    """{rank: {policy: status}} as report.json shows it, wherever its per-rank entries sit in the document."""
    found: dict[int, dict[str, str]] = {}

    def walk(node: object) -> None:
        if isinstance(node, dict):
            if isinstance(node.get("rank"), int) and isinstance(node.get("policies"), list):
                found[node["rank"]] = {
                    p["policy"]: p["status"]
                    for p in node["policies"]
                    if isinstance(p, dict) and "policy" in p and "status" in p
                }
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(json.loads((run_dir / "report.json").read_text()))
    return found


@contextmanager
def cpu_load(num_processes: int = 1) -> Iterator[None]:
    """The test runs beside `num_processes` CPU-heavy processes, as on a loaded CI machine: busy loops, ended by
    their pid, for what the machine's load does not already hold.

    The last minute's load average counts this test's own process and whatever else keeps a core busy (in the
    suite's run, its other worker): the busy loops added are what it lacks of `num_processes` more than one, so the
    suite does not spend its own CPU time making load it already has, and a test run alone is loaded all the same."""
    already = max(0, int(os.getloadavg()[0]) - 1)
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(num_processes - already)]
    try:
        yield
    finally:
        for proc in burners:
            proc.kill()
            proc.wait(10)


def end_ray_session(proc: subprocess.Popen) -> None:
    """`ray stop` for one head only: SIGTERM to its `ray start --block` process group (GCS, raylet, dashboard),
    then SIGKILL to what is left. Plain `ray stop` would end every Ray instance of this user on the machine."""
    for sig, wait_s in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        with suppress(subprocess.TimeoutExpired):
            proc.wait(wait_s)
    with suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)  # `ray start --block` may exit before its children
