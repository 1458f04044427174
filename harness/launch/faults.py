"""Fault injection, for tests of the launch bounds: HARNESS_INJECT_FAULT="rank=1,kind=die,after=ready" makes rank 1
call os._exit(1) when it reports "ready"; kind=hang makes it sleep instead, and kind=stop stops it (SIGSTOP) until
a test sends SIGCONT, a point of the run the test can act at without a race (fill a disk, then let it go on).
`after` is "start" (before joining the group), an event kind ("ready", "done"), "policy:NAME" (NAME starts) or
"policy-done:NAME" (NAME finished and its record so far was sent). The rank-side wrapper (harness.launch.rank_side)
reads it, so rank_main never sees it; the driver parses it first, so a malformed spec fails before any rank starts.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass
from typing import Literal

from harness.core.events import RankEvent
from harness.launch.contract import LaunchError

FAULT_ENV = "HARNESS_INJECT_FAULT"


@dataclass(frozen=True, kw_only=True)
class FaultSpec:
    """A test hook: make one rank die, hang or stop at a given point (HARNESS_INJECT_FAULT)."""

    rank: int
    kind: Literal["die", "hang", "stop"]
    after: str = "ready"  # "start", an event kind, "policy:NAME" or "policy-done:NAME"

    def matches(self, event: RankEvent) -> bool:
        kind, _, policy = self.after.partition(":")
        if policy:
            return event.kind == kind and getattr(event, "policy", None) == policy
        return event.kind == self.after

    def trigger(self) -> None:
        if self.kind == "die":
            os._exit(1)  # no cleanup, no exception: what a crashed or OOM-killed rank looks like to the others
        if self.kind == "stop":
            os.kill(os.getpid(), signal.SIGSTOP)  # returns once SIGCONT arrives; the rank goes on as if never stopped
            return
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
            raise LaunchError(f"{FAULT_ENV}={text!r}: expected rank=R,kind=die|hang|stop[,after=EVENT], got {part!r}")
        fields[key] = value.strip()
    if "rank" not in fields or "kind" not in fields:
        raise LaunchError(f"{FAULT_ENV}={text!r}: rank= and kind= are required")
    if not fields["rank"].isdigit():
        raise LaunchError(f"{FAULT_ENV}={text!r}: rank must be a rank number, got {fields['rank']!r}")
    if fields["kind"] not in ("die", "hang", "stop"):
        raise LaunchError(f"{FAULT_ENV}={text!r}: kind must be die, hang or stop, got {fields['kind']!r}")
    return FaultSpec(rank=int(fields["rank"]), kind=fields["kind"], after=fields.get("after") or "ready")  # type: ignore[arg-type]
