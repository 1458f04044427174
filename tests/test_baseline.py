"""A fresh CPU run of the smoke scenario against the committed CPU baseline, through `harness compare`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BASELINE = ROOT / "results" / "baselines" / "cpu-smoke"


@pytest.mark.timeout(300)
def test_fresh_cpu_smoke_run_matches_the_committed_baseline(tmp_path):
    run = subprocess.run([sys.executable, "-m", "harness", "run", "smoke", "--out", str(tmp_path / "run")],
                         cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    # Times and throughputs depend on the machine; memory, error and outcome must match.
    cmp = subprocess.run([sys.executable, "-m", "harness", "compare", str(BASELINE), str(tmp_path / "run"),
                          "--ignore", "time", "--ignore", "throughput", "--json"],
                         cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert cmp.returncode == 0, cmp.stdout[-3000:] + cmp.stderr
    result = json.loads(cmp.stdout)
    assert result["num_regressions"] == 0
    compared = {(r["policy"], r["metric"]) for r in result["rows"] if r["verdict"] == "unchanged"}
    for policy in ("legacy", "fixed", "lower-bound"):
        assert (policy, "contract_total_bytes") in compared
        assert (policy, "workspace_delta_avg_bytes") in compared
    assert not any(r["metric"] in ("dispatch_us", "experts_tflops") for r in result["rows"])


def test_compare_flags_a_doubled_workspace_against_the_baseline(tmp_path):
    report = json.loads((BASELINE / "report.json").read_text())
    for policy in report["policies"]:
        if policy["policy"] == "fixed":
            for key in ("min", "avg", "max"):
                policy["workspace_delta_bytes"][key] *= 2
    (tmp_path / "report.json").write_text(json.dumps(report))
    cmp = subprocess.run([sys.executable, "-m", "harness", "compare", str(BASELINE), str(tmp_path / "report.json"),
                          "--ignore", "time", "--ignore", "throughput"],
                         cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert cmp.returncode == 1, cmp.stdout + cmp.stderr
    assert "workspace_delta_avg_bytes" in cmp.stdout and "regression" in cmp.stdout


def test_ignore_names_an_unknown_group_clearly():
    cmp = subprocess.run([sys.executable, "-m", "harness", "compare", str(BASELINE), str(BASELINE), "--ignore", "speed"],
                         cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert cmp.returncode == 2
    assert "--ignore 'speed': unknown metric or group" in cmp.stderr and "groups: memory, error, time" in cmp.stderr
