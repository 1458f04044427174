"""Small real filesystems for the fault tests: a tmpfs the test mounts (root only, as in CI) and unmounts in a
finalizer, and the check that a command ended in one line and exit 2."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest


def mount_tmpfs(path: Path, request: pytest.FixtureRequest, *options: str, size: str = "2m") -> Path:
    """A tmpfs of `size` at `path`, unmounted when the test ends; the test is skipped, saying why, when not root."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root (CI runs as root)")
    path.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", ",".join([f"size={size}", *options]), "tmpfs", str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    request.addfinalizer(lambda: subprocess.run(["umount", "-l", str(path)], check=False))
    return path


def free_bytes(fs: Path) -> int:
    info = os.statvfs(fs)
    return info.f_bavail * info.f_frsize


def fill(fs: Path, *, leave_bytes: int = 0, name: str = "filler") -> Path:
    """A file in `fs` that takes all its free space but `leave_bytes` (a multiple of the page size: tmpfs counts
    pages); with leave_bytes=0, written until the filesystem refuses more."""
    path = fs / name
    block = b"\0" * 65536
    with open(path, "wb", buffering=0) as f:
        todo = free_bytes(fs) - leave_bytes
        try:
            while todo > 0 or not leave_bytes:
                todo -= f.write(block[: min(len(block), todo)] if leave_bytes else block)
        except OSError:
            if leave_bytes:
                raise
    assert free_bytes(fs) == leave_bytes, (free_bytes(fs), leave_bytes)
    return path


def remount_read_only(path: Path) -> None:
    subprocess.run(["mount", "-o", "remount,ro", str(path)], check=True)


def one_line_exit_2(result: subprocess.CompletedProcess[str], *says: str) -> str:
    """The command ended with exit 2 and one line on stderr holding every one of `says`, and no traceback."""
    err = result.stderr.strip()
    assert result.returncode == 2, (result.returncode, result.stdout[-2000:], err[-2000:])
    assert "Traceback" not in result.stderr + result.stdout
    assert len(err.splitlines()) == 1, err
    for text in says:
        assert text in err, err
    return err
