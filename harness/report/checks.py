"""The verdict rules: every check of a rank x policy, judged from the record's numbers and the scenario.

    Judging / judging_of()  what the checks compare against: the scenario's expectations and tolerances
    evaluate_checks()       expectation, correctness and memory of one rank x policy (the baseline check given)
    stopped_by()            the other ranks whose OOM or error stopped a rank's policy (its checks are then skipped)
    baseline_checks()       per policy of one rank: its memory baseline against the rank's first policy's
    first_diverging()       the first stage of the data path beyond its tolerance
    policy_expectation()    a policy's outcome over all ranks against the expected one
    contract_problems()     a builtin policy's contract bytes in a record against the scenario's shapes
                            (expected_contracts)
    exit_of()               the exit code and its one-line reason from the check counts and the problems

The rank records facts (numbers, and the tolerances it checked rows against); every verdict is made here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from harness.core.contract import BUILTIN_POLICIES, builtin_shapes
from harness.core.exits import EXIT_ERROR, EXIT_FAILED, EXIT_OK
from harness.core.records import Correctness, ExpectedOutcome, MemoryMeasurement, PolicyResult, RankRecord, StageCheck
from harness.core.rounding import CUDA_SMALL_SEGMENT_BYTES, RSS_READ_SLACK_BYTES, UNRECORDED_BASELINE_ROUNDING_BYTES
from harness.core.units import MIB, human_bytes
from harness.report.model import Check, CheckCounts, CheckOutcome, Checks, Outcome, Problem
from harness.scenario.schema import Scenario
from harness.scenario.sections import WrongKernels

DEFAULT_MEMORY_TOLERANCE_PCT = 2.0
DEFAULT_MAX_ERROR = 0.06


# The memory check: the device shows whole caching-allocator segments, so a small workspace rounds up (a 1-10 MiB
# request takes a 20 MiB segment): at most one such segment per buffer, two buffers.
ALLOCATOR_ROUNDING_BYTES = 2 * CUDA_SMALL_SEGMENT_BYTES

# The baseline check: how far two policies' baselines on one rank may differ and still be "the same state", for
# records that do not carry their own allocator_rounding_bytes (those from before the rank's warm-up pass).
BASELINE_ROUNDING_BYTES = UNRECORDED_BASELINE_ROUNDING_BYTES  # harness.core.rounding says why


@dataclass(frozen=True, kw_only=True)
class Judging:
    """What the checks compare against: the scenario's expectations and tolerances."""

    expected: dict[str, ExpectedOutcome]
    memory_tolerance_pct: float
    max_error: float
    max_error_source: str  # "expect.max_error" or, when the scenario is unreadable, the record's own number
    # Kernels releases expected to be wrong, and how (expect.wrong_kernels); the stages' tolerances.
    wrong_kernels: dict[str, WrongKernels] = field(default_factory=dict)
    stage_tolerance: dict[str, float] = field(default_factory=dict)


def _pct(value: float, reference: float) -> float:
    return (value - reference) / reference * 100.0 if reference else (0.0 if value == reference else math.inf)


def _gib(num_bytes: float) -> str:
    return human_bytes(num_bytes)


def _expectation_check(result: PolicyResult, expected: str | None) -> Check:
    if result.status == "error":
        return Check(outcome="error", message=f"policy raised: {result.error or 'no message'}")
    if expected is None:
        return Check(outcome="skip", message="no expected outcome")
    actual = "oom" if result.status == "oom" else "fit"
    if expected == actual:
        return Check(outcome="pass", message=f"expected {expected}, got {actual}")
    detail = f": {result.oom.message}" if result.oom is not None else ""
    return Check(outcome="fail", message=f"expected {expected}, got {actual}{detail}")


def _correctness_check(result: PolicyResult, judging: Judging, release: str | None) -> Check:
    """Pass when the end-to-end error, the slots and every stage are within tolerance, or when the kernels that
    ran (`release`) are expected to be wrong and are wrong exactly as expected (expect.wrong_kernels)."""
    if result.status == "oom":
        return Check(outcome="skip", message="policy OOMed")
    if result.status == "error":
        return Check(outcome="error", message=f"policy raised: {result.error or 'no message'}")
    c = result.correctness
    if c is None:
        return Check(outcome="skip", message="no correctness result recorded")
    diverged = first_diverging(c, judging)
    within = c.max_rel_error <= judging.max_error and c.num_wrong_slots == 0 and diverged is None
    message = (
        f"max rel error {c.max_rel_error:.3g} (tolerance {judging.max_error:.3g}, {judging.max_error_source}), "
        f"max abs error {c.max_abs_error:.3g}, {c.num_wrong_slots} wrong slots of {c.num_checked_tokens} "
        "checked tokens" + (f"; check {c.check_us / 1e6:.3g} s" if c.check_us is not None else "")
    )
    divergence = describe_divergence(diverged) if diverged is not None else None
    want = judging.wrong_kernels.get(release) if release is not None else None
    if want is None:
        return Check(
            outcome="pass" if within else "fail", message=f"{divergence}; {message}" if divergence else message
        )
    wanted = want.stage + (f" from row {want.first_wrong_row}" if want.first_wrong_row is not None else "")
    why = f" ({want.reason})" if want.reason else ""
    if (
        diverged is not None
        and diverged.stage == want.stage
        and (want.first_wrong_row is None or diverged.first_wrong_row == want.first_wrong_row)
    ):
        return Check(
            outcome="pass",
            message=f"vLLM {release} kernels wrong as expected at {wanted}{why}: {divergence}; {message}",
        )
    found = divergence or "every stage within tolerance"
    return Check(
        outcome="fail", message=f"vLLM {release} kernels were expected wrong at {wanted}{why}, found {found}; {message}"
    )


def first_diverging(c: Correctness, judging: Judging) -> StageCheck | None:
    """The first stage, in data-path order, with a wrong row or an error over the scenario's stage tolerance."""
    for stage in c.stages:
        tolerance = judging.stage_tolerance.get(stage.stage, stage.tolerance)
        if stage.num_rows_wrong > 0 or stage.max_rel_error > tolerance:
            return stage
    return None


def describe_divergence(stage: StageCheck) -> str:
    """A diverging stage in words: rows wrong and their share, experts, the first wrong row, the largest error."""
    where = "tokens" if stage.stage == "combine" else "rows"
    text = (
        f"first diverging stage {stage.stage}: {stage.num_rows_wrong} of {stage.num_rows_checked} "
        f"{'sampled ' if stage.rows == 'sampled' else ''}{where} wrong ({stage.fraction_wrong:.1%})"
    )
    if stage.wrong_experts:
        text += f", local experts {_ranges(stage.wrong_experts)}"
    if stage.first_wrong_row is not None:
        slot = (
            f" (expert {stage.first_wrong_expert}, slot {stage.first_wrong_slot})"
            if stage.first_wrong_expert is not None
            else ""
        )
        text += f", first wrong {'token' if stage.stage == 'combine' else 'row'} {stage.first_wrong_row}{slot}"
    return text + f", max row error {stage.max_rel_error:.3g} (tolerance {stage.tolerance:.3g})"


def _ranges(values: list[int]) -> str:
    """[4, 5, 6, 7, 9] -> "4-7, 9"."""
    groups: list[list[int]] = []
    for v in sorted(values):
        if groups and groups[-1][1] == v - 1:
            groups[-1][1] = v
        else:
            groups.append([v, v])
    return ", ".join(f"{a}-{b}" if b > a else f"{a}" for a, b in groups)


def _memory_check(result: PolicyResult, tolerance_pct: float) -> Check:
    if result.status == "oom":
        return Check(outcome="skip", message="policy OOMed")
    if result.memory is None:
        return Check(outcome="skip", message="no memory measurement")
    allocated = result.contract.common_bytes + result.contract.ws2_bytes
    delta = result.memory.workspace_delta_bytes
    tolerance = tolerance_pct / 100.0
    slack = tolerance * allocated
    floor = ""
    if result.memory.method == "rss" and slack < RSS_READ_SLACK_BYTES:
        slack, floor = RSS_READ_SLACK_BYTES, f", at least {RSS_READ_SLACK_BYTES} B on RSS"
    within = abs(delta - allocated) <= slack
    message = (
        f"workspace delta {_gib(delta)} ({delta} B) vs allocated contract {_gib(allocated)} "
        f"({allocated} B): {_pct(delta, allocated):+.3g}% (tolerance {tolerance_pct:g}%{floor}, "
        f"{result.memory.method})"
    )
    reserved = result.memory.workspace_reserved_bytes
    if not within and reserved is not None:
        # Accept the allocator's segment rounding only when NVML shows exactly what the allocator reserved.
        rounding = 0 <= reserved - allocated <= ALLOCATOR_ROUNDING_BYTES
        if rounding and abs(delta - reserved) <= tolerance * reserved:
            within = True
            message += f"; matches the allocator's {reserved} B of segments (rounding of small buffers)"
    return Check(outcome="pass" if within else "fail", message=message)


def evaluate_checks(
    result: PolicyResult,
    *,
    expected_outcome: str | None,
    judging: Judging,
    baseline: Check,
    stopped_by: list[int] | None = None,
    release: str | None = None,
) -> Checks:
    """The four checks of one rank x policy. `release`: the vLLM release whose kernels ran on the rank, if known.

    `stopped_by`: the other ranks whose OOM or error stopped this rank's policy (its status is then "error"). The
    ranks stop a policy together, so the others record an error that is not theirs: their expectation,
    correctness and memory checks are skipped, and the policy is judged on the ranks that failed.
    """
    if stopped_by:
        skip = Check(
            outcome="skip",
            message=f"policy stopped: rank(s) {stopped_by} ran out of memory or raised; judged on those ranks",
        )
        return Checks(expectation=skip, correctness=skip, memory=skip, baseline=baseline)
    return Checks(
        expectation=_expectation_check(result, expected_outcome),
        correctness=_correctness_check(result, judging, release),
        memory=_memory_check(result, judging.memory_tolerance_pct),
        baseline=baseline,
    )


def stopped_by(rank: int, result: PolicyResult, oom_ranks: dict[str, list[int]]) -> list[int] | None:
    """The other ranks whose OOM or error stopped this rank's policy (the ranks stop a policy together); None when
    this rank's own status is its own doing."""
    if result.status != "error":
        return None
    if result.failed_ranks is not None:
        others = [r for r in result.failed_ranks if r != rank]
        return others if rank not in result.failed_ranks and others else None
    return oom_ranks.get(result.policy)  # records before failed_ranks: only another rank's OOM stopped a policy


def baseline_rounding(memory: MemoryMeasurement | None) -> int | None:
    """The record's own allowance when it carries one (the rank knows its allocator), else this module's."""
    if memory is None:
        return None
    if memory.allocator_rounding_bytes is not None:
        return memory.allocator_rounding_bytes
    return BASELINE_ROUNDING_BYTES.get(memory.method)


_WARMUP_HINT = {
    None: "no warm-up pass recorded: a record of an older harness, whose first policy's window held one-time setup",
    "full": "after a full warm-up pass",
    "comm-only": "the warm-up pass was comm-only on this rank: its workspace did not fit",
    "failed": "the warm-up pass failed on this rank",
}


def baseline_checks(record: RankRecord) -> dict[str, Check]:
    """Per policy of one rank: its memory baseline against the rank's first measured policy's.

    The first policy's window must not hold one-time setup (lazy NCCL or kernel initialisation) that the later
    ones do not: then the policies' peaks are comparable. Equal means within the allocator's rounding.
    """
    measured = [(p.policy, p.memory) for p in record.policies if p.memory is not None]
    checks: dict[str, Check] = {}
    if len(measured) < 2:
        for policy, _ in measured:
            checks[policy] = Check(outcome="skip", message="one policy measured on this rank: no baseline to compare")
        return checks
    first, reference = measured[0][0], measured[0][1]
    assert reference is not None
    for policy, memory in measured:
        assert memory is not None
        rounding = baseline_rounding(memory) or 0
        diff = memory.baseline_bytes - reference.baseline_bytes
        if policy == first:
            checks[policy] = Check(
                outcome="pass",
                message=f"baseline {memory.baseline_bytes} B ({memory.method}): "
                "the reference for this rank's other policies",
            )
        elif abs(diff) <= rounding and memory.method == reference.method:
            checks[policy] = Check(
                outcome="pass",
                message=f"baseline {memory.baseline_bytes} B, {diff:+d} B from "
                f"{first}'s (allowed: {rounding} B of {memory.method} rounding)",
            )
        else:
            checks[policy] = Check(
                outcome="fail",
                message=(
                    f"baseline {memory.baseline_bytes} B is {diff:+d} B ({diff / MIB:+.1f} MiB) from {first}'s "
                    f"{reference.baseline_bytes} B, beyond the {rounding} B of {memory.method} rounding: the policies "
                    f"did not start from the same state ({_WARMUP_HINT[record.warmup]})"
                ),
            )
    return checks


# legacy and fixed are vLLM's own formulas, stable across the records' history; lower-bound (the live set) was
# refined after records still committed were made, so its figure in a record is its harness's, not checked here.
RECOMPUTED_CONTRACTS = tuple(p for p in BUILTIN_POLICIES if p != "lower-bound")


def expected_contracts(scenario: Scenario | None) -> dict[str, tuple[int, int, int]]:
    """(common, ws2, total) bytes of legacy and fixed at the scenario's shapes (harness.core.contract)."""
    if scenario is None:
        return {}
    args = scenario.sizing_args()
    shapes = {p: builtin_shapes(p, args) for p in scenario.policies if p in RECOMPUTED_CONTRACTS}
    return {p: (s.common_bytes, s.ws2_bytes, s.total_bytes) for p, s in shapes.items()}


def contract_problems(record: RankRecord, expected: dict[str, tuple[int, int, int]]) -> list[Problem]:
    """A builtin policy's contract (legacy, fixed) is computed, not measured: the record's bytes must be the ones
    the scenario's shapes give (`expected`, from expected_contracts), else the record is not of this scenario or
    was edited."""
    problems = []
    for result in record.policies:
        want = expected.get(result.policy)
        got = result.contract
        if want is not None and (got.common_bytes, got.ws2_bytes, got.total_bytes) != want:
            problems.append(
                Problem(
                    kind="mismatch",
                    rank=record.rank,
                    path=f"ranks/rank-{record.rank:05d}.json",
                    cause=f"rank {record.rank}, policy {result.policy}: contract common {got.common_bytes} B, ws2 "
                    f"{got.ws2_bytes} B, total {got.total_bytes} B; the scenario's shapes give {want[0]}, "
                    f"{want[1]}, {want[2]} B",
                )
            )
    return problems


def policy_expectation(outcome: Outcome | None, expected: str | None) -> CheckOutcome:
    if expected is None:
        return "skip"
    if outcome is None or outcome == "error":
        return "error"
    return "pass" if outcome == expected else "fail"


def judging_of(scenario: Scenario | None, records: tuple[RankRecord, ...]) -> Judging:
    if scenario is not None:
        return Judging(
            expected=dict(scenario.expect.outcomes),
            memory_tolerance_pct=scenario.expect.memory_tolerance_pct,
            max_error=scenario.expect.max_error,
            max_error_source="expect.max_error",
            wrong_kernels=dict(scenario.expect.wrong_kernels),
            stage_tolerance=scenario.expect.stage_tolerance.model_dump(),
        )
    # No readable scenario: the tolerance the ranks were given is all there is; say where it came from.
    tolerances = [p.correctness.tolerance for r in records for p in r.policies if p.correctness]
    return Judging(
        expected={},
        memory_tolerance_pct=DEFAULT_MEMORY_TOLERANCE_PCT,
        max_error=min(tolerances, default=DEFAULT_MAX_ERROR),
        max_error_source="the records' tolerance",
    )


def exit_of(counts: CheckCounts, problems: list[Problem]) -> tuple[int, str]:
    if problems:
        kinds: dict[str, int] = {}
        for p in problems:
            kinds[p.kind] = kinds.get(p.kind, 0) + 1
        listed = ", ".join(f"{n} {k}" for k, n in sorted(kinds.items()))
        failed = f"; {counts.num_fail} check(s) failed" if counts.num_fail else ""
        return EXIT_ERROR, f"errors: {listed}{failed}"
    if counts.num_fail:
        return EXIT_FAILED, f"{counts.num_fail} check(s) failed"
    return EXIT_OK, f"all {counts.num_pass} checks passed ({counts.num_skip} skipped)"
