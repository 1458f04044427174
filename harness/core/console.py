"""The one way the harness makes a rich console: tables are never cut, paths and messages never broken.

rich fits a table into the console's width by cutting cells ("8069…", "contr…"). On a terminal that width is
the window's; in a CI log or a pipe it is a guess (COLUMNS, else 80), so the numbers a user reads there were
lost. A console from `make_console` widens itself, for the length of one `print`, to what the widest renderable
printed needs (a table's natural width): in a log every line is as long as its content, and on a narrow terminal
the terminal wraps a long line instead of rich dropping what did not fit. Plain text is soft-wrapped (no
rich line breaks, no cropping), so a printed path can be copied whole.

What still differs between a terminal and a log is rich's own detection: colours and the live progress table
only on a terminal (`Console.is_terminal`), plain lines in a log. And on an interactive terminal a table that is
wider than the window loses columns from its right (the leading ones, which name the row, stay) until it fits, with
a line saying which were left out: `--wide` (`show_every_column`) keeps them all. Pipes and CI logs always get
every column, whole.
"""

from __future__ import annotations

from typing import Any

from rich.console import Console, Group
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

# A bound on the measuring width only: tables report their natural width up to it. Wider than any real table.
_MEASURE_WIDTH = 100_000
_KEEP_LEADING = 2  # columns a narrowed table always keeps: the ones that name its row (policy, outcome; cell, ...)
_every_column = False  # --wide: a terminal gets every column too


def show_every_column(wide: bool = True) -> None:
    """`--wide`: tables on an interactive terminal keep every column (wider than the window, wrapped by it)."""
    global _every_column
    _every_column = wide


def narrow_table(console: Console, table: Table, width: int) -> list[str]:
    """Drop `table`'s columns from the right (keeping the leading ones) until it measures at most `width`; the
    headers of those dropped. Cells are never cut: what remains is whole."""
    dropped: list[str] = []
    options = console.options.update_width(_MEASURE_WIDTH)
    while len(table.columns) > _KEEP_LEADING and Measurement.get(console, options, table).maximum > width:
        dropped.insert(0, str(table.columns.pop().header))
    for column in table.columns:
        column.overflow = "fold"  # a column still too wide wraps within its cell rather than losing characters
    return dropped


def _narrowed(console: Console, obj: Any, width: int) -> list[Any]:
    """obj fitted to `width` columns: each table in it narrowed, with a line naming what was left out."""
    if isinstance(obj, Table):
        dropped = narrow_table(console, obj, width)
        note = Text(f"({len(dropped)} column(s) left out to fit {width} columns: {', '.join(dropped)}; --wide shows "
                    "them)", style="dim") if dropped else None
        return [obj] + ([note] if note else [])
    if isinstance(obj, Group):
        return [Group(*[part for child in obj.renderables for part in _narrowed(console, child, width)])]
    return [obj]


class WideConsole(Console):
    """A rich Console whose `print` is at least as wide as the widest (non-string) renderable it is given."""

    def print(self, *objects: Any, **kwargs: Any) -> None:  # noqa: A003 (rich's name)
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

    def _natural_width(self, objects: tuple[Any, ...]) -> int:
        # Strings are soft-wrapped (never broken or cropped), so only renderables such as tables and groups count.
        options = self.options.update_width(_MEASURE_WIDTH)
        widths = [Measurement.get(self, options, obj).maximum for obj in objects if not isinstance(obj, str)]
        return max(widths, default=0)


def make_console(**kwargs: Any) -> Console:
    """A console for the harness's output (stdout unless `file=`/`stderr=` says otherwise); kwargs go to rich."""
    kwargs.setdefault("soft_wrap", True)
    return WideConsole(**kwargs)
