"""The collector's verdicts on what a test's ranks recorded: a rank records facts, harness.report.checks judges."""

from __future__ import annotations

from pathlib import Path

from harness.core.records import PolicyResult
from harness.report.checks import evaluate_checks, judging_of, stopped_by
from harness.report.collect import collect
from harness.report.model import Check, Checks, RunReport
from harness.scenario.schema import Scenario


def judge_policy(result: PolicyResult, scenario: Scenario, *, rank: int, release: str | None = None) -> Checks:
    """One rank x policy judged by the collector's rules against `scenario`. The baseline check compares a rank's
    policies with each other, so it is not made here (collected_checks makes it)."""
    return evaluate_checks(
        result,
        expected_outcome=scenario.expect.outcomes.get(result.policy),
        judging=judging_of(scenario, ()),
        stopped_by=stopped_by(rank, result, {}),
        baseline=Check(outcome="skip", message="one policy judged alone"),
        release=release,
    )


def collected_checks(run_dir: Path) -> dict[tuple[int, str], Checks]:
    """Every (rank, policy)'s checks in the report that `harness collect` makes of `run_dir` (nothing written)."""
    report = collect(run_dir, write=False).report
    assert isinstance(report, RunReport)
    return {(rank.rank, p.policy): p.checks for rank in report.ranks for p in rank.policies}
