"""A fork server for the real `harness` command: many short commands, each in a process of its own, without an
interpreter start each.

The server is one `python tests/cli_forkserver.py` process, started with the environment the commands are to see.
It imports what a refusal of the CLI imports (harness.cli, pydantic, PyYAML, rich, the scenario schema, the
launcher's front) and never torch (it checks), then for each job read from its stdin forks a child, which:
    - takes the job's limits (RLIMIT_AS, RLIMIT_CPU, the CPUs it may run on), its working directory, /dev/null as
      stdin, and the job's two files as stdout and stderr;
    - runs `harness ARGS` as `python -m harness` does (`raise SystemExit(main())` at the top level of the process,
      so the interpreter itself flushes, prints an uncaught exception's traceback and picks the exit code).
The server waits for the child, within the job's wall-clock bound (then SIGKILL), and answers one JSON line: the
exit code as subprocess reports it (negative: the signal) or null when the bound ran out, and the wall time.

What each command sees is what a fresh `python -m harness` process sees, except the time and memory of an
interpreter start and those imports: a command that goes on to import torch (a refusal the checks missed) still
meets the address-space limit, and a loop still meets the CPU-time limit, in its own process.
"""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

SERVER = Path(__file__).resolve()
# What `harness plan` and a refusal of `harness run` import, loaded once in the server; torch is not among them.
PRELOAD = (
    "harness.cli",
    "harness.scenario.schema",
    "harness.scenario.matrix",
    "harness.launch.overrides",
    "harness.launch.run",
    "harness.sizing.plan",
    "harness.core.console",
    "pydantic",
    "yaml",
    "rich.console",
    "rich.table",
)


@dataclass(frozen=True)
class Job:
    args: list[str]
    cwd: str
    stdout: str  # file paths the child writes its streams to
    stderr: str
    wall_s: float  # the bound; past it the child is killed and the answer's returncode is None
    address_space_bytes: int | None = None
    cpu_s: int | None = None
    num_cpus: int | None = None


@dataclass(frozen=True)
class Answer:
    returncode: int | None
    wall_s: float


class CliForkServer:
    """The client: started with the environment its commands see; run(job) from any thread, one job at a time."""

    def __init__(self, env: dict[str, str]) -> None:
        self._proc = subprocess.Popen(
            [sys.executable, str(SERVER)], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1
        )
        self._lock = threading.Lock()
        ready = self._proc.stdout.readline()  # type: ignore[union-attr]
        if ready.strip() != "ready":
            self.close()
            raise RuntimeError(f"the CLI fork server did not start: {ready!r}")

    def run(self, job: Job) -> Answer:
        with self._lock:
            self._proc.stdin.write(json.dumps(job.__dict__) + "\n")  # type: ignore[union-attr]
            self._proc.stdin.flush()  # type: ignore[union-attr]
            line = self._proc.stdout.readline()  # type: ignore[union-attr]
        if not line:
            raise RuntimeError(f"the CLI fork server ended (exit {self._proc.poll()})")
        return Answer(**json.loads(line))

    def close(self) -> None:
        if self._proc.stdin is not None:
            self._proc.stdin.close()
        try:
            self._proc.wait(10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait(10)


def _child(job: Job) -> None:
    """In the forked child: the job's process state, then `harness ARGS` as `python -m harness` runs it."""
    import resource

    if job.address_space_bytes is not None:
        resource.setrlimit(resource.RLIMIT_AS, (job.address_space_bytes, job.address_space_bytes))
    if job.cpu_s is not None:
        resource.setrlimit(resource.RLIMIT_CPU, (job.cpu_s, job.cpu_s + 1))
    if job.num_cpus is not None:
        os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[: job.num_cpus])
    os.chdir(job.cwd)
    for fd, path, flags in (
        (0, os.devnull, os.O_RDONLY),
        (1, job.stdout, os.O_WRONLY | os.O_CREAT | os.O_TRUNC),
        (2, job.stderr, os.O_WRONLY | os.O_CREAT | os.O_TRUNC),
    ):
        opened = os.open(path, flags, 0o600)
        os.dup2(opened, fd)
        os.close(opened)
    sys.argv = ["harness", *job.args]
    from harness.cli import main

    raise SystemExit(main())  # as harness/__main__.py: unwinds the server's loop, then the interpreter exits


def _wait(pid: int, bound_s: float) -> int | None:
    deadline = time.monotonic() + bound_s
    delay = 0.001
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        if time.monotonic() > deadline:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            return None
        time.sleep(delay)
        delay = min(delay * 2, 0.02)


def _serve() -> None:
    import importlib

    for name in PRELOAD:
        importlib.import_module(name)
    assert "torch" not in sys.modules, "the fork server must not import torch: its children would start with it"
    # The imports, frozen: a child's collections leave them alone, so it neither walks them nor copies every page
    # of the server's heap it shares, as writing each object's GC header would (a refusal: 0.04 s of CPU, not 0.1).
    gc.freeze()
    print("ready", flush=True)
    for line in sys.stdin:
        job = Job(**json.loads(line))
        sys.stdout.flush()
        sys.stderr.flush()
        started = time.monotonic()
        pid = os.fork()
        if pid == 0:
            _child(job)  # never returns: SystemExit ends the child
        code = _wait(pid, job.wall_s)
        print(json.dumps({"returncode": code, "wall_s": time.monotonic() - started}), flush=True)


if __name__ == "__main__":
    _serve()
