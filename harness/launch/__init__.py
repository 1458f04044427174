"""Getting ranks running and their records back: launchers, and the driver of `harness run`.

Owns: the launch contract (this module: LaunchPlan, RankEntry, RunSink, bounds, fault injection), the local
launcher (`local`), the Ray launcher (`ray_launcher`) and the driver (`run`: a scenario or matrix -> launch ->
collect). Launchers only build RankInfos; the rank entry is handed to them (RankEntry), so they import neither
harness.rank's lifecycle nor harness.bench.

May import: harness.core, harness.scenario, harness.sizing, harness.rank, harness.report.

Launchers: one process per rank, each rank's record back to the driver, every wait bounded.

    harness run ──> Launcher.launch(LaunchPlan, RunSink)
                      local  torch.multiprocessing (spawn); events and records come back over a pipe per rank
                      ray    one placement-group bundle and one actor per rank; events through a progress actor,
                             final records as Ray objects
                    in every rank: rank_entry() -> the RankEntry's main(scenario, RankInfo, run_dir, progress)
                    on the driver: RunSink validates every event (harness.core.events), writes the record so far
                    after each policy (PolicyDone) and the final record the moment they arrive, both to
                    ranks/rank-NNNNN.json, and a RankFailure (ranks/rank-NNNNN.failed.json) naming the finished
                    and lost policies for each rank that died, hung, raised or never started

Launchers only build `RankInfo`s; `harness.rank.distributed.init_rank` is the one rendezvous (docs/design.md).

Bounds (scenario.launch): the placement and the actors' start within `placement_timeout_s`; once one rank has
ended (record, error or death) the others get `collective_timeout_s` more, since every rank does the same
collectives; nothing runs past `rank_timeout_s` from the launch. A rank that died is told from a hung one by its
exit (the process's exit code, its closed pipe, Ray's actor error), never by how long it was silent. SIGTERM to
the driver is handled as Ctrl-C is (`sigterm_as_interrupt`): records so far kept, ranks stopped, nothing left.

Fault injection, for tests of those bounds: HARNESS_INJECT_FAULT="rank=1,kind=die,after=ready" makes rank 1
call os._exit(1) when it reports "ready"; kind=hang makes it sleep instead. `after` is "start" (before joining
the group), an event kind ("ready", "done"), "policy:NAME" (NAME starts) or "policy-done:NAME" (NAME finished
and its record so far was sent). It is read here, in the launchers' wrapper, so rank_main never sees it.
"""

from __future__ import annotations

import os
import signal
import socket
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol

from harness.core.events import (
    Event, EventError, Failed, Placed, PolicyDone, RankEvent, RecordWritten, parse_event,
)
from harness.core.records import RankFailure, RankRecord, rank_record_path, write_json_atomic, write_record

if TYPE_CHECKING:
    from harness.rank.distributed import RankInfo
    from harness.scenario.schema import Scenario

FAULT_ENV = "HARNESS_INJECT_FAULT"
POLL_INTERVAL_S = 0.2

DeviceType = Literal["cuda", "cpu"]


class LaunchError(Exception):
    """The launch itself failed (no cluster, placement not satisfied, bad fault spec): exit code 2."""


@dataclass(frozen=True, kw_only=True)
class ClusterResources:
    """What a launcher can place ranks on."""

    num_gpus: int
    num_cpus: int
    num_nodes: int
    description: str  # one line, for messages: "2 nodes, 4 CPU, 0 GPU"


@dataclass(frozen=True, kw_only=True)
class RankEntry:
    """What a rank runs and what it returns, given by the caller so launchers import neither rank nor bench.

    `main(scenario, info, run_dir, progress)` returns a pydantic record; `record_model` validates it on the
    driver. Both are module-level, so they pickle by reference into spawned processes and Ray actors.
    """

    main: Callable[..., Any]
    record_model: type[Any]
    policies: tuple[str, ...] = ()  # what each rank measures, in order: a failure names those it never finished


@dataclass(frozen=True, kw_only=True)
class LaunchPlan:
    """One run's launch: the scenario, where records go, and the bounds of every wait."""

    scenario: Scenario
    run_id: str
    run_dir: Path
    device_type: DeviceType
    entry: RankEntry  # what each rank runs: the measurement (harness.rank) or the bench (harness.bench)

    @property
    def num_ranks(self) -> int:
        return self.scenario.parallel.num_ranks

    @property
    def comm_backend(self) -> Literal["nccl", "gloo"]:
        # On CPU "cpu:gloo,cuda:nccl" fails: one backend, chosen by the device.
        return "nccl" if self.device_type == "cuda" else "gloo"

    @property
    def placement_strategy(self) -> Literal["PACK", "SPREAD"]:
        return self.scenario.launch.placement_strategy

    @property
    def num_cpus_per_rank(self) -> int:
        return self.scenario.launch.cpus_per_rank

    @property
    def placement_timeout_s(self) -> float:
        return self.scenario.launch.placement_timeout_s

    @property
    def rank_timeout_s(self) -> float:
        return self.scenario.launch.rank_timeout_s

    @property
    def collective_timeout_s(self) -> float:
        return self.scenario.launch.collective_timeout_s

    def rank_info(self, rank: int, *, master_addr: str, master_port: int, device_index: int) -> RankInfo:
        from harness.rank.distributed import RankInfo  # torch: only once a launch begins

        return RankInfo(
            rank=rank,
            world_size=self.num_ranks,
            master_addr=master_addr,
            master_port=master_port,
            comm_backend=self.comm_backend,
            device_type=self.device_type,
            device_index=device_index,
            collective_timeout_s=self.collective_timeout_s,
            run_id=self.run_id,
        )

    def bundle(self) -> dict[str, float]:
        """One rank's placement-group bundle: {GPU: 1, CPU: c} with GPUs, {CPU: c} without."""
        if self.device_type == "cuda":
            return {"GPU": 1, "CPU": self.num_cpus_per_rank}
        return {"CPU": self.num_cpus_per_rank}


@dataclass(frozen=True, kw_only=True)
class LaunchOutcome:
    num_records: int
    failures: tuple[RankFailure, ...]
    error: str | None = None  # an infrastructure error that stopped the launch, for the user

    @property
    def ok(self) -> bool:
        return not self.failures and self.error is None


class Launcher(Protocol):
    name: Literal["local", "ray"]

    def resources(self) -> ClusterResources: ...

    def launch(self, plan: LaunchPlan, sink: RunSink) -> LaunchOutcome: ...

    def close(self) -> None: ...


# ---------------------------------------------------------------------------------------------------------------
# Driver side: records are written as they arrive, so an interrupt or a later failure never loses them.


@dataclass
class RunSink:
    """Receives events, records and failures from a launcher on the driver; writes them under run_dir.

    Events from ranks arrive as JSON data and are validated here (`rank_event`); a PolicyDone event's record so far
    is written at once, the final record replaces it, and a failure names the policies the rank finished (from
    its record so far) and those it lost.
    """

    run_dir: Path
    run_id: str
    num_ranks: int
    scenario_hash: str = ""
    policies: tuple[str, ...] = ()  # what every rank measures, in order
    record_model: type[Any] = RankRecord  # LaunchPlan.entry.record_model
    listener: Callable[[Event], None] | None = None
    nodes: dict[int, str] = field(default_factory=dict)  # rank -> node, for failures and the display
    records: dict[int, Any] = field(default_factory=dict)  # final records
    so_far: dict[int, Any] = field(default_factory=dict)  # records so far (complete=False), until the final one
    failures: dict[int, RankFailure] = field(default_factory=dict)
    first_end_at: float | None = None
    first_end_rank: int | None = None

    @staticmethod
    def for_plan(plan: LaunchPlan, *, listener: Callable[[Event], None] | None = None) -> RunSink:
        return RunSink(run_dir=plan.run_dir, run_id=plan.run_id, num_ranks=plan.num_ranks,
                       scenario_hash=plan.scenario.scenario_hash, policies=plan.entry.policies,
                       record_model=plan.entry.record_model, listener=listener)

    @property
    def pending(self) -> list[int]:
        return [r for r in range(self.num_ranks) if r not in self.records and r not in self.failures]

    @property
    def header(self) -> dict[str, Any]:
        """The header fields of events the driver itself makes (harness.core.records.RunHeader)."""
        return {"run_id": self.run_id, "scenario_hash": self.scenario_hash}

    def event(self, event: Event) -> None:
        """A typed event, made by the launcher or parsed from a rank's data."""
        if isinstance(event, Placed):
            self.nodes[event.rank] = event.node
        if isinstance(event, PolicyDone):
            self._record_so_far(event)
        if self.listener is not None:
            self.listener(event)

    def rank_event(self, rank: int, data: Any) -> None:
        """An event rank `rank` sent, as JSON data: validated against the event models, then handled."""
        try:
            event = parse_event(data)
        except EventError as exc:
            self.failure(rank, f"error: {exc}", detail=repr(data)[:2000])
            return
        if getattr(event, "rank", rank) != rank:
            self.failure(rank, f"error: rank {rank} sent an event of rank {getattr(event, 'rank', None)}")
            return
        self.event(event)

    def _validate(self, rank: int, data: Any, what: str) -> Any | None:
        try:
            return self.record_model.model_validate(data)
        except Exception as exc:  # noqa: BLE001 - a record the driver cannot read is that rank's failure
            self.failure(rank, f"error: the rank's {what} does not validate: {exc}".splitlines()[0], detail=str(exc))
            return None

    def _record_so_far(self, event: PolicyDone) -> None:
        rank = event.rank
        if rank in self.records or rank in self.failures:
            return
        record = self._validate(rank, event.record, "record so far")
        if record is not None:
            write_record(rank_record_path(self.run_dir, rank), record)
            self.so_far[rank] = record

    def _ended(self, rank: int) -> None:
        if self.first_end_at is None:
            self.first_end_at = time.monotonic()
            self.first_end_rank = rank

    def record(self, rank: int, data: dict[str, Any]) -> None:
        """Validate the final record that came back from a rank and write it at once (over its record so far)."""
        if rank in self.failures:
            return
        record = self._validate(rank, data, "record")
        if record is None:
            return
        write_record(rank_record_path(self.run_dir, rank), record)
        self.records[rank] = record
        self.so_far.pop(rank, None)
        self._ended(rank)
        self.event(RecordWritten(**self.header, rank=rank))

    def failure(self, rank: int, cause: str, *, detail: str = "") -> None:
        if rank in self.records or rank in self.failures:
            return
        so_far = self.so_far.get(rank)
        finished = [p.policy for p in so_far.policies] if so_far is not None else []
        failure = RankFailure(
            **self.header, rank=rank, node=self.nodes.get(rank, "unknown"), cause=cause, detail=detail,
            at=time.time(), finished_policies=finished, lost_policies=[p for p in self.policies if p not in finished],
        )
        write_record(rank_record_path(self.run_dir, rank, failed=True), failure)
        self.failures[rank] = failure
        self._ended(rank)
        self.event(Failed(**self.header, rank=rank, cause=cause))

    def fail_pending(self, cause: str, *, detail: str = "") -> None:
        for rank in self.pending:
            self.failure(rank, cause, detail=detail)

    def write_placement(self, data: dict[str, Any]) -> None:
        """launch.json: where each rank ran (node IP, Ray node id, pid), which records do not carry."""
        write_json_atomic(self.run_dir / "launch.json", data)

    def outcome(self, error: str | None = None) -> LaunchOutcome:
        failures = tuple(self.failures[r] for r in sorted(self.failures))
        return LaunchOutcome(num_records=len(self.records), failures=failures, error=error)


def describe_failure(failure: RankFailure) -> str:
    """One line for the console: the rank, its node, the cause, and what finished and what was lost."""
    line = f"rank {failure.rank} on {failure.node}: {failure.cause}"
    if failure.finished_policies:
        line += f"; finished: {', '.join(failure.finished_policies)} (kept in its record)"
    if failure.lost_policies:
        line += f"; lost: {', '.join(failure.lost_policies)}"
    return line


@dataclass
class RankWatch:
    """The bounds of one launch: rank_timeout_s overall, collective_timeout_s once a first rank has ended."""

    plan: LaunchPlan
    sink: RunSink
    started_at: float = field(default_factory=time.monotonic)

    def deadline(self) -> float:
        deadline = self.started_at + self.plan.rank_timeout_s
        if self.sink.first_end_at is not None:
            deadline = min(deadline, self.sink.first_end_at + self.plan.collective_timeout_s)
        return deadline

    def expired(self) -> bool:
        return time.monotonic() >= self.deadline()

    def fail_hung(self) -> None:
        """A RankFailure for each rank still without a result once the deadline has passed."""
        waited_s = time.monotonic() - self.started_at
        if self.sink.first_end_at is not None and self.deadline() < self.started_at + self.plan.rank_timeout_s:
            why = (
                f"rank {self.sink.first_end_rank} ended {self.sink.first_end_at - self.started_at:.0f} s into the run; "
                f"the others had collective_timeout_s = {self.plan.collective_timeout_s:g} s more"
            )
        else:
            why = f"rank_timeout_s = {self.plan.rank_timeout_s:g} s passed"
        self.sink.fail_pending(f"hung: no result within {waited_s:.0f} s", detail=why)


class Terminated(KeyboardInterrupt):
    """SIGTERM to the driver, handled as Ctrl-C is: records so far kept, ranks stopped, nothing orphaned."""

    signum = signal.SIGTERM


@contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """While a launch runs, SIGTERM raises Terminated (a KeyboardInterrupt) in the driver's main thread.

    Ray's driver sets its own SIGTERM handler (sys.exit) at ray.init; this one replaces it for the launch and
    puts it back after, so the launchers' interrupt paths run for both signals.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: object) -> None:
        raise Terminated()

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def exit_cause(exitcode: int) -> str:
    """'died: exit code 1' or 'died: killed by SIGKILL'."""
    if exitcode < 0:
        try:
            return f"died: killed by {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"died: killed by signal {-exitcode}"
    if exitcode == 0:
        return "died: exited with code 0 before sending its record"
    return f"died: exit code {exitcode}"


def hostname() -> str:
    return socket.gethostname()


# ---------------------------------------------------------------------------------------------------------------
# Rank side: the wrapper both launchers run around harness.rank.lifecycle.rank_main.


@dataclass(frozen=True, kw_only=True)
class FaultSpec:
    """A test hook: make one rank die or hang at a given point (HARNESS_INJECT_FAULT)."""

    rank: int
    kind: Literal["die", "hang"]
    after: str = "ready"  # "start", an event kind, "policy:NAME" or "policy-done:NAME"

    def matches(self, event: RankEvent) -> bool:
        kind, _, policy = self.after.partition(":")
        if policy:
            return event.kind == kind and getattr(event, "policy", None) == policy
        return event.kind == self.after

    def trigger(self) -> None:
        if self.kind == "die":
            os._exit(1)  # no cleanup, no exception: what a crashed or OOM-killed rank looks like to the others
        while True:
            time.sleep(3600)


def parse_fault_spec(text: str | None) -> FaultSpec | None:
    """'rank=1,kind=die,after=ready' -> FaultSpec; raise LaunchError naming what is wrong."""
    if not text:
        return None
    fields: dict[str, str] = {}
    for part in text.split(","):
        key, sep, value = part.strip().partition("=")
        if not sep or key not in ("rank", "kind", "after"):
            raise LaunchError(f"{FAULT_ENV}={text!r}: expected rank=R,kind=die|hang[,after=EVENT], got {part!r}")
        fields[key] = value.strip()
    if "rank" not in fields or "kind" not in fields:
        raise LaunchError(f"{FAULT_ENV}={text!r}: rank= and kind= are required")
    if not fields["rank"].isdigit():
        raise LaunchError(f"{FAULT_ENV}={text!r}: rank must be a rank number, got {fields['rank']!r}")
    if fields["kind"] not in ("die", "hang"):
        raise LaunchError(f"{FAULT_ENV}={text!r}: kind must be die or hang, got {fields['kind']!r}")
    return FaultSpec(rank=int(fields["rank"]), kind=fields["kind"], after=fields.get("after") or "ready")  # type: ignore[arg-type]


def rank_entry(scenario: Scenario, info: RankInfo, run_dir: Path, emit: Callable[[dict[str, Any]], None],
               entry: RankEntry) -> dict[str, Any]:
    """Run one rank inside a launcher's process and return its record as JSON data.

    `emit` carries the rank's events back to the driver as JSON data (model dumps; the driver validates them).
    It returns once the data is on its way out of this process, so a record so far survives a crash right
    after. Exceptions propagate: the launcher reports them as the rank's failure.
    """
    from harness.rank.distributed import apply_safe_env

    apply_safe_env()
    fault = parse_fault_spec(os.environ.get(FAULT_ENV))
    if fault is not None and fault.rank != info.rank:
        fault = None
    if fault is not None and fault.after == "start":
        fault.trigger()

    def progress(event: RankEvent) -> None:
        emit(event.model_dump(mode="json"))  # delivered when emit returns: no sleep before a fault
        if fault is not None and fault.matches(event):
            fault.trigger()

    return entry.main(scenario, info, run_dir, progress).model_dump(mode="json")


def format_exception(exc: BaseException) -> tuple[str, str]:
    """(cause, detail) for an exception raised inside a rank."""
    if isinstance(exc, KeyboardInterrupt):
        return "interrupted: Ctrl-C reached the rank", ""
    lines = traceback.format_exception_only(type(exc), exc)
    return f"error: {lines[-1].strip()}", "".join(traceback.format_exception(exc))
