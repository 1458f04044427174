"""The harness's log: one `harness` logger hierarchy (each module logs through `logging.getLogger(__name__)`),
configured at import (HARNESS_LOG_LEVEL's level, else INFO: a caller of the library sees what the command would
say) and again by the command line (`harness.cli.main`) from -v/--verbose, -q/--quiet and HARNESS_LOG_LEVEL.

Log records are what the harness says about its own work on stderr: progress and status (INFO), what it took
over or left out (WARNING), refusals and failures (ERROR, one line after ERROR_PREFIX). What a command
answers (tables, JSON, verdict lines) is its result and goes to stdout, never through the log.

Levels: INFO by default; HARNESS_LOG_LEVEL (debug, info, warning, error, or a number) sets another default, each -v
goes one level down and each -q one level up. Errors are always shown.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import Iterator
from typing import TextIO

from harness.core.errors import BadInput
from harness.core.text import shown_line

LOG_LEVEL_ENV = "HARNESS_LOG_LEVEL"
ROOT_LOGGER = "harness"
LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}
ERROR_PREFIX = "harness: error: "  # every refusal and failure of the harness starts with it, and only here


def error_line(message: str) -> str:
    """The one line an error is shown as: ERROR_PREFIX, then the message (its control characters escaped by the
    formatter: a name read from a file never splits the line or sends an escape code)."""
    return ERROR_PREFIX + message


class LogLevelError(BadInput, ValueError):
    """HARNESS_LOG_LEVEL holds something that is not a level (the message is the one-line refusal)."""


def parse_level(text: str) -> int:
    """A level name (case-insensitive) or number; LogLevelError names the variable, the value and what is allowed."""
    value = text.strip()
    if value.lower() in LEVELS:
        return LEVELS[value.lower()]
    if value.isdigit() and 0 < int(value) <= logging.CRITICAL:
        return int(value)
    raise LogLevelError(
        f"{LOG_LEVEL_ENV} {value[:40]!r} is not a log level; allowed: {', '.join(LEVELS)} or a number 1-50"
    )


def level_from(*, verbose: int = 0, quiet: int = 0, env: str | None = None) -> int:
    """The level the command line asks for: HARNESS_LOG_LEVEL's (else INFO), 10 lower per -v and 10 higher per -q,
    between DEBUG and ERROR."""
    base = parse_level(env) if env else logging.INFO
    return min(max(base - 10 * verbose + 10 * quiet, logging.DEBUG), logging.ERROR)


class _Formatter(logging.Formatter):
    """INFO and DEBUG as written (progress lines); WARNING after `harness: `; ERROR as error_line gives it."""

    def format(self, record: logging.LogRecord) -> str:
        message = record.getMessage()
        if record.levelno >= logging.ERROR:
            details = getattr(record, "details", ())  # HarnessError.details: each its own escaped line
            return error_line(shown_line(message)) + "".join(f"\n  {shown_line(d)}" for d in details)
        if record.levelno >= logging.WARNING:
            return "harness: " + message
        return message


class _StderrHandler(logging.StreamHandler):
    """Writes to the sys.stderr of the moment (a test's captured stream, a redirected one), never to the one seen
    when the handler was made; a stderr that is gone drops the line silently: the exit code still says it."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    @property
    def stream(self) -> TextIO:
        return sys.stderr

    @stream.setter
    def stream(self, _value: TextIO) -> None:
        pass

    def handleError(self, record: logging.LogRecord) -> None:
        pass


def default_level() -> int:
    """HARNESS_LOG_LEVEL's level, INFO without it (or with a bad one, which harness.cli.main refuses)."""
    try:
        return level_from(env=os.environ.get(LOG_LEVEL_ENV))
    except LogLevelError:
        return logging.INFO


@contextlib.contextmanager
def logging_at(level: int) -> Iterator[None]:
    """The hierarchy at `level` inside the block, at the level it had before after it."""
    before = logging.getLogger(ROOT_LOGGER).level or logging.INFO
    configure(level)
    try:
        yield
    finally:
        configure(before)


def configure(level: int) -> None:
    """Send the `harness` hierarchy's records at `level` and above to stderr, one line each (idempotent: a second
    call replaces the first's handler, as in-process callers of harness.cli.main do)."""
    logger = logging.getLogger(ROOT_LOGGER)
    for handler in [h for h in logger.handlers if isinstance(h, _StderrHandler)]:
        logger.removeHandler(handler)
    handler = _StderrHandler()
    handler.setFormatter(_Formatter())
    logger.addHandler(handler)
    logger.setLevel(level)
    logger.propagate = False  # the root logger's handlers (a library's basicConfig) would print each line twice
