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

from cli_utils import REPO_DIR, harness_env, run_cli_inproc

GATED = {"plan (in process)", "harness plan (command)", "collect 1024 rank records"}


# The probes run here, once each: every gated kind (in process, a command, a child probe, a matrix probe) and the
# local launch's latency. The Ray launch, the matrix collect and the layout search are `harness bench`'s to run.
PROBES = "plan,plan-command,run-local,collect,plan-matrix"


@pytest.mark.slow
@pytest.mark.vllm_wheel  # the release-matrix probe plans 0.29.0 and 0.30.0: a cold cache downloads them
@pytest.mark.timeout(600)
def test_cpu_only_bench_measures_and_reports_its_targets(tmp_path: Path):
    done = subprocess.run([sys.executable, "-m", "harness", "bench", "--cpu-only", "--json", "--repeats", "1",
                           "--probes", PROBES, "--out", str(tmp_path / "bench")], cwd=REPO_DIR, env=harness_env(),
                          capture_output=True, text=True, timeout=550)  # fmt: skip
    assert done.returncode in (0, 1), done.stdout[-3000:] + done.stderr[-3000:]
    assert "Traceback" not in done.stderr  # a probe that cannot measure says so in a line
    report = json.loads(done.stdout)
    costs = {c["name"]: c for c in report["cpu_costs"]}
    # Exactly the probes asked for, each sampled once (the in-process plan: 20 calls).
    assert set(costs) == GATED | {"run to first rank ready (local)", "harness plan 1024-cell release matrix (CPU)"}
    assert len(costs["harness plan (command)"]["samples_s"]) == 1
    assert len(costs["run to first rank ready (local)"]["samples_s"]) == 1
    assert len(costs["plan (in process)"]["samples_s"]) == 20
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


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--repeats", "0"], "harness: error: --repeats 0: allowed 1 to 20\n"),
        (["--repeats", "21"], "harness: error: --repeats 21: allowed 1 to 20\n"),
        (
            ["--probes", "plan,serach"],
            "harness: error: --probes: 'serach' is not a probe; allowed: plan, plan-command, "
            "run-local, run-ray, collect, plan-matrix, matrix-collect, search\n",
        ),
    ],
)
def test_bench_probe_selection_refuses_what_it_does_not_have(tmp_path: Path, args: list[str], message: str):
    result = run_cli_inproc("bench", "--cpu-only", *args, "--out", str(tmp_path / "bench"))
    assert (result.returncode, result.stdout, result.stderr) == (2, "", message)
    assert not (tmp_path / "bench").exists()
