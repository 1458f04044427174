"""`harness bench` on CPU: interleaved raw and harness variants on real gloo ranks, thresholds from the scenario."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import yaml

from scenario_utils import TINY

ROOT = Path(__file__).resolve().parent.parent


def _bench(tmp_path: Path, bench: dict) -> tuple[subprocess.CompletedProcess, dict]:
    data = dict(TINY, name="tiny-bench", bench=bench)
    path = tmp_path / "tiny-bench.yaml"
    path.write_text(yaml.safe_dump(data))
    out = tmp_path / "out"
    done = subprocess.run([sys.executable, "-m", "harness", "bench", str(path), "--no-cpu-costs", "--json",
                           "--out", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=240)
    return done, json.loads((out / "bench.json").read_text())


def test_bench_reports_every_variant_per_rank_and_passes_low_thresholds(tmp_path):
    done, data = _bench(tmp_path, {"iterations": 3, "experts_ratio_min": 0.01, "comm_busbw_ratio_min": 0.001})
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    report, ranks = data["report"], data["ranks"]
    assert report["ok"] is True and report["num_ranks"] == 2 and len(ranks) == 2
    for rank in ranks:
        assert [p["policy"] for p in rank["policies"]] == ["legacy", "fixed"]
        for policy in rank["policies"]:
            names = {v["name"] for v in policy["variants"]}
            assert names == {"dispatch:harness", "a2a:raw-dispatch", "experts:harness", "experts:raw-reference",
                             "combine:harness", "a2a:raw-combine"}
            assert all(v["num_samples"] == 2 and v["median_us"] > 0 for v in policy["variants"])  # first dropped
            # The harness's experts step and the raw reference compute the same math on the valid rows.
            assert policy["max_rel_error"] < 0.06
            assert policy["dispatch_bytes"] > 0 and policy["combine_bytes"] > 0
    summary = {p["policy"]: p for p in report["policies"]}
    assert summary["fixed"]["experts_ratio_min"] > 0 and summary["legacy"]["comm_ratio_min"] > 0
    assert report["legacy_over_fixed_experts_time"] > 0
    markdown = (tmp_path / "out" / "bench.md").read_text()
    assert markdown.rstrip().endswith("OK") and "# command: harness bench" in markdown


def test_bench_below_a_scenario_threshold_exits_1_and_names_it(tmp_path):
    done, data = _bench(tmp_path, {"iterations": 2, "experts_ratio_min": 50.0})
    assert done.returncode == 1, done.stdout[-2000:] + done.stderr[-2000:]
    failures = data["report"]["failures"]
    assert any("experts step at" in f and "bench.experts_ratio_min = 50.0" in f for f in failures)
    assert (tmp_path / "out" / "bench.md").read_text().rstrip().endswith("FAILED")
