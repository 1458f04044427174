"""Per-policy aggregates of the bench over ranks, the legacy/fixed time ratio, and the scenario's thresholds."""

from __future__ import annotations

import statistics

from harness.bench.records import BENCH_POLICIES, BenchPolicySummary, BenchRankRecord
from harness.scenario.schema import Scenario


def _min(values: list[float]) -> float | None:
    return min(values) if values else None


def _max(values: list[float]) -> float | None:
    return max(values) if values else None


def _summary(policy: str, records: list[BenchRankRecord]) -> BenchPolicySummary:
    rows = [p for r in records for p in r.policies if p.policy == policy and p.status == "ok"]
    experts = [p.experts_ratio for p in rows if p.experts_ratio is not None]
    sticks = [p.comm_yardstick for p in rows if p.comm_yardstick is not None]
    tflops = [p.experts_tflops for p in rows if p.experts_tflops is not None]
    return BenchPolicySummary(
        policy=policy,
        num_ranks_ok=len(rows),
        experts_raw_variant=rows[0].experts_raw_variant if rows else None,
        experts_ratio_min=_min(experts),
        experts_ratio_median=statistics.median(experts) if experts else None,
        comm_ratio_min=_min([p.comm_ratio for p in rows if p.comm_ratio is not None]),
        experts_tflops_min=_min(tflops),
        experts_tflops_max=_max(tflops),
        fraction_of_fp8_peak_max=_max(
            [p.experts_tflops_fraction_of_peak for p in rows if p.experts_tflops_fraction_of_peak is not None]
        ),
        harness_comm_busbw_gbps_min=_min(
            [p.harness_comm_busbw_gbps for p in rows if p.harness_comm_busbw_gbps is not None]
        ),
        raw_a2a_busbw_gbps_max=_max([p.raw_a2a_busbw_gbps for p in rows if p.raw_a2a_busbw_gbps is not None]),
        max_rel_error=_max([p.max_rel_error for p in rows if p.max_rel_error is not None]),
        comm_bound_ratio_min=_min([y.bound_ratio for y in sticks if y.bound_ratio is not None]),
        comm_timing=sticks[0].timing if sticks else None,
        dispatch_us_max=_max([y.dispatch_us for y in sticks]),
        combine_us_max=_max([y.combine_us for y in sticks]),
        dispatch_bound_us_max=_max([y.dispatch_bound_us for y in sticks if y.dispatch_bound_us is not None]),
        combine_bound_us_max=_max([y.combine_bound_us for y in sticks if y.combine_bound_us is not None]),
    )


def _below_thresholds(summary: BenchPolicySummary, scenario: Scenario) -> list[str]:
    t, s, failures = scenario.bench, summary, []
    if s.experts_ratio_min is not None and s.experts_ratio_min < t.experts_ratio_min:
        failures.append(
            f"{s.policy}: experts step at {s.experts_ratio_min:.3f} of the raw kernel "
            f"(threshold bench.experts_ratio_min = {t.experts_ratio_min})"
        )
    # The raw-collective ratio (comm_ratio_min) is a diagnostic; the yardstick's bound gates, where it means
    # something (GPU ranks: probed bandwidths).
    if s.comm_bound_ratio_min is not None and s.comm_bound_ratio_min < t.comm_bound_ratio_min:
        failures.append(
            f"{s.policy}: dispatch + combine ({s.comm_timing}) at {s.comm_bound_ratio_min:.3f} of the "
            f"bound (threshold bench.comm_bound_ratio_min = {t.comm_bound_ratio_min})"
        )
    return failures


def _errors(records: list[BenchRankRecord]) -> list[str]:
    """Policies that raised: the first rank's message per policy (every rank stopped it together)."""
    seen: dict[str, str] = {}
    for record in records:
        for p in record.policies:
            if p.status == "error" and p.policy not in seen:
                seen[p.policy] = f"{p.policy}: raised on {p.error or 'a rank'}"
    return list(seen.values())


def summarize(
    records: list[BenchRankRecord], scenario: Scenario
) -> tuple[list[BenchPolicySummary], float | None, list[str]]:
    """Per-policy aggregates over ranks, the legacy/fixed experts time ratio, and the failures (thresholds,
    policies that raised)."""
    order = {p: i for i, p in enumerate(BENCH_POLICIES)}
    policies = sorted({p.policy for r in records for p in r.policies}, key=lambda p: order.get(p, len(order)))
    summaries = [_summary(policy, records) for policy in policies]
    failures = [f for s in summaries for f in _below_thresholds(s, scenario)] + _errors(records)
    experts_us = {
        policy: [
            v.median_us
            for r in records
            for p in r.policies
            if p.policy == policy and p.status == "ok"
            for v in p.variants
            if v.name == "experts:harness"
        ]
        for policy in policies
    }
    ratio = None
    if experts_us.get("legacy") and experts_us.get("fixed"):
        ratio = statistics.median(experts_us["legacy"]) / statistics.median(experts_us["fixed"])
    return summaries, ratio, failures
