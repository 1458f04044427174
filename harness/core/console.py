"""The one way the harness makes a rich console: tables are never cut, paths and messages never broken.

rich fits a table into the console's width by cutting cells ("8069…", "contr…"). On a terminal that width is
the window's; in a CI log or a pipe it is a guess (COLUMNS, else 80), so the numbers a user reads there were
lost. A console from `make_console` widens itself, for the length of one `print`, to what the widest renderable
printed needs (a table's natural width): in a log every line is as long as its content, and on a narrow terminal
the terminal wraps a long line instead of rich dropping what did not fit. Plain text is soft-wrapped (no
rich line breaks, no cropping), so a printed path can be copied whole.

What still differs between a terminal and a log is rich's own detection: colours and the live progress table
only on a terminal (`Console.is_terminal`), plain lines in a log. And on an interactive terminal a table wider than
the window loses columns, the widest first, keeping its first column and the essential ones (ESSENTIAL_HEADERS),
until it fits, with a line naming what was left out: `--wide` (`show_every_column`) keeps them all. Pipes and CI
logs always get every column, whole.
"""

from __future__ import annotations

import errno
import os
from typing import Any

from rich.console import Console, Group
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

# A bound on the measuring width only: tables report their natural width up to it. Wider than any real table.
_MEASURE_WIDTH = 100_000
# What a narrowed table keeps: its first column (it names the row) and every column with one of these headers, the
# ones that name a row or give its verdict in the harness's tables (run/collect, plan, compare, vllm audit).
ESSENTIAL_HEADERS = frozenset(
    {
        "policy",
        "cell",
        "outcome",
        "contract",
        "ws delta max",  # run, collect
        "total",
        "x fixed",  # plan
        "metric",
        "change",
        "verdict",  # compare, vllm audit
        "class",
        "per GPU",  # vllm audit
        "here",  # scenarios
        "layout",
        "deployment KV tokens",  # plan --search
    }
)
_every_column = False  # --wide: a terminal gets every column too


def show_every_column(wide: bool = True) -> None:
    """`--wide`: tables on an interactive terminal keep every column (wider than the window, wrapped by it)."""
    global _every_column
    _every_column = wide


def narrow_table(console: Console, table: Table, width: int) -> list[str]:
    """Drop `table`'s columns, the widest first (the rightmost of equals), never the first or an essential one
    (ESSENTIAL_HEADERS), until it measures at most `width`; the headers of those dropped, in table order. Cells are
    never cut: what remains is whole. Widest first: one wide column (a shape, a source path) makes room for several
    narrow figures."""
    dropped: list[tuple[int, str]] = []
    options = console.options.update_width(_MEASURE_WIDTH)
    while Measurement.get(console, options, table).maximum > width:
        optional = [i for i, c in enumerate(table.columns) if i > 0 and str(c.header) not in ESSENTIAL_HEADERS]
        if not optional:
            break
        widths = {i: _column_width(console, options, table.columns[i]) for i in optional}
        column = table.columns.pop(max(optional, key=lambda i: (widths[i], i)))
        dropped.append((column._index, str(column.header)))
    for column in table.columns:
        column.overflow = "fold"  # a column still too wide wraps within its cell rather than losing characters
    return [header for _, header in sorted(dropped)]


def _column_width(console: Console, options: Any, column: Any) -> int:
    cells = [column.header, *column.cells]
    return max((Measurement.get(console, options, cell).maximum for cell in cells), default=0)


def _narrowed(console: Console, obj: Any, width: int) -> list[Any]:
    """obj fitted to `width` columns: each table in it narrowed, with a line naming what was left out."""
    if isinstance(obj, Table):
        dropped = narrow_table(console, obj, width)
        note = (
            Text(
                f"({len(dropped)} column(s) left out to fit {width} columns: {', '.join(dropped)}; --wide shows them)",
                style="dim",
            )
            if dropped
            else None
        )
        return [obj] + ([note] if note else [])
    if isinstance(obj, Group):
        return [Group(*[part for child in obj.renderables for part in _narrowed(console, child, width)])]
    return [obj]


class WideConsole(Console):
    """A rich Console whose `print` is at least as wide as the widest (non-string) renderable it is given."""

    def print(self, *objects: Any, **kwargs: Any) -> None:
        with self._lock:
            if self.is_terminal and not _every_column and not self.is_dumb_terminal:
                objects = tuple(part for obj in objects for part in _narrowed(self, obj, self.width))
                super().print(*objects, **kwargs)
                return
            needed = self._natural_width(objects)
            if needed <= self.width:
                super().print(*objects, **kwargs)
                return
            saved = self._width
            self._width = needed
            try:
                super().print(*objects, **kwargs)
            finally:
                self._width = saved

    def on_broken_pipe(self) -> None:
        """The reader of the output went away (`| head`): not rich's quiet exit 1, but the OSError every output
        failure is, so the command ends the way harness.cli says (one line, exit 2: its verdict is not known)."""
        raise BrokenPipeError(errno.EPIPE, os.strerror(errno.EPIPE))

    def _natural_width(self, objects: tuple[Any, ...]) -> int:
        # Strings are soft-wrapped (never broken or cropped), so only renderables such as tables and groups count.
        options = self.options.update_width(_MEASURE_WIDTH)
        widths = [Measurement.get(self, options, obj).maximum for obj in objects if not isinstance(obj, str)]
        return max(widths, default=0)


def make_console(**kwargs: Any) -> Console:
    """A console for the harness's output (stdout unless `file=`/`stderr=` says otherwise); kwargs go to rich."""
    kwargs.setdefault("soft_wrap", True)
    return WideConsole(**kwargs)
