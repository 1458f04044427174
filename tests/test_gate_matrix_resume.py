"""An interrupted matrix: matrix.json is written before the first cell, so it can be collected as a matrix, and
`harness run MATRIX --out DIR --resume` keeps the finished cells and runs the interrupted one again."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from cli_utils import REPO_DIR, harness_env, run_cli_inproc
from scenario_utils import TINY

from harness.launch.rundir import CLAIM_FILE
from harness.scenario.schema import parse_scenario

pytestmark = pytest.mark.slow  # real runs: rank processes

BOUND_S = parse_scenario(TINY, path="<tiny>").launch.rank_timeout_s  # the scenario's own bound on a rank


def _matrix_file(tmp_path: Path) -> Path:
    base = {k: v for k, v in TINY.items() if k != "name"}
    path = tmp_path / "tiny-matrix.yaml"
    path.write_text(yaml.safe_dump({"matrix": {"name": "tiny-matrix", "base": base, "axes": {"seed": [0, 1]}}}))
    return path


def test_an_interrupted_matrix_is_collected_as_one_and_resumed(tmp_path: Path) -> None:
    matrix, out = _matrix_file(tmp_path), tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-m", "harness", "run", str(matrix), "--out", str(out)], cwd=REPO_DIR,
                            env=harness_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    first = second = None
    deadline = time.monotonic() + 2 * BOUND_S
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            if (out / "matrix.json").exists() and first is None:
                cells = [c["name"] for c in json.loads((out / "matrix.json").read_text())["cells"]]
                first, second = out / cells[0], out / cells[1]
            if second is not None and (second / "run.json").exists():
                break  # the first cell finished, the second has started: stop the matrix in it
            time.sleep(0.02)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert first is not None and (out / "matrix.json").exists()  # written before the first cell ran
    assert (first / "report.json").exists()
    kept = (first / "report.json").read_bytes()
    assert (second / "run.json").exists() and (second / CLAIM_FILE).exists()

    collected = run_cli_inproc("collect", str(out))  # a matrix, with its unfinished cell named
    assert collected.returncode == 2 and "Traceback" not in collected.stdout + collected.stderr
    report = json.loads((out / "report.json").read_text())
    assert report["kind"] == "matrix" and [c["name"] for c in report["cells"]] == [first.name, second.name]

    again = run_cli_inproc("run", str(matrix), "--out", str(out))
    assert f"cell {second.name}: interrupted" in again.stdout and "--resume" in again.stdout
    resumed = run_cli_inproc("run", str(matrix), "--out", str(out), "--resume")
    assert resumed.returncode in (0, 1), resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert f"cell {first.name}: already run" in resumed.stdout
    assert (first / "report.json").read_bytes() == kept  # the finished cell was kept as it was
    cell = json.loads((second / "report.json").read_text())
    assert cell["problems"] == [] and cell["hardware"]["num_ranks_reported"] == TINY["parallel"]["num_ranks"]
    assert not (second / CLAIM_FILE).exists() and not (out / CLAIM_FILE).exists()
    report = json.loads((out / "report.json").read_text())
    assert report["kind"] == "matrix" and all(c["report"]["problems"] == [] for c in report["cells"])


def test_resume_needs_an_interrupted_matrix_directory(tmp_path: Path) -> None:
    result = run_cli_inproc("run", str(_matrix_file(tmp_path)), "--out", str(tmp_path / "new"), "--resume")
    assert result.returncode == 2 and "holds no matrix.json" in result.stderr
    assert not (tmp_path / "new").exists()
