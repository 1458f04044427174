"""Text read from files, directories or the command line, made safe to show in one line of a message."""

from __future__ import annotations


def shown_line(text: str) -> str:
    """A whole message for the terminal, in one line: control characters escaped (shown_text, uncut), so a name or
    version read from a file or a directory (a MODEL, a tree's _version.py) never splits the line or sends an
    escape code. Every one-line error the commands print goes through it."""
    return shown_text(text, limit=max(200, len(text)))


def shown_text(text: str, limit: int = 200) -> str:
    """A file name or other text for a message: control characters escaped, at most `limit` characters."""
    text = text[: limit + 1].encode("unicode_escape").decode("ascii") if not text[: limit + 1].isprintable() else text
    return text if len(text) <= limit else text[:limit] + "..."
