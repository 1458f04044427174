"""Output in a terminal and in a CI log: tables are never cut, and printed paths are never broken."""

from __future__ import annotations

import io
import json
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from cli_utils import REPO_DIR, harness_env
from rich.table import Table

from harness.core.console import make_console

# Ten columns of nine-digit numbers: about 130 characters, wider than the 80 a log is assumed to have.
NUMBERS = [f"{806912345 + i}" for i in range(10)]


def _log_console(buffer: io.StringIO):
    return make_console(file=buffer, width=80)  # what rich assumes for a pipe or a CI log without COLUMNS


def test_a_table_wider_than_the_console_keeps_every_cell_whole():
    table = Table(title="a wide table")
    for i in range(len(NUMBERS)):
        table.add_column(f"contract {i}")
    table.add_row(*NUMBERS)
    buffer = io.StringIO()
    console = _log_console(buffer)
    console.print(table)
    out = buffer.getvalue()
    assert "…" not in out
    assert all(n in out for n in NUMBERS) and all(f"contract {i}" in out for i in range(len(NUMBERS)))
    assert max(len(line) for line in out.splitlines()) > 80
    assert console.width == 80  # widened for that print only


def test_a_long_path_stays_on_one_line():
    path = "/data/results/" + "/".join(f"deepseek-v3-dp32-pr55579-{i}" for i in range(6))
    buffer = io.StringIO()
    _log_console(buffer).print(f"results: {path}  (12.3 s)")
    assert buffer.getvalue().splitlines() == [f"results: {path}  (12.3 s)"]


def _piped(command: str, cwd: Path = REPO_DIR, timeout_s: float = 120.0) -> subprocess.CompletedProcess[str]:
    """`harness ARGS | cat` through a shell: stdout is a pipe, and no COLUMNS tells rich a width."""
    env = harness_env()
    env.pop("COLUMNS", None)
    shell = f"set -o pipefail; {shlex.quote(sys.executable)} -m harness {command} | cat"
    return subprocess.run(["bash", "-c", shell], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout_s, check=False)


@pytest.mark.parametrize("command", ["plan smoke", "plan deepseek-v3-dp32-pr55579", "scenarios"])
def test_piped_tables_are_whole(command):
    result = _piped(command)
    assert result.returncode == 0, result.stderr
    assert "…" not in result.stdout
    assert "\x1b[" not in result.stdout  # no colour codes in a log


@pytest.mark.slow
def test_run_smoke_piped_prints_no_ellipsis_and_a_whole_results_path(smoke_run, smoke_run_copy: Path):
    # The shared run (tests/conftest.py): `harness run` with stdout a pipe, --out a path longer than a log's width.
    out, result = smoke_run.out, smoke_run
    assert len(str(out)) > 100
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "…" not in result.stdout
    assert re.search(rf"^results: {re.escape(str(out))}  \(\d+\.\d s\)$", result.stdout, re.MULTILINE)
    report = json.loads((out / "report.json").read_text())
    assert report["exit_code"] == 0
    # The header's scenario line carries a long path: one line, not broken at the log's assumed width.
    assert f"# scenario: smoke (hash {report['scenario']['hash']}) {report['scenario']['path']}" in result.stdout
    for name in ("legacy", "fixed", "lower-bound"):  # row labels whole, the widest one included
        assert re.search(rf"^│ {re.escape(name)} +│", result.stdout, re.MULTILINE), name
    compare = _piped(f"compare {shlex.quote(str(out))} {shlex.quote(str(out))}")
    assert compare.returncode == 0, compare.stderr
    assert "…" not in compare.stdout
    copy = smoke_run_copy  # collect writes into the run: a copy of it, at a path as long
    collect = _piped(f"collect {shlex.quote(str(copy))}")
    assert collect.returncode == 0, collect.stderr
    assert "…" not in collect.stdout
    assert f"wrote {copy / 'report.json'}" in collect.stdout.splitlines()


# ---- progress of long commands ----------------------------------------------------------------------------------


def test_collect_of_a_matrix_says_which_cell_it_is_on(tmp_path: Path):
    matrix_dir = tmp_path / "matrix"
    shutil.copytree(REPO_DIR / "results" / "h200" / "1xh200-matrix-nightly-releases", matrix_dir)
    cells = [c["name"] for c in json.loads((matrix_dir / "matrix.json").read_text())["cells"]]
    result = _piped(f"collect {shlex.quote(str(matrix_dir))}")
    # 1: the committed records predate the rank's warm-up pass, and collect's baseline check fails them (the
    # second policy of a cell starts ~350 MiB higher than the first); what matters here is the progress.
    assert result.returncode in (0, 1), result.stderr
    progress = [line for line in result.stderr.splitlines() if line.startswith("collecting cell ")]
    assert progress == [f"collecting cell {i}/{len(cells)}: {name}" for i, name in enumerate(cells, 1)]
    assert "…" not in result.stdout


def test_a_release_download_says_so_before_pip_runs(tmp_path: Path):
    # A release the index does not have: pip runs, fails at once, and nothing is left in the cache.
    result = _piped(f"vllm audit --vllm-version 0.0.999 --cache-dir {shlex.quote(str(tmp_path))}")
    assert result.returncode == 2
    lines = result.stderr.splitlines()
    assert lines[0].startswith("harness: downloading vllm==0.0.999 with pip (a wheel of about 300 MB")
    assert "could not download vLLM release 0.0.999" in lines[-1]
