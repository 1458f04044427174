"""The typed report: what `collect` produces and every rendering, `compare` and the matrix report consume.

    RunReport                       one run directory (report.json, kind "run"): a RunSummary and its ranks
      header: run_id, generation, scenario_name/hash, versions, hardware   (the fields records carry too)
      scenario: ScenarioInfo        the letters D P E T M K I N, tolerances, expectations, how memory was measured
      policies: [PolicySummary]     per policy, every per-rank metric as an Aggregate (min/avg/max over ranks)
      checks, check_failures, problems, status, exit_code, exit_reason
      components: [ComponentReport] the layer's buffers the run allocated: predicted, measured, verdicts
      ranks: [RankEntry]            per rank, per policy: RankPolicy, with its four checks (RunReport only)
    MatrixReport                    a matrix directory (kind "matrix"): cells, each a MatrixCell referencing its
                                    cell's report.json (its sha256) and carrying that report's RunSummary

Frozen and validated, in base units (bytes, microseconds, GB/s, TFLOP/s). report.json is `to_json_text()`: strict
JSON, since the models refuse NaN and infinities (`allow_inf_nan=False`) and the dump refuses them again.
Readers use attributes, never string keys: a renamed field is a type error, not a silently skipped gate.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, JsonValue, field_validator

from harness.core.records import Breakdown, KernelsRecord, OomRecord, StageCheck, Versions

# 3: a matrix's cells carry their RunSummary (no per-rank entries) and the sha256 of their own report.json, and the
#    matrix the sha256 of its matrix.json; a run's report is as in 2.
# 2: the typed model (generation, baseline check, timing spreads, outcome per policy).
REPORT_SCHEMA_VERSION = 3
OLDEST_REPORT_SCHEMA_VERSION = 2  # read as well: a version-2 matrix's embedded cell reports are read as summaries

CheckName = Literal["expectation", "correctness", "memory", "baseline"]
CheckOutcome = Literal["pass", "fail", "skip", "error"]
Outcome = Literal["fit", "oom", "error"]
ProblemKind = Literal[
    "rank-failure",  # a launcher's failure record: the rank died or hung
    "missing",  # a record run.json promises is not there
    "truncated",  # a record cut off mid-write
    "corrupt",  # not a record: binary garbage, not JSON, wrong fields
    "newer-schema",  # written by a newer harness
    "invalid",  # a well-formed record holding NaN, infinity or a negative size
    "unexpected-file",  # anything in ranks/ that is not a canonical rank-NNNNN[.failed].json
    "outside",  # a link that leads out of the run directory, or not a regular file
    "mismatch",  # a record of another run, rank or scenario
    "missing-rank",  # no record and no failure record for a rank run.json names
    "no-records",
    "no-manifest",
    "policy-error",  # a policy raised on a rank (not an OOM, not stopped by another rank's OOM)
    "missing-cell",  # a matrix cell with no run directory
    "incomplete",  # a rank's record so far (written after a policy) with no final record and no failure record
]


class ReportModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class Aggregate(ReportModel):
    """A per-rank value over the ranks that have it."""

    min: int | float
    avg: float
    max: int | float
    num_ranks: int


class Check(ReportModel):
    outcome: CheckOutcome
    message: str


class Checks(ReportModel):
    """The four checks of one rank x policy (docs/reports.md, "Checks")."""

    expectation: Check
    correctness: Check
    memory: Check
    baseline: Check

    def items(self) -> Iterator[tuple[CheckName, Check]]:
        yield from (("expectation", self.expectation), ("correctness", self.correctness), ("memory", self.memory),
                    ("baseline", self.baseline))


class CheckCounts(ReportModel):
    num_pass: int = 0
    num_fail: int = 0
    num_skip: int = 0
    num_error: int = 0

    def plus(self, other: CheckCounts) -> CheckCounts:
        return CheckCounts(num_pass=self.num_pass + other.num_pass, num_fail=self.num_fail + other.num_fail,
                           num_skip=self.num_skip + other.num_skip, num_error=self.num_error + other.num_error)

    @classmethod
    def of(cls, outcomes: list[CheckOutcome]) -> CheckCounts:
        return cls(num_pass=outcomes.count("pass"), num_fail=outcomes.count("fail"),
                   num_skip=outcomes.count("skip"), num_error=outcomes.count("error"))


class PolicyCheckCounts(ReportModel):
    expectation: CheckCounts
    correctness: CheckCounts
    memory: CheckCounts
    baseline: CheckCounts


class Problem(ReportModel):
    """Something that keeps the report from being complete: it makes the exit code 2."""

    kind: ProblemKind
    cause: str  # one line
    rank: int | None = None
    path: str | None = None  # relative to the run directory (the matrix directory for a matrix)
    cell: str | None = None  # matrix reports only


class CheckFailure(ReportModel):
    rank: int
    policy: str
    check: CheckName
    outcome: CheckOutcome
    message: str
    cell: str | None = None


class StageSpread(ReportModel):
    """How much a stage's samples varied, the widest over ranks; None: the records keep no per-stage min/max.

    Time: (max - min) / median of the microseconds. Rate: the same for the throughput derived from them,
    median * (max - min) / (min * max), which is wider since a rate is the inverse of a time.
    """

    dispatch: float | None = None
    experts: float | None = None
    combine: float | None = None
    dispatch_rate: float | None = None
    experts_rate: float | None = None
    combine_rate: float | None = None

    def of(self, stage: Literal["dispatch", "experts", "combine"], *, rate: bool = False) -> float | None:
        if rate:
            return {"dispatch": self.dispatch_rate, "experts": self.experts_rate, "combine": self.combine_rate}[stage]
        return {"dispatch": self.dispatch, "experts": self.experts, "combine": self.combine}[stage]


class RankPolicy(ReportModel):
    """One rank x policy: the record's numbers, with the verdicts collect computed from them."""

    policy: str
    status: Literal["ok", "oom", "error"]
    expected_outcome: Literal["fit", "oom"] | None
    stopped_by_ranks: list[int] | None
    contract_total_bytes: int
    contract_allocated_bytes: int  # common + ws2: what the workspace allocates
    workspace_delta_bytes: int | None
    delta_bytes: int | None
    baseline_bytes: int | None
    peak_bytes: int | None
    allocator_allocated_peak_bytes: int | None
    allocator_reserved_peak_bytes: int | None
    breakdown: Breakdown | None
    dispatch_us: float | None
    experts_us: float | None
    combine_us: float | None
    timing_spread: StageSpread | None  # None: the record keeps no per-stage min/max
    experts_tflops: float | None
    dispatch_busbw_gbps: float | None  # None with one physical rank: nothing crosses a link
    combine_busbw_gbps: float | None
    max_rel_error: float | None
    max_abs_error: float | None
    num_wrong_slots: int | None
    oom: OomRecord | None
    error: str | None
    checks: Checks
    # The correctness check's stages (harness.rank.check), the first that diverged, and the check's own time.
    first_diverging_stage: str | None = None
    check_us: float | None = None
    stages: list[StageCheck] = []
    # memory.deployment_ballast: the KV cache the deployment sizes with this policy's workspace, and its verdict
    deployment_kv_tokens: int | None = None
    deployment_verdict: str | None = None


class RankEntry(ReportModel):
    rank: int
    hostname: str
    node_ip: str
    device_name: str
    device_uuid: str | None
    device_total_bytes: int | None
    started_at: float
    ready_at: float | None
    finished_at: float
    expert_num_tokens: list[int]
    policies: list[RankPolicy]
    failure: str | None = None  # the launcher's failure record when the rank died after these policies
    kernels: KernelsRecord | None = None  # the experts kernels that ran: for vLLM's ops, release, sha256, size
    lost_policies: list[str] = []  # policies of the scenario this rank has no result for
    complete: bool = True  # False: the record written after a policy, not the rank's final one
    warmup: Literal["full", "comm-only", "failed"] | None = None  # the rank's warm-up pass; None: none recorded

    def policy(self, name: str) -> RankPolicy | None:
        return next((p for p in self.policies if p.policy == name), None)


class PolicySummary(ReportModel):
    """One policy over all ranks. Measured figures aggregate the ranks where the policy ran to the end."""

    policy: str
    contract_total_bytes: int | None
    contract_allocated_bytes: int | None
    contract_common_bytes: int | None
    contract_ws2_bytes: int | None
    contract_source: str | None
    lower_bound_bytes: int | None
    fixed_total_bytes: int | None
    ratio_to_fixed: float | None
    num_ranks: int
    num_ok: int
    num_oom: int
    num_stopped: int
    num_error: int
    outcome: Outcome | None  # None: no rank has a result
    expected_outcome: Literal["fit", "oom"] | None
    expectation: CheckOutcome  # outcome against expected_outcome: skip without an expectation
    baseline_bytes: Aggregate | None  # each rank's memory before the policy allocated anything
    workspace_delta_bytes: Aggregate | None
    delta_bytes: Aggregate | None
    allocator_allocated_peak_bytes: Aggregate | None
    allocator_reserved_peak_bytes: Aggregate | None
    max_rel_error: Aggregate | None
    max_abs_error: Aggregate | None
    dispatch_us: Aggregate | None
    experts_us: Aggregate | None
    combine_us: Aggregate | None
    timing_spread: StageSpread | None  # None when any rank that ran lacks per-stage min/max
    experts_tflops: Aggregate | None
    dispatch_busbw_gbps: Aggregate | None
    combine_busbw_gbps: Aggregate | None
    num_wrong_slots: int
    checks: PolicyCheckCounts
    deployment_kv_tokens: int | None = None  # memory.deployment_ballast: the fewest over ranks
    deployment_verdict: str | None = None


class ScenarioInfo(ReportModel):
    """The scenario as the run saw it; shapes are None when it could not be parsed."""

    name: str | None = None
    hash: str | None = None
    path: str | None = None
    description: str | None = None
    num_dispatchers: int | None = None
    num_ranks: int | None = None
    num_local_experts: int | None = None
    max_tokens_per_rank: int | None = None
    M: int | None = None
    hidden_size: int | None = None
    intermediate_size: int | None = None
    N: int | None = None
    top_k: int | None = None
    num_experts: int | None = None
    model_preset: str | None = None
    activation: str | None = None
    workspace_dtype: str | None = None
    emulated: bool | None = None
    routing: str | None = None
    num_tokens_per_dispatcher: int | None = None
    policies: list[str] = []
    expected_outcomes: dict[str, Literal["fit", "oom"]] = {}
    memory_tolerance_pct: float | None = None
    max_error: float | None = None
    measurement_method: str | None = None
    experts_backend: str | None = None
    comm_backend: str | None = None
    memory_method: Literal["nvml", "rss"] | None = None
    memory_label: str | None = None
    baseline_rounding_bytes: int | None = None  # the baseline check's allowance (see checks.baseline_rounding)
    memory_budget_bytes: int | None = None  # memory.budget_gb / budget_gpu: device memory the process may use
    ballast_bytes: int | None = None


class HardwareInfo(ReportModel):
    device_kind: Literal["cuda", "cpu"] | None = None
    device_names: list[str] = []
    device_total_bytes: Aggregate | None = None
    device_capabilities: list[str] = []
    num_ranks_expected: int | None = None
    num_ranks_reported: int = 0
    num_rank_failures: int = 0
    num_nodes: int = 0
    nodes: list[str] = []
    launcher: str | None = None


class ComponentReport(ReportModel):
    """One buffer of the layer (kind "layer": harness.sizing.layer) or of a deployment (kind "deployment") that the
    run allocated: the model's bytes against what the ranks allocated and their device showed, with the verdicts
    the collector judged and the scenario's expected verdicts. harness.report.components builds them."""

    kind: str
    name: str
    predicted_bytes: int | None
    source: str  # where the prediction comes from
    allocated_bytes: int | None = None  # what the rank asked the allocator for (the same on every rank)
    measured_bytes: Aggregate | None = None  # the device's delta over the component's step (NVML or RSS), over ranks
    within_rounding: bool | None = None  # every rank's device showed the step's bytes up to the allocator's rounding
    cap_bytes: int | None = None  # a library's limit on the buffer
    verdicts: list[str] = []
    expected_verdicts: list[str] | None = None  # None: the scenario expects nothing of it
    expectation: CheckOutcome = "skip"
    detail: str = ""


class RunSummary(ReportModel):
    """A run's report less its per-rank entries: everything `compare` and a matrix's combined report read of a run
    (header, verdicts, per-policy aggregates, failed checks, problems). A matrix report holds one per cell."""

    report_schema_version: int = REPORT_SCHEMA_VERSION
    record_schema_version: int
    kind: Literal["run"] = "run"
    run_id: str | None
    generation: str  # "<run id>@<content hash of the inputs>": all four outputs carry it
    scenario_name: str | None
    scenario_hash: str | None
    status: Literal["OK", "FAILED"]
    exit_code: int
    exit_reason: str
    command: list[str] | None
    started_at: float | None
    finished_at: float | None
    scenario: ScenarioInfo
    scenario_problem: str | None
    versions: Versions | None
    version_mismatches: dict[str, list[str]]
    hardware: HardwareInfo
    policies: list[PolicySummary]
    checks: CheckCounts
    check_failures: list[CheckFailure]
    problems: list[Problem]
    components: list[ComponentReport] = []  # the layer's (and a deployment's) buffers the run allocated
    content_digest: str | None = None  # written by dump_json: sha256 of the rest (a hand edit shows)

    def policy(self, name: str) -> PolicySummary | None:
        return next((p for p in self.policies if p.policy == name), None)


class RunReport(RunSummary):
    """One run directory's report.json: its RunSummary and every rank's entry."""

    ranks: list[RankEntry]

    def summary(self) -> RunSummary:
        """This report less its ranks (the fields are validated already: nothing is validated again)."""
        return RunSummary.model_construct(**{name: getattr(self, name) for name in RunSummary.model_fields})

    def to_json_text(self) -> str:
        return dump_json(self)


class SkippedCombination(ReportModel):
    name: str
    axis_values: dict[str, JsonValue]
    reason: str


class MatrixCell(ReportModel):
    name: str  # a safe single path component
    dir: str
    axis_values: dict[str, JsonValue]
    planned_contracts: dict[str, int]  # builtin policies' contract bytes, known even for a cell that never ran
    report: RunSummary
    # "sha256:<hex>" of the cell's own report.json as collect wrote it: compare checks the file against it (an
    # edited cell report is refused) without parsing it. None: no report.json written for this report (a cell
    # that never ran, one whose reports could not be written, one collected in memory, or a version-2 report).
    report_sha256: str | None = None

    @field_validator("report", mode="before")
    @classmethod
    def _summary_only(cls, report: object) -> object:
        """The cell's report as its own report.json has it, less its ranks (they stay in that file) and that file's
        digest (report_sha256 and the matrix report's own digest cover it), so a cell read from disk and one
        collected just now give the same matrix report."""
        if isinstance(report, RunReport):
            report = report.summary()
        if isinstance(report, RunSummary) and report.content_digest is not None:
            return report.model_copy(update={"content_digest": None})
        if isinstance(report, dict) and report.get("content_digest") is not None:
            return {**report, "content_digest": None}
        return report


class MatrixReport(ReportModel):
    report_schema_version: int = REPORT_SCHEMA_VERSION
    kind: Literal["matrix"] = "matrix"
    run_id: str  # the matrix directory's name; a cell's run id is "<run id>-<cell>"
    generation: str
    name: str
    description: str
    path: str | None
    status: Literal["OK", "FAILED"]
    exit_code: int
    exit_reason: str
    axes: dict[str, list[JsonValue]]
    num_combinations: int
    num_valid: int
    skipped: list[SkippedCombination]
    versions: Versions | None
    version_mismatches: dict[str, list[str]]
    hardware: HardwareInfo
    checks: CheckCounts
    check_failures: list[CheckFailure]
    problems: list[Problem]
    cells: list[MatrixCell]
    manifest_sha256: str | None = None  # "sha256:<hex>" of matrix.json's bytes as collected; None: a version-2 report
    content_digest: str | None = None  # written by dump_json: sha256 of the rest (a hand edit shows)

    def to_json_text(self) -> str:
        return dump_json(self)


Report = RunReport | MatrixReport


def dump_json(report: Report) -> str:
    """report.json: indented, one line per rank (a 1024-rank report stays fast to write and diffable), and
    strict JSON: `allow_nan=False` refuses a NaN that got past the models. The last field, content_digest, is
    content_digest() of the rest, so a number edited by hand (the generation kept) is told from what collect wrote."""
    data = report.model_dump(mode="json")
    data.pop("content_digest", None)
    data["content_digest"] = content_digest(data)
    return _json_text(data, 0, None) + "\n"


def with_digest(report: Report) -> Report:
    """The report as report.json holds it: with its content_digest."""
    return report.model_copy(update={"content_digest": content_digest(report.model_dump(mode="json"))})


def content_digest(data: dict[str, object]) -> str:
    """sha256 of report.json's data without its content_digest, as canonical JSON (sorted keys, no spaces):
    the same for the data dump_json writes and for that text read back with json.loads."""
    body = {k: v for k, v in data.items() if k != "content_digest"}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), allow_nan=False, ensure_ascii=True)
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


_ONE_LINE_PER_ITEM = ("ranks",)


def _json_text(value: object, level: int, key: str | None) -> str:
    pad, end = " " * (level + 1), " " * level
    if isinstance(value, dict) and value:
        items = [f"{pad}{json.dumps(k)}: {_json_text(v, level + 1, k)}" for k, v in value.items()]
        return "{\n" + ",\n".join(items) + "\n" + end + "}"
    if isinstance(value, list) and value and key in _ONE_LINE_PER_ITEM:
        return "[\n" + ",\n".join(pad + json.dumps(v, allow_nan=False) for v in value) + "\n" + end + "]"
    if isinstance(value, list) and value:
        return "[\n" + ",\n".join(pad + _json_text(v, level + 1, None) for v in value) + "\n" + end + "]"
    return json.dumps(value, allow_nan=False)


class ReportFormatError(Exception):
    """A report.json that is not a report this harness reads; the message says why in one line."""


def parse_report(data: object, *, where: str) -> Report:
    """A report from parsed report.json data; ReportFormatError names the first bad field."""
    from pydantic import ValidationError

    if not isinstance(data, dict) or data.get("kind") not in ("run", "matrix"):
        raise ReportFormatError(f"{where}: not a harness report (no kind run/matrix)")
    version = data.get("report_schema_version")
    if not isinstance(version, int):
        raise ReportFormatError(f"{where}: not a harness report (no report_schema_version)")
    if version > REPORT_SCHEMA_VERSION:
        raise ReportFormatError(f"{where}: report schema version {version} is newer than this harness reads "
                                f"({REPORT_SCHEMA_VERSION}); upgrade the harness")
    if version < OLDEST_REPORT_SCHEMA_VERSION:
        raise ReportFormatError(f"{where}: report schema version {version} is older than this harness reads "
                                f"({OLDEST_REPORT_SCHEMA_VERSION} to {REPORT_SCHEMA_VERSION}); run `harness collect` "
                                "on its run directory again")
    if data["kind"] == "matrix" and version < 3:
        data = _matrix_cells_as_summaries(data)
    model: type[RunReport] | type[MatrixReport] = RunReport if data["kind"] == "run" else MatrixReport
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = ".".join(str(p) for p in first["loc"])
        raise ReportFormatError(f"{where}: corrupt report: {loc}: {first['msg']}") from None


def _matrix_cells_as_summaries(data: dict[str, Any]) -> dict[str, Any]:
    """A version-2 matrix report's data (each cell embedding its whole RunReport) in the shape of version 3: each
    cell's report less its ranks (their own report.json has them), without a report_sha256 to check (version 2
    had none: its digest covered the embedded reports). A copy: the caller's data (whose digest is checked) is
    left as it was."""
    cells = data.get("cells")
    if not isinstance(cells, list):
        return data
    summaries = [{**c, "report": {k: v for k, v in c["report"].items() if k != "ranks"}}
                 if isinstance(c, dict) and isinstance(c.get("report"), dict) else c for c in cells]
    return {**data, "cells": summaries}
