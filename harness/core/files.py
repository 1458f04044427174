"""Facts about the filesystem and processes that several packages check before they write.

probe_writable()   a file written and removed where outputs go, and the free space there: before any work
pid_alive()        whether a process of this host is still running (a claim or a staging folder's owner)
remove_dead_staging()  NAME.<kind>-PID folders beside NAME whose process is gone, removed
"""

from __future__ import annotations

import errno
import os
import re
import shutil
import tempfile
from pathlib import Path


def probe_writable(directory: Path, *, need_bytes: int = 0) -> None:
    """Before any measuring: write, sync and remove a probe file in `directory` (or, when it does not exist yet, in
    its nearest existing parent: nothing is created) and check that `need_bytes` are free there. OSError naming the
    path when the outputs could not be written (a read-only directory or filesystem, no permission, a full disk),
    so the error comes before the work, not after it."""
    directory = Path(directory).absolute()
    while not directory.exists() and directory != directory.parent:
        directory = directory.parent
    if not directory.is_dir():
        raise NotADirectoryError(errno.ENOTDIR, "Not a directory", str(directory))
    fd, probe = tempfile.mkstemp(prefix=".harness-probe.", suffix=".tmp", dir=directory)
    try:
        os.write(fd, b"\0" * 4096)  # a block: a full filesystem refuses it
        os.fsync(fd)
    finally:
        os.close(fd)
        Path(probe).unlink(missing_ok=True)
    info = os.statvfs(directory)
    free = info.f_bavail * info.f_frsize
    if free < need_bytes:
        raise OSError(
            errno.ENOSPC,
            f"No space left on device: {free} bytes free, the outputs need about {need_bytes}",
            str(directory),
        )


def pid_alive(pid: int) -> bool:
    """Whether process `pid` of this host exists (another user's counts: signal 0 is then refused, not failed)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except (OverflowError, ValueError):  # beyond any pid
        return False
    return True


def remove_dead_staging(directory: Path, kinds: tuple[str, ...]) -> list[Path]:
    """The `<name>.<kind>-PID` folders next to `directory` (an extraction's staging, an entry renamed aside) whose
    process is gone: removed, so a killed extraction does not keep its hundreds of MB forever. A live process's
    folder is left to it; links and files are never touched."""
    pattern = re.compile(re.escape(directory.name) + r"\.(" + "|".join(map(re.escape, kinds)) + r")-(\d+)")
    removed: list[Path] = []
    try:
        siblings = list(directory.parent.iterdir()) if directory.parent.is_dir() else []
    except OSError:
        return removed
    for sibling in siblings:
        match = pattern.fullmatch(sibling.name)
        if match is None or sibling.is_symlink() or not sibling.is_dir():
            continue
        pid = int(match.group(2))
        if pid != os.getpid() and not pid_alive(pid):
            shutil.rmtree(sibling, ignore_errors=True)
            removed.append(sibling)
    return removed
