"""Records that cross processes: frozen, typed, versioned, in base units (bytes, microseconds, seconds).

A run directory holds:

    run.json                 RunManifest: the scenario, how many ranks were launched, by what, the command
    ranks/rank-00003.json    RankRecord: one per rank. Written after every policy with the policies finished so far
                             (complete=False), then replaced by the rank's final record (complete=True)
    ranks/rank-00003.failed.json  RankFailure: written by the launcher for a rank that died, hung or raised; it names
                             the policies the rank finished and those that were lost
    oom/...                  memory snapshots kept on OOM

Every record and event (harness.core.events) shares one header: the schema version, the run id and the scenario
hash (RunHeader), and the rank where there is one (RankHeader). Writes are atomic (temporary file, then rename),
so a crash never leaves half a record.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from harness.core.killpoints import kill_point

# 2: a rank records facts only; the verdicts of version 1 (Correctness.within_tolerance and first_diverging_stage,
# PolicyResult.expectation_met) are made by the collector (harness.report.checks). A version 1 record still loads:
# those three fields are read and dropped (_drop_verdicts).
SCHEMA_VERSION = 2
MIN_SCHEMA_VERSION = 1
# A cheap bound before validation; the scenario's own list (harness.scenario.limits.MAX_POLICIES at most) is
# checked by the collector, which knows the scenario.
MAX_RECORD_POLICIES = 64
# The rank's own verdicts in version 1 records, per policy and per policy's correctness.
_V1_POLICY_VERDICTS = ("expectation_met",)
_V1_CORRECTNESS_VERDICTS = ("within_tolerance", "first_diverging_stage")


RecordProblem = Literal["missing", "unreadable", "truncated", "corrupt", "newer-schema"]


class RecordError(Exception):
    """A record that cannot be read: missing, truncated, corrupt, or of a newer schema. `reason` names which."""

    def __init__(self, message: str, reason: RecordProblem = "corrupt") -> None:
        super().__init__(message)
        self.reason: RecordProblem = reason


class Record(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class RunHeader(Record):
    """The header every record and event of a run carries: which schema, which run, which scenario."""

    schema_version: int = SCHEMA_VERSION
    run_id: str
    scenario_hash: str


class RankHeader(RunHeader):
    """RunHeader plus the rank the record or event is about."""

    rank: int


class Versions(Record):
    harness: str
    python: str
    torch: str
    cuda: str | None = None
    nccl: str | None = None
    driver: str | None = None
    ray: str | None = None
    vllm_source: str | None = None  # e.g. "release 0.26.0 (wheel, cached)" or "installed 0.33.0"
    vllm_kernels: str | None = None  # the ops library loaded by the vllm-ops backend, if any


class Hardware(Record):
    hostname: str
    node_ip: str
    device_kind: Literal["cuda", "cpu"]
    device_name: str
    device_uuid: str | None = None
    device_total_bytes: int | None = None
    device_capability: str | None = None  # "9.0"
    num_cpus: int


class ContractBytes(Record):
    """The policy's workspace as vLLM's modular kernel would allocate it."""

    ws13_shape: list[int]
    ws2_shape: list[int]
    out_shape: list[int]
    common_bytes: int
    ws2_bytes: int
    total_bytes: int
    source: str


class MemoryMeasurement(Record):
    """Peaks and deltas of one policy, measured from a baseline with weights and comm buffers up."""

    method: Literal["nvml", "rss"]
    label: str  # "GPU memory (NVML device used)" or "CPU memory (process RSS)"
    baseline_bytes: int
    peak_bytes: int
    delta_bytes: int  # peak - baseline over the whole policy (workspaces + the data path's transient use)
    workspace_delta_bytes: int  # device-used growth from allocating common + ws2 alone
    # GPU: what the caching allocator reserved (cudaMalloc'd) for the two buffers. It rounds small requests up to
    # whole segments (a 1-10 MiB request takes a 20 MiB segment), so tiny workspaces show more than they ask.
    workspace_reserved_bytes: int | None = None
    process_peak_bytes: int | None = None  # NVML per-process used memory
    allocator_allocated_peak_bytes: int | None = None
    allocator_reserved_peak_bytes: int | None = None
    allocator_baseline_bytes: int | None = None
    num_samples: int = 0
    # How far two policies' baselines may differ when both start from the same warmed state: the allocator's
    # granularity (CUDA caching allocator: 2 MiB blocks), or on CPU what RSS moves by between equal states
    # (malloc arenas, the interpreter). None in records from before the warm-up pass.
    allocator_rounding_bytes: int | None = None


class Breakdown(Record):
    """Exact bytes of the harness's own allocations on this rank; `other` is what the device shows beyond them."""

    weights_bytes: int
    dispatch_bytes: int
    common_bytes: int  # ws13 and out alias it
    ws2_bytes: int
    combine_bytes: int
    ballast_bytes: int
    other_bytes: int  # context, NCCL, allocator slack; on CPU the interpreter and libraries
    # The experts backend's own temporaries at most (its chunking bounds them), counted apart from `other` so a
    # budget verdict that depends on the backend says so.
    scratch_bytes: int = 0
    # The comm region: DeepEP low-latency's buffer for the same T, K and experts, as vLLM's batched path holds it
    # (CommRecord has the figures); 0 when the scenario has none. Records before the comm category read 0.
    comm_bytes: int = 0


class CommRecord(Record):
    """Which comm backend carried the run, why, and its buffers on this rank."""

    backend: Literal["symm-mem", "nccl", "gloo"]
    choice: str  # why: "named by the scenario", or how auto chose
    deepep_ll_bytes: int  # DeepEP low-latency's buffer for the same T, K and global experts (harness.sizing.deepep)
    deepep_combine_variant: str  # which DeepEP message layout the figure assumes
    comm_bytes: int  # the comm category: deepep_ll_bytes, or 0 when memory.comm_buffer is "none" or the
    # scenario's layer.all2all is not deepep-low-latency
    harness_bytes: int  # the send/receive staging the harness itself allocated (counted in dispatch and combine)
    row_kernels: str = "torch"  # what moved the rows (harness.rank.comm.fused): "triton <version>" or "torch"


class OomRecord(Record):
    policy: str
    stage: str  # "workspace", "experts", ...
    requested_bytes: int | None
    free_bytes: int | None
    total_bytes: int | None
    budget_bytes: int | None
    message: str
    snapshot_file: str | None = None  # relative to the run directory
    # What the policy's workspace held when the allocation failed (its first block, when the second failed); None:
    # not a workspace OOM, or a record from before the field.
    allocated_bytes: int | None = None


class Timings(Record):
    """Medians over the measured iterations (first sample dropped), in microseconds.

    The per-stage min and max over the same samples let `harness compare` tell a change from the run's own noise;
    records written before they existed hold None.
    """

    dispatch_us: float
    experts_us: float
    combine_us: float
    num_samples: int
    dispatch_min_us: float | None = None
    dispatch_max_us: float | None = None
    experts_min_us: float | None = None
    experts_max_us: float | None = None
    combine_min_us: float | None = None
    combine_max_us: float | None = None
    # How dispatch and combine were timed: "graph" (CUDA-graph replays of one captured dispatch and its combine,
    # the experts step eager between them, as `harness bench` times them) or "eager", with why where eager
    # (harness.rank.graphs.capture_reason); the experts step is always eager. None: records from before the field.
    timing_mode: Literal["graph", "eager"] | None = None
    timing_reason: str | None = None
    num_host_syncs: int | None = None  # device-to-host reads one dispatch needed (DispatchHandle.num_host_syncs)


class Throughput(Record):
    experts_tflops: float
    dispatch_algbw_gbps: float
    dispatch_busbw_gbps: float
    combine_algbw_gbps: float
    combine_busbw_gbps: float
    dispatch_bytes: int  # bytes this rank sent in one dispatch
    combine_bytes: int


STAGES = ("dispatch", "gemm1", "activation", "quant", "gemm2", "combine")
Stage = Literal["dispatch", "gemm1", "activation", "quant", "gemm2", "combine"]


class StageCheck(Record):
    """One stage of the data path checked against the reference applied to the previous stage's actual output.

    Rows are global rows of the batched (E*M) view (row = expert * M + slot), except for combine, whose rows are
    this rank's tokens. Experts are local expert indices (0..E-1) on this rank.
    """

    stage: Stage
    rows: Literal["all", "sampled"]  # every valid row, or sampled rows of every expert (first and last included)
    num_rows_checked: int
    num_rows_wrong: int
    # Rows not judged: the stage's input was not finite there (an earlier stage's divergence explains it).
    num_rows_unjudged: int = 0
    max_rel_error: float  # per row max |got - ref| / max |ref|, the maximum over the checked rows
    tolerance: float
    first_wrong_row: int | None = None
    first_wrong_expert: int | None = None
    first_wrong_slot: int | None = None
    wrong_experts: list[int] = Field(default_factory=list)

    @property
    def diverged(self) -> bool:
        return self.num_rows_wrong > 0

    @property
    def fraction_wrong(self) -> float:
        return self.num_rows_wrong / self.num_rows_checked if self.num_rows_checked else 0.0


class Correctness(Record):
    max_abs_error: float
    max_rel_error: float  # max |out - ref| / max |ref| over the rank's tokens
    num_wrong_slots: int  # expert slots whose token does not match what was routed there
    num_checked_tokens: int
    tolerance: float  # expect.max_error as the rank was given it (the collector judges against the scenario's)
    stages: list[StageCheck] = Field(default_factory=list)  # in data-path order
    check_us: float | None = None  # wall time of the whole check on this rank (its own work, not the data path)


class KernelsRecord(Record):
    """The experts kernels that ran on this rank and, for vLLM's ops, which library exactly."""

    backend: str  # "vllm-ops", "torch-cutlass", "reference"
    description: str  # e.g. "vLLM 0.30.0 _C_stable_libtorch.abi3.so" or "torch 2.11.0 _scaled_grouped_mm"
    release: str | None = None  # the vLLM release whose ops ran, when known
    release_from: str | None = None  # how the release is known: "release", "wheel", "src", "installed", "given", "cache"
    library: str | None = None  # path of the ops library as loaded on this rank
    library_sha256: str | None = None
    library_bytes: int | None = None
    torch_requirement: str | None = None  # the release's torch pin, e.g. "torch==2.13.0"


class DeploymentKv(Record):
    """memory.deployment_ballast: the KV cache the deployment sizes with this policy's workspace (vLLM's order:
    weights, held once, the profile run with the workspace, then the KV cache from what is left), and what the run
    allocated for it, measured like a component."""

    outcome: str  # the deployment model's verdict with this workspace: starts, fails, oom, refused
    verdict: str
    kv_tokens: int
    num_blocks: int
    component: ComponentMemory | None = None  # ballast-kv-cache as allocated (None when the deployment does not start)


class PolicyResult(Record):
    policy: str
    status: Literal["ok", "oom", "error"]
    contract: ContractBytes
    memory: MemoryMeasurement | None = None
    breakdown: Breakdown | None = None
    timings: Timings | None = None
    throughput: Throughput | None = None
    correctness: Correctness | None = None
    expected_outcome: Literal["fit", "oom"] | None = None  # expect.outcomes as the rank was given it
    oom: OomRecord | None = None
    error: str | None = None  # status "error": what was raised, on this rank or (stopped) on the ranks named
    # Ranks whose own OOM or error ended this policy; every rank stops the policy together (they agree before the
    # next collective). None in older records.
    failed_ranks: list[int] | None = None
    deployment_kv: DeploymentKv | None = None  # memory.deployment_ballast only


class ComponentMemory(Record):
    """One buffer of the layer that the rank allocated, against the layer model's prediction for it.

    A step (making the weights, allocating the dispatch buffers) is measured as a whole: `step_allocated_bytes` is
    everything it asked the allocator for, and the NVML (or RSS) delta and the allocator's reserved delta cover
    the whole step, after cached blocks were released. `allocated_bytes` is this component's part of the step.
    """

    name: str  # harness.scenario.schema.LAYER_COMPONENTS: expert-weights, dispatch-quant, deepep-rdma, ...
    predicted_bytes: int  # harness.sizing.layer's bytes for the component at this scenario's shapes
    prediction_source: str
    allocated_bytes: int
    step_allocated_bytes: int
    measured_delta_bytes: int  # NVML device used (GPU) or process RSS (CPU) over the step
    reserved_delta_bytes: int | None = None  # torch's caching allocator (GPU)
    within_rounding: bool  # the device shows the step's bytes, up to the allocator's rounding


class RankRecord(RankHeader):
    record_kind: Literal["rank"] = "rank"
    scenario_name: str
    scenario: dict[str, Any]
    num_ranks: int
    num_dispatchers: int
    emulated: bool
    comm_backend: Literal["nccl", "gloo", "symm-mem"]  # the dispatch/combine backend (CommRecord says why)
    experts_backend: str
    measurement_method: Literal["same-baseline"]  # every policy from one baseline, in one process
    versions: Versions
    hardware: Hardware
    policies: list[PolicyResult]
    started_at: float  # unix seconds
    finished_at: float
    ready_at: float | None = None  # group joined, weights and comm buffers up, warm-up done: the first policy starts
    expert_num_tokens: list[int]  # received per local expert, last iteration of the first policy that ran
    comm: CommRecord | None = None  # the comm backend's choice and buffers (absent in older records)
    # False: the record so far, sent after a policy finished; the final record (True) replaces it. A rank that
    # failed later leaves complete=False and a RankFailure naming the policies lost.
    complete: bool = True
    # The setup's warm-up pass, so every policy starts from the same warmed state: "full" (dispatch -> experts ->
    # combine and the check on a live-set workspace, freed before the first baseline), "comm-only" (the warm-up
    # workspace did not fit on some rank: dispatch alone), "failed" (a step raised; the policies record the
    # error themselves). None in records from before the warm-up pass.
    warmup: Literal["full", "comm-only", "failed"] | None = None
    # The layer components the setup allocated, each measured (absent in records from before the layer model).
    components: list[ComponentMemory] = []
    # memory.deployment_ballast: the rest of the deployment held as ballast (harness.sizing.deployment_ballast),
    # each against the deployment model's bytes, measured like the components.
    ballast: list[ComponentMemory] = []
    # The experts kernels that ran: the backend and, for vLLM's ops, the release, file, sha256 and size.
    kernels: KernelsRecord | None = None

    @field_validator("policies")
    @classmethod
    def _each_policy_once(cls, policies: list[PolicyResult]) -> list[PolicyResult]:
        seen: set[str] = set()
        for result in policies:
            if result.policy in seen:
                raise ValueError(f"policy {result.policy[:80]!r} is listed twice; each policy once")
            seen.add(result.policy)
        return policies


class RankFailure(RankHeader):
    """Written by a launcher for a rank that died, hung or raised before its final record."""

    record_kind: Literal["rank-failure"] = "rank-failure"
    scenario_hash: str = ""  # absent from records of schema 1's first writers
    node: str
    cause: str  # "died: exit code -9", "hung: no result within 60 s", ...
    detail: str = ""
    at: float
    # From the rank's record so far (ranks/rank-NNNNN.json, complete=False): the policies it finished, and the
    # scenario's policies that never finished on it.
    finished_policies: list[str] = []
    lost_policies: list[str] = []


class RunManifest(RunHeader):
    record_kind: Literal["run"] = "run"
    scenario_name: str
    scenario: dict[str, Any]
    scenario_path: str | None
    num_ranks: int
    launcher: Literal["local", "ray"]
    command: list[str]
    started_at: float
    versions: Versions | None = None
    # scenario_digest(scenario) as the driver wrote it: an edit of the scenario here (a raised expect.max_error)
    # shows. None in records from before it.
    scenario_sha256: str | None = None


def scenario_digest(scenario: dict[str, Any]) -> str:
    """sha256 of a record's scenario as canonical JSON (sorted keys, no spaces)."""
    import hashlib

    return hashlib.sha256(json.dumps(scenario, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def rank_record_path(run_dir: Path, rank: int, *, failed: bool = False) -> Path:
    suffix = ".failed.json" if failed else ".json"
    return run_dir / "ranks" / f"rank-{rank:05d}{suffix}"


def _umask() -> int:
    """The process's umask, read without changing it where Linux allows (os.umask can only set it)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def write_text_atomic(path: Path, text: str) -> Path:
    """Write text through a temporary file in the same directory and a rename: readers never see half a file.

    The file gets the mode a plain open() would give (0666 less the umask: 0644 by default), not mkstemp's 0600,
    so a CI uploader or a web server running as another user can read reports and records. On any failure the
    temporary file is removed, and an OSError without a file name (a write or fsync on a full disk) gets `path`,
    so the one line the CLI prints for it names what could not be written.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            os.fchmod(f.fileno(), 0o666 & ~_umask())
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        kill_point(f"write:{path.name}")  # a test hook: the driver killed with the temporary on disk
        os.replace(tmp, path)
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        if exc.filename is None and exc.errno is not None:
            raise OSError(exc.errno, exc.strerror, str(path)) from exc
        raise
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def write_json_atomic(path: Path, data: Any) -> Path:
    """JSON through write_text_atomic, so a crash never leaves half a record."""
    return write_text_atomic(path, json.dumps(data, indent=1) + "\n")


def write_record(path: Path, record: Record) -> Path:
    return write_json_atomic(path, record.model_dump(mode="json"))


_KINDS: dict[str, type[Record]] = {"rank": RankRecord, "rank-failure": RankFailure, "run": RunManifest}


def read_record(path: Path) -> RankRecord | RankFailure | RunManifest:
    """Read one record; raise RecordError naming the file and the cause."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise RecordError(f"{path}: missing", "missing") from None
    except OSError as exc:
        raise RecordError(f"{path}: cannot read: {exc.strerror}", "unreadable") from None
    return parse_record(data, where=str(path))


def parse_record(data: bytes, *, where: str) -> RankRecord | RankFailure | RunManifest:
    """A record from a file's bytes; RecordError (one line, starting with `where`) for anything else."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise RecordError(f"{where}: corrupt: not UTF-8 text (byte {exc.start})", "corrupt") from None
    try:
        loaded = json.loads(text)
    except json.JSONDecodeError as exc:
        # A record is one JSON object: one that stops before its closing brace was cut off mid-write.
        body = text.strip()
        if body.startswith("{") and not body.endswith("}"):
            raise RecordError(f"{where}: truncated JSON ({exc.msg} at line {exc.lineno})", "truncated") from None
        raise RecordError(f"{where}: corrupt JSON ({exc.msg} at line {exc.lineno})", "corrupt") from None
    except (ValueError, RecursionError) as exc:  # a 5000-digit integer, nesting deeper than the parser goes
        raise RecordError(f"{where}: corrupt JSON ({type(exc).__name__})", "corrupt") from None
    return _validate_record(loaded, where)


def _drop_verdicts(data: dict[str, Any]) -> dict[str, Any]:
    """A version 1 rank record without the verdicts it carried (the collector makes every verdict); anything
    malformed is left as it is, for validation to name."""
    policies = data.get("policies")
    if not isinstance(policies, list):
        return data
    kept = []
    for policy in policies:
        if isinstance(policy, dict):
            policy = {k: v for k, v in policy.items() if k not in _V1_POLICY_VERDICTS}
            correctness = policy.get("correctness")
            if isinstance(correctness, dict):
                policy["correctness"] = {k: v for k, v in correctness.items() if k not in _V1_CORRECTNESS_VERDICTS}
        kept.append(policy)
    return {**data, "policies": kept}


def _validate_record(data: Any, where: str) -> RankRecord | RankFailure | RunManifest:
    if not isinstance(data, dict):
        raise RecordError(f"{where}: corrupt: expected a JSON object")
    version = data.get("schema_version")
    if not isinstance(version, int) or isinstance(version, bool):
        raise RecordError(f"{where}: corrupt: no schema_version")
    if version < MIN_SCHEMA_VERSION:
        raise RecordError(f"{where}: corrupt: schema_version {version} is no version of these records; allowed: "
                          f"{MIN_SCHEMA_VERSION} to {SCHEMA_VERSION}")
    if version > SCHEMA_VERSION:
        raise RecordError(
            f"{where}: schema version {version} is newer than this harness reads ({SCHEMA_VERSION}); "
            "upgrade the harness to read it", "newer-schema"
        )
    kind = data.get("record_kind")
    model = _KINDS.get(kind) if isinstance(kind, str) else None
    if model is None:
        raise RecordError(f"{where}: corrupt: record_kind {str(kind)[:40]!r} is not one of {', '.join(_KINDS)}")
    if version < 2 and model is RankRecord:
        data = _drop_verdicts(data)
    policies = data.get("policies")
    if isinstance(policies, list) and len(policies) > MAX_RECORD_POLICIES:  # before validating thousands of them
        raise RecordError(f"{where}: corrupt: policies: {len(policies)} policies; allowed: at most "
                          f"{MAX_RECORD_POLICIES}")
    try:
        # strict, as scenarios are: no "123" or 1.0 for a byte count, no false for a count
        return model.model_validate(data, strict=True)  # type: ignore[return-value]
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = ".".join(str(p) for p in first["loc"])
        raise RecordError(f"{where}: corrupt: {loc}: {first['msg']}") from None
