"""The driver's sink: events, records and failures from a launcher, written under the run directory as they arrive,
so an interrupt or a later failure never loses them.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness.core.events import Event, EventError, Failed, Placed, PolicyDone, RecordWritten, parse_event
from harness.core.killpoints import kill_point
from harness.core.records import RankFailure, RankRecord, rank_record_path, write_json_atomic, write_record
from harness.launch.contract import LaunchOutcome

if TYPE_CHECKING:
    from harness.launch.contract import LaunchPlan


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
            kill_point("policy-done")

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
        kill_point("record")
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
