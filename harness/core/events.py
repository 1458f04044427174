"""Progress events: what ranks and launchers tell the driver while a run is in flight.

Typed, frozen and versioned like the records, and sharing their header (harness.core.records.RunHeader /
RankHeader: schema version, run id, scenario hash, rank). One union, `Event`, discriminated by `kind`:

    kind            from      when
    placing         launcher  the Ray placement group is requested
    placed          launcher  a rank's process or actor runs on a node
    ready           rank      group joined, weights and comm buffers up, warm-up pass done
    policy          rank      a policy starts (allocate -> iterate -> measure -> judge)
    policy-done     rank      a policy finished; carries the rank's record so far (the driver writes it at once)
    done            rank      every policy finished; the final record follows
    record          driver    the rank's final record was written
    failed          driver    the rank died, hung, raised or was interrupted (its RankFailure was written)

Events cross process and actor boundaries as `model_dump(mode="json")` data and are validated on the driver with
`parse_event`, so a rank and a driver of different versions fail loudly instead of misreading each other.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, TypeAdapter, ValidationError

from harness.core.records import SCHEMA_VERSION, RankHeader, RunHeader


class Placing(RunHeader):
    kind: Literal["placing"] = "placing"
    num_bundles: int
    bundle: dict[str, float]  # one rank's bundle: {"GPU": 1, "CPU": 1} or {"CPU": 1}


class Placed(RankHeader):
    kind: Literal["placed"] = "placed"
    node: str  # hostname, or "IP (ray node ID)"
    pid: int | None = None


class Ready(RankHeader):
    kind: Literal["ready"] = "ready"
    backend: str  # the experts backend that will run


class PolicyStarted(RankHeader):
    kind: Literal["policy"] = "policy"
    policy: str


class PolicyDone(RankHeader):
    kind: Literal["policy-done"] = "policy-done"
    policy: str
    status: str  # the policy's status on this rank: "ok", "oom" or "error"
    # The rank's record so far (complete=False), as JSON data of the launch entry's record model (a RankRecord, or
    # a bench record): the driver validates it against that model and writes it atomically.
    record: dict[str, Any]


class Done(RankHeader):
    kind: Literal["done"] = "done"


class RecordWritten(RankHeader):
    kind: Literal["record"] = "record"


class Failed(RankHeader):
    kind: Literal["failed"] = "failed"
    cause: str


Event = Annotated[
    Placing | Placed | Ready | PolicyStarted | PolicyDone | Done | RecordWritten | Failed,
    Field(discriminator="kind"),
]
RankEvent = Ready | PolicyStarted | PolicyDone | Done  # what a rank itself sends
_ADAPTER: TypeAdapter[Event] = TypeAdapter(Event)


class EventError(Exception):
    """Event data that does not validate: the sender speaks another version of the protocol, or a bug."""


def parse_event(data: Any) -> Event:
    """A typed event from the JSON data that crossed a process or actor boundary; EventError otherwise."""
    version = data.get("schema_version") if isinstance(data, dict) else None
    if isinstance(version, int) and version > SCHEMA_VERSION:
        raise EventError(f"event schema version {version} is newer than this driver reads ({SCHEMA_VERSION})")
    try:
        return _ADAPTER.validate_python(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        kind = data.get("kind") if isinstance(data, dict) else type(data).__name__
        raise EventError(f"event {str(kind)[:40]!r} does not validate: {where}: {first['msg']}") from None
