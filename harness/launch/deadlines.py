"""The bounds of a launch on the driver: its deadlines (RankWatch), how a rank's end is named (exit_cause), and
SIGTERM handled as Ctrl-C (sigterm_as_interrupt).

Once one rank has ended (record, error or death) the others get `collective_timeout_s` more, since every rank
does the same collectives; nothing runs past `rank_timeout_s` from the launch. A rank that died is told from a
hung one by its exit, never by how long it was silent.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TypeVar

from harness.launch.contract import LaunchPlan
from harness.launch.sink import RunSink

POLL_INTERVAL_S = 0.2
T = TypeVar("T")


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


def without_sigint(start: Callable[[], T]) -> T:
    """Call `start` (which starts processes: a rank, a local Ray cluster's GCS and raylet, which start the rank
    actors' workers) so that what it starts ignores SIGINT from its first instruction. Ctrl-C in a terminal goes to
    the whole foreground process group; a rank interrupted while it started (Python's own imports: "Fatal Python
    error: init_import_site") or inside a collective printed its traceback. The driver alone takes the Ctrl-C and
    stops the ranks.

    A signal mask is not inherited (a fork-exec clears it), an ignored disposition is, and Python installs its
    KeyboardInterrupt handler only over the default one. So SIGINT is ignored while `start` runs, and blocked
    meanwhile: a Ctrl-C in that window stays pending for the driver (a blocked signal is never discarded as
    ignored) and arrives once its handler is back. The mask is the calling thread's: in a process with other
    threads, a Ctrl-C in that window may be delivered to one of them and is then ignored."""
    if threading.current_thread() is not threading.main_thread():  # only the main thread sets handlers
        return start()
    previous_mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        return start()
    finally:
        signal.signal(signal.SIGINT, previous)
        signal.pthread_sigmask(signal.SIG_SETMASK, previous_mask)
