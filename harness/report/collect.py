"""`harness collect`: turn one run's per-rank records into report.json, report.md, junit.xml and report.html.

    run.json + ranks/rank-NNNNN.json (+ rank-NNNNN.failed.json)
        -> load_run()        read inside the run directory only; every bad file becomes a Problem, never a traceback
        -> build_report()    judge every rank x policy from the numbers, aggregate: a RunReport (harness.report.model)
        -> write_report()    report.json, report.md, junit.xml, report.html, all stamped with one generation

Collect trusts nothing a record says about itself: verdicts are recomputed from the numbers and the scenario's
tolerances (a rank's own `within_tolerance` and `expectation_met` flags are ignored); NaN, infinities and negative
sizes make a record invalid; only canonical file names are read (ranks/rank-00001.json, never rank-1.json);
nothing is read through a link out of the run directory, nor anything that is not a regular file.

Exit codes (also the report's `exit_code`):
    0  every check passed
    1  a check failed: an expectation not met, correctness out of tolerance, memory out of tolerance, unequal
       baselines
    2  errors: rank failures, unreadable, invalid or mismatched records, ranks missing against run.json, a policy
       that raised, or no records at all

Checks, per rank x policy (docs/reports.md says how to read them):
    expectation  expected outcome ("fit" | "oom") against the actual one; skipped without an expectation
    correctness  max_rel_error <= expect.max_error, no wrongly routed slot and no diverging stage (each stage of the
                 data path within expect.stage_tolerance); or, for a kernels release in expect.wrong_kernels, the
                 first diverging stage (and first wrong row) stated there; skipped when the policy OOMed
    memory       workspace delta within expect.memory_tolerance_pct of the allocated contract (common + ws2)
    baseline     the policy's memory baseline equals the rank's first policy's within the allocator's rounding,
                 so every policy was measured from the same warmed state
A rank whose policy was stopped because another rank ran out of memory (status "error"; the ranks stop a policy
together) has its checks skipped; the policy's outcome is "oom".
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import stat
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.core.contract import fixed_shapes, live_set_bytes
from harness.core.exits import EXIT_ERROR, EXIT_FAILED, EXIT_OK
from harness.core.records import (
    SCHEMA_VERSION,
    Correctness,
    MemoryMeasurement,
    PolicyResult,
    RankFailure,
    RankRecord,
    Record,
    RecordError,
    RunManifest,
    StageCheck,
    Timings,
    parse_record,
)
from harness.report.model import (
    Aggregate,
    Check,
    CheckOutcome,
    CheckCounts,
    CheckFailure,
    Checks,
    HardwareInfo,
    Outcome,
    PolicyCheckCounts,
    PolicySummary,
    Problem,
    ProblemKind,
    RankEntry,
    RankPolicy,
    Report,
    RunReport,
    ScenarioInfo,
    StageSpread,
)
from harness.scenario.schema import Scenario, ScenarioError, WrongKernels, parse_scenario

REPORT_FILES = ("report.json", "report.md", "junit.xml", "report.html")
DEFAULT_MEMORY_TOLERANCE_PCT = 2.0
DEFAULT_MAX_ERROR = 0.06
MAX_RECORD_BYTES = 64 * 2**20  # a rank record is kilobytes; anything this large is not one
MAX_RANK_FILES = 1 << 20

# The memory check: the device shows whole caching-allocator segments, so a small workspace rounds up (a 1-10 MiB
# request takes a 20 MiB segment): at most one 20 MiB segment per buffer.
ALLOCATOR_ROUNDING_BYTES = 2 * 20 * 2**20

# The baseline check: how far two policies' baselines on one rank may differ and still be "the same state", for
# records that do not carry their own allocator_rounding_bytes (those from before the rank's warm-up pass).
#   nvml: the CUDA driver maps device memory in 2 MiB pages, the granularity of the caching allocator's segments
#         and of NVML's "used", so equal states read equal to within one 2 MiB page.
#   rss:  glibc keeps freed heap memory resident up to M_TRIM_THRESHOLD, which its dynamic mmap threshold raises
#         to at most 2 x 32 MiB after a large free (mallopt(3)); equal states read equal to within that.
BASELINE_ROUNDING_BYTES = {"nvml": 2 * 2**20, "rss": 64 * 2**20}

_RANK_FILE_RE = re.compile(r"^rank-(\d{5,})(\.failed)?\.json$")
# Fields of a record that are signed by nature: a delta can be negative (RSS returned to the OS), so can "other".
_SIGNED_FIELDS = frozenset({"delta_bytes", "workspace_delta_bytes", "other_bytes", "started_at", "finished_at",
                            "ready_at", "at"})


# ---------------------------------------------------------------------------------------------------------------
# Loading


@dataclass(frozen=True, kw_only=True)
class LoadedRun:
    """A run directory read back: the manifest, readable records sorted by rank, and every problem found."""

    run_dir: Path
    manifest: RunManifest | None
    records: tuple[RankRecord, ...]
    failures: tuple[RankFailure, ...]
    problems: tuple[Problem, ...]
    input_hash: str  # sha256 over every input file's name and bytes: the generation's content part


@dataclass
class _Inputs:
    """What load_run gathers step by step."""

    run_dir: Path
    root: Path  # run_dir resolved: nothing outside it is read
    problems: list[Problem] = field(default_factory=list)
    digests: list[tuple[str, str]] = field(default_factory=list)  # (relative path, sha256 of the bytes)
    unreadable_ranks: set[int] = field(default_factory=set)

    def problem(self, kind: ProblemKind, cause: str, *, rank: int | None = None, path: str | None = None) -> None:
        self.problems.append(Problem(kind=kind, cause=cause, rank=rank, path=path))


def read_contained(root: Path, path: Path, *, limit: int = MAX_RECORD_BYTES) -> bytes | tuple[ProblemKind, str]:
    """The bytes of a regular file inside `root` (resolved), or (problem kind, cause): a link out of the directory,
    a FIFO or device (which would block or never end), a file over `limit`, or one that cannot be read."""
    try:
        real = path.resolve(strict=True)
    except FileNotFoundError:
        return "missing", "missing"
    except (OSError, RuntimeError) as exc:  # a link loop
        return "outside", f"cannot resolve: {exc}"
    if not real.is_relative_to(root):
        return "outside", f"a link to {real}, outside the run directory: not read"
    try:
        fd = os.open(real, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as exc:
        return "corrupt", f"cannot open: {exc.strerror}"
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            return "outside", "not a regular file: not read"
        if info.st_size > limit:
            return "corrupt", f"{info.st_size} bytes, more than a record can be ({limit}): not read"
        with os.fdopen(os.dup(fd), "rb") as f:
            data = f.read(limit + 1)
    except OSError as exc:
        return "corrupt", f"cannot read: {exc.strerror}"
    finally:
        os.close(fd)
    if len(data) > limit:
        return "corrupt", f"more than {limit} bytes: not read"
    return data


def _read_record_file(inputs: _Inputs, rel: str, *, rank: int | None) -> Record | None:
    """One record file: read contained, hashed, parsed; a Problem instead of any exception."""
    data = read_contained(inputs.root, inputs.run_dir / rel)
    if isinstance(data, tuple):
        kind, cause = data
        if kind != "missing":
            inputs.digests.append((rel, kind))
        inputs.problem(kind, f"{rel}: {cause}", rank=rank, path=rel)
        return None
    inputs.digests.append((rel, hashlib.sha256(data).hexdigest()))
    try:
        record = parse_record(data, where=rel)
    except RecordError as exc:
        inputs.problem(exc.reason if exc.reason != "unreadable" else "corrupt", str(exc), rank=rank, path=rel)
        return None
    invalid = invalid_value(record) if _may_hold_invalid(data) else None
    if invalid is not None:
        inputs.problem("invalid", f"{rel}: {invalid}", rank=rank, path=rel)
        return None
    return record


_NEGATIVE_NUMBER_RE = re.compile(rb"[:\[,]\s*-[0-9]")


def _may_hold_invalid(data: bytes) -> bool:
    """A cheap look at the bytes: only a record holding NaN, Infinity or a negative number needs the full walk."""
    return b"NaN" in data or b"Infinity" in data or _NEGATIVE_NUMBER_RE.search(data) is not None


def invalid_value(record: Record) -> str | None:
    """The first NaN, infinity or negative size in a record, named by its field path; None when it has none."""
    for where, value in _leaves(record.model_dump(), ()):
        name = where[-1] if where else ""
        path = ".".join(str(p) for p in where)
        if isinstance(value, float) and not math.isfinite(value):
            return f"{path} is {value}: a record holds finite numbers only"
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value < 0:
            sized = isinstance(name, int) or name.endswith(("_bytes", "_us", "_gbps", "_tflops")) or name.startswith("num_")
            if sized and name not in _SIGNED_FIELDS:
                return f"{path} is {value}: sizes, counts and times are >= 0"
    return None


def _leaves(value: Any, where: tuple[str | int, ...]) -> Iterator[tuple[tuple[str | int, ...], Any]]:
    if isinstance(value, dict):
        if where and where[-1] == "scenario":
            return  # the scenario is checked by its own schema
        for key, item in value.items():
            yield from _leaves(item, (*where, key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from _leaves(item, (*where, i))
    else:
        yield where, value


def _load_manifest(inputs: _Inputs) -> RunManifest | None:
    if not (inputs.run_dir / "run.json").exists() and not (inputs.run_dir / "run.json").is_symlink():
        inputs.problem("no-manifest", "run.json is missing: cannot tell how many ranks were launched", path="run.json")
        return None
    loaded = _read_record_file(inputs, "run.json", rank=None)
    if loaded is None or isinstance(loaded, RunManifest):
        return loaded
    inputs.problem("mismatch", f"run.json holds a {loaded.record_kind!r} record, not the run manifest",  # type: ignore[attr-defined]
                   path="run.json")
    return None


def _scan_ranks_dir(inputs: _Inputs) -> list[tuple[int, bool, str]]:
    """(rank, is_failure, relative path) of every canonical file in ranks/; anything else there is a problem."""
    ranks_dir = inputs.run_dir / "ranks"
    if not ranks_dir.is_dir():
        return []
    if not ranks_dir.resolve().is_relative_to(inputs.root):
        inputs.problem("outside", f"ranks/ is a link to {ranks_dir.resolve()}, outside the run directory: not read",
                       path="ranks/")
        return []
    found: list[tuple[int, bool, str]] = []
    with os.scandir(ranks_dir) as entries:
        names = sorted(entry.name for _, entry in zip(range(MAX_RANK_FILES), entries))
    for name in names:
        rel = f"ranks/{name}"
        match = _RANK_FILE_RE.match(name)
        if match is None or name != f"rank-{int(match.group(1)):05d}{match.group(2) or ''}.json":
            why = ("a temporary file left by a writer that was stopped" if name.endswith(".tmp") else
                   "not a canonical rank-NNNNN[.failed].json name (five digits at least, no extra zeros)")
            inputs.problem("unexpected-file", f"{rel}: {why}; not read", path=rel)
            continue
        found.append((int(match.group(1)), match.group(2) is not None, rel))
    return found


def _check_rank_record(inputs: _Inputs, record: Record, rank: int, is_failure: bool, rel: str,
                       manifest: RunManifest | None) -> bool:
    """Whether a parsed rank file belongs here: its kind, rank, run and scenario; a mismatch problem if not."""
    expected = RankFailure if is_failure else RankRecord
    cause = None
    if not isinstance(record, expected):
        cause = f"{rel}: holds a {record.record_kind!r} record"  # type: ignore[attr-defined]
    elif record.rank != rank:
        cause = f"{rel}: the record says rank {record.rank}, the file name says {rank}"
    elif manifest is not None and record.run_id != manifest.run_id:
        cause = f"{rel}: run_id {record.run_id!r} is not this run's ({manifest.run_id!r})"
    elif isinstance(record, RankRecord) and manifest is not None and record.scenario_hash != manifest.scenario_hash:
        cause = (f"{rel}: scenario hash {record.scenario_hash} differs from the run's {manifest.scenario_hash}; "
                 "left out of the aggregates")
    if cause is not None:
        inputs.unreadable_ranks.add(rank)
        inputs.problem("mismatch", cause, rank=rank, path=rel)
        return False
    if manifest is not None and rank >= manifest.num_ranks:
        inputs.problem("mismatch", f"{rel}: rank {rank} is outside the {manifest.num_ranks} ranks run.json names",
                       rank=rank, path=rel)
    return True


def load_run(run_dir: Path) -> LoadedRun:
    """Read run.json and ranks/*.json inside `run_dir`; never raises for a bad file, it becomes a Problem."""
    run_dir = Path(run_dir)
    inputs = _Inputs(run_dir=run_dir, root=run_dir.resolve())
    manifest = _load_manifest(inputs)
    records: dict[int, RankRecord] = {}
    failures: dict[int, RankFailure] = {}
    for rank, is_failure, rel in _scan_ranks_dir(inputs):
        record = _read_record_file(inputs, rel, rank=rank)
        if record is None:
            inputs.unreadable_ranks.add(rank)
        elif _check_rank_record(inputs, record, rank, is_failure, rel, manifest):
            if isinstance(record, RankFailure):
                failures[rank] = record
            else:
                records[rank] = record  # type: ignore[assignment]
    if manifest is not None:
        for rank in sorted(set(range(manifest.num_ranks)) - set(records) - set(failures) - inputs.unreadable_ranks):
            rel = f"ranks/rank-{rank:05d}.json"
            inputs.problem("missing-rank", f"rank {rank}: no record and no failure record ({rel} is missing)",
                           rank=rank, path=rel)
    if not records:
        inputs.problem("no-records", "no readable rank records in ranks/", path="ranks/")
    digest = hashlib.sha256(json.dumps(sorted(inputs.digests)).encode()).hexdigest()
    return LoadedRun(
        run_dir=run_dir, manifest=manifest, records=tuple(records[r] for r in sorted(records)),
        failures=tuple(failures[r] for r in sorted(failures)), problems=tuple(inputs.problems), input_hash=digest,
    )


def generation_of(run_id: str | None, input_hash: str) -> str:
    """The stamp every output of one collect carries: which run, and which exact inputs."""
    return f"{run_id or 'unknown-run'}@{input_hash[:16]}"


# ---------------------------------------------------------------------------------------------------------------
# Checks


@dataclass(frozen=True, kw_only=True)
class Judging:
    """What the checks compare against: the scenario's expectations and tolerances."""

    expected: dict[str, str]
    memory_tolerance_pct: float
    max_error: float
    max_error_source: str  # "expect.max_error" or, when the scenario is unreadable, the record's own number
    # Kernels releases expected to be wrong, and how (expect.wrong_kernels); the stages' tolerances.
    wrong_kernels: dict[str, WrongKernels] = field(default_factory=dict)
    stage_tolerance: dict[str, float] = field(default_factory=dict)


def _pct(value: float, reference: float) -> float:
    return (value - reference) / reference * 100.0 if reference else (0.0 if value == reference else math.inf)


def _gib(num_bytes: float) -> str:
    return f"{num_bytes / 2**30:.4g} GiB"


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
    diverged = _first_diverging(c, judging)
    within = c.max_rel_error <= judging.max_error and c.num_wrong_slots == 0 and diverged is None
    message = (f"max rel error {c.max_rel_error:.3g} (tolerance {judging.max_error:.3g}, {judging.max_error_source}), "
               f"max abs error {c.max_abs_error:.3g}, {c.num_wrong_slots} wrong slots of {c.num_checked_tokens} "
               "checked tokens" + (f"; check {c.check_us / 1e6:.3g} s" if c.check_us is not None else ""))
    divergence = describe_divergence(diverged) if diverged is not None else None
    want = judging.wrong_kernels.get(release) if release is not None else None
    if want is None:
        return Check(outcome="pass" if within else "fail",
                     message=f"{divergence}; {message}" if divergence else message)
    wanted = want.stage + (f" from row {want.first_wrong_row}" if want.first_wrong_row is not None else "")
    why = f" ({want.reason})" if want.reason else ""
    if diverged is not None and diverged.stage == want.stage and (
            want.first_wrong_row is None or diverged.first_wrong_row == want.first_wrong_row):
        return Check(outcome="pass",
                     message=f"vLLM {release} kernels wrong as expected at {wanted}{why}: {divergence}; {message}")
    found = divergence or "every stage within tolerance"
    return Check(outcome="fail",
                 message=f"vLLM {release} kernels were expected wrong at {wanted}{why}, found {found}; {message}")


def _first_diverging(c: Correctness, judging: Judging) -> StageCheck | None:
    """The first stage, in data-path order, with a wrong row or an error over the scenario's stage tolerance."""
    for stage in c.stages:
        tolerance = judging.stage_tolerance.get(stage.stage, stage.tolerance)
        if stage.num_rows_wrong > 0 or stage.max_rel_error > tolerance:
            return stage
    return None


def describe_divergence(stage: StageCheck) -> str:
    """A diverging stage in words: rows wrong and their share, experts, the first wrong row, the largest error."""
    where = "tokens" if stage.stage == "combine" else "rows"
    text = (f"first diverging stage {stage.stage}: {stage.num_rows_wrong} of {stage.num_rows_checked} "
            f"{'sampled ' if stage.rows == 'sampled' else ''}{where} wrong ({stage.fraction_wrong:.1%})")
    if stage.wrong_experts:
        text += f", local experts {_ranges(stage.wrong_experts)}"
    if stage.first_wrong_row is not None:
        slot = (f" (expert {stage.first_wrong_expert}, slot {stage.first_wrong_slot})"
                if stage.first_wrong_expert is not None else "")
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
    within = abs(delta - allocated) <= tolerance * allocated
    message = (f"workspace delta {_gib(delta)} ({delta} B) vs allocated contract {_gib(allocated)} "
               f"({allocated} B): {_pct(delta, allocated):+.3g}% (tolerance {tolerance_pct:g}%, {result.memory.method})")
    reserved = result.memory.workspace_reserved_bytes
    if not within and reserved is not None:
        # Accept the allocator's segment rounding only when NVML shows exactly what the allocator reserved.
        rounding = 0 <= reserved - allocated <= ALLOCATOR_ROUNDING_BYTES
        if rounding and abs(delta - reserved) <= tolerance * reserved:
            within = True
            message += f"; matches the allocator's {reserved} B of segments (rounding of small buffers)"
    return Check(outcome="pass" if within else "fail", message=message)


def evaluate_checks(result: PolicyResult, *, expected_outcome: str | None, judging: Judging,
                    baseline: Check, stopped_by: list[int] | None = None, release: str | None = None) -> Checks:
    """The four checks of one rank x policy. `release`: the vLLM release whose kernels ran on the rank, if known.

    `stopped_by`: the other ranks whose OOM or error stopped this rank's policy (its status is then "error"). The
    ranks stop a policy together, so the others record an error that is not theirs: their expectation,
    correctness and memory checks are skipped, and the policy is judged on the ranks that failed.
    """
    if stopped_by:
        skip = Check(outcome="skip", message=f"policy stopped: rank(s) {stopped_by} ran out of memory or raised; "
                                             "judged on those ranks")
        return Checks(expectation=skip, correctness=skip, memory=skip, baseline=baseline)
    return Checks(expectation=_expectation_check(result, expected_outcome),
                  correctness=_correctness_check(result, judging, release),
                  memory=_memory_check(result, judging.memory_tolerance_pct), baseline=baseline)


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
            checks[policy] = Check(outcome="pass", message=f"baseline {memory.baseline_bytes} B ({memory.method}): "
                                                           "the reference for this rank's other policies")
        elif abs(diff) <= rounding and memory.method == reference.method:
            checks[policy] = Check(outcome="pass", message=f"baseline {memory.baseline_bytes} B, {diff:+d} B from "
                                   f"{first}'s (allowed: {rounding} B of {memory.method} rounding)")
        else:
            checks[policy] = Check(outcome="fail", message=(
                f"baseline {memory.baseline_bytes} B is {diff:+d} B ({diff / 2**20:+.1f} MiB) from {first}'s "
                f"{reference.baseline_bytes} B, beyond the {rounding} B of {memory.method} rounding: the policies "
                f"did not start from the same state ({_WARMUP_HINT[record.warmup]})"))
    return checks


# ---------------------------------------------------------------------------------------------------------------
# The report


def _agg(values: Iterable[float | int | None]) -> Aggregate | None:
    """min/avg/max over ranks of the values that exist; None when no rank has one."""
    present = [v for v in values if v is not None]
    if not present:
        return None
    return Aggregate(min=min(present), avg=sum(present) / len(present), max=max(present), num_ranks=len(present))


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


def _scenario_info(loaded: LoadedRun, scenario: Scenario | None, raw: dict[str, Any] | None) -> ScenarioInfo:
    m, first = loaded.manifest, (loaded.records[0] if loaded.records else None)
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
        memory = next((p.memory for r in loaded.records for p in r.policies if p.memory is not None), None)
        fields.update(measurement_method=first.measurement_method, experts_backend=first.experts_backend,
                      comm_backend=first.comm_backend, memory_method=memory.method if memory else None,
                      memory_label=memory.label if memory else None,
                      baseline_rounding_bytes=baseline_rounding(memory))
    return ScenarioInfo(**fields)


def _versions(loaded: LoadedRun) -> tuple[Any, dict[str, list[str]]]:
    """The lowest rank's versions, and every field on which ranks disagree (a mixed cluster is worth a warning)."""
    sources = [r.versions for r in loaded.records]
    if not sources and loaded.manifest is not None and loaded.manifest.versions is not None:
        sources = [loaded.manifest.versions]
    if not sources:
        return None, {}
    mismatches: dict[str, list[str]] = {}
    for name in type(sources[0]).model_fields:
        distinct = sorted({str(getattr(v, name)) for v in sources})
        if len(distinct) > 1:
            mismatches[name] = distinct
    return sources[0], mismatches


def _hardware(loaded: LoadedRun) -> HardwareInfo:
    records = loaded.records
    hostnames = sorted({r.hardware.hostname for r in records} | {f.node for f in loaded.failures})
    return HardwareInfo(
        device_kind=records[0].hardware.device_kind if records else None,
        device_names=sorted({r.hardware.device_name for r in records}),
        device_total_bytes=_agg(r.hardware.device_total_bytes for r in records),
        device_capabilities=sorted({r.hardware.device_capability for r in records if r.hardware.device_capability}),
        num_ranks_expected=loaded.manifest.num_ranks if loaded.manifest else None,
        num_ranks_reported=len(records), num_rank_failures=len(loaded.failures), num_nodes=len(hostnames),
        nodes=hostnames, launcher=loaded.manifest.launcher if loaded.manifest else None,
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
                 stopped: list[int] | None) -> RankPolicy:
    mem: MemoryMeasurement | None = result.memory
    t, tp, c = result.timings, result.throughput, result.correctness
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
        first_diverging_stage=c.first_diverging_stage if c else None, check_us=c.check_us if c else None,
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
        stopped = _stopped_by(record.rank, result, oom_ranks)
        checks = evaluate_checks(result, expected_outcome=expected, judging=judging,
                                 baseline=baselines.get(result.policy, no_baseline), stopped_by=stopped,
                                 release=record.kernels.release if record.kernels else None)
        entries.append(_rank_policy(record, result, checks, expected, stopped))
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


def _stopped_by(rank: int, result: PolicyResult, oom_ranks: dict[str, list[int]]) -> list[int] | None:
    """The other ranks whose OOM or error stopped this rank's policy (the ranks stop a policy together); None when
    this rank's own status is its own doing."""
    if result.status != "error":
        return None
    if result.failed_ranks is not None:
        others = [r for r in result.failed_ranks if r != rank]
        return others if rank not in result.failed_ranks and others else None
    return oom_ranks.get(result.policy)  # records before failed_ranks: only another rank's OOM stopped a policy


def _failure_text(failure: RankFailure) -> str:
    return f"{failure.cause}" + (f" ({failure.detail})" if failure.detail else "")


def _failure_problems(loaded: LoadedRun, scenario_policies: list[str]) -> list[Problem]:
    """One problem per failed rank, naming what it finished before it failed and what was lost."""
    finished = {r.rank: [p.policy for p in r.policies] for r in loaded.records}
    problems = []
    for f in loaded.failures:
        done = finished.get(f.rank, [])  # what the records on disk hold, not what the launcher believed
        lost = [p for p in scenario_policies if p not in done] if scenario_policies else list(f.lost_policies)
        kept = f"; finished {', '.join(done)}" if done else ""
        gone = f"; lost {', '.join(lost)}" if lost else ""
        problems.append(Problem(kind="rank-failure", rank=f.rank, path=f"ranks/rank-{f.rank:05d}.failed.json",
                                cause=f"rank {f.rank} on {f.node}: {_failure_text(f)}{kept}{gone}"))
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
        expectation=_policy_expectation(outcome, expected),
        baseline_bytes=_agg(e.baseline_bytes for e in entries),
        workspace_delta_bytes=_agg(e.workspace_delta_bytes for e in ran),
        delta_bytes=_agg(e.delta_bytes for e in ran),
        allocator_allocated_peak_bytes=_agg(e.allocator_allocated_peak_bytes for e in ran),
        allocator_reserved_peak_bytes=_agg(e.allocator_reserved_peak_bytes for e in ran),
        max_rel_error=_agg(e.max_rel_error for e in ran), max_abs_error=_agg(e.max_abs_error for e in ran),
        dispatch_us=_agg(e.dispatch_us for e in ran), experts_us=_agg(e.experts_us for e in ran),
        combine_us=_agg(e.combine_us for e in ran),
        timing_spread=_widest(spreads) if spreads and all(s is not None for s in spreads) else None,  # type: ignore[arg-type]
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


def _policy_expectation(outcome: Outcome | None, expected: str | None) -> CheckOutcome:
    if expected is None:
        return "skip"
    if outcome is None or outcome == "error":
        return "error"
    return "pass" if outcome == expected else "fail"


def _widest(spreads: list[StageSpread]) -> StageSpread:
    def most(values: list[float | None]) -> float | None:
        present = [v for v in values if v is not None]
        return max(present) if present else None

    return StageSpread(**{name: most([getattr(s, name) for s in spreads]) for name in StageSpread.model_fields})


def _judging(scenario: Scenario | None, records: tuple[RankRecord, ...]) -> Judging:
    if scenario is not None:
        return Judging(expected=dict(scenario.expect.outcomes), memory_tolerance_pct=scenario.expect.memory_tolerance_pct,
                       max_error=scenario.expect.max_error, max_error_source="expect.max_error",
                       wrong_kernels=dict(scenario.expect.wrong_kernels),
                       stage_tolerance=scenario.expect.stage_tolerance.model_dump())
    # No readable scenario: the tolerance the ranks were given is all there is; say where it came from.
    tolerances = [p.correctness.tolerance for r in records for p in r.policies if p.correctness]
    return Judging(expected={}, memory_tolerance_pct=DEFAULT_MEMORY_TOLERANCE_PCT,
                   max_error=min(tolerances, default=DEFAULT_MAX_ERROR), max_error_source="the records' tolerance")


def _judge(loaded: LoadedRun, scenario: Scenario | None) -> _Judged:
    judging = _judging(scenario, loaded.records)
    scenario_policies = list(scenario.policies) if scenario else []
    judged = _Judged(policy_order=list(scenario_policies))
    oom_ranks: dict[str, list[int]] = {}
    for record in loaded.records:
        for result in record.policies:
            if result.status == "oom":
                oom_ranks.setdefault(result.policy, []).append(record.rank)
    failures = {f.rank: f for f in loaded.failures}
    for record in loaded.records:
        _judge_rank(record, judging, oom_ranks, judged, failures.get(record.rank), scenario_policies)
    judged.problems += _failure_problems(loaded, scenario_policies)
    return judged


def _exit(counts: CheckCounts, problems: list[Problem]) -> tuple[int, str]:
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


def _problem_order(p: Problem) -> tuple[int, str, str]:
    return (p.rank if p.rank is not None else -1, p.path or "", p.kind)


def build_report(loaded: LoadedRun, *, scenario_hint: Scenario | None = None) -> RunReport:
    """The report of one run: every number any rendering shows, in base units, with the verdicts judged here.

    `scenario_hint` describes the run when neither run.json nor any record does (a matrix cell that never ran).
    """
    scenario, raw, scenario_problem = _scenario_of(loaded, scenario_hint)
    judged = _judge(loaded, scenario)
    contracts = {p.policy: p.contract for r in reversed(loaded.records) for p in r.policies}  # lowest rank wins
    fixed_total = fixed_shapes(scenario.sizing_args()).total_bytes if scenario else (
        contracts["fixed"].total_bytes if "fixed" in contracts else None)
    expected = dict(scenario.expect.outcomes) if scenario else {}
    summaries = [_policy_summary(p, judged.ranks, contracts, scenario, fixed_total, expected.get(p))
                 for p in judged.policy_order]
    counts = CheckCounts.of([c.outcome for r in judged.ranks for e in r.policies for _, c in e.checks.items()])
    problems = sorted([*loaded.problems, *judged.problems], key=_problem_order)
    exit_code, reason = _exit(counts, problems)
    manifest, records = loaded.manifest, loaded.records
    run_id = manifest.run_id if manifest else (records[0].run_id if records else None)
    versions, mismatches = _versions(loaded)
    info = _scenario_info(loaded, scenario, raw)
    input_hash = loaded.input_hash if (records or manifest or not scenario_hint) else \
        hashlib.sha256(scenario_hint.model_dump_json().encode()).hexdigest()
    return RunReport(
        record_schema_version=SCHEMA_VERSION, run_id=run_id, generation=generation_of(run_id, input_hash),
        scenario_name=info.name, scenario_hash=info.hash, status="OK" if exit_code == EXIT_OK else "FAILED",
        exit_code=exit_code, exit_reason=reason, command=list(manifest.command) if manifest else None,
        started_at=manifest.started_at if manifest else min((r.started_at for r in records), default=None),
        finished_at=max((r.finished_at for r in records), default=None), scenario=info,
        scenario_problem=scenario_problem, versions=versions, version_mismatches=mismatches,
        hardware=_hardware(loaded), policies=summaries, checks=counts, check_failures=judged.failures,
        problems=problems, ranks=judged.ranks,
    )


# ---------------------------------------------------------------------------------------------------------------
# Writing


_GENERATION_RE = {
    "report.json": re.compile(r'"generation": "([^"]+)"'),
    "report.md": re.compile(r"^# generation: (\S+)$", re.M),
    "junit.xml": re.compile(r'<property name="generation" value="([^"]+)"'),
    "report.html": re.compile(r'<meta name="harness-generation" content="([^"]+)"'),
}


def output_generations(out_dir: Path) -> dict[str, str | None]:
    """The generation each of the four outputs in `out_dir` carries (None: absent, unreadable or unstamped)."""
    root = Path(out_dir).resolve()
    found: dict[str, str | None] = {}
    for name, pattern in _GENERATION_RE.items():
        data = read_contained(root, Path(out_dir) / name, limit=256 * 2**20)
        match = pattern.search(data.decode("utf-8", "replace")) if isinstance(data, bytes) else None
        found[name] = match.group(1) if match else None
    return found


def _remove_stray_temporaries(out_dir: Path) -> None:
    """Temporary files of an earlier collect that was killed mid-write (atomic writes clean up on any exception,
    not on SIGKILL); only this collect's own names."""
    for name in REPORT_FILES:
        for tmp in out_dir.glob(f".{name}.*.tmp"):
            if tmp.is_file() and not tmp.is_symlink():
                tmp.unlink(missing_ok=True)


def write_report(out_dir: Path, report: Report) -> tuple[tuple[Path, ...], tuple[str, ...]]:
    """report.json first (machine-readable first), then the renderings of the same report; every write atomic.

    Returns the paths written and notes on what was replaced: outputs of another generation (a collect that was
    killed between writes, or records that changed since) are detected and rewritten.
    """
    from harness.core.records import write_text_atomic
    from harness.report.html import render_html
    from harness.report.markdown import render_junit, render_markdown

    out_dir.mkdir(parents=True, exist_ok=True)
    _remove_stray_temporaries(out_dir)
    before = output_generations(out_dir)
    notes = tuple(f"{name} was of generation {gen}; rewritten as {report.generation}"
                  for name, gen in before.items() if gen is not None and gen != report.generation)
    texts = {"report.json": report.to_json_text(), "report.md": render_markdown(report),
             "junit.xml": render_junit(report), "report.html": render_html(report)}
    paths = tuple(write_text_atomic(out_dir / name, texts[name]) for name in REPORT_FILES)
    return paths, notes


@dataclass(frozen=True, kw_only=True)
class CollectResult:
    """What `collect` produced. `report` is exactly what report.json holds."""

    run_dir: Path
    report: Report
    outputs: tuple[Path, ...] = ()
    notes: tuple[str, ...] = ()  # outputs of another generation that were rewritten
    write_error: str | None = None  # the outputs could not be written (one line); the exit code is then 2

    @property
    def exit_code(self) -> int:
        return EXIT_ERROR if self.write_error else self.report.exit_code

    @property
    def status(self) -> str:
        return self.report.status

    def summary_table(self) -> Any:
        """A rich renderable: the header, the per-policy table with its units row, problems, and the footer."""
        from rich.console import Group
        from rich.text import Text

        from harness.report.markdown import render_summary

        summary = render_summary(self.report)
        if self.write_error is None:
            return summary
        return Group(summary, Text(f"ERROR (exit 2): {self.write_error}", style="bold red"))


def collect(run_dir: Path, *, write: bool = True, scenario_hint: Scenario | None = None) -> CollectResult:
    """Aggregate one run directory's records; write the four reports into it unless `write` is False.

    Never raises for bad records; a run directory that does not exist yields an error report that is not written.
    """
    run_dir = Path(run_dir)
    report = build_report(load_run(run_dir), scenario_hint=scenario_hint)
    if not (write and run_dir.is_dir()):
        return CollectResult(run_dir=run_dir, report=report)
    return write_outputs(run_dir, report)


def write_outputs(out_dir: Path, report: Report) -> CollectResult:
    """write_report, with a failure to write (a read-only directory, a directory where report.md goes, a full
    disk) turned into the result's one-line `write_error` and exit code 2 instead of an exception."""
    try:
        outputs, notes = write_report(out_dir, report)
    except OSError as exc:
        where = Path(exc.filename).name if exc.filename else out_dir
        return CollectResult(run_dir=out_dir, report=report,
                             write_error=f"cannot write the reports into {out_dir}: {where}: {exc.strerror}")
    return CollectResult(run_dir=out_dir, report=report, outputs=outputs, notes=notes)
