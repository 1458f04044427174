"""Every limit on scenario and matrix input, in one place, so the schema, the reader and the reference agree.

The limits keep every check bounded in time and memory whatever a file holds: a file is read only up to
MAX_FILE_BYTES, a YAML document is composed only to MAX_YAML_DEPTH levels and MAX_YAML_NODES nodes (aliases
counted as often as they expand), and no message formats a value longer than MAX_SHOWN_CHARS. The size bounds of
the scenario fields (hidden_size, num_ranks, ...) live here too; docs/scenario-schema.md lists them all.
"""

from __future__ import annotations

import reprlib
from typing import Any

# Files
MAX_FILE_BYTES = 64 * 1024  # scenario files are about 1 KiB, matrix files a few KiB
MAX_PATH_CHARS = 4096  # a path in a field or on the command line (PATH_MAX on Linux)

# YAML documents
MAX_YAML_DEPTH = 16  # a matrix override's `set: {expect.outcomes: {policy: fit}}` is 7 levels deep
MAX_YAML_NODES = 10_000  # after alias expansion; a scenario has about 50
MAX_YAML_ALIASES = 100  # `*name` references in one document
MAX_INT_DIGITS = 18  # every integer field fits in 18 digits; a longer one is refused before it is converted

# Strings
MAX_STRING_CHARS = MAX_PATH_CHARS  # any string value or key
MAX_NAME_CHARS = 200  # a scenario name becomes a directory name (255 bytes at most) with a date prefix
MAX_DESCRIPTION_CHARS = 500
NAME_PATTERN_TEXT = "letters, digits and . _ + -, starting with a letter or digit"

# Scenario sizes. Large enough for every model preset at 4x its size, small enough that every product
# of them the plan computes (E * T * D * max(2I, K) * 2 bytes) stays an exact Python int and a short message.
MAX_HIDDEN_SIZE = 65_536  # K
MAX_INTERMEDIATE_SIZE = 131_072  # I
MAX_NUM_EXPERTS = 16_384  # routed experts, and E per rank
MAX_TOP_K = 64
MAX_NUM_DISPATCHERS = 4_096  # D
MAX_NUM_RANKS = 1_024  # P
MAX_TOKENS_PER_RANK = 262_144  # T (vLLM's newer default is 8192)
MAX_SEED = 2**32 - 1
MAX_ITERATIONS = 10_000
MAX_MEMORY_GB = 4_096.0  # budget or ballast, in GB; no device holds more
MIN_BUDGET_BYTES = 2**20  # a budget below 1 MiB holds no workspace at all: a typo (or 4.9e-324), not a GPU
MAX_TIMEOUT_S = 7 * 86_400.0
MAX_CPUS_PER_RANK = 256
MAX_BUFFER_MB = 1_048_576  # a DeepEP buffer of 1 TiB
MAX_GPUS_PER_NODE = 64
MAX_POLICIES = 16
MAX_POLICY_CHARS = 64
MAX_ROW_INDEX = 2**48  # a row of the (E*M) view: E * T * D stays far below
MAX_PERCENT = 1_000.0
MAX_RATIO = 100.0
MAX_ZIPF_EXPONENT = 16.0
MIN_SAMPLE_INTERVAL_MS = 0.1
MAX_SAMPLE_INTERVAL_MS = 60_000.0

# Matrices: the cell count is the product of the axis lengths, checked before any cell is built.
MAX_MATRIX_AXES = 16
MAX_AXIS_VALUES = 1_024
MAX_MATRIX_CELLS = 1_024
MAX_MATRIX_VALUES = 1_000_000  # cells x the base's values: every cell starts as a copy of the base (~60 values)
MAX_MATRIX_OVERRIDES = 64
MAX_MATRIX_NAME_CHARS = 64  # the matrix name prefixes every cell's scenario name
MAX_CELL_NAME_CHARS = 128

# Messages
MAX_SHOWN_CHARS = 80


class _ShortRepr(reprlib.Repr):
    """reprlib with small limits that never formats a huge integer whole (CPython refuses past 4300 digits)."""

    def __init__(self) -> None:
        super().__init__()
        self.maxlevel, self.maxdict, self.maxlist, self.maxtuple, self.maxset = 3, 4, 6, 6, 6
        self.maxstring, self.maxother, self.maxlong = MAX_SHOWN_CHARS, MAX_SHOWN_CHARS, 40

    def repr_int(self, x: int, level: int) -> str:
        if x.bit_length() > 128:
            return f"<integer of about {int(x.bit_length() * 0.30103) + 1} digits>"
        return super().repr_int(x, level)


_SHORT = _ShortRepr()


def shown(value: Any) -> str:
    """repr() of a value for a message, at most about MAX_SHOWN_CHARS characters, whatever the value holds."""
    text = _SHORT.repr(value)
    return text if len(text) <= MAX_SHOWN_CHARS + 3 else text[:MAX_SHOWN_CHARS] + "..."


def shown_key(key: str) -> str:
    """A key for a message, quoted; ascii() when it holds anything but ASCII, so a look-alike ('mоdel' with a
    Cyrillic o) reads differently from the key it imitates ('m\\u043edel' against 'model')."""
    text = key[:MAX_SHOWN_CHARS + 1]
    quoted = repr(text) if text.isascii() else ascii(text)
    return quoted if len(key) <= MAX_SHOWN_CHARS else quoted[:MAX_SHOWN_CHARS] + "..."


# The command line, counted and measured before argparse sees it (argparse takes minutes for 100,000 options): a
# `vllm serve` command after `--` has tens of flags, a JSON value (--eplb-config) kilobytes.
MAX_ARGS, MAX_ARG_CHARS = 1024, 64 * 1024


def shown_line(text: str) -> str:
    """A whole message for the terminal, in one line: control characters escaped (shown_text, uncut), so a name or
    version read from a file or a directory (a MODEL, a tree's _version.py) never splits the line or sends an
    escape code. Every one-line error the commands print goes through it."""
    return shown_text(text, limit=max(200, len(text)))


def shown_text(text: str, limit: int = 200) -> str:
    """A file name or other text for a message: control characters escaped, at most `limit` characters."""
    text = text[: limit + 1].encode("unicode_escape").decode("ascii") if not text[: limit + 1].isprintable() else text
    return text if len(text) <= limit else text[:limit] + "..."
