"""The progress display of a launch: ranks up N/P and the policy each rank is measuring, as a live table on a
terminal and one line per event in logs. A RunSink listener: it sees every event the driver handles.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from rich.console import Console
from rich.live import Live
from rich.table import Table
from rich.text import Text

from harness.core.events import Done, Event, Failed, Placed, Placing, PolicyDone, PolicyStarted, Ready, RecordWritten


@dataclass
class _RankState:
    node: str = ""
    status: str = "starting"
    num_policies_done: int = 0
    up: bool = False
    failed: bool = False


@dataclass
class RunProgress:
    """Ranks up N/P and the policy each rank is measuring: a live table on a terminal, one line per event in logs."""

    console: Console
    title: str
    num_ranks: int
    num_policies: int
    ranks: dict[int, _RankState] = field(default_factory=dict)
    note: str = ""
    _live: Live | None = None

    def __post_init__(self) -> None:
        self.ranks = {r: _RankState() for r in range(self.num_ranks)}

    @property
    def num_up(self) -> int:
        return sum(s.up for s in self.ranks.values())

    @contextmanager
    def shown(self) -> Iterator[RunProgress]:
        if self.console.is_terminal:
            self._live = Live(self.render(), console=self.console, refresh_per_second=4, transient=False)
            self._live.start()
        try:
            yield self
        finally:
            if self._live is not None:
                self._live.update(self.render())
                self._live.stop()
                self._live = None

    def __call__(self, event: Event) -> None:
        line = self._apply(event)
        if self._live is not None:
            self._live.update(self.render())
        elif line:
            self.console.print(line, highlight=False, markup=False)

    def _apply(self, event: Event) -> str:
        if isinstance(event, Placing):
            self.note = f"placing {event.num_bundles} bundles of {event.bundle}"
            return self.note
        state = self.ranks.get(event.rank)
        if state is None:
            return ""
        rank = event.rank
        if isinstance(event, Placed):
            state.node, state.status = event.node, "placed"
            return f"rank {rank}: placed on {state.node} (pid {event.pid})"
        if isinstance(event, Ready):
            state.up, state.status = True, "ready"
            return f"rank {rank}: ready ({self.num_up}/{self.num_ranks} up)"
        if isinstance(event, PolicyStarted):
            state.status = f"measuring {event.policy}"
            return f"rank {rank}: measuring {event.policy} ({state.num_policies_done + 1}/{self.num_policies})"
        if isinstance(event, PolicyDone):
            state.num_policies_done += 1
            state.status = f"{event.policy}: {event.status}"
            return f"rank {rank}: {event.policy} {event.status}; record so far written"
        if isinstance(event, Done):
            state.status, state.num_policies_done = "done", self.num_policies
            return f"rank {rank}: done"
        if isinstance(event, RecordWritten):
            state.status = "record written"
            return f"rank {rank}: record written"
        if isinstance(event, Failed):
            state.failed, state.status = True, f"FAILED: {event.cause}"
            return f"rank {rank}: FAILED: {event.cause}"
        return ""

    def render(self) -> Table:
        title = Text(f"{self.title}\nranks up {self.num_up}/{self.num_ranks}  {self.note}")
        table = Table(title=title, title_justify="left")
        table.add_column("rank", justify="right")
        table.add_column("node")
        table.add_column("policies", justify="right")
        table.add_column("status")
        for rank, state in self.ranks.items():
            style = "red" if state.failed else ("green" if state.status in ("done", "record written") else None)
            table.add_row(
                str(rank),
                Text(state.node),
                f"{state.num_policies_done}/{self.num_policies}",
                Text(state.status),
                style=style,
            )  # Text: causes may hold "[...]", which is not markup
        return table
