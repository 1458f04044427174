"""`harness bench` on CPU: interleaved raw and harness variants on real gloo ranks, thresholds from the scenario."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from harness.bench.markdown import render_markdown
from harness.bench.records import BenchReport, CpuCost
from scenario_utils import TINY

ROOT = Path(__file__).resolve().parent.parent
SUB_STAGES = {"dispatch.quantize", "dispatch.layout", "dispatch.pack", "dispatch.exchange", "dispatch.unpack",
              "combine.expert-reduce", "combine.exchange", "combine.token-reduce"}


def _bench(tmp_path: Path, bench: dict, *extra: str) -> tuple[subprocess.CompletedProcess, dict]:
    data = dict(TINY, name="tiny-bench", bench=bench)
    path = tmp_path / "tiny-bench.yaml"
    path.write_text(yaml.safe_dump(data))
    out = tmp_path / "out"
    done = subprocess.run([sys.executable, "-m", "harness", "bench", str(path), "--no-cpu-costs", "--out", str(out),
                           *extra], cwd=ROOT, capture_output=True, text=True, timeout=240)
    return done, json.loads((out / "bench.json").read_text())


def test_bench_reports_every_variant_per_rank_and_passes_low_thresholds(tmp_path):
    done, data = _bench(tmp_path, {"iterations": 3, "experts_ratio_min": 0.01, "comm_busbw_ratio_min": 0.001}, "--json")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert json.loads(done.stdout) == data["report"]  # --json: stdout is the report alone, progress on stderr
    assert "rank 0: ready" in done.stderr and "rank 1: fixed ok; record so far written" in done.stderr
    report, ranks = data["report"], data["ranks"]
    assert report["ok"] is True and report["num_ranks"] == 2 and len(ranks) == 2
    for rank in ranks:
        assert rank["complete"] is True and rank["scenario_hash"] == report["scenario_hash"]
        assert [p["policy"] for p in rank["policies"]] == ["legacy", "fixed"]
        for policy in rank["policies"]:
            names = {v["name"] for v in policy["variants"]}
            assert names == {"dispatch:harness", "a2a:raw-dispatch", "experts:harness", "experts:raw-reference",
                             "combine:harness", "a2a:raw-combine", *SUB_STAGES}
            # On CPU the only raw collective is gloo's all_to_all_single: the ratio is taken against it.
            assert (policy["comm_raw_dispatch_variant"], policy["comm_raw_combine_variant"]) == (
                "a2a:raw-dispatch", "a2a:raw-combine")
            assert all(v["num_samples"] == 2 and v["median_us"] > 0 for v in policy["variants"])  # first dropped
            assert all(v["min_us"] <= v["median_us"] <= v["max_us"] for v in policy["variants"])
            # The harness's experts step and the raw reference compute the same math on the valid rows.
            assert policy["max_rel_error"] < 0.06
            assert policy["dispatch_bytes"] > 0 and policy["combine_bytes"] > 0
    summary = {p["policy"]: p for p in report["policies"]}
    assert summary["fixed"]["experts_ratio_min"] > 0 and summary["legacy"]["comm_ratio_min"] > 0
    assert report["legacy_over_fixed_experts_time"] > 0
    assert report["command"][:3] == ["harness", "bench", str(tmp_path / "tiny-bench.yaml")]
    assert "--no-cpu-costs" in report["command"] and "--json" in report["command"]
    markdown = (tmp_path / "out" / "bench.md").read_text()
    assert markdown.rstrip().endswith("OK") and "# command: harness bench" in markdown
    assert "## Per rank" in markdown and "2 rank(s), experts backend reference" in markdown


def test_bench_below_a_scenario_threshold_exits_1_and_names_it(tmp_path):
    done, data = _bench(tmp_path, {"iterations": 2, "experts_ratio_min": 50.0})
    assert done.returncode == 1, done.stdout[-2000:] + done.stderr[-2000:]
    failures = data["report"]["failures"]
    assert any("experts step at" in f and "bench.experts_ratio_min = 50.0" in f for f in failures)
    assert "bench: 2 rank(s) on cpu" in done.stdout and "rank 1: ready" in done.stdout  # progress as it goes
    assert (tmp_path / "out" / "bench.md").read_text().rstrip().endswith("FAILED")


def test_cpu_only_report_has_no_empty_rank_tables():
    report = BenchReport(
        run_id="20261130-000000-bench-smoke", scenario_hash="b847df0681b13f14", scenario_name="smoke", num_ranks=0,
        experts_backend=None, versions=None, device_name=None, command=["harness", "bench", "--cpu-only"],
        thresholds={"bench.experts_ratio_min": 0.5}, policies=[], legacy_over_fixed_experts_time=None,
        cpu_costs=[CpuCost(name="plan (in process)", median_s=0.01, samples_s=[0.01], target_s=0.05,
                           within_target=True)],
        failures=[], ok=True,
    )
    markdown = render_markdown(report, [])
    assert "CPU-side costs only (--cpu-only): no ranks ran" in markdown
    for absent in ("0 rank(s)", "None", "## Per rank", "## Ratios", "legacy / fixed"):
        assert absent not in markdown, absent
    assert "| plan (in process) | 0.010 | 0.05 | ok |" in markdown and markdown.rstrip().endswith("OK")


@pytest.mark.parametrize("num_ranks", [2, 3, 4, 8, 16])
def test_raw_vdev_pads_each_peer_to_what_torchs_blocks_divide(num_ranks):
    """torch 2.11's all_to_all_vdev splits a peer's bytes evenly over its blocks and asserts they divide (a
    device-side assert seen on 2 x H200 with 2064-byte rows): every split, in 64-byte rows, is a multiple of the
    blocks per peer for the send buffer's size, covers the peer's bytes, and adds less than one 64-byte row per
    block; the splits fit the buffer."""
    import random

    from harness.bench.raw_comm import PeerBytes, vdev_blocks_per_peer, vdev_rows

    rng = random.Random(num_ranks)
    for _ in range(300):
        row_bytes = rng.choice([2064, 7184, 4096, 96, 2112])
        rows = [rng.randint(0, 20000) for _ in range(num_ranks)]
        capacity, splits = vdev_rows(PeerBytes(row_bytes=row_bytes, send_rows=rows, recv_rows=rows), max(sum(rows), 1))
        per_peer = vdev_blocks_per_peer(capacity * 64, num_ranks)
        assert sum(splits) <= capacity
        for r, s in zip(rows, splits):
            assert s % per_peer == 0 and 0 <= s * 64 - r * row_bytes < 64 * per_peer
    assert [vdev_blocks_per_peer(b, 2) for b in (2**19, 2**20, 3 * 2**20, 2**23)] == [4, 8, 16, 32]
    assert vdev_blocks_per_peer(2**23, 16) == 1 and vdev_blocks_per_peer(2**23, 32) == 1
