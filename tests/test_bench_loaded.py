"""`harness bench --cpu-only` measures and reports its CPU-side targets: each gated probe is timed on the CPU clock
(user + system, which a loaded machine does not stretch) with the wall time beside it, judged against its target, and
the verdict, the failures listed and the exit code agree with those judgements. Whether this machine meets the
targets is the bench's report, not this test's assertion: a slow or shared machine may miss them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from cli_utils import REPO_DIR, harness_env

GATED = {"plan (in process)", "harness plan (command)", "collect 1024 rank records"}


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_cpu_only_bench_measures_and_reports_its_targets(tmp_path: Path):
    done = subprocess.run([sys.executable, "-m", "harness", "bench", "--cpu-only", "--json", "--out",
                           str(tmp_path / "bench")], cwd=REPO_DIR, env=harness_env(), capture_output=True,
                          text=True, timeout=1100)  # fmt: skip
    assert done.returncode in (0, 1), done.stdout[-3000:] + done.stderr[-3000:]
    assert "Traceback" not in done.stderr  # a probe that cannot measure says so in a line
    report = json.loads(done.stdout)
    costs = {c["name"]: c for c in report["cpu_costs"]}
    assert GATED <= set(costs)
    for name in GATED:
        cost = costs[name]
        assert cost["clock"] == "cpu" and cost["gated"], cost
        assert len(cost["samples_s"]) >= 1 and all(s > 0 for s in cost["samples_s"]), cost
        assert cost["wall_median_s"] is not None and cost["wall_median_s"] > 0
        assert cost["target_s"] > 0
        assert cost["within_target"] is (cost["median_s"] <= cost["target_s"]), cost
    for name, cost in costs.items():
        if name.startswith("run to first rank ready"):  # a latency across processes: shown, never gated
            assert cost["clock"] == "wall" and not cost["gated"] and cost["within_target"]
    missed = [c for c in costs.values() if c["gated"] and not c["within_target"]]
    for cost in missed:  # each missed target is a failure line naming the probe, its figure and its target
        assert any(cost["name"] in f and f"target {cost['target_s']}" in f for f in report["failures"]), cost
    assert report["ok"] is (not report["failures"])
    assert done.returncode == (0 if report["ok"] else 1)
    md = (tmp_path / "bench" / "bench.md").read_text()
    for name in GATED:
        assert f"| {name} |" in md
