"""Memory per rank on CPU: the sampler, the breakdown, budgets and OOM records, expectations, the NVML fallback."""

from __future__ import annotations

import time
from pathlib import Path

import torch

from distributed_utils import parallel_launch
from harness.core.records import RankRecord, rank_record_path, read_record, write_record
from harness.rank.memory import Accountant, BudgetExceeded, MemoryProbe, PeakSampler, nvml_device_for
from scenario_utils import tiny
from verdicts import collected_checks

MB = 2**20


def test_sampler_sees_a_short_spike():
    probe = MemoryProbe(torch.device("cpu"))
    acc = Accountant(torch.device("cpu"))
    with PeakSampler(probe, interval_s=0.0005) as sampler:
        baseline = probe.used_bytes()
        spike = acc.alloc("ballast", (64 * MB,), torch.uint8)  # touched: 64 MiB of RSS
        time.sleep(0.02)
        del spike
        time.sleep(0.01)
    assert probe.used_bytes() < baseline + 16 * MB  # the mapping went back to the OS
    assert sampler.peak_bytes - baseline >= 60 * MB
    assert sampler.num_samples >= 5


def test_accountant_counts_exact_bytes_per_category_and_enforces_a_cpu_budget():
    acc = Accountant(torch.device("cpu"), budget_bytes=10 * MB)
    a = acc.alloc("common", (MB,), torch.bfloat16)
    acc.alloc("ws2", (3, 1024), torch.float32)
    assert acc.bytes_of("common") == 2 * MB and acc.bytes_of("ws2") == 12288
    assert acc.total_bytes == 2 * MB + 12288
    try:
        acc.alloc("common", (9 * MB,), torch.uint8)
    except BudgetExceeded as exc:
        assert exc.requested_bytes == 9 * MB
        assert isinstance(exc, torch.OutOfMemoryError)  # one OOM path for GPU and CPU
        assert "Tried to allocate 9.00 MiB (9437184 bytes) for common" in str(exc)
    else:
        raise AssertionError("the budget was not enforced")
    acc.release("common", a)
    assert acc.bytes_of("common") == 0


def test_nvml_fallback_without_a_driver_uses_rss_labelled_as_cpu_memory():
    assert nvml_device_for(torch.device("cpu")) is None
    probe = MemoryProbe(torch.device("cpu"))
    assert probe.method == "rss" and probe.label == "CPU memory (process RSS)"
    assert probe.process_used_bytes() is None and probe.used_bytes() > 0
    if not torch.cuda.is_available():
        # pynvml is installed but no driver answers: the handle lookup gives up instead of failing.
        assert nvml_device_for(torch.device("cuda", 0)) is None


def _rank_main(info, scenario_data, run_dir):
    from harness.rank.lifecycle import rank_main
    from harness.scenario.schema import parse_scenario

    return rank_main(parse_scenario(scenario_data), info, Path(run_dir)).model_dump(mode="json")


def _run(scenario, tmp_path) -> list[RankRecord]:
    data = scenario.model_dump(mode="json")
    raw = parallel_launch(scenario.parallel.num_ranks, _rank_main, data, str(tmp_path))
    records = [RankRecord.model_validate(r) for r in raw]
    for record in records:  # records survive the trip through JSON and the schema
        path = write_record(rank_record_path(tmp_path, record.rank), record)
        assert read_record(path) == record
    return records


def test_breakdown_sums_to_what_was_allocated_and_workspace_delta_matches_contract(tmp_path):
    scenario = tiny(**{"model.hidden_size": 256, "model.intermediate_size": 128, "parallel.max_tokens_per_rank": 64})
    records = _run(scenario, tmp_path)
    E, K, I = 8, 256, 128
    M = 64 * 2
    for record in records:
        for policy in record.policies:
            b, c = policy.breakdown, policy.contract
            assert b.common_bytes == c.common_bytes and b.ws2_bytes == c.ws2_bytes
            assert b.weights_bytes == E * (2 * I * K + K * I) + E * (2 * I + K) * 4
            assert b.dispatch_bytes > E * M * K  # expert_x alone is E*M*K fp8 bytes
            assert b.ballast_bytes == 0
            delta = policy.memory.workspace_delta_bytes
            allocated = c.common_bytes + c.ws2_bytes
            assert abs(delta - allocated) <= 0.02 * allocated, (policy.policy, delta, allocated)
            assert policy.memory.method == "rss" and policy.memory.label.startswith("CPU memory")
            assert policy.memory.peak_bytes >= policy.memory.baseline_bytes + delta
        legacy, fixed = record.policies
        assert legacy.contract.total_bytes == 2 * fixed.contract.total_bytes  # D=2: ws13 and ws2 doubled
        assert record.versions.torch == torch.__version__ and record.hardware.device_kind == "cpu"
        assert record.scenario_hash == scenario.scenario_hash


def test_budget_oom_is_a_recorded_result_and_the_next_policy_still_runs(tmp_path):
    # legacy needs 4x fixed's workspace here; the budget sits between them.
    scenario = tiny(
        **{
            "model.hidden_size": 256,
            "model.intermediate_size": 128,
            "parallel.max_tokens_per_rank": 64,
            "parallel.num_dispatchers": 4,
            "parallel.num_local_experts": 4,
            "memory.budget_gb": 0.004,
            "expect.outcomes": {"legacy": "oom", "fixed": "fit"},
            "memory.comm_buffer": "none",
        }
    )  # DeepEP LL's 2.1 MB would leave fixed no room
    fixed_bytes = 4 * 256 * (256 + 256) * 2  # E * M * (max(N, K) + max(I, K)) * bf16
    # About 1.4 MB of weights and comm buffers sit below the budget too: legacy's common (2 MiB) fits, its ws2 does not.
    assert 2 * fixed_bytes < 0.004e9 < 4 * fixed_bytes
    records = _run(scenario, tmp_path)
    checks = collected_checks(tmp_path)  # the collector judges what the ranks recorded
    for record in records:
        legacy, fixed = record.policies
        assert legacy.status == "oom" and checks[record.rank, "legacy"].expectation.outcome == "pass"
        oom = legacy.oom
        assert oom.policy == "legacy" and oom.stage == "workspace"
        assert oom.requested_bytes == legacy.contract.ws2_bytes  # common fit; ws2 is the allocation refused
        assert oom.budget_bytes == 4_000_000 and oom.total_bytes == 4_000_000
        assert oom.free_bytes is not None and oom.free_bytes < oom.requested_bytes
        assert "CPU budget exceeded" in oom.message
        assert fixed.status == "ok" and checks[record.rank, "fixed"].expectation.outcome == "pass"
        assert checks[record.rank, "fixed"].correctness.outcome == "pass", checks[record.rank, "fixed"].correctness
        # Nothing of the failed policy stays counted: the breakdown shows fixed's buffers alone.
        assert fixed.breakdown.common_bytes == fixed.contract.common_bytes
        assert fixed.breakdown.ws2_bytes == fixed.contract.ws2_bytes


def test_expected_outcome_that_does_not_happen_is_a_failure(tmp_path):
    scenario = tiny(
        **{
            "memory.budget_gb": 0.002,
            "expect.outcomes": {"legacy": "fit", "fixed": "oom"},
            "model.hidden_size": 256,
            "model.intermediate_size": 128,
            "parallel.max_tokens_per_rank": 64,
            "memory.comm_buffer": "none",
        }
    )  # DeepEP LL's 2.1 MB would fail setup in a 2 MB budget
    records = _run(scenario, tmp_path)
    checks = collected_checks(tmp_path)
    for record in records:
        legacy, fixed = record.policies
        assert legacy.status == "oom" and legacy.expected_outcome == "fit"
        assert checks[record.rank, "legacy"].expectation.outcome == "fail"
        assert checks[record.rank, "legacy"].expectation.message.startswith("expected fit, got oom")
        assert fixed.status == "oom" and checks[record.rank, "fixed"].expectation.outcome == "pass"
