"""Progress of a wheel download that pip runs with its output captured: a byte progress bar on a terminal, a line
every few seconds in a log.

pip's own bar needs pip's stdout to be a terminal, and the harness captures it (its ERROR lines make the one-line
refusals). So pip runs with TMPDIR pointed at a scratch directory of the harness's: pip streams the wheel into a
file under it before moving it to its destination, and the bytes there are the bytes downloaded so far. The total
is pip's own "Downloading vllm-...whl (312.6 MB)" line.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import threading
import time
from pathlib import Path
from typing import IO, Any

from harness.core.units import human_bytes

LOG_INTERVAL_S = 5.0  # a line this often in a log
POLL_S = 0.25
_SIZE_RE = re.compile(r"Downloading \S+ \((\d+(?:\.\d+)?) (kB|MB|GB|bytes)\)")
_UNITS = {"bytes": 1, "kB": 10**3, "MB": 10**6, "GB": 10**9}  # pip's format_size is decimal


def bytes_under(directory: Path) -> int:
    """Bytes of the regular files under `directory` (what pip has written so far); 0 when it is not there."""
    total = 0
    for root, _, files in os.walk(directory):
        for name in files:
            with contextlib.suppress(OSError):  # pip moved or removed it in between
                total += os.stat(os.path.join(root, name), follow_symlinks=False).st_size
    return total


def total_from_pip(line: str) -> int | None:
    match = _SIZE_RE.search(line)
    return int(float(match.group(1)) * _UNITS[match.group(2)]) if match else None


class _LogLines:
    """One line every `interval_s`: 'harness: vllm==0.30.0: 120 MiB of 298 MiB (40%), 12.3 MiB/s'."""

    def __init__(self, out: IO[str], label: str, interval_s: float):
        self.out, self.label, self.interval_s = out, label, interval_s
        self.started = self.last = time.monotonic()

    def update(self, done: int, total: int | None) -> None:
        now = time.monotonic()
        if now - self.last < self.interval_s:
            return
        self.last = now
        rate = done / max(now - self.started, 1e-9)
        of = f" of {human_bytes(total)} ({min(done / total, 1.0):.0%})" if total else ""
        print(f"harness: {self.label}: {human_bytes(done)}{of}, {human_bytes(rate)}/s", file=self.out, flush=True)

    def close(self) -> None:
        pass


class _Bar:
    """rich's byte progress bar on the terminal."""

    def __init__(self, out: IO[str], label: str):
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            DownloadColumn,
            Progress,
            TextColumn,
            TimeRemainingColumn,
            TransferSpeedColumn,
        )

        self.progress = Progress(
            TextColumn(f"harness: {label}"),
            BarColumn(),
            DownloadColumn(binary_units=True),
            TransferSpeedColumn(),
            TimeRemainingColumn(),
            console=Console(file=out),
        )
        self.task = self.progress.add_task(label, total=None)
        self.progress.start()

    def update(self, done: int, total: int | None) -> None:
        self.progress.update(self.task, completed=done, total=total)

    def close(self) -> None:
        self.progress.stop()


def run_with_progress(
    command: list[str], *, label: str, scratch: Path, timeout_s: float, out: IO[str], interval_s: float = LOG_INTERVAL_S
) -> subprocess.CompletedProcess:
    """Run `command` (a pip download) with TMPDIR=scratch, reporting the bytes under scratch as they grow; its
    CompletedProcess with stdout and stderr captured whole. subprocess.TimeoutExpired past timeout_s (the child
    killed), as subprocess.run raises it."""
    scratch.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, TMPDIR=str(scratch), TEMP=str(scratch), TMP=str(scratch))
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    captured: dict[str, list[str]] = {"out": [], "err": []}
    total: list[int | None] = [None]

    def read(stream: Any, sink: list[str]) -> None:
        for line in stream:
            sink.append(line)
            total[0] = total[0] or total_from_pip(line)

    readers = [
        threading.Thread(target=read, args=(proc.stdout, captured["out"]), daemon=True),
        threading.Thread(target=read, args=(proc.stderr, captured["err"]), daemon=True),
    ]
    for reader in readers:
        reader.start()
    terminal = getattr(out, "isatty", lambda: False)()
    reporter: _Bar | _LogLines = _Bar(out, label) if terminal else _LogLines(out, label, interval_s)
    deadline = time.monotonic() + timeout_s
    try:
        while proc.poll() is None:
            if time.monotonic() > deadline:
                proc.kill()
                proc.wait()
                raise subprocess.TimeoutExpired(command, timeout_s)
            reporter.update(bytes_under(scratch), total[0])
            time.sleep(POLL_S)
    except BaseException:  # Ctrl-C or the timeout: no pip left behind
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        raise
    finally:
        reporter.close()
    for reader in readers:
        reader.join()
    return subprocess.CompletedProcess(command, proc.returncode, "".join(captured["out"]), "".join(captured["err"]))
