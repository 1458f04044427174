"""An interactive terminal of 80 columns: each table fits it (columns left out, named, behind --wide); a pipe keeps
every column (tests/test_console.py). The commands run under a real pseudo-terminal with an 80x50 window."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import re
import select
import struct
import subprocess
import sys
import termios
from pathlib import Path

import pytest
from cli_utils import REPO_DIR, harness_env

COLUMNS = 80
ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[()][0-9A-Za-z]|\x1b[=>78]")
BOX = set("│┃┏┓┗┛┡┩└┘┌┐├┤━─╇┳┻╋┼┬┴")


def in_pty(*args: str, columns: int = COLUMNS) -> tuple[int, list[str]]:
    """`python -m harness ARGS` with stdin, stdout and stderr on a pty of `columns` columns; its exit code and
    its output lines with the terminal's escape sequences removed. Waits for the command's exit (a hung command
    is bounded by the scenario's own timeouts)."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, columns, 0, 0))
    env = harness_env()
    env.pop("LINES", None)
    env["TERM"] = "xterm-256color"
    proc = subprocess.Popen([sys.executable, "-m", "harness", *args], stdin=slave, stdout=slave, stderr=slave,
                            cwd=REPO_DIR, env=env, close_fds=True)
    os.close(slave)
    out = bytearray()
    try:
        while True:
            ready, _, _ = select.select([master], [], [], 1.0)
            if ready:
                try:
                    data = os.read(master, 65536)
                except OSError:  # EIO: the child closed its end
                    break
                if not data:
                    break
                out += data
            elif proc.poll() is not None:
                break
    finally:
        os.close(master)
    rc = proc.wait()
    text = ANSI.sub("", out.decode("utf-8", "replace"))
    return rc, re.split(r"\r\n|\n|\r", text)


def table_rows(lines: list[str]) -> list[str]:
    return [line for line in lines if BOX & set(line)]


def assert_fits(lines: list[str]) -> list[str]:
    rows = table_rows(lines)
    assert rows, "no table printed:\n" + "\n".join(lines[-40:])
    wide = [row for row in rows if len(row) > COLUMNS]
    assert not wide, f"{len(wide)} table row(s) wider than {COLUMNS} columns:\n" + "\n".join(wide[:5])
    return rows


def test_plan_fits_and_names_what_it_left_out():
    rc, lines = in_pty("plan", "smoke")
    assert rc == 0
    rows = assert_fits(lines)
    header = next(row for row in rows if "policy" in row)
    assert "total" in header and "x fixed" in header  # the essential columns stay
    assert any("left out to fit 80 columns" in line and "--wide shows them" in line for line in lines)
    legacy = next(row for row in rows if "legacy" in row)
    assert "32" in legacy and "4.00" in legacy  # the total in MiB and the ratio, whole


def test_wide_keeps_every_column_on_a_terminal():
    rc, lines = in_pty("plan", "smoke", "--wide")
    assert rc == 0
    assert max(len(row) for row in table_rows(lines)) > COLUMNS
    assert not any("left out to fit" in line for line in lines)
    assert any("source" in row for row in table_rows(lines))


@pytest.mark.slow
def test_run_fits(tmp_path: Path):
    rc, lines = in_pty("run", "smoke", "--out", str(tmp_path / "run"))
    assert rc == 0, "\n".join(lines[-40:])
    rows = assert_fits(lines)
    header = next(row for row in rows if "policy" in row and "outcome" in row)
    assert "contract" in header and "ws delta max" in header
    assert any("fit (expected fit): pass" in row for row in rows)
    # report.md on disk keeps every column: the terminal's view is the terminal's alone.
    assert "dispatch busbw" in (tmp_path / "run" / "report.md").read_text()
    # The scenario as the user can open it, relative to the repository (a Ray job's working_dir is deleted).
    assert json.loads((tmp_path / "run" / "run.json").read_text())["scenario_path"] == "scenarios/smoke.yaml"


def test_compare_fits():
    baseline = "results/baselines/cpu-smoke"
    rc, lines = in_pty("compare", baseline, baseline)
    assert rc == 0, "\n".join(lines[-40:])
    rows = assert_fits(lines)
    assert any("verdict" in row and "change" in row for row in rows)


@pytest.mark.vllm_wheel
def test_audit_fits():
    rc, lines = in_pty("vllm", "audit", "--vllm-version", "0.30.0")
    assert rc == 0, "\n".join(lines[-40:])
    rows = assert_fits(lines)
    assert any("CutlassBatchedExpertsFp8" in row and "consistent" in row for row in rows)
