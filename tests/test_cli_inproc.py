"""The in-process CLI of the tests (tests/cli_utils.py run_cli_inproc) gives what `python -m harness` gives, and
leaves the test process as it found it."""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

import pytest

from cli_utils import REPO_DIR, run_cli_inproc, run_harness

PR_CASE = "scenarios/deepseek-v3-dp32-pr55579.yaml"


@pytest.mark.parametrize(
    "args",
    [
        ("--help",),  # argparse's SystemExit(0)
        ("rnu",),  # a usage error: SystemExit(2) and one line on stderr
        ("plan", PR_CASE, "--json"),
        ("plan", "smoek"),  # the command's own refusal: exit 2
        ("collect", "no-such-run"),
    ],
    ids=lambda args: " ".join(args),
)
def test_the_same_exit_code_and_output_as_a_subprocess(
    args: tuple[str, ...], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A narrow terminal here: neither form may wrap at it (argparse's help would), both print as in a CI log.
    monkeypatch.setenv("COLUMNS", "33")
    child = run_harness(*args, cwd=tmp_path)
    here = run_cli_inproc(*args, cwd=tmp_path)
    assert (here.returncode, here.stdout, here.stderr) == (child.returncode, child.stdout, child.stderr)


def test_cwd_and_environment_are_the_commands_and_then_put_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "33")  # a narrow terminal here; the command must not see it (run_harness drops it)
    before_cwd, before_env = os.getcwd(), dict(os.environ)
    # A name looked up from the working directory: found from tmp_path only if the command ran there.
    (tmp_path / "mine.yaml").write_text(
        (REPO_DIR / "scenarios" / "smoke.yaml").read_text().replace("name: smoke", "name: mine")
    )
    result = run_cli_inproc("plan", "mine.yaml", "--json", cwd=tmp_path, env={"HARNESS_CACHE_DIR": str(tmp_path)})
    assert result.returncode == 0, result.stderr
    assert '"scenario": "mine"' in result.stdout
    assert (os.getcwd(), dict(os.environ)) == (before_cwd, before_env)


def test_an_uncaught_exception_is_exit_1_and_a_traceback(monkeypatch: pytest.MonkeyPatch) -> None:
    import harness.cli

    def boom(argv: list[str]) -> int:
        raise RuntimeError("planted")

    monkeypatch.setattr(harness.cli, "main", boom)
    result = run_cli_inproc("plan", "smoke")
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr.startswith("Traceback (most recent call last):") and "RuntimeError: planted" in result.stderr


def test_logging_set_up_by_a_command_does_not_outlive_it(monkeypatch: pytest.MonkeyPatch) -> None:
    import harness.cli

    def configures_logging(argv: list[str]) -> int:
        logging.getLogger("harness").addHandler(logging.StreamHandler(sys.stderr))
        logging.getLogger("harness").setLevel(logging.DEBUG)
        logging.getLogger("harness").warning("from the command")
        print("out")
        return 0

    logger = logging.getLogger("harness")
    before = (list(logging.getLogger().handlers), list(logger.handlers), logger.level)
    monkeypatch.setattr(harness.cli, "main", configures_logging)
    result = run_cli_inproc("anything")
    assert (result.returncode, result.stdout) == (0, "out\n")
    # the command's own handler wrote its line (the harness's handler, set up at import, may write it too)
    assert result.stderr.splitlines()[-1] == "from the command"
    assert (list(logging.getLogger().handlers), list(logger.handlers), logger.level) == before
