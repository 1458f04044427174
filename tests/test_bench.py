"""`harness bench` on CPU: interleaved raw and harness variants on real gloo ranks, thresholds from the scenario."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import torch
import yaml

from cli_utils import run_cli_inproc

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
    done = run_cli_inproc("bench", str(path), "--no-cpu-costs", "--out", str(out), *extra)
    return done, json.loads((out / "bench.json").read_text())


@pytest.mark.slow
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
            # The yardstick: bytes on every device; on CPU ranks no probe and no graph, so the bound is n/a
            y = policy["comm_yardstick"]
            assert y["timing"] == "eager" and y["hbm_gbps"] is None and y["bound_ratio"] is None
            assert y["dispatch_local_bytes"] == y["received_pairs"] * (TINY["model"]["hidden_size"] + 4) > 0
            assert policy["comm_graph_error"] == "CPU ranks: no CUDA graphs" and policy["kernels"] == []
    summary = {p["policy"]: p for p in report["policies"]}
    assert summary["fixed"]["experts_ratio_min"] > 0 and summary["legacy"]["comm_ratio_min"] > 0
    assert summary["fixed"]["comm_bound_ratio_min"] is None  # n/a on CPU: not gating
    assert "## Comm yardstick" in (tmp_path / "out" / "bench.md").read_text()
    assert 0 < summary["fixed"]["experts_tflops_min"] <= summary["fixed"]["experts_tflops_max"]
    assert report["legacy_over_fixed_experts_time"] > 0
    assert report["command"][:3] == ["harness", "bench", str(tmp_path / "tiny-bench.yaml")]
    assert "--no-cpu-costs" in report["command"] and "--json" in report["command"]
    markdown = (tmp_path / "out" / "bench.md").read_text()
    assert markdown.rstrip().endswith("OK") and "# command: harness bench" in markdown
    assert "## Per rank" in markdown and "2 rank(s), experts backend reference" in markdown
    fixed_row = next(line for line in markdown.splitlines() if line.startswith("| fixed |"))
    cells = [c.strip() for c in fixed_row.strip("|").split("|")]
    assert cells[4] == "n/a"  # the comm bound ratio: n/a on CPU ranks, not failed
    low, _, high = cells[7].partition("..")
    assert float(low) > 0 and "0.0..0.0" not in fixed_row  # CPU TFLOP/s at 4 significant digits


@pytest.mark.slow
def test_cpu_ranks_never_fail_on_the_comm_ratios(tmp_path):
    done, data = _bench(tmp_path, {"iterations": 2, "experts_ratio_min": 0.01, "comm_busbw_ratio_min": 50.0,
                                   "comm_bound_ratio_min": 50.0})
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert data["report"]["failures"] == [] and data["report"]["ok"] is True


@pytest.mark.slow
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
    assert "| plan (in process) | 0.010 | wall | 0.010 | 0.05 | ok |" in markdown and markdown.rstrip().endswith("OK")


def test_yardstick_counts_minimal_local_and_anchor_bytes_and_the_bound():
    """Two ranks of 2 experts each, K = 256, top-2: token 0 picks experts 0 and 1 (both on rank 0: no remote row),
    token 1 picks 1 and 2 (one remote row to rank 1), token 2 picks 2 and 3 (one remote row). The bound adds the
    remote bytes over the link and the local bytes over HBM; off CUDA (no probe) it is None, not a failure."""
    from harness.bench.yardstick import distinct_remote_rows, yardstick

    ids = torch.tensor([[0, 1], [1, 2], [2, 3]])
    assert distinct_remote_rows(ids, rank=0, num_local_experts=2, num_ranks=2) == 2
    assert distinct_remote_rows(ids, rank=1, num_local_experts=2, num_ranks=2) == 2  # tokens 0 and 1 go to rank 0
    K = 256
    args = dict(topk_ids=ids, rank=0, num_ranks=2, num_local_experts=2, hidden_size=K, received_pairs=5,
                moved_row_bytes=K + 48, out_bytes=2, dispatch_us=10.0, combine_us=20.0, timing="graph")
    y = yardstick(**args, hbm_gbps=4000.0, link_gbps=400.0)
    assert (y.remote_rows, y.selections, y.received_pairs) == (2, 6, 5)
    assert y.dispatch_min_remote_bytes == 2 * (K + 4 + 2 * 2) and y.combine_min_remote_bytes == 2 * 2 * K
    assert y.dispatch_local_bytes == 5 * (K + 4) and y.combine_local_bytes == 5 * 2 * K
    assert y.dispatch_moved_bytes == 2 * (K + 48)
    assert y.anchor_dispatch_bytes == 6 * (K + 2 * 4 + 16) and y.anchor_combine_bytes == 6 * 2 * K
    bound_d = (2 * (K + 8) / 400.0 + 5 * (K + 4) / 4000.0) / 1e3  # bytes / (GB/s) = ns; / 1e3 = us
    bound_c = (4 * K / 400.0 + 10 * K / 4000.0) / 1e3
    assert y.dispatch_bound_us == pytest.approx(bound_d) and y.combine_bound_us == pytest.approx(bound_c)
    assert y.bound_ratio == pytest.approx((bound_d + bound_c) / 30.0)
    one = yardstick(**{**args, "num_ranks": 1, "num_local_experts": 4}, hbm_gbps=4000.0, link_gbps=None)
    assert one.remote_rows == 0 and one.dispatch_bound_us == pytest.approx(5 * (K + 4) / 4000.0 / 1e3)
    cpu = yardstick(**args, hbm_gbps=None, link_gbps=None)
    assert cpu.bound_ratio is None and cpu.dispatch_bound_us is None and cpu.dispatch_local_bytes > 0
    assert yardstick(**args, hbm_gbps=4000.0, link_gbps=None).bound_ratio is None  # P = 2 needs the link probe


def test_queue_ahead_counts_late_enqueueing_and_doubles_its_sleep():
    """A timed call whose enqueueing outlasted the GPU sleep is late (the GPU ran dry: host time in the sample);
    past half the sleep the sleep doubles, up to its cap. The yardstick carries the last sleep and the count."""
    from harness.bench.yardstick import yardstick
    from harness.rank.timing import QueueAhead

    q = QueueAhead(torch.device("cpu"), sleep_us=100.0, max_sleep_us=300.0)
    q.note(40.0)
    assert (q.sleep_us, q.late, q.samples) == (100.0, 0, 1)
    q.note(60.0)  # past half: a margin kept for the next call
    assert (q.sleep_us, q.late) == (200.0, 0)
    q.note(250.0)  # longer than the sleep: late, and the sleep doubles to its cap
    assert (q.sleep_us, q.late, q.samples) == (300.0, 1, 3)
    q.note(1000.0)
    assert (q.sleep_us, q.late) == (300.0, 2)
    ids = torch.tensor([[0, 1]])
    y = yardstick(topk_ids=ids, rank=0, num_ranks=1, num_local_experts=2, hidden_size=64, received_pairs=2,
                  moved_row_bytes=112, out_bytes=2, hbm_gbps=1000.0, link_gbps=None, dispatch_us=3.0,
                  combine_us=4.0, timing="graph", idle_dispatch_us=9.0, idle_combine_us=8.0, queue=q)
    assert (y.queued_ahead_us, y.late_samples, y.idle_dispatch_us, y.idle_combine_us) == (300.0, 2, 9.0, 8.0)
    assert y.bound_ratio == pytest.approx((2 * 68 / 1000.0 + 2 * 128 / 1000.0) / 1e3 / 7.0)  # the queued times


@pytest.mark.gpu
def test_queue_ahead_hides_the_launch_of_a_graph_replay():
    """On a GPU: the events around a replay queued behind the sleep time the replay's kernels, not its launch:
    a captured chain of small kernels replayed queued takes no longer than launched on an idle GPU, and the
    sleep (calibrated on the GPU's clock) outlasts the enqueueing, so no sample is late."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from harness.rank.timing import QueueAhead

    x = torch.zeros(1 << 10, device="cuda")
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        x.add_(1)
        with torch.cuda.graph(graph, stream=stream):
            for _ in range(20):
                x.add_(1)
    torch.cuda.synchronize()
    q = QueueAhead(torch.device("cuda"))
    times = {"queued": [], "idle": []}
    for _ in range(21):
        for mode in times:
            torch.cuda.synchronize()
            since = q.before() if mode == "queued" else 0.0
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            graph.replay()
            end.record()
            if mode == "queued":
                q.after(since)
            end.synchronize()
            times[mode].append(start.elapsed_time(end))
    assert q.cycles_per_us > 100 and q.samples == 21 and q.late <= 1  # the first may double the sleep
    assert sorted(times["queued"])[10] <= sorted(times["idle"])[10]
    assert float(x[0]) == 1 + 42 * 20
