"""A test hook on the driver: HARNESS_KILL_AT="MOMENT[,nth=N][,signal=KILL|TERM|INT|INT-GROUP]" makes the driver send
itself SIGNAL (SIGKILL by default; INT-GROUP: SIGINT to its whole process group, the ranks too, as a terminal's
Ctrl-C does) the Nth time (1st by default) it reaches MOMENT, so a test of what a killed run leaves
behind acts at a named point of the run rather than racing a timer.

Moments (docs/launch.md, "Fault injection"):
    launch             a run's run.json is written, no rank started yet
    ranks-started      every rank's process or actor is started (they are joining, setting up)
    policy-done        a rank's record so far (one policy finished) is on disk
    record             a rank's final record is on disk
    write:FILE         a report file (report.json, report.md, junit.xml, report.html, status.json) has its temporary
                       written beside it, not yet renamed over it
    matrix-collect     every cell of a matrix is collected, the matrix's own report not yet written

The hook is read where the moment happens (one environment lookup); a malformed value is refused before a run starts
(`parse_kill_spec`), never while it runs.
"""

from __future__ import annotations

import os
import re
import signal
from dataclasses import dataclass

KILL_ENV = "HARNESS_KILL_AT"
MOMENTS = ("launch", "ranks-started", "policy-done", "record", "matrix-collect")
_WRITE_RE = re.compile(r"write:[A-Za-z0-9._-]{1,64}")
_SIGNALS: dict[str, int] = {"KILL": signal.SIGKILL, "TERM": signal.SIGTERM, "INT": signal.SIGINT,
                            "INT-GROUP": -signal.SIGINT}  # negative: to the process group


class KillSpecError(ValueError):
    """HARNESS_KILL_AT is malformed; the message names the part and what is allowed."""


@dataclass(frozen=True)
class KillSpec:
    moment: str
    nth: int = 1
    signum: int = int(signal.SIGKILL)


def parse_kill_spec(text: str | None) -> KillSpec | None:
    if not text:
        return None
    moment, *rest = text.split(",")
    if moment not in MOMENTS and not _WRITE_RE.fullmatch(moment):
        raise KillSpecError(f"{KILL_ENV}={text[:200]!r}: moment {moment[:80]!r} is not one of "
                            f"{', '.join(MOMENTS)}, write:FILE")
    nth, signum = 1, int(signal.SIGKILL)
    for part in rest:
        key, _, value = part.partition("=")
        if key == "nth" and value.isdigit() and 0 < int(value) < 1_000_000:
            nth = int(value)
        elif key == "signal" and value in _SIGNALS:
            signum = _SIGNALS[value]
        else:
            raise KillSpecError(f"{KILL_ENV}={text[:200]!r}: {part[:80]!r}: allowed: nth=N (1 or more), "
                                "signal=KILL|TERM|INT|INT-GROUP")
    return KillSpec(moment=moment, nth=nth, signum=signum)


_reached: dict[str, int] = {}


def kill_point(moment: str) -> None:
    """The driver reached `moment`: with HARNESS_KILL_AT naming it (and this is its Nth time), signal this process.

    SIGKILL ends it here; SIGTERM and SIGINT are delivered before the next line runs, as a real signal would be."""
    text = os.environ.get(KILL_ENV)
    if not text:
        return
    try:
        spec = parse_kill_spec(text)
    except KillSpecError:
        return  # refused before the run started; a value changed since is not this point's to judge
    if spec is None or spec.moment != moment:
        return
    _reached[moment] = _reached.get(moment, 0) + 1
    if _reached[moment] == spec.nth:
        if spec.signum < 0:
            os.killpg(os.getpgrp(), -spec.signum)
        else:
            os.kill(os.getpid(), spec.signum)
