"""Ctrl-C at any moment of a run ends it with one line and exit 130: no traceback of the driver or of a rank, no
"Fatal Python error", no rank left running. The driver sends the terminal's Ctrl-C (SIGINT to its whole process
group) itself at a named moment (HARNESS_KILL_AT=MOMENT,signal=INT-GROUP), so no step races a timer. Ray's start
failures, its plain Exception among them, are one line and exit 2."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from cli_utils import REPO_DIR, harness_env
from harness.core.files import pid_alive
from harness.core.killpoints import KILL_ENV
from harness.scenario.schema import parse_scenario
from scenario_utils import TINY

BOUND_S = 2 * parse_scenario(TINY, path="<tiny>").launch.rank_timeout_s


@pytest.mark.parametrize("moment", ["launch", "ranks-started", "policy-done", "write:report.json"])
def test_ctrl_c_at_any_moment_is_one_line_and_130(tmp_path: Path, moment: str) -> None:
    scenario = tmp_path / "tiny.yaml"
    scenario.write_text(yaml.safe_dump(TINY))
    out = tmp_path / "out"
    # a session of its own: the Ctrl-C goes to the harness's process group, the ranks in it, never to pytest
    result = subprocess.run(
        [sys.executable, "-m", "harness", "run", str(scenario), "--out", str(out)],
        cwd=REPO_DIR,
        env={**harness_env(), KILL_ENV: f"{moment},signal=INT-GROUP"},
        capture_output=True,
        text=True,
        timeout=BOUND_S,
        start_new_session=True,
        check=False,
    )
    text = result.stdout + result.stderr
    assert result.returncode == 128 + signal.SIGINT, text[-3000:]
    assert result.stderr.startswith("harness: interrupted") and result.stderr.count("\n") == 1, result.stderr
    assert "(SIGTERM)" not in text
    for noise in ("Traceback", "Fatal Python error", "KeyboardInterrupt", "Exception ignored"):
        assert noise not in text, text[-3000:]
    if (out / "launch.json").exists():  # every rank the launch started is gone
        assert not [r["pid"] for r in json.loads((out / "launch.json").read_text())["ranks"] if pid_alive(r["pid"])]


def test_a_ray_cluster_that_does_not_start_is_one_line(tmp_path: Path, monkeypatch, capsys) -> None:
    """Ray raises its plain Exception when a local cluster's raylet is not up within its 30 s
    (ray/_private/node.py); that is an infrastructure error like any other failure to connect."""
    import ray

    from harness.cli import main

    def timed_out(*args: object, **kwargs: object) -> None:
        raise Exception(
            "The current node timed out during startup. This could happen because some of the raylet "
            "failed to startup or the GCS has become overloaded."
        )

    monkeypatch.setattr(ray, "init", timed_out)
    scenario = tmp_path / "tiny.yaml"
    scenario.write_text(yaml.safe_dump(TINY))
    code = main(["run", str(scenario), "--launcher", "ray", "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    assert err.startswith("harness: error: cannot connect to the Ray cluster at local: The current node timed out")
    assert not (tmp_path / "out").exists()  # claimed, and released empty


@pytest.mark.one_thread
def test_what_the_launchers_start_ignores_sigint_and_the_driver_keeps_its_ctrl_c() -> None:
    """Ranks and a local Ray cluster are started through without_sigint: what they start inherits SIGINT ignored
    (a mask would not be inherited), and a Ctrl-C meanwhile reaches the driver once its handler is back."""
    import os

    if len(os.listdir("/proc/self/task")) > 1:
        pytest.skip(
            "a pending SIGINT goes to a thread that does not block it, and the window ignores it: the test needs a "
            "process of one thread (a pytest-xdist worker has more)"
        )

    from harness.launch.deadlines import without_sigint

    child = without_sigint(
        lambda: subprocess.run(
            [sys.executable, "-c", "import signal; print(signal.getsignal(signal.SIGINT) == signal.SIG_IGN)"],
            capture_output=True,
            text=True,
            check=True,
        )
    )
    assert child.stdout == "True\n"
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    with pytest.raises(KeyboardInterrupt):
        without_sigint(lambda: os.kill(os.getpid(), signal.SIGINT))  # pending while starting, delivered after


@pytest.mark.parametrize("argv", [["plan"] + [f"--x{i}" for i in range(100_000)], ["plan", "x" * 100_000]])
def test_arguments_are_capped_before_argparse(argv: list[str], capsys) -> None:
    from harness.cli import main
    from harness.scenario.limits import MAX_ARG_CHARS, MAX_ARGS

    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("harness: error: ")
    assert f"allowed: at most {MAX_ARGS}" in err if len(argv) > MAX_ARGS else f"allowed: at most {MAX_ARG_CHARS}" in err
