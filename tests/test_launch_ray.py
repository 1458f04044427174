"""The Ray launcher on real Ray clusters on this machine: a simulated multi-node cluster shared by the module
(`ray.cluster_utils.Cluster`: a head without the dashboard and three workers of 2 CPUs each) and, for
`ray job submit`, a real `ray start --head` with the dashboard on loopback. Ranks use gloo (no GPUs here).

Every driver is a subprocess of the real CLI (`python -m harness run --address ...`), bounded by a timeout.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.core.records import read_record
from harness.launch import FAULT_ENV
from harness.rank.distributed import SAFE_NCCL_ENV, free_port
from harness.scenario.schema import load_scenario
from launch_helpers import (
    REPO_DIR,
    cpu_load,
    end_ray_session,
    harness_env,
    rank_files,
    report_policies,
    run_cli,
    tiny_scenario,
)

pytestmark = [pytest.mark.ray, pytest.mark.slow]

NUM_NODES = 4
NUM_CPUS_PER_NODE = 2
# Bounds are the scenario's own (launch.collective_timeout_s, placement_timeout_s) plus this margin for the driver on
# a loaded 2-core machine shared by four raylets: its 0.2 s poll, draining the progress log, writing records.
DRIVER_MARGIN_S = 15.0
# The test clusters listen on loopback only, so they run without token authentication; the job test below
# uses a token of its own, as a real cluster would.
RAY_TEST_ENV = {"RAY_AUTH_MODE": "disabled"}


@pytest.fixture(scope="module")
def cluster() -> Iterator[str]:
    """A head and three worker nodes, 2 CPUs and one `harness_test_node` resource each; yields its address."""
    from ray.cluster_utils import Cluster

    saved = {k: os.environ.get(k) for k in RAY_TEST_ENV}
    os.environ.update(RAY_TEST_ENV)
    try:
        cluster = Cluster(
            initialize_head=True,
            # No dashboard: the launcher does not use it (the job test below starts a head with one), and on a
            # 2-core machine its nine processes cost 0.7 CPU-s in every 20 s idle and seconds at start
            head_node_args={
                "num_cpus": NUM_CPUS_PER_NODE,
                "resources": {"harness_test_node": 1},
                "include_dashboard": False,
            },
        )
        for _ in range(NUM_NODES - 1):
            cluster.add_node(num_cpus=NUM_CPUS_PER_NODE, resources={"harness_test_node": 1})
        cluster.wait_for_nodes(timeout=60)
        yield cluster.address
        cluster.shutdown()
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def ray_env(**extra: str) -> dict[str, str]:
    return harness_env(**{**RAY_TEST_ENV, **extra})


def placement(run_dir: Path) -> list[dict]:
    return json.loads((run_dir / "launch.json").read_text())["ranks"]


# --------------------------------------------------------------------------------------------------------------


def test_default_smoke_spreads_over_two_nodes(cluster: str, tmp_path: Path) -> None:
    # No scenario and no --launcher: --address selects Ray, and the cluster's GPUs (none) select smoke.
    out = tmp_path / "run"
    run = run_cli("--address", cluster, "--placement-strategy", "SPREAD", "--out", str(out), env=ray_env())
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "no scenario given: running smoke.yaml (0 GPU(s) found)" in run.stdout
    files = rank_files(out)
    assert sorted(files.records) == [0, 1] and not files.failures
    assert all(r.complete and r.warmup == "full" for r in files.records.values())
    nodes = {r["node_id"] for r in placement(out)}
    assert len(nodes) == 2, f"SPREAD put both ranks on one node: {placement(out)}"
    assert all(r["safe_env"] == SAFE_NCCL_ENV for r in placement(out))  # every actor runs with multicast off
    manifest = read_record(out / "run.json")
    assert manifest.launcher == "ray" and manifest.scenario_name == "smoke"  # type: ignore[union-attr]
    assert (out / "report.json").exists()
    print(f"ray smoke (existing 4-node cluster, SPREAD): harness run -> report in {run.wall_s:.1f} s")


def test_ctrl_c_removes_actors_and_keeps_what_arrived(cluster: str, tmp_path: Path) -> None:
    scenario = tiny_scenario(tmp_path, collective_timeout_s=60)
    out = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-m", "harness", "run", str(scenario), "--address", cluster, "--out", str(out)],
        cwd=REPO_DIR,
        env=ray_env(**{FAULT_ENV: "rank=1,kind=hang,after=ready"}),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and not (out / "launch.json").exists():
            time.sleep(0.2)
        assert (out / "launch.json").exists(), "the run did not start within 90 s"
        time.sleep(3)
        started = time.monotonic()
        os.killpg(proc.pid, signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=60)
        stop_s = time.monotonic() - started
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
    assert proc.returncode == 130, stdout[-2000:] + stderr[-2000:]
    assert stderr.count("harness: interrupted") == 1, stderr
    assert stop_s < 30
    files = rank_files(out)
    assert sorted(files.failures) == [0, 1]
    assert all(f.cause.startswith("interrupted") for f in files.failures.values())
    # The actors' processes are gone (ray.kill), not just orphaned: the next test needs every CPU of the cluster.
    for entry in placement(out):
        assert _gone(entry["pid"]), f"rank {entry['rank']}'s actor process {entry['pid']} is still running"


def _gone(pid: int, wait_s: float = 10.0) -> bool:
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/status").read_text().split("State:")[1].split()[0]
        except (OSError, IndexError):
            return True
        if state == "Z":
            return True
        time.sleep(0.2)
    return False


def test_eight_ranks_run_unchanged_across_nodes(cluster: str, tmp_path: Path) -> None:
    out = tmp_path / "run"  # D=8 on P=8 (nothing emulated), smoke's shapes, gloo
    run = run_cli("scenarios/smoke-8ranks.yaml", "--address", cluster, "--out", str(out), env=ray_env())
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    files = rank_files(out)
    assert sorted(files.records) == list(range(8)) and not files.failures
    assert all(r.num_ranks == 8 and r.num_dispatchers == 8 for r in files.records.values())
    # PACK with 1 CPU per rank fills the four 2-CPU nodes.
    assert len({r["node_id"] for r in placement(out)}) == NUM_NODES
    print(f"ray 8 ranks on {NUM_NODES} nodes: harness run -> report in {run.wall_s:.1f} s")


def test_killed_rank_names_rank_node_and_cause(cluster: str, tmp_path: Path) -> None:
    scenario = tiny_scenario(tmp_path, collective_timeout_s=10)
    out = tmp_path / "run"
    with cpu_load():
        run = run_cli(
            str(scenario),
            "--address",
            cluster,
            "--placement-strategy",
            "SPREAD",
            "--out",
            str(out),
            env=ray_env(**{FAULT_ENV: "rank=1,kind=die,after=ready"}),
        )
    assert run.returncode == 2, run.stdout[-3000:] + run.stderr[-3000:]
    failure = rank_files(out).failures[1]
    assert failure.cause.startswith("died:")  # Ray's actor error: told by its exit, not by a timeout
    node_of_rank_1 = next(r for r in placement(out) if r["rank"] == 1)
    assert node_of_rank_1["node_ip"] in failure.node and node_of_rank_1["node_id"][:12] in failure.node
    assert "rank 1 on" in run.stderr
    assert failure.cause in (out / "report.json").read_text()


def test_rank_killed_after_its_first_policy_keeps_both_ranks_first_results(cluster: str, tmp_path: Path) -> None:
    out = tmp_path / "run"
    run = run_cli(
        "scenarios/smoke.yaml",
        "--address",
        cluster,
        "--out",
        str(out),
        env=ray_env(**{FAULT_ENV: "rank=1,kind=die,after=policy-done:legacy"}),
    )
    assert run.returncode == 2, run.stdout[-3000:] + run.stderr[-3000:]
    assert "harness: rank 1 on" in run.stderr and "lost: fixed, lower-bound" in run.stderr
    files = rank_files(out)
    for rank in (0, 1):  # the records so far came back through the progress log, not a shared filesystem
        record = files.records[rank]
        assert not record.complete and [p.policy for p in record.policies] == ["legacy"]
        assert record.policies[0].status == "ok"
    dead = files.failures[1]
    assert dead.cause.startswith("died:")
    assert dead.finished_policies == ["legacy"] and dead.lost_policies == ["fixed", "lower-bound"]
    shown = report_policies(out)
    assert shown[0]["legacy"] == "ok" and shown[1]["legacy"] == "ok"


def test_hung_rank_is_bounded_and_other_records_are_kept(cluster: str, tmp_path: Path) -> None:
    timeout_s = 5.0
    scenario = tiny_scenario(tmp_path, collective_timeout_s=timeout_s)
    out = tmp_path / "run"
    with cpu_load():
        run = run_cli(
            str(scenario),
            "--address",
            cluster,
            "--out",
            str(out),
            env=ray_env(**{FAULT_ENV: "rank=1,kind=hang,after=done"}),
        )
    assert run.returncode == 2, run.stdout[-3000:] + run.stderr[-3000:]
    files = rank_files(out)
    finished, hung = files.records[0], files.failures[1]
    assert finished.complete
    assert hung.cause.startswith("hung: no result within") and hung.lost_policies == []
    waited_s = hung.at - finished.finished_at
    assert timeout_s <= waited_s <= timeout_s + DRIVER_MARGIN_S, waited_s
    assert "hung: no result within" in (out / "report.json").read_text()


def test_unsatisfiable_placement_says_asked_and_available(cluster: str, tmp_path: Path) -> None:
    # No node has 4 CPUs: the placement group can never be satisfied.
    scenario = tiny_scenario(tmp_path, cpus_per_rank=4, placement_timeout_s=5)
    out = tmp_path / "run"
    run = run_cli(str(scenario), "--address", cluster, "--out", str(out), env=ray_env())
    assert run.returncode == 2, run.stdout[-3000:] + run.stderr[-3000:]
    assert "placement group not satisfied within 5 s" in run.stderr
    assert "asks for 2 bundles of {CPU 4}" in run.stderr
    assert f"the cluster has CPU {NUM_NODES * NUM_CPUS_PER_NODE}, GPU 0 in all" in run.stderr
    assert f"on {NUM_NODES} node(s)" in run.stderr
    files = rank_files(out)
    assert not files.records and sorted(files.failures) == [0, 1]
    assert all(f.cause.startswith("not started") for f in files.failures.values())
    # Refused within the placement bound: every failure was written placement_timeout_s after the run began.
    manifest = read_record(out / "run.json")
    assert all(f.at - manifest.started_at <= 5 + DRIVER_MARGIN_S for f in files.failures.values())  # type: ignore[union-attr]
    # The group was removed: the cluster places a run right after (covered by any later test in this module too).


def test_ray_launcher_without_address_starts_its_own_cluster(cluster: str, tmp_path: Path) -> None:
    # `cluster` is up on this machine too: the launcher must start a new one ("local"), not join it.
    out = tmp_path / "run"
    run = run_cli("scenarios/smoke.yaml", "--launcher", "ray", "--out", str(out), env=ray_env())
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert json.loads((out / "launch.json").read_text())["address"] == "local"
    # --launcher picks how ranks start, not what they measure: the scenario keeps the file's hash.
    assert read_record(out / "run.json").scenario_hash == load_scenario("scenarios/smoke.yaml").scenario_hash
    assert "Ray cluster local: 1 node(s), 2 CPU" in run.stdout  # sized for 2 ranks x 1 CPU
    assert sorted(rank_files(out).records) == [0, 1]
    print(f"ray smoke (new local cluster): harness run -> report in {run.wall_s:.1f} s")


# ---- ray start + ray job submit ----------------------------------------------------------------------------


@pytest.fixture
def ray_head(tmp_path: Path) -> Iterator[tuple[str, dict[str, str]]]:
    """`ray start --head --block` with the dashboard on loopback, in a session of its own; yields (jobs URL, env).

    Teardown ends exactly that session's processes (its process group), never other Ray instances.
    """
    dashboard_port = free_port()
    env = ray_env(
        RAY_AUTH_MODE="token",
        RAY_AUTH_TOKEN=secrets.token_hex(32),
        PATH=str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", ""),
    )
    temp_dir = tempfile.mkdtemp(prefix="hl-ray-", dir="/tmp")  # its own session dir; short for Ray's sockets
    cmd = [
        str(Path(sys.executable).parent / "ray"),
        "start",
        "--head",
        "--block",
        "--disable-usage-stats",
        f"--temp-dir={temp_dir}",
        f"--port={free_port()}",
        f"--num-cpus={NUM_CPUS_PER_NODE}",
        "--include-dashboard=true",
        "--dashboard-host=127.0.0.1",
        f"--dashboard-port={dashboard_port}",
        f"--ray-client-server-port={free_port()}",
        f"--dashboard-agent-listen-port={free_port()}",
        f"--dashboard-agent-grpc-port={free_port()}",
        f"--metrics-export-port={free_port()}",
    ]
    log = (tmp_path / "ray-start.log").open("w")
    head = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{dashboard_port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert head.poll() is None, f"ray start exited: {(tmp_path / 'ray-start.log').read_text()[-2000:]}"
            try:
                urllib.request.urlopen(f"{url}/api/version", timeout=2)
                break
            except urllib.error.HTTPError:
                break  # an answer (even 401) means the dashboard is up
            except (urllib.error.URLError, OSError):
                assert time.monotonic() < deadline, "the dashboard did not come up within 60 s"
                time.sleep(0.5)
        yield url, env
    finally:
        end_ray_session(head)
        log.close()
        shutil.rmtree(temp_dir, ignore_errors=True)


def test_ray_job_submit_runs_the_same_command(ray_head: tuple[str, dict[str, str]], tmp_path: Path) -> None:
    url, env = ray_head
    out = tmp_path / "job-run"  # absolute: the job's working directory is a temporary copy
    submission_id = f"harness-test-{secrets.token_hex(4)}"
    started = time.monotonic()
    submit = subprocess.run(
        [
            str(REPO_DIR / "launch" / "submit.sh"),
            "--address",
            url,
            "--submission-id",
            submission_id,
            "scenarios/smoke.yaml",
            "--out",
            str(out),
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    wall_s = time.monotonic() - started
    status = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from ray.job_submission import JobSubmissionClient as C; "
            "print(C(sys.argv[1]).get_job_status(sys.argv[2]).value)",
            url,
            submission_id,
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert status.stdout.strip() == "SUCCEEDED", (
        submit.stdout[-3000:] + submit.stderr[-3000:] + status.stdout + status.stderr
    )
    assert submit.returncode == 0
    assert (out / "report.json").exists()
    manifest = read_record(out / "run.json")
    assert manifest.launcher == "ray" and manifest.scenario_name == "smoke"  # type: ignore[union-attr]
    assert sorted(rank_files(out).records) == [0, 1]
    print(f"ray job submit smoke: submit -> report in {wall_s:.1f} s")
