"""`harness collect`: turn one run's per-rank records into report.json, report.md, junit.xml and report.html.

    run.json + ranks/rank-NNNNN.json (+ rank-NNNNN.failed.json)
        -> load_run()        records sorted by rank; every unreadable, missing or mismatched file becomes a problem
        -> build_report()    one plain dict: the machine-readable report (ints and floats in base units)
        -> render_*()        report.md, junit.xml, report.html, all rendered from that same dict

Exit codes (also the report's `exit_code`):
    0  every check passed
    1  a check failed: an expectation not met, correctness out of tolerance, memory out of tolerance
    2  errors: rank failures, unreadable or mismatched records, ranks missing against run.json, a policy that
       raised, or no records at all

Checks, per rank x policy (shared/DESIGN.md §6; docs/reports.md says how to read them):
    expectation  expected outcome ("fit" | "oom") against the actual one; skipped without an expectation
    correctness  the combined output within tolerance of the reference; skipped when the policy OOMed
    memory       measured workspace delta within expect.memory_tolerance_pct of the allocated contract
                 (common + ws2); skipped when the policy OOMed or nothing was measured
A rank whose policy was stopped because another rank ran out of memory (status "error", harness.rank.lifecycle stops the
policy on every rank together) has its checks skipped; the policy's outcome is "oom".
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal
from collections.abc import Iterable

from harness.core.records import (
    SCHEMA_VERSION,
    PolicyResult,
    RankFailure,
    RankRecord,
    RecordError,
    RunManifest,
    read_record,
)
from harness.scenario.schema import Scenario, ScenarioError, parse_scenario
from harness.core.contract import fixed_shapes, live_set_bytes

from harness.core.exits import EXIT_ERROR, EXIT_FAILED, EXIT_OK  # noqa: F401 - re-exported for report readers
REPORT_SCHEMA_VERSION = 1
REPORT_FILES = ("report.json", "report.md", "junit.xml", "report.html")
CHECKS = ("expectation", "correctness", "memory")
DEFAULT_MEMORY_TOLERANCE_PCT = 2.0

CheckOutcome = Literal["pass", "fail", "skip", "error"]
ProblemKind = Literal[
    "rank-failure", "unreadable", "missing-rank", "no-records", "no-manifest", "mismatch", "policy-error", "missing-cell"
]

_RANK_FILE_RE = re.compile(r"^rank-(\d+)(\.failed)?\.json$")

# How each per-rank metric is aggregated in the tables; report.json keeps min/avg/max of every one, the tables
# show the named aggregation (nccl-tests: max time over ranks for a collective, min bandwidth).
AGGREGATION: dict[str, str] = {
    "workspace_delta_bytes": "min/avg/max",
    "delta_bytes": "max",
    "allocator_allocated_peak_bytes": "max",
    "allocator_reserved_peak_bytes": "max",
    "max_rel_error": "max",
    "max_abs_error": "max",
    "dispatch_us": "max",
    "experts_us": "max",
    "combine_us": "max",
    "experts_tflops": "min",
    "dispatch_busbw_gbps": "min",
    "combine_busbw_gbps": "min",
}


@dataclass(frozen=True, kw_only=True)
class Problem:
    """Something that keeps the report from being complete: it makes the exit code 2."""

    kind: ProblemKind
    cause: str
    rank: int | None = None
    path: str | None = None  # relative to the run directory

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "rank": self.rank, "path": self.path, "cause": self.cause}


@dataclass(frozen=True, kw_only=True)
class CheckResult:
    check: str
    outcome: CheckOutcome
    message: str

    def to_json(self) -> dict[str, Any]:
        return {"outcome": self.outcome, "message": self.message}


@dataclass(frozen=True, kw_only=True)
class LoadedRun:
    """A run directory read back: the manifest, readable records sorted by rank, and every problem found."""

    run_dir: Path
    manifest: RunManifest | None
    records: tuple[RankRecord, ...]
    failures: tuple[RankFailure, ...]
    problems: tuple[Problem, ...]


@dataclass(frozen=True, kw_only=True)
class CollectResult:
    """What `collect` produced. `report` is exactly what report.json holds."""

    run_dir: Path
    report: dict[str, Any]
    outputs: tuple[Path, ...] = field(default=())

    @property
    def exit_code(self) -> int:
        return int(self.report["exit_code"])

    @property
    def status(self) -> str:
        return str(self.report["status"])

    def summary_table(self) -> Any:
        """A rich renderable: the header, the per-policy table with its units row, problems, and the footer."""
        from harness.report.markdown import render_summary

        return render_summary(self.report)


# ---------------------------------------------------------------------------------------------------------------
# Loading


def _relative(run_dir: Path, path: Path) -> str:
    try:
        return str(path.relative_to(run_dir))
    except ValueError:
        return str(path)


def _strip_dir(message: str, run_dir: Path) -> str:
    """RecordError messages start with the absolute path; the report names files relative to the run."""
    return message.replace(f"{run_dir}/", "")


def load_run(run_dir: Path) -> LoadedRun:
    """Read run.json and ranks/*.json; never raises for a bad record, it becomes a Problem instead."""
    run_dir = Path(run_dir)
    problems: list[Problem] = []
    manifest: RunManifest | None = None
    manifest_path = run_dir / "run.json"
    if not manifest_path.exists():
        problems.append(Problem(kind="no-manifest", path="run.json",
                                cause="run.json is missing: cannot tell how many ranks were launched"))
    else:
        try:
            loaded = read_record(manifest_path)
        except RecordError as exc:
            problems.append(Problem(kind="unreadable", path="run.json", cause=_strip_dir(str(exc), run_dir)))
        else:
            if isinstance(loaded, RunManifest):
                manifest = loaded
            else:
                problems.append(Problem(kind="mismatch", path="run.json",
                                        cause=f"run.json holds a {loaded.record_kind!r} record, not the run manifest"))

    records: dict[int, RankRecord] = {}
    failures: dict[int, RankFailure] = {}
    unreadable_ranks: set[int] = set()
    ranks_dir = run_dir / "ranks"
    paths = sorted(ranks_dir.glob("rank-*.json")) if ranks_dir.is_dir() else []
    for path in paths:
        rel = _relative(run_dir, path)
        match = _RANK_FILE_RE.match(path.name)
        if match is None:
            problems.append(Problem(kind="unreadable", path=rel, cause=f"{rel}: file name is not rank-NNNNN[.failed].json"))
            continue
        rank, is_failure = int(match.group(1)), match.group(2) is not None
        try:
            record = read_record(path)
        except RecordError as exc:
            unreadable_ranks.add(rank)
            problems.append(Problem(kind="unreadable", rank=rank, path=rel, cause=_strip_dir(str(exc), run_dir)))
            continue
        expected_type = RankFailure if is_failure else RankRecord
        if not isinstance(record, expected_type):
            unreadable_ranks.add(rank)
            problems.append(Problem(kind="mismatch", rank=rank, path=rel,
                                    cause=f"{rel}: holds a {record.record_kind!r} record"))
            continue
        if record.rank != rank:
            unreadable_ranks.add(rank)
            problems.append(Problem(kind="mismatch", rank=rank, path=rel,
                                    cause=f"{rel}: the record says rank {record.rank}, the file name says {rank}"))
            continue
        if manifest is not None and record.run_id != manifest.run_id:
            unreadable_ranks.add(rank)
            problems.append(Problem(kind="mismatch", rank=rank, path=rel,
                                    cause=f"{rel}: run_id {record.run_id!r} is not this run's ({manifest.run_id!r})"))
            continue
        if isinstance(record, RankFailure):
            failures[rank] = record
            detail = f" ({record.detail})" if record.detail else ""
            problems.append(Problem(kind="rank-failure", rank=rank, path=rel,
                                    cause=f"rank {rank} on {record.node}: {record.cause}{detail}"))
            continue
        assert isinstance(record, RankRecord)
        if manifest is not None and record.scenario_hash != manifest.scenario_hash:
            unreadable_ranks.add(rank)
            problems.append(Problem(
                kind="mismatch", rank=rank, path=rel,
                cause=f"{rel}: scenario hash {record.scenario_hash} differs from the run's {manifest.scenario_hash}; "
                      "left out of the aggregates"))
            continue
        if manifest is not None and rank >= manifest.num_ranks:
            problems.append(Problem(kind="mismatch", rank=rank, path=rel,
                                    cause=f"{rel}: rank {rank} is outside the {manifest.num_ranks} ranks run.json names"))
        records[rank] = record

    if manifest is not None:
        seen = set(records) | set(failures) | unreadable_ranks
        for rank in range(manifest.num_ranks):
            if rank not in seen:
                rel = f"ranks/rank-{rank:05d}.json"
                problems.append(Problem(kind="missing-rank", rank=rank, path=rel,
                                        cause=f"rank {rank}: no record and no failure record ({rel} is missing)"))
    if not records:
        problems.append(Problem(kind="no-records", path="ranks/", cause="no readable rank records in ranks/"))
    problems.sort(key=lambda p: (p.rank if p.rank is not None else -1, p.path or "", p.kind))
    return LoadedRun(
        run_dir=run_dir,
        manifest=manifest,
        records=tuple(records[r] for r in sorted(records)),
        failures=tuple(failures[r] for r in sorted(failures)),
        problems=tuple(problems),
    )


# ---------------------------------------------------------------------------------------------------------------
# Checks


def _pct(value: float, reference: float) -> float:
    return (value - reference) / reference * 100.0 if reference else (0.0 if value == reference else float("inf"))


def _gib(num_bytes: float) -> str:
    return f"{num_bytes / 2**30:.4g} GiB"


def evaluate_checks(result: PolicyResult, *, expected_outcome: str | None, memory_tolerance_pct: float,
                    stopped_by_oom_on: list[int] | None = None) -> dict[str, CheckResult]:
    """The three checks of one rank x policy.

    `stopped_by_oom_on`: the ranks that ran out of memory when this rank's status is "error" because of them. The
    ranks agree to stop a policy together (harness.rank.lifecycle), so the others record an error that is not theirs: their
    checks are skipped, and the expectation is judged on the ranks that did run out of memory.
    """
    checks: dict[str, CheckResult] = {}
    actual = "oom" if result.status == "oom" else "fit"
    oomed = result.status == "oom"

    if stopped_by_oom_on:
        message = f"policy stopped: rank(s) {stopped_by_oom_on} ran out of memory; judged on those ranks"
        return {name: CheckResult(check=name, outcome="skip", message=message) for name in CHECKS}
    if result.status == "error":
        checks["expectation"] = CheckResult(check="expectation", outcome="error",
                                            message=f"policy raised: {result.error or 'no message'}")
    elif expected_outcome is None:
        checks["expectation"] = CheckResult(check="expectation", outcome="skip", message="no expected outcome")
    elif expected_outcome == actual:
        checks["expectation"] = CheckResult(check="expectation", outcome="pass", message=f"expected {expected_outcome}, got {actual}")
    else:
        detail = f": {result.oom.message}" if result.oom is not None else ""
        checks["expectation"] = CheckResult(check="expectation", outcome="fail",
                                            message=f"expected {expected_outcome}, got {actual}{detail}")

    if oomed:
        checks["correctness"] = CheckResult(check="correctness", outcome="skip", message="policy OOMed")
    elif result.status == "error":
        checks["correctness"] = CheckResult(check="correctness", outcome="error",
                                            message=f"policy raised: {result.error or 'no message'}")
    elif result.correctness is None:
        checks["correctness"] = CheckResult(check="correctness", outcome="skip", message="no correctness result recorded")
    else:
        c = result.correctness
        summary = (f"max rel error {c.max_rel_error:.3g} (tolerance {c.tolerance:.3g}), max abs error "
                   f"{c.max_abs_error:.3g}, {c.num_wrong_slots} wrong slots of {c.num_checked_tokens} checked tokens")
        checks["correctness"] = CheckResult(check="correctness", outcome="pass" if c.within_tolerance else "fail",
                                            message=summary)

    allocated = result.contract.common_bytes + result.contract.ws2_bytes
    if oomed:
        checks["memory"] = CheckResult(check="memory", outcome="skip", message="policy OOMed")
    elif result.memory is None:
        checks["memory"] = CheckResult(check="memory", outcome="skip", message="no memory measurement")
    else:
        delta = result.memory.workspace_delta_bytes
        off_pct = _pct(delta, allocated)
        tolerance = memory_tolerance_pct / 100.0
        within = abs(delta - allocated) <= tolerance * allocated
        message = (f"workspace delta {_gib(delta)} ({delta} B) vs allocated contract {_gib(allocated)} "
                   f"({allocated} B): {off_pct:+.3g}% (tolerance {memory_tolerance_pct:g}%, {result.memory.method})")
        reserved = result.memory.workspace_reserved_bytes
        if not within and reserved is not None:
            # The device shows whole allocator segments: a small workspace rounds up (at most one 20 MiB
            # segment per buffer). Accept that when NVML matches what the allocator reserved.
            rounding = 0 <= reserved - allocated <= ALLOCATOR_ROUNDING_BYTES
            if rounding and abs(delta - reserved) <= tolerance * reserved:
                within = True
                message += f"; matches the allocator's {reserved} B of segments (rounding of small buffers)"
        checks["memory"] = CheckResult(check="memory", outcome="pass" if within else "fail", message=message)
    return checks


# ---------------------------------------------------------------------------------------------------------------
# The report dict


ALLOCATOR_ROUNDING_BYTES = 2 * 20 * 2**20  # two buffers, each at most one 20 MiB segment of rounding


def _agg(values: Iterable[float | int | None]) -> dict[str, Any] | None:
    """min/avg/max over ranks of the values that exist; None when no rank has one."""
    present = [v for v in values if v is not None]
    if not present:
        return None
    return {"min": min(present), "avg": sum(present) / len(present), "max": max(present), "num_ranks": len(present)}


def _scenario_of(loaded: LoadedRun, hint: Scenario | None) -> tuple[Scenario | None, dict[str, Any] | None, str | None]:
    """The run's scenario (parsed), its raw dict, and why it could not be parsed."""
    raw = loaded.manifest.scenario if loaded.manifest else (loaded.records[0].scenario if loaded.records else None)
    if raw is None and hint is not None:
        return hint, hint.model_dump(mode="json"), None
    if raw is None:
        return None, None, "no manifest and no records: the scenario is unknown"
    try:
        return parse_scenario(dict(raw), path="run.json scenario"), raw, None
    except ScenarioError as exc:
        return None, raw, str(exc)


def _scenario_section(loaded: LoadedRun, scenario: Scenario | None, raw: dict[str, Any] | None) -> dict[str, Any]:
    m, first = loaded.manifest, (loaded.records[0] if loaded.records else None)
    section: dict[str, Any] = {
        "name": m.scenario_name if m else (first.scenario_name if first else (scenario.name if scenario else None)),
        "hash": m.scenario_hash if m else (first.scenario_hash if first else (scenario.scenario_hash if scenario else None)),
        "path": m.scenario_path if m else None,
        "description": (raw or {}).get("description"),
    }
    if scenario is not None:
        args = scenario.sizing_args()
        section.update({
            "num_dispatchers": args.num_dispatchers,
            "num_ranks": scenario.parallel.num_ranks,
            "num_local_experts": args.num_local_experts,
            "max_tokens_per_rank": args.max_tokens_per_rank,
            "M": args.M,
            "hidden_size": args.K,
            "intermediate_size": args.intermediate_size,
            "N": args.N,
            "top_k": args.top_k,
            "num_experts": scenario.model.num_experts,
            "model_preset": scenario.model.preset,
            "activation": args.activation,
            "workspace_dtype": args.workspace_dtype,
            "emulated": scenario.emulated,
            "routing": scenario.routing.kind,
            "num_tokens_per_dispatcher": scenario.num_tokens_per_dispatcher,
            "policies": list(scenario.policies),
            "expected_outcomes": dict(scenario.expect.outcomes),
            "memory_tolerance_pct": scenario.expect.memory_tolerance_pct,
            "max_error": scenario.expect.max_error,
            "measurement_method": scenario.memory.method,
        })
    elif first is not None:
        # An unparsable scenario (e.g. written by a newer harness): keep what the record states directly.
        section.update({"num_dispatchers": first.num_dispatchers, "num_ranks": first.num_ranks, "emulated": first.emulated,
                        "policies": [p.policy for p in first.policies], "measurement_method": first.measurement_method})
    if first is not None:
        section["measurement_method"] = first.measurement_method
        section["experts_backend"] = first.experts_backend
        section["comm_backend"] = first.comm_backend
        memory = next((p.memory for r in loaded.records for p in r.policies if p.memory is not None), None)
        section["memory_method"] = memory.method if memory else None
        section["memory_label"] = memory.label if memory else None
    else:
        section.update({"experts_backend": None, "comm_backend": None, "memory_method": None, "memory_label": None})
    return section


_VERSION_FIELDS = ("harness", "python", "torch", "cuda", "nccl", "driver", "ray", "vllm_source", "vllm_kernels")


def _versions_section(loaded: LoadedRun) -> tuple[dict[str, Any], dict[str, list[str]]]:
    """The lowest rank's versions, and every field on which ranks disagree (a mixed cluster is worth a warning)."""
    sources = [r.versions for r in loaded.records] or ([loaded.manifest.versions] if loaded.manifest and loaded.manifest.versions else [])
    if not sources:
        return {name: None for name in _VERSION_FIELDS}, {}
    versions = {name: getattr(sources[0], name) for name in _VERSION_FIELDS}
    mismatches: dict[str, list[str]] = {}
    for name in _VERSION_FIELDS:
        distinct = sorted({str(getattr(v, name)) for v in sources})
        if len(distinct) > 1:
            mismatches[name] = distinct
    return versions, mismatches


def _hardware_section(loaded: LoadedRun) -> dict[str, Any]:
    records = loaded.records
    hostnames = sorted({r.hardware.hostname for r in records} | {f.node for f in loaded.failures})
    return {
        "device_kind": records[0].hardware.device_kind if records else None,
        "device_names": sorted({r.hardware.device_name for r in records}),
        "device_total_bytes": _agg(r.hardware.device_total_bytes for r in records),
        "device_capabilities": sorted({r.hardware.device_capability for r in records if r.hardware.device_capability}),
        "num_ranks_expected": loaded.manifest.num_ranks if loaded.manifest else None,
        "num_ranks_reported": len(records),
        "num_rank_failures": len(loaded.failures),
        "num_nodes": len(hostnames),
        "nodes": hostnames,
        "launcher": loaded.manifest.launcher if loaded.manifest else None,
    }


def _rank_policy_entry(result: PolicyResult, checks: dict[str, CheckResult], expected: str | None,
                      stopped_by_oom_on: list[int] | None) -> dict[str, Any]:
    mem, t, tp, c = result.memory, result.timings, result.throughput, result.correctness
    return {
        "policy": result.policy,
        "status": result.status,
        "stopped_by_oom_on_ranks": stopped_by_oom_on,
        "expected_outcome": expected,
        "contract_total_bytes": result.contract.total_bytes,
        "contract_allocated_bytes": result.contract.common_bytes + result.contract.ws2_bytes,
        "workspace_delta_bytes": mem.workspace_delta_bytes if mem else None,
        "delta_bytes": mem.delta_bytes if mem else None,
        "baseline_bytes": mem.baseline_bytes if mem else None,
        "peak_bytes": mem.peak_bytes if mem else None,
        "allocator_allocated_peak_bytes": mem.allocator_allocated_peak_bytes if mem else None,
        "allocator_reserved_peak_bytes": mem.allocator_reserved_peak_bytes if mem else None,
        "breakdown": result.breakdown.model_dump() if result.breakdown else None,
        "dispatch_us": t.dispatch_us if t else None,
        "experts_us": t.experts_us if t else None,
        "combine_us": t.combine_us if t else None,
        "experts_tflops": tp.experts_tflops if tp else None,
        "dispatch_busbw_gbps": tp.dispatch_busbw_gbps if tp else None,
        "combine_busbw_gbps": tp.combine_busbw_gbps if tp else None,
        "max_rel_error": c.max_rel_error if c else None,
        "max_abs_error": c.max_abs_error if c else None,
        "num_wrong_slots": c.num_wrong_slots if c else None,
        "oom": result.oom.model_dump() if result.oom else None,
        "error": result.error,
        "checks": {name: checks[name].to_json() for name in CHECKS},
    }


def _policy_summaries(ranks: list[dict[str, Any]], policy_order: list[str], records: tuple[RankRecord, ...],
                      scenario: Scenario | None) -> list[dict[str, Any]]:
    fixed_total = fixed_shapes(scenario.sizing_args()).total_bytes if scenario else None
    lower_bound = live_set_bytes(scenario.sizing_args()) if scenario else None
    contracts = {p.policy: p.contract for r in reversed(records) for p in r.policies}  # lowest rank wins
    if fixed_total is None and "fixed" in contracts:
        fixed_total = contracts["fixed"].total_bytes
    summaries = []
    for policy in policy_order:
        entries = [p for r in ranks for p in r["policies"] if p["policy"] == policy]
        contract = contracts.get(policy)
        num_oom = sum(1 for e in entries if e["status"] == "oom")
        num_stopped = sum(1 for e in entries if e["stopped_by_oom_on_ranks"])
        num_error = sum(1 for e in entries if e["status"] == "error") - num_stopped
        if not entries:
            outcome = None
        elif num_oom:
            outcome = "oom"  # one rank out of memory is the deployment out of memory
        else:
            outcome = "error" if num_error else "fit"
        # Measured figures only from ranks where the policy ran to the end: an OOMed rank's workspace delta is
        # the allocation that failed (0), not a measurement of the policy.
        ran = [e for e in entries if e["status"] == "ok"]
        summary: dict[str, Any] = {
            "policy": policy,
            "contract_total_bytes": contract.total_bytes if contract else None,
            "contract_allocated_bytes": contract.common_bytes + contract.ws2_bytes if contract else None,
            "contract_common_bytes": contract.common_bytes if contract else None,
            "contract_ws2_bytes": contract.ws2_bytes if contract else None,
            "contract_source": contract.source if contract else None,
            "lower_bound_bytes": lower_bound,
            "fixed_total_bytes": fixed_total,
            "ratio_to_fixed": contract.total_bytes / fixed_total if contract and fixed_total else None,
            "num_ranks": len(entries),
            "num_ok": sum(1 for e in entries if e["status"] == "ok"),
            "num_oom": num_oom,
            "num_stopped_by_oom": num_stopped,
            "num_error": num_error,
            "outcome": outcome,
            "expected_outcome": next((e["expected_outcome"] for e in entries if e["expected_outcome"]),
                                     scenario.expect.outcomes.get(policy) if scenario else None),
        }
        for metric in AGGREGATION:
            summary[metric] = _agg(e[metric] for e in ran)
        summary["num_wrong_slots"] = sum(e["num_wrong_slots"] or 0 for e in ran)
        summary["checks"] = {
            name: {f"num_{o}": sum(1 for e in entries if e["checks"][name]["outcome"] == o) for o in ("pass", "fail", "skip", "error")}
            for name in CHECKS
        }
        summaries.append(summary)
    return summaries


def build_report(loaded: LoadedRun, *, scenario_hint: Scenario | None = None) -> dict[str, Any]:
    """The machine-readable report of one run: every number any rendering shows, in base units.

    `scenario_hint` describes the run when neither run.json nor any record does (a matrix cell that never ran).
    """
    scenario, raw, scenario_problem = _scenario_of(loaded, scenario_hint)
    problems = list(loaded.problems)
    expected_by_scenario = dict(scenario.expect.outcomes) if scenario else {}
    tolerance_pct = scenario.expect.memory_tolerance_pct if scenario else DEFAULT_MEMORY_TOLERANCE_PCT

    policy_order: list[str] = list(scenario.policies) if scenario else []
    oom_ranks: dict[str, list[int]] = {}
    for record in loaded.records:
        for result in record.policies:
            if result.status == "oom":
                oom_ranks.setdefault(result.policy, []).append(record.rank)
    ranks: list[dict[str, Any]] = []
    failures: list[dict[str, Any]] = []
    for record in loaded.records:
        entries = []
        for result in record.policies:
            if result.policy not in policy_order:
                policy_order.append(result.policy)
            expected = result.expected_outcome or expected_by_scenario.get(result.policy)
            stopped = oom_ranks.get(result.policy) if result.status == "error" else None
            checks = evaluate_checks(result, expected_outcome=expected, memory_tolerance_pct=tolerance_pct,
                                     stopped_by_oom_on=stopped)
            entries.append(_rank_policy_entry(result, checks, expected, stopped))
            for check in checks.values():
                if check.outcome in ("fail", "error"):
                    failures.append({"rank": record.rank, "policy": result.policy, "check": check.check,
                                     "outcome": check.outcome, "message": check.message})
            if result.status == "error" and not stopped:
                problems.append(Problem(kind="policy-error", rank=record.rank,
                                        path=f"ranks/rank-{record.rank:05d}.json",
                                        cause=f"rank {record.rank}, policy {result.policy}: {result.error or 'raised'}"))
        ranks.append({
            "rank": record.rank,
            "hostname": record.hardware.hostname,
            "node_ip": record.hardware.node_ip,
            "device_name": record.hardware.device_name,
            "device_uuid": record.hardware.device_uuid,
            "device_total_bytes": record.hardware.device_total_bytes,
            "started_at": record.started_at,
            "ready_at": record.ready_at,
            "finished_at": record.finished_at,
            "expert_num_tokens": list(record.expert_num_tokens),
            "policies": entries,
        })

    counts = {f"num_{o}": 0 for o in ("pass", "fail", "skip", "error")}
    for rank in ranks:
        for entry in rank["policies"]:
            for check in entry["checks"].values():
                counts[f"num_{check['outcome']}"] += 1

    if problems:
        exit_code = EXIT_ERROR
    elif counts["num_fail"]:
        exit_code = EXIT_FAILED
    else:
        exit_code = EXIT_OK
    versions, version_mismatches = _versions_section(loaded)
    manifest = loaded.manifest
    return {
        "report_schema_version": REPORT_SCHEMA_VERSION,
        "record_schema_version": SCHEMA_VERSION,
        "kind": "run",
        "run_id": manifest.run_id if manifest else (loaded.records[0].run_id if loaded.records else None),
        "status": "OK" if exit_code == EXIT_OK else "FAILED",
        "exit_code": exit_code,
        "exit_reason": _exit_reason(exit_code, counts, problems),
        "command": list(manifest.command) if manifest else None,
        "started_at": manifest.started_at if manifest else (min(r.started_at for r in loaded.records) if loaded.records else None),
        "finished_at": max((r.finished_at for r in loaded.records), default=None),
        "scenario": _scenario_section(loaded, scenario, raw),
        "scenario_problem": scenario_problem,
        "versions": versions,
        "version_mismatches": version_mismatches,
        "hardware": _hardware_section(loaded),
        "aggregation": dict(AGGREGATION),
        "policies": _policy_summaries(ranks, policy_order, loaded.records, scenario),
        "checks": counts,
        "check_failures": failures,
        "problems": [p.to_json() for p in sorted(problems, key=lambda p: (p.rank if p.rank is not None else -1, p.path or "", p.kind))],
        "ranks": ranks,
    }


def _exit_reason(exit_code: int, counts: dict[str, int], problems: list[Problem]) -> str:
    if exit_code == EXIT_OK:
        return f"all {counts['num_pass']} checks passed ({counts['num_skip']} skipped)"
    if exit_code == EXIT_FAILED:
        return f"{counts['num_fail']} check(s) failed"
    kinds: dict[str, int] = {}
    for p in problems:
        kinds[p.kind] = kinds.get(p.kind, 0) + 1
    listed = ", ".join(f"{n} {k}" for k, n in sorted(kinds.items()))
    failed = f"; {counts['num_fail']} check(s) failed" if counts["num_fail"] else ""
    return f"errors: {listed}{failed}"


# ---------------------------------------------------------------------------------------------------------------
# Writing


def write_report(out_dir: Path, report: dict[str, Any]) -> tuple[Path, ...]:
    """report.json first (machine-readable first), then the renderings of that same dict; every write atomic."""
    from harness.report.markdown import render_json, render_junit, render_markdown, write_text_atomic
    from harness.report.html import render_html

    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [write_text_atomic(out_dir / "report.json", render_json(report))]
    paths.append(write_text_atomic(out_dir / "report.md", render_markdown(report)))
    paths.append(write_text_atomic(out_dir / "junit.xml", render_junit(report)))
    paths.append(write_text_atomic(out_dir / "report.html", render_html(report)))
    return tuple(paths)


def collect(run_dir: Path, *, write: bool = True, scenario_hint: Scenario | None = None) -> CollectResult:
    """Aggregate one run directory's records; write the four reports into it unless `write` is False.

    Never raises for bad records; a run directory that does not exist yields an error report that is not written.
    """
    run_dir = Path(run_dir)
    loaded = load_run(run_dir)
    report = build_report(loaded, scenario_hint=scenario_hint)
    outputs: tuple[Path, ...] = ()
    if write and run_dir.is_dir():
        outputs = write_report(run_dir, report)
    return CollectResult(run_dir=run_dir, report=report, outputs=outputs)
