"""The README's Ray section, run as written: a local head with Ray's token auth on, then the README's own
`ray job submit` command, read from README.md so the two cannot drift apart.

A fresh machine is a fresh HOME: no ~/.ray/auth_token until the README's first command makes one. The head runs
with the README's `ray start --head` plus what a shared machine needs (its own ports and --temp-dir, --block so
the test owns its process group); the submit command runs verbatim except for the dashboard port. Ranks use gloo.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from launch_helpers import REPO_DIR, end_ray_session, rank_files

from harness.core.records import read_record
from harness.launch.overrides import DEFAULT_CPU_SCENARIO
from harness.rank.distributed import free_port
from harness.scenario.schema import load_scenario

pytestmark = pytest.mark.slow  # real runs: rank processes and Ray clusters

README_ADDRESS = "http://127.0.0.1:8265"  # Ray's default dashboard address, as the README writes it
HEAD_START_S = 60.0  # `ray start --head` up to a dashboard that answers, on a loaded 2-core machine
# Beyond the scenario's own bounds: uploading the working dir, the job driver importing torch, the report.
JOB_OVERHEAD_S = 120.0
# No GPUs here, so the README's command (no scenario) runs the CPU default; its bounds bound the job.
_DEFAULT = load_scenario(DEFAULT_CPU_SCENARIO)
JOB_BOUND_S = _DEFAULT.launch.placement_timeout_s + _DEFAULT.launch.rank_timeout_s + JOB_OVERHEAD_S


def readme_ray_commands() -> list[str]:
    """The commands of the README's Ray section's first bash block, continuation lines joined, comments dropped."""
    text = (REPO_DIR / "README.md").read_text()
    section = text.split("## Running on a Ray cluster", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```bash\n(.*?)```", section, re.DOTALL)
    assert block, "README.md's Ray section has no bash block"
    joined = block.group(1).replace("\\\n", " ")
    return [re.sub(r"\s+#\s.*$", "", line).strip() for line in joined.splitlines() if line.strip()]


def test_readme_names_the_launcher_an_absolute_out_and_token_auth():
    start, submit = readme_ray_commands()
    assert start.startswith("ray get-auth-token --generate") and "ray start --head" in start
    assert submit.startswith("RAY_AUTH_MODE=token ray job submit --address " + README_ADDRESS)
    assert "--launcher ray" in submit
    assert re.search(r'--out "\$HOME/', submit)  # absolute on the head, new per submission (a date in it)


def test_cluster_config_keeps_the_dashboard_private_and_requires_the_token():
    import yaml

    config = yaml.safe_load((REPO_DIR / "launch" / "cluster.yaml").read_text())
    head_ip = config["provider"]["head_ip"]
    head_start = " ".join(config["head_start_ray_commands"])
    assert "0.0.0.0" not in head_start
    assert f"--dashboard-host={head_ip}" in head_start and f"--node-ip-address={head_ip}" in head_start
    for command in (head_start, " ".join(config["worker_start_ray_commands"])):
        assert "RAY_AUTH_MODE=token" in command.split("ray start")[0]  # exported before Ray starts
    assert config["file_mounts"] == {"~/.ray/auth_token": "~/.ray/auth_token"}
    firewall = " ".join(config["head_setup_commands"])
    subnet = head_ip.rsplit(".", 1)[0] + ".0/24"
    assert "6379" in firewall and "8265" in firewall and f"! -s {subnet} -j DROP" in firewall


@dataclass(frozen=True)
class Head:
    url: str
    env: dict[str, str]  # a fresh HOME holding the token, the venv first on PATH, no Ray settings inherited
    home: Path


def _fresh_env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_") and k != "PYTHONPATH"}
    env.update(HOME=str(home), PATH=str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", ""))
    return env


@pytest.fixture
def token_head(tmp_path: Path) -> Iterator[Head]:
    """The README's first line on a fresh HOME, with this test's own ports and temp dir; ended by process group."""
    home = tmp_path / "home"
    home.mkdir()
    env = _fresh_env(home)
    start = readme_ray_commands()[0]
    generate, ray_start = (part.strip() for part in start.split("&&"))
    subprocess.run(["bash", "-c", generate], cwd=tmp_path, env=env, check=True, timeout=60)
    assert (home / ".ray" / "auth_token").stat().st_size > 0
    temp_dir = tempfile.mkdtemp(prefix="hr-ray-", dir="/tmp")  # short: Ray's socket paths live under it
    dashboard_port = free_port()
    own = [f"--temp-dir={temp_dir}", "--block", "--disable-usage-stats", "--num-cpus=2",
           f"--port={free_port()}", f"--dashboard-port={dashboard_port}", f"--ray-client-server-port={free_port()}",
           f"--dashboard-agent-listen-port={free_port()}", f"--dashboard-agent-grpc-port={free_port()}",
           f"--metrics-export-port={free_port()}", f"--runtime-env-agent-port={free_port()}"]
    log = (tmp_path / "ray-start.log").open("w")
    head = subprocess.Popen(["bash", "-c", f"exec {ray_start} " + " ".join(own)], cwd=tmp_path, env=env,
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{dashboard_port}"
    try:
        _wait_for_dashboard(url, head, tmp_path / "ray-start.log")
        yield Head(url=url, env=env, home=home)
    finally:
        _stop_jobs(url, env)
        end_ray_session(head)
        log.close()
        shutil.rmtree(temp_dir, ignore_errors=True)


def _wait_for_dashboard(url: str, head: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + HEAD_START_S
    while True:
        assert head.poll() is None, f"ray start exited: {log.read_text()[-2000:]}"
        try:
            urllib.request.urlopen(f"{url}/api/version", timeout=2)
            return
        except urllib.error.HTTPError:
            return  # an answer, even 401, means the dashboard is up
        except (urllib.error.URLError, OSError):
            assert time.monotonic() < deadline, f"the dashboard did not come up within {HEAD_START_S:g} s"
            time.sleep(0.5)


def _stop_jobs(url: str, env: dict[str, str]) -> None:
    """Stop this head's unfinished jobs: a job driver runs in a session of its own, outside the head's group."""
    script = ("import sys; from ray.job_submission import JobSubmissionClient as C; c = C(sys.argv[1]); "
              "[c.stop_job(j.submission_id) for j in c.list_jobs() if not j.status.is_terminal()]")
    subprocess.run([sys.executable, "-c", script, url], env={**env, "RAY_AUTH_MODE": "token"},
                   capture_output=True, timeout=60, check=False)


def _job_status(head: Head, submission_id: str) -> str:
    script = ("import sys; from ray.job_submission import JobSubmissionClient as C; "
              "print(C(sys.argv[1]).get_job_status(sys.argv[2]).value)")
    done = subprocess.run([sys.executable, "-c", script, head.url, submission_id],
                          env={**head.env, "RAY_AUTH_MODE": "token"}, capture_output=True, text=True, timeout=60)
    return done.stdout.strip() or done.stderr[-2000:]


@pytest.mark.ray
@pytest.mark.timeout(HEAD_START_S + JOB_BOUND_S + 120)
def test_readme_ray_job_submit_runs_verbatim_with_token_auth(token_head: Head, tmp_path: Path) -> None:
    # Token auth is on: the dashboard refuses a request without the token.
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(f"{token_head.url}/api/jobs/", timeout=10)
    assert refused.value.code == 401

    submit = readme_ray_commands()[1]
    assert submit.count(README_ADDRESS) == 1
    command = submit.replace(README_ADDRESS, token_head.url)
    started = time.monotonic()
    # `ray job submit` follows the job's log until the job ends.
    job = subprocess.run(["bash", "-c", command], cwd=REPO_DIR, env=token_head.env, capture_output=True, text=True,
                         timeout=JOB_BOUND_S)
    wall_s = time.monotonic() - started
    output = job.stdout + job.stderr
    submission = re.search(r"raysubmit_\w+", output)
    assert submission, output[-3000:]
    assert _job_status(token_head, submission.group(0)) == "SUCCEEDED", output[-3000:]
    assert job.returncode == 0, output[-3000:]

    # The run landed where the README's --out says, on this (the head) node, and the path printed is whole.
    printed = re.findall(r"^results: (/\S+)  \(\d+\.\d s\)$", job.stdout, re.MULTILINE)
    assert len(printed) == 1, job.stdout[-3000:]
    run_dir = Path(printed[0])
    assert run_dir.parent == token_head.home / "harness-results" and run_dir.name.startswith("ray-")
    report = json.loads((run_dir / "report.json").read_text())
    assert report["exit_code"] == 0 and report["scenario"]["name"] == _DEFAULT.name
    manifest = read_record(run_dir / "run.json")
    assert manifest.launcher == "ray"  # type: ignore[union-attr]
    files = rank_files(run_dir)
    assert sorted(files.records) == list(range(_DEFAULT.parallel.num_ranks)) and not files.failures
    assert "…" not in job.stdout
    print(f"README ray job submit (token auth): submit -> report in {wall_s:.1f} s")


@pytest.mark.parametrize(("token_in", "mode_given", "mode_seen"), [
    ("file", None, "token"), ("env", None, "token"), (None, None, ""), ("file", "disabled", "disabled"),
])
def test_submit_sh_turns_token_mode_on_when_it_finds_a_token(tmp_path: Path, token_in, mode_given, mode_seen):
    # What submit.sh hands to `ray`: a `ray` first on PATH that prints RAY_AUTH_MODE and its arguments.
    home, bin_dir = tmp_path / "home", tmp_path / "bin"
    (home / ".ray").mkdir(parents=True)
    bin_dir.mkdir()
    (bin_dir / "ray").write_text('#!/bin/sh\necho "mode=${RAY_AUTH_MODE:-}"; echo "args=$*"\n')
    (bin_dir / "ray").chmod(0o755)
    env = {**_fresh_env(home), "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    if token_in == "file":
        (home / ".ray" / "auth_token").write_text("t" * 32)
    elif token_in == "env":
        env["RAY_AUTH_TOKEN"] = "t" * 32
    if mode_given is not None:
        env["RAY_AUTH_MODE"] = mode_given
    done = subprocess.run([str(REPO_DIR / "launch" / "submit.sh"), "--address", "http://127.0.0.1:1", "smoke"],
                          env=env, capture_output=True, text=True, timeout=30, check=True)
    assert f"mode={mode_seen}" in done.stdout.splitlines()
    assert "-- python -m harness run smoke --launcher ray" in done.stdout
