"""The CPU regression matrix runs for real through the CLI: every cell on gloo ranks, one combined report."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from cli_utils import run_cli_inproc

pytestmark = pytest.mark.slow  # real runs: rank processes

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.timeout(300)
def test_cpu_ci_matrix_runs_every_cell_and_writes_one_report(tmp_path):
    out = tmp_path / "matrix"
    done = run_cli_inproc("run", "scenarios/matrix/cpu-ci.yaml", "--out", str(out))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    report = json.loads((out / "report.json").read_text())
    assert report["kind"] == "matrix" and report["exit_code"] == 0
    assert report["num_valid"] == len(report["cells"]) >= 2
    n = len(report["cells"])  # each cell announced with its place in the matrix, and ended with its exit code
    for i, cell in enumerate(report["cells"], start=1):
        assert f"cell {i} of {n}: {cell['name']}" in done.stdout and f"cell {i} of {n} ({cell['name']}): exit code 0" \
            in done.stdout, done.stdout[-3000:]
    for cell in report["cells"]:
        assert (out / cell["name"] / "report.json").exists()
        # the combined report holds the summary of the report the cell was collected into when it finished (written
        # once), less its ranks, and names that file by the sha256 of its bytes
        own_bytes = (out / cell["name"] / "report.json").read_bytes()
        assert cell["report_sha256"] == "sha256:" + hashlib.sha256(own_bytes).hexdigest()
        own = json.loads(own_bytes)
        assert own.pop("content_digest").startswith("sha256:")  # the cell's file's digest; the matrix's covers it
        assert len(own.pop("ranks")) == 2 and "ranks" not in cell["report"]
        assert cell["report"]["content_digest"] is None
        assert own == {k: v for k, v in cell["report"].items() if k != "content_digest"}
        page = (out / cell["name"] / "report.html").read_text()
        assert 'id="plots-in-matrix"' in page and "<img" not in page  # the matrix's page plots the cells
        ranks = sorted((out / cell["name"] / "ranks").glob("rank-*.json"))
        assert len(ranks) == 2  # both gloo ranks of every cell recorded
    assert (out / "junit.xml").exists() and (out / "report.html").exists()
