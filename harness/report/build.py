"""Aggregation: a loaded run's records, judged by harness.report.checks, into the typed RunReport.

    build_report()    every number any rendering shows, in base units, with the verdicts, the problems and the exit
    collect_report()  the same, streamed from the run directory: each record judged and folded as it is read, then
                      dropped (RunFold), so memory is the report's, not the records' (about 27 of 65 KB a rank)
    generation_of()   the stamp every output of one collect carries: the run and its exact inputs

A rank whose policy was stopped because another rank ran out of memory (status "error"; the ranks stop a policy
together) has its checks skipped; the policy's outcome is "oom".
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.core.contract import fixed_shapes, live_set_bytes
from harness.core.exits import EXIT_OK
from harness.core.records import (
    SCHEMA_VERSION, MemoryMeasurement, PolicyResult, RankFailure, RankRecord, RunManifest, Timings,
)
from harness.report.checks import (
    Judging,
    baseline_checks,
    baseline_rounding,
    contract_problems,
    expected_contracts,
    evaluate_checks,
    exit_of,
    first_diverging,
    judging_of,
    policy_expectation,
    stopped_by,
)
from harness.report.components import ComponentFold, component_failures
from harness.report.load import LoadedRun, load_run
from harness.report.model import (
    Aggregate,
    Check,
    CheckCounts,
    CheckFailure,
    Checks,
    HardwareInfo,
    Outcome,
    PolicyCheckCounts,
    PolicySummary,
    Problem,
    RankEntry,
    RankPolicy,
    RunReport,
    ScenarioInfo,
    StageSpread,
)
from harness.scenario.schema import Scenario, ScenarioError, parse_stored_scenario

def generation_of(run_id: str | None, input_hash: str) -> str:
    """The stamp every output of one collect carries: which run, and which exact inputs."""
    return f"{run_id or 'unknown-run'}@{input_hash[:16]}"


def _agg(values: Iterable[float | int | None]) -> Aggregate | None:
    """min/avg/max over ranks of the values that exist; None when no rank has one."""
    present = [v for v in values if v is not None]
    if not present:
        return None
    return Aggregate(min=min(present), avg=sum(present) / len(present), max=max(present), num_ranks=len(present))


def _scenario_of(raw: dict[str, Any] | None, hint: Scenario | None) -> tuple[Scenario | None, dict[str, Any] | None, str | None]:
    """The run's scenario (parsed) from run.json's (else the first record's) raw dict, and why it could not be."""
    if raw is None and hint is not None:
        return hint, hint.model_dump(mode="json"), None
    if raw is None:
        return None, None, "no manifest and no records: the scenario is unknown"
    try:
        return parse_stored_scenario(dict(raw), path="run.json scenario"), raw, None
    except ScenarioError as exc:
        return None, raw, str(exc)


def _scenario_info(m: RunManifest | None, first: RankRecord | None, memory: MemoryMeasurement | None,
                   scenario: Scenario | None, raw: dict[str, Any] | None) -> ScenarioInfo:
    """`first`: the lowest rank's record; `memory`: the first memory measurement of any rank, in rank order."""
    fields: dict[str, Any] = {
        "name": m.scenario_name if m else (first.scenario_name if first else (scenario.name if scenario else None)),
        "hash": m.scenario_hash if m else (first.scenario_hash if first else (scenario.scenario_hash if scenario else None)),
        "path": m.scenario_path if m else None,
        "description": str((raw or {}).get("description") or "") or None,
    }
    if scenario is not None:
        args = scenario.sizing_args()
        fields.update(
            num_dispatchers=args.num_dispatchers, num_ranks=scenario.parallel.num_ranks,
            num_local_experts=args.num_local_experts, max_tokens_per_rank=args.max_tokens_per_rank, M=args.M,
            hidden_size=args.K, intermediate_size=args.intermediate_size, N=args.N, top_k=args.top_k,
            num_experts=scenario.model.num_experts, model_preset=scenario.model.preset, activation=args.activation,
            workspace_dtype=args.workspace_dtype, emulated=scenario.emulated, routing=scenario.routing.kind,
            num_tokens_per_dispatcher=scenario.num_tokens_per_dispatcher, policies=list(scenario.policies),
            expected_outcomes=dict(scenario.expect.outcomes), memory_tolerance_pct=scenario.expect.memory_tolerance_pct,
            max_error=scenario.expect.max_error, measurement_method=scenario.memory.method,
            memory_budget_bytes=scenario.memory.budget_bytes, ballast_bytes=scenario.memory.ballast_bytes)
    elif first is not None:  # an unparsable scenario (e.g. a newer harness's): what the record states directly
        fields.update(num_dispatchers=first.num_dispatchers, num_ranks=first.num_ranks, emulated=first.emulated,
                      policies=[p.policy for p in first.policies])
    if first is not None:
        fields.update(measurement_method=first.measurement_method, experts_backend=first.experts_backend,
                      comm_backend=first.comm_backend, memory_method=memory.method if memory else None,
                      memory_label=memory.label if memory else None,
                      baseline_rounding_bytes=baseline_rounding(memory))
    return ScenarioInfo(**fields)


@dataclass
class _Running:
    """min/avg/max over ranks of a value, folded one rank at a time (the sum in rank order, as _agg adds)."""

    count: int = 0
    total: float = 0
    low: float | None = None
    high: float | None = None

    def add(self, value: float | int | None) -> None:
        if value is None:
            return
        self.count += 1
        self.total += value
        self.low = value if self.low is None else min(self.low, value)
        self.high = value if self.high is None else max(self.high, value)

    def aggregate(self) -> Aggregate | None:
        if not self.count:
            return None
        return Aggregate(min=self.low, avg=self.total / self.count, max=self.high, num_ranks=self.count)


@dataclass
class _Seen:
    """What the run-wide sections need from the records, folded as each is read."""

    first: RankRecord | None = None
    memory: MemoryMeasurement | None = None
    contracts: dict[str, Any] = field(default_factory=dict)  # policy -> the lowest rank's contract
    oom_ranks: dict[str, list[int]] = field(default_factory=dict)
    version_values: dict[str, set[str]] = field(default_factory=dict)
    hostnames: set[str] = field(default_factory=set)
    device_names: set[str] = field(default_factory=set)
    capabilities: set[str] = field(default_factory=set)
    device_total: _Running = field(default_factory=_Running)
    num_records: int = 0
    started_at: float | None = None
    finished_at: float | None = None
    finished_policies: dict[int, list[str]] = field(default_factory=dict)  # failed ranks only: what they finished

    def add(self, record: RankRecord, failed: bool) -> None:
        if self.first is None:
            self.first = record
        if self.memory is None:
            self.memory = next((p.memory for p in record.policies if p.memory is not None), None)
        own = {p.policy: p.contract for p in record.policies}
        for policy, contract in own.items():
            self.contracts.setdefault(policy, contract)  # records come in rank order: the lowest rank wins
        for p in record.policies:
            if p.status == "oom":
                self.oom_ranks.setdefault(p.policy, []).append(record.rank)
        for name in type(record.versions).model_fields:
            self.version_values.setdefault(name, set()).add(str(getattr(record.versions, name)))
        hw = record.hardware
        self.hostnames.add(hw.hostname)
        self.device_names.add(hw.device_name)
        if hw.device_capability:
            self.capabilities.add(hw.device_capability)
        self.device_total.add(hw.device_total_bytes)
        self.num_records += 1
        self.started_at = record.started_at if self.started_at is None else min(self.started_at, record.started_at)
        if record.finished_at is not None:
            self.finished_at = record.finished_at if self.finished_at is None else max(self.finished_at,
                                                                                       record.finished_at)
        if failed:
            self.finished_policies[record.rank] = [p.policy for p in record.policies]

    def versions(self, manifest: RunManifest | None) -> tuple[Any, dict[str, list[str]]]:
        """The lowest rank's versions, and every field on which ranks disagree (a mixed cluster is worth a warning)."""
        if self.first is None:
            return (manifest.versions, {}) if manifest is not None and manifest.versions is not None else (None, {})
        return self.first.versions, {name: sorted(values) for name, values in self.version_values.items()
                                     if len(values) > 1}

    def hardware(self, manifest: RunManifest | None, failures: tuple[RankFailure, ...]) -> HardwareInfo:
        hostnames = sorted(self.hostnames | {f.node for f in failures})
        return HardwareInfo(
            device_kind=self.first.hardware.device_kind if self.first else None,
            device_names=sorted(self.device_names), device_total_bytes=self.device_total.aggregate(),
            device_capabilities=sorted(self.capabilities),
            num_ranks_expected=manifest.num_ranks if manifest else None,
            num_ranks_reported=self.num_records, num_rank_failures=len(failures), num_nodes=len(hostnames),
            nodes=hostnames, launcher=manifest.launcher if manifest else None,
        )


def _spread(t: Timings | None) -> StageSpread | None:
    """How much each stage's samples varied on one rank (StageSpread); None when the record predates min/max."""
    if t is None:
        return None
    stages = {"dispatch": (t.dispatch_min_us, t.dispatch_max_us, t.dispatch_us),
              "experts": (t.experts_min_us, t.experts_max_us, t.experts_us),
              "combine": (t.combine_min_us, t.combine_max_us, t.combine_us)}
    fields: dict[str, float | None] = {}
    for name, (lo, hi, med) in stages.items():
        if lo is None or hi is None:
            return None
        fields[name] = (hi - lo) / med if med > 0 else None
        fields[f"{name}_rate"] = med * (hi - lo) / (lo * hi) if lo > 0 and hi > 0 else None
    return StageSpread(**fields)


def _rank_policy(record: RankRecord, result: PolicyResult, checks: Checks, expected: str | None,
                 stopped: list[int] | None, judging: Judging) -> RankPolicy:
    mem: MemoryMeasurement | None = result.memory
    t, tp, c = result.timings, result.throughput, result.correctness
    diverged = first_diverging(c, judging) if c else None
    # Bus bandwidth is algbw x (P-1)/P: with one physical rank nothing crosses a link, and 0 would read as "slow".
    bus = tp is not None and record.num_ranks > 1
    return RankPolicy(
        policy=result.policy, status=result.status, expected_outcome=expected, stopped_by_ranks=stopped,  # type: ignore[arg-type]
        contract_total_bytes=result.contract.total_bytes,
        contract_allocated_bytes=result.contract.common_bytes + result.contract.ws2_bytes,
        # A policy that did not run to the end measured no workspace: its record's 0 is the allocation that failed.
        workspace_delta_bytes=mem.workspace_delta_bytes if mem and result.status == "ok" else None,
        delta_bytes=mem.delta_bytes if mem else None,
        baseline_bytes=mem.baseline_bytes if mem else None, peak_bytes=mem.peak_bytes if mem else None,
        allocator_allocated_peak_bytes=mem.allocator_allocated_peak_bytes if mem else None,
        allocator_reserved_peak_bytes=mem.allocator_reserved_peak_bytes if mem else None,
        breakdown=result.breakdown,
        dispatch_us=t.dispatch_us if t else None, experts_us=t.experts_us if t else None,
        combine_us=t.combine_us if t else None, timing_spread=_spread(t),
        experts_tflops=tp.experts_tflops if tp else None,
        dispatch_busbw_gbps=tp.dispatch_busbw_gbps if bus and tp else None,
        combine_busbw_gbps=tp.combine_busbw_gbps if bus and tp else None,
        max_rel_error=c.max_rel_error if c else None, max_abs_error=c.max_abs_error if c else None,
        num_wrong_slots=c.num_wrong_slots if c else None, oom=result.oom, error=result.error, checks=checks,
        first_diverging_stage=diverged.stage if diverged else None, check_us=c.check_us if c else None,
        deployment_kv_tokens=result.deployment_kv.kv_tokens if result.deployment_kv else None,
        deployment_verdict=result.deployment_kv.verdict if result.deployment_kv else None,
        stages=list(c.stages) if c else [],
    )


@dataclass
class _Judged:
    ranks: list[RankEntry] = field(default_factory=list)
    failures: list[CheckFailure] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)
    policy_order: list[str] = field(default_factory=list)


def _judge_rank(record: RankRecord, judging: Judging, oom_ranks: dict[str, list[int]], judged: _Judged,
                failure: RankFailure | None, scenario_policies: list[str]) -> None:
    """One rank's RankEntry with every check judged; its failed checks and policy errors go into `judged`."""
    baselines = baseline_checks(record)
    no_baseline = Check(outcome="skip", message="no memory measurement")
    entries = []
    for result in record.policies:
        if result.policy not in judged.policy_order:
            judged.policy_order.append(result.policy)
        expected = judging.expected.get(result.policy) if judging.expected else result.expected_outcome
        stopped = stopped_by(record.rank, result, oom_ranks)
        checks = evaluate_checks(result, expected_outcome=expected, judging=judging,
                                 baseline=baselines.get(result.policy, no_baseline), stopped_by=stopped,
                                 release=record.kernels.release if record.kernels else None)
        entries.append(_rank_policy(record, result, checks, expected, stopped, judging))
        for name, check in checks.items():
            if check.outcome in ("fail", "error"):
                judged.failures.append(CheckFailure(rank=record.rank, policy=result.policy, check=name,
                                                    outcome=check.outcome, message=check.message))
        if result.status == "error" and not stopped:
            judged.problems.append(Problem(kind="policy-error", rank=record.rank, path=f"ranks/rank-{record.rank:05d}.json",
                                           cause=f"rank {record.rank}, policy {result.policy}: {result.error or 'raised'}"))
    done = {p.policy for p in record.policies}
    if not record.complete and failure is None:
        judged.problems.append(Problem(
            kind="incomplete", rank=record.rank, path=f"ranks/rank-{record.rank:05d}.json",
            cause=f"rank {record.rank}: its record is the one written after {len(done)} finished policy(ies), the "
                  "final record never came, and no failure record says why"))
    hw = record.hardware
    judged.ranks.append(RankEntry(
        rank=record.rank, hostname=hw.hostname, node_ip=hw.node_ip, device_name=hw.device_name,
        device_uuid=hw.device_uuid, device_total_bytes=hw.device_total_bytes, started_at=record.started_at,
        ready_at=record.ready_at, finished_at=record.finished_at, expert_num_tokens=list(record.expert_num_tokens),
        policies=entries, failure=_failure_text(failure) if failure else None, kernels=record.kernels,
        lost_policies=[p for p in scenario_policies if p not in done], complete=record.complete, warmup=record.warmup,
    ))


def _failure_text(failure: RankFailure) -> str:
    return f"{failure.cause}" + (f" ({failure.detail})" if failure.detail else "")


def _failure_line(failure: RankFailure) -> str:
    """The failure in one line, for a problem's cause: its cause's first line, and its detail when that is one line
    too; a longer detail (a rank's traceback) stays in its record, which the line names."""
    cause = (failure.cause.strip().splitlines() or [""])[0]
    detail = failure.detail.strip()
    if not detail:
        return cause
    if "\n" not in detail and "\r" not in detail:
        return f"{cause} ({detail})"
    return f"{cause} (its traceback: ranks/rank-{failure.rank:05d}.failed.json)"


def _failure_problems(failures: tuple[RankFailure, ...], finished: dict[int, list[str]],
                      scenario_policies: list[str]) -> list[Problem]:
    """One problem per failed rank, naming what it finished before it failed (`finished`: the policies its record
    on disk holds, not what the launcher believed) and what was lost."""
    problems = []
    for f in failures:
        done = finished.get(f.rank, [])
        lost = [p for p in scenario_policies if p not in done] if scenario_policies else list(f.lost_policies)
        kept = f"; finished {', '.join(done)}" if done else ""
        gone = f"; lost {', '.join(lost)}" if lost else ""
        problems.append(Problem(kind="rank-failure", rank=f.rank, path=f"ranks/rank-{f.rank:05d}.failed.json",
                                cause=f"rank {f.rank} on {f.node}: {_failure_line(f)}{kept}{gone}"))
    return problems


def _policy_summary(policy: str, ranks: list[RankEntry], contracts: dict[str, Any], scenario: Scenario | None,
                    fixed_total: int | None, expected_default: str | None) -> PolicySummary:
    entries = [p for r in ranks for p in r.policies if p.policy == policy]
    contract = contracts.get(policy)
    num_oom = sum(1 for e in entries if e.status == "oom")
    num_stopped = sum(1 for e in entries if e.stopped_by_ranks)
    num_error = sum(1 for e in entries if e.status == "error") - num_stopped
    outcome: Outcome | None = None
    if entries:
        outcome = "oom" if num_oom else ("error" if num_error else "fit")  # one rank out of memory: the deployment
    expected = next((e.expected_outcome for e in entries if e.expected_outcome), expected_default)
    # Measured figures only from ranks where the policy ran to the end: an OOMed rank's workspace delta is
    # the allocation that failed (0), not a measurement of the policy.
    ran = [e for e in entries if e.status == "ok"]
    spreads = [e.timing_spread for e in ran]
    return PolicySummary(
        policy=policy,
        contract_total_bytes=contract.total_bytes if contract else None,
        contract_allocated_bytes=contract.common_bytes + contract.ws2_bytes if contract else None,
        contract_common_bytes=contract.common_bytes if contract else None,
        contract_ws2_bytes=contract.ws2_bytes if contract else None,
        contract_source=contract.source if contract else None,
        lower_bound_bytes=live_set_bytes(scenario.sizing_args()) if scenario else None,
        fixed_total_bytes=fixed_total,
        ratio_to_fixed=contract.total_bytes / fixed_total if contract and fixed_total else None,
        num_ranks=len(entries), num_ok=len(ran), num_oom=num_oom, num_stopped=num_stopped,
        num_error=num_error, outcome=outcome, expected_outcome=expected,  # type: ignore[arg-type]
        expectation=policy_expectation(outcome, expected),
        baseline_bytes=_agg(e.baseline_bytes for e in entries),
        workspace_delta_bytes=_agg(e.workspace_delta_bytes for e in ran),
        delta_bytes=_agg(e.delta_bytes for e in ran),
        allocator_allocated_peak_bytes=_agg(e.allocator_allocated_peak_bytes for e in ran),
        allocator_reserved_peak_bytes=_agg(e.allocator_reserved_peak_bytes for e in ran),
        max_rel_error=_agg(e.max_rel_error for e in ran), max_abs_error=_agg(e.max_abs_error for e in ran),
        dispatch_us=_agg(e.dispatch_us for e in ran), experts_us=_agg(e.experts_us for e in ran),
        combine_us=_agg(e.combine_us for e in ran),
        timing_spread=_widest(spreads) if spreads and all(s is not None for s in spreads) else None,  # type: ignore[arg-type]
        deployment_kv_tokens=min((e.deployment_kv_tokens for e in entries if e.deployment_kv_tokens is not None),
                                 default=None),
        deployment_verdict=next((e.deployment_verdict for e in entries if e.deployment_verdict), None),
        experts_tflops=_agg(e.experts_tflops for e in ran),
        dispatch_busbw_gbps=_agg(e.dispatch_busbw_gbps for e in ran),
        combine_busbw_gbps=_agg(e.combine_busbw_gbps for e in ran),
        num_wrong_slots=sum(e.num_wrong_slots or 0 for e in ran),
        checks=PolicyCheckCounts(
            expectation=CheckCounts.of([e.checks.expectation.outcome for e in entries]),
            correctness=CheckCounts.of([e.checks.correctness.outcome for e in entries]),
            memory=CheckCounts.of([e.checks.memory.outcome for e in entries]),
            baseline=CheckCounts.of([e.checks.baseline.outcome for e in entries])),
    )



def _widest(spreads: list[StageSpread]) -> StageSpread:
    def most(values: list[float | None]) -> float | None:
        present = [v for v in values if v is not None]
        return max(present) if present else None

    return StageSpread(**{name: most([getattr(s, name) for s in spreads]) for name in StageSpread.model_fields})



def _problem_order(p: Problem) -> tuple[int, str, str]:
    return (p.rank if p.rank is not None else -1, p.path or "", p.kind)


def _needs_every_rank(record: RankRecord) -> bool:
    """A record whose verdict waits for every rank's: a policy stopped by another rank, from a harness that did not
    yet record which ranks (failed_ranks); any rank's OOM then explains it (checks.stopped_by)."""
    return any(p.status == "error" and p.failed_ranks is None for p in record.policies)


class RunFold:
    """A RecordSink (harness.report.load): each record judged into its RankEntry and folded into the run's
    aggregates as it is read, then dropped; `report()` assembles the RunReport.

    Kept until the end, and only then judged: the few records of _needs_every_rank, and every record of a run
    whose scenario cannot be read (its tolerance is then the records' own, known once all are read)."""

    def __init__(self, scenario_hint: Scenario | None = None) -> None:
        self.hint = scenario_hint
        self.manifest: RunManifest | None = None
        self.failures: dict[int, RankFailure] = {}
        self.scenario: Scenario | None = None
        self.raw: dict[str, Any] | None = None
        self.scenario_problem: str | None = None
        self.judging: Judging | None = None
        self.seen = _Seen()
        self.judged = _Judged()
        self.kept: list[RankRecord] = []
        self.contracts: dict[str, tuple[int, int, int]] | None = None  # legacy's and fixed's bytes, once known
        self.components = ComponentFold()  # the layer's buffers the ranks recorded

    def _resolve(self, raw: dict[str, Any] | None, records: Iterable[RankRecord]) -> None:
        self.scenario, self.raw, self.scenario_problem = _scenario_of(raw, self.hint)
        self.judging = judging_of(self.scenario, tuple(records))
        self.judged.policy_order = list(self.scenario.policies) if self.scenario else []

    def begin(self, manifest: RunManifest | None, failures: dict[int, RankFailure]) -> None:
        self.manifest, self.failures = manifest, failures
        if manifest is not None:
            scenario, _, _ = _scenario_of(manifest.scenario, self.hint)
            if scenario is not None:
                self._resolve(manifest.scenario, ())

    def add(self, record: RankRecord) -> None:
        self.seen.add(record, failed=record.rank in self.failures)
        self.components.add(record)
        if self.judging is None or _needs_every_rank(record):
            self.kept.append(record)
        else:
            self._judge(record)

    def _judge(self, record: RankRecord) -> None:
        assert self.judging is not None
        _judge_rank(record, self.judging, self.seen.oom_ranks, self.judged, self.failures.get(record.rank),
                    list(self.scenario.policies) if self.scenario else [])
        if self.contracts is None:
            self.contracts = expected_contracts(self.scenario)
        self.judged.problems += contract_problems(record, self.contracts)

    def report(self, loaded: LoadedRun) -> RunReport:
        """The RunReport, once load_run has handed over every record (`loaded`: its problems and input hash)."""
        if self.judging is None:
            raw = self.manifest.scenario if self.manifest else (self.kept[0].scenario if self.kept else None)
            self._resolve(raw, self.kept)
        for record in self.kept:
            self._judge(record)
        judged, seen, scenario, manifest = self.judged, self.seen, self.scenario, self.manifest
        if self.kept:  # judged out of rank order: put the ranks and their failed checks back in it
            judged.ranks.sort(key=lambda r: r.rank)
            judged.failures.sort(key=lambda f: f.rank)
        scenario_policies = list(scenario.policies) if scenario else []
        judged.problems += _failure_problems(loaded.failures, seen.finished_policies, scenario_policies)
        contracts = seen.contracts
        fixed_total = fixed_shapes(scenario.sizing_args()).total_bytes if scenario else (
            contracts["fixed"].total_bytes if "fixed" in contracts else None)
        expected = dict(scenario.expect.outcomes) if scenario else {}
        summaries = [_policy_summary(p, judged.ranks, contracts, scenario, fixed_total, expected.get(p))
                     for p in judged.policy_order]
        counts = CheckCounts.of([c.outcome for r in judged.ranks for e in r.policies for _, c in e.checks.items()])
        versions, mismatches = seen.versions(manifest)
        # The layer's components: an expectation the run judged counts as a check (a skipped one does not).
        components = self.components.reports(scenario, versions)
        counts = counts.plus(CheckCounts.of([c.expectation for c in components if c.expectation != "skip"]))
        problems = sorted([*loaded.problems, *judged.problems], key=_problem_order)
        exit_code, reason = exit_of(counts, problems)
        if component_failures(components):
            reason += "; " + "; ".join(component_failures(components))
        run_id = manifest.run_id if manifest else (seen.first.run_id if seen.first else None)
        info = _scenario_info(manifest, seen.first, seen.memory, scenario, self.raw)
        input_hash = loaded.input_hash if (seen.num_records or manifest or not self.hint) else \
            hashlib.sha256(self.hint.model_dump_json().encode()).hexdigest()
        return RunReport(
            record_schema_version=SCHEMA_VERSION, run_id=run_id, generation=generation_of(run_id, input_hash),
            scenario_name=info.name, scenario_hash=info.hash, status="OK" if exit_code == EXIT_OK else "FAILED",
            exit_code=exit_code, exit_reason=reason, command=list(manifest.command) if manifest else None,
            started_at=manifest.started_at if manifest else seen.started_at, finished_at=seen.finished_at,
            scenario=info, scenario_problem=self.scenario_problem, versions=versions, version_mismatches=mismatches,
            hardware=seen.hardware(manifest, loaded.failures), policies=summaries, checks=counts,
            check_failures=judged.failures, problems=problems, ranks=judged.ranks, components=components,
        )


def build_report(loaded: LoadedRun, *, scenario_hint: Scenario | None = None) -> RunReport:
    """The report of one run already loaded with its records: every number any rendering shows, in base units,
    with the verdicts judged here.

    `scenario_hint` describes the run when neither run.json nor any record does (a matrix cell that never ran).
    """
    fold = RunFold(scenario_hint)
    fold.begin(loaded.manifest, {f.rank: f for f in loaded.failures})
    for record in loaded.records:
        fold.add(record)
    return fold.report(loaded)


def collect_report(run_dir: Path, *, scenario_hint: Scenario | None = None) -> RunReport:
    """build_report(load_run(run_dir)), streamed: no more than one record in memory at a time (plus the few that
    RunFold keeps), the same report."""
    fold = RunFold(scenario_hint)
    return fold.report(load_run(run_dir, sink=fold))
