"""The one way the harness makes a rich console: tables are never cut, paths and messages never broken.

rich fits a table into the console's width by cutting cells ("8069…", "contr…"). On a terminal that width is
the window's; in a CI log or a pipe it is a guess (COLUMNS, else 80), so the numbers a user reads there were
lost. A console from `make_console` widens itself, for the length of one `print`, to what the widest renderable
printed needs (a table's natural width): in a log every line is as long as its content, and on a narrow terminal
the terminal wraps a long line instead of rich dropping what did not fit. Plain text is soft-wrapped (no
rich line breaks, no cropping), so a printed path can be copied whole.

What still differs between a terminal and a log is rich's own detection: colours and the live progress table
only on a terminal (`Console.is_terminal`), plain lines in a log.
"""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.measure import Measurement

# A bound on the measuring width only: tables report their natural width up to it. Wider than any real table.
_MEASURE_WIDTH = 100_000


class WideConsole(Console):
    """A rich Console whose `print` is at least as wide as the widest (non-string) renderable it is given."""

    def print(self, *objects: Any, **kwargs: Any) -> None:  # noqa: A003 (rich's name)
        with self._lock:
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
