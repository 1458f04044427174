"""The real `harness` command, two ways, from the repository root:

run_harness     `python -m harness ARGS` as a subprocess of this interpreter. For what only a process boundary
                shows: signals, a crashing or killed process, a closed pipe, what the interpreter reads at start.
run_cli_inproc  `harness.cli.main(ARGS)` in this process, with what the subprocess would have had: the same
                environment (harness_env()), working directory, stdout and stderr captured at the file descriptors (so
                what rank processes print lands there too), SystemExit and an uncaught exception turned into the exit
                code and the traceback the interpreter would give. Both return a CompletedProcess with text output.

The process-wide state a command may leave behind (logging handlers and levels, `--wide`) is put back after each
in-process call, so one test's command cannot change what the next one prints.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import subprocess
import sys
import tempfile
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

REPO_DIR = Path(__file__).resolve().parent.parent


def harness_env() -> dict[str, str]:
    """This checkout first on PYTHONPATH, so the tree under test runs whichever tree is installed."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_DIR), env.get("PYTHONPATH", "")) if p)
    env.pop("COLUMNS", None)  # as in CI: harness.core.console prints tables whole without it
    return env


def run_harness(
    *args: str, cwd: Path = REPO_DIR, timeout_s: float = 120.0, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """`python -m harness ARGS`; stdout and stderr captured as text. env: variables set on top of harness_env()."""
    return subprocess.run(
        [sys.executable, "-m", "harness", *args],
        cwd=cwd,
        env={**harness_env(), **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )


def run_cli_inproc(
    *args: str, cwd: Path = REPO_DIR, env: dict[str, str] | None = None, base_env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """`harness ARGS` through harness.cli.main in this process, as run_harness would give it (module docstring).

    env: variables set on top of base_env (default harness_env()), as run_harness takes them. Bounded by the test's
    own timeout (pytest-timeout), not a separate one: nothing here can kill a call that hangs."""
    from harness.cli import main

    with (
        _environment({**(harness_env() if base_env is None else base_env), **(env or {})}),
        _cwd(cwd),
        _cli_state(),
        _captured_fds() as captured,
    ):
        code = _exit_code(main, list(args))
    return subprocess.CompletedProcess(["harness", *args], code, captured.stdout, captured.stderr)


def _exit_code(main: object, argv: list[str]) -> int:
    """What `python -m harness` would exit with: main's code, SystemExit's (argparse), 1 and a traceback for an
    uncaught exception."""
    try:
        return int(main(argv))  # type: ignore[operator]
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            return exc.code or 0
        print(exc.code, file=sys.stderr)
        return 1
    except Exception:  # noqa: BLE001 (the interpreter's own report of an uncaught exception)
        traceback.print_exc()
        return 1


@contextmanager
def _environment(env: dict[str, str]) -> Iterator[None]:
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(env)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


@contextmanager
def _cwd(path: Path) -> Iterator[None]:
    saved = os.getcwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(saved)


@contextmanager
def _cli_state() -> Iterator[None]:
    """Logging's handlers, levels and switches, and `--wide`, as they were before the command."""

    def loggers() -> list[logging.Logger]:
        manager = logging.Logger.manager
        return [logging.root, *(lg for lg in list(manager.loggerDict.values()) if isinstance(lg, logging.Logger))]

    saved = {id(lg): (list(lg.handlers), lg.level, lg.propagate, lg.disabled) for lg in loggers()}
    kept = {id(h) for handlers, *_ in saved.values() for h in handlers}
    disable = logging.root.manager.disable
    try:
        yield
    finally:
        for lg in loggers():
            for handler in lg.handlers:
                if id(handler) not in kept:
                    handler.close()  # made by the command: it may hold the command's captured stream
            handlers, level, propagate, disabled = saved.get(id(lg), ([], logging.NOTSET, True, False))
            lg.handlers[:] = handlers
            lg.level, lg.propagate, lg.disabled = level, propagate, disabled
        logging.disable(disable)
        console = sys.modules.get("harness.core.console")
        if console is not None:
            console.show_every_column(False)


class _Captured:
    stdout = ""
    stderr = ""


@contextmanager
def _captured_fds() -> Iterator[_Captured]:
    """fds 1 and 2 pointed at temporary files, sys.stdout and sys.stderr new streams on them (buffered as a
    subprocess's are: stdout by block, stderr by line); the text read back as `subprocess.run(text=True)` reads it."""
    captured = _Captured()
    sys.stdout.flush()
    sys.stderr.flush()
    saved_fds = os.dup(1), os.dup(2)
    saved_streams = sys.stdout, sys.stderr
    with tempfile.TemporaryFile() as out_file, tempfile.TemporaryFile() as err_file:
        os.dup2(out_file.fileno(), 1)
        os.dup2(err_file.fileno(), 2)
        out = io.TextIOWrapper(io.BufferedWriter(io.FileIO(1, "w", closefd=False)), encoding="utf-8")
        err = io.TextIOWrapper(
            io.BufferedWriter(io.FileIO(2, "w", closefd=False)),
            encoding="utf-8",
            errors="backslashreplace",
            line_buffering=True,
        )
        sys.stdout, sys.stderr = out, err
        try:
            yield captured
        finally:
            for stream in (out, err):
                # A command that closed or dropped its stdout: what was left is lost, as at exit.
                with contextlib.suppress(OSError, ValueError):
                    stream.close()  # flushes; the fd itself stays open (closefd=False)
            sys.stdout, sys.stderr = saved_streams
            os.dup2(saved_fds[0], 1)
            os.dup2(saved_fds[1], 2)
            os.close(saved_fds[0])
            os.close(saved_fds[1])
            captured.stdout = _read_text(out_file)
            captured.stderr = _read_text(err_file)


def _read_text(file: object) -> str:
    file.seek(0)  # type: ignore[attr-defined]
    data: bytes = file.read()  # type: ignore[attr-defined]
    return data.decode("utf-8", errors="replace").replace("\r\n", "\n").replace("\r", "\n")


def without_download_lines(stderr: str) -> str:
    """stderr less the two progress lines of a release's first download (harness.sizing.vllm_source.registry: a
    cold cache fetches the release a plan reads), which a check of an error's single line does not count."""
    return "\n".join(line for line in stderr.splitlines()
                     if not line.startswith(("harness: downloading vllm==", "harness: downloaded vllm-")))  # fmt: skip
