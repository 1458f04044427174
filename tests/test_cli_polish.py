"""The CLI's small promises: --version, what runs here, inputs checked before anything starts, --fail-on-verdict
on a predicted layer failure, one error prefix, and a Ray connection failure that names the token."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
from cli_utils import REPO_DIR, run_cli_inproc


def test_version_names_the_package_and_the_commit():
    result = run_cli_inproc("--version")
    assert result.returncode == 0
    from harness import __version__

    line = result.stdout.strip()
    assert line.startswith(f"harness {__version__}")
    head = subprocess.run(["git", "-C", str(REPO_DIR), "rev-parse", "--short", "HEAD"], capture_output=True,
                          text=True, check=False).stdout.strip()
    if head:
        assert re.fullmatch(rf"harness {re.escape(__version__)} \(git {head}(, modified)?\)", line), line


def test_scenarios_marks_what_runs_here_and_why_not():
    from harness.launch.machine import local_machine
    from harness.scenario.fit import can_run, resolve_device
    from harness.scenario.schema import load_scenario

    result = run_cli_inproc("scenarios", "--json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    machine = local_machine()
    assert data["machine"] == machine.description
    for row in data["scenarios"]:
        scenario = load_scenario(REPO_DIR / "scenarios" / row["file"])
        reason = can_run(scenario, device_type=resolve_device(scenario, machine.num_gpus), machine=machine)
        assert row["runs_here"] == (reason is None), row
        # The reason up to the machine's free RAM, which moves between two reads of it.
        assert (row["why_not"] or "").split("; allowed:")[0] == (reason or "").split("; allowed:")[0], row
        assert "e+" not in (reason or ""), reason  # human sizes: "1.78 TiB", never "1.82e+03 GiB"
    table = run_cli_inproc("scenarios").stdout
    assert re.search(r"\d+ of \d+ run on ", table)


@pytest.mark.parametrize("flag, value", [("--vllm-ops-library", "nope.so"), ("--vllm-wheel", "nope.whl"),
                                         ("--vllm-src", "no-such-tree")])
def test_a_missing_vllm_input_is_refused_before_any_rank(tmp_path: Path, flag: str, value: str):
    out = tmp_path / "run"
    result = run_cli_inproc("run", "smoke", flag, value, "--out", str(out))
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"harness: error: {flag} {value}: no such file"), lines
    assert not out.exists()  # no run directory, no rank started


def test_a_ray_connection_failure_names_the_token(monkeypatch):
    from ray.exceptions import AuthenticationError

    from harness.launch.ray_launcher import connect_failure

    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    text = connect_failure("10.0.0.1:6379", ConnectionError("Failed to connect to GCS within 22 seconds"))
    assert "Failed to connect to GCS within 22 seconds" in text
    assert "RAY_AUTH_MODE=token" in text and "~/.ray/auth_token" in text
    assert "token" not in connect_failure("local", RuntimeError("raylet died"))
    auth = connect_failure("10.0.0.1:6379", AuthenticationError("Unauthenticated: invalid token"))
    assert "the head wants its token" in auth and len(auth.splitlines()) == 1


@pytest.mark.vllm_wheel
def test_fail_on_verdict_fails_a_layer_deepep_refuses():
    plain = run_cli_inproc("plan", "vllm-57894-eplb-deepep-ll", "--vllm-version", "0.33.0", "--json")
    assert plain.returncode == 0, plain.stderr  # the expectation (over-cap) holds: the plan alone is data
    gated = run_cli_inproc("plan", "vllm-57894-eplb-deepep-ll", "--vllm-version", "0.33.0", "--json",
                        "--fail-on-verdict")
    assert gated.returncode == 1, gated.stderr
    assert json.loads(gated.stdout)["layer_verdict_failures"] == ["vllm 0.33.0: deepep-rdma over-cap"]
