"""Starting real vLLM on dummy weights: the one place this project executes vLLM code, on purpose, in a child
process of its own process group, bounded by a timeout, and stopped (the whole group) once the figures are printed.

    serve  `PYTHON -m vllm.entrypoints.cli.main serve MODEL FLAGS --load-format dummy --skip-tokenizer-init`;
           ready at "Application startup complete" (the API server's defaults: OPENAI_API_SERVER usage context)
    llm    `LLM(model=MODEL, load_format="dummy", skip_tokenizer_init=True, **FLAGS as keyword arguments)`; ready
           when the constructor returns (the LLM class's defaults: max_num_batched_tokens 16384, max_num_seqs 1024
           on a GPU of 70 GiB or more, unless given)
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

READY_MARKER = "HARNESS-VERIFY-READY"
# The API server logs "Starting vLLM server on ADDRESS" once its engine is up (entrypoints/openai/api_server.py),
# then uvicorn "Application startup complete".
READY = re.compile(rf"{READY_MARKER}|Application startup complete|Starting vLLM (?:API )?server on")
# The LLM class's child: keyword arguments as JSON in argv[1]; prints the marker once the engine is up.
LLM_CHILD = (
    "import json, sys\n"
    "from vllm import LLM\n"
    "kwargs = json.loads(sys.argv[1])\n"
    "LLM(load_format='dummy', skip_tokenizer_init=True, **kwargs)\n"
    f"print('{READY_MARKER}', flush=True)\n"
)


class LaunchError(Exception):
    """What cannot be started here; one line."""


@dataclass
class Launched:
    status: str  # ready, failed, timeout
    log: str
    seconds: float
    returncode: int | None


def flags_to_kwargs(model: str, flags: list[str]) -> dict[str, object]:
    """`--max-model-len 4096 --enforce-eager --compilation-config '{...}'` as the LLM class's keyword arguments."""
    kwargs: dict[str, object] = {"model": model}
    i = 0
    while i < len(flags):
        word = flags[i]
        if not word.startswith("--"):
            raise LaunchError(f"--entry llm: {word[:40]} is not a --flag the LLM class takes as a keyword argument; "
                              "use --entry serve for it")  # fmt: skip
        name, _, inline = word[2:].partition("=")
        key = name.replace("-", "_")
        if inline:
            value: str | None = inline
        elif i + 1 < len(flags) and not flags[i + 1].startswith("--"):
            value = flags[i + 1]
            i += 1
        else:
            value = None
        kwargs[key] = True if value is None else _value(value)
        i += 1
    return kwargs


def _value(text: str) -> object:
    if re.fullmatch(r"-?\d+", text):
        return int(text)
    if re.fullmatch(r"-?\d+\.\d*(?:e-?\d+)?", text):
        return float(text)
    if text[:1] in "{[":
        try:
            return json.loads(text)
        except ValueError:
            return text
    return {"true": True, "false": False}.get(text.lower(), text)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def command(python: str, entry: str, model: str, flags: list[str]) -> list[str]:
    if entry == "llm":
        return [python, "-c", LLM_CHILD, json.dumps(flags_to_kwargs(model, flags))]
    return [python, "-m", "vllm.entrypoints.cli.main", "serve", model, *flags, "--load-format", "dummy",
            "--skip-tokenizer-init", "--host", "127.0.0.1", "--port", str(_free_port())]  # fmt: skip


def stop_group(pgid: int, grace_s: float = 10.0, leader: subprocess.Popen[bytes] | None = None) -> None:
    """SIGTERM to the whole group (the API server, the engine core, its workers), then SIGKILL what is left.

    leader: the group's first process when it is this process's child. It is reaped as soon as it exits: until then
    it stays a zombie of the group, which would keep the group "alive" for the whole grace period."""
    for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return
        end = time.monotonic() + wait
        while time.monotonic() < end:
            if leader is not None:
                leader.poll()
            try:
                os.killpg(pgid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.1)


def launch(argv: list[str], log_path: Path, timeout_s: float, env: dict[str, str] | None = None) -> Launched:
    """Run argv in a new session, its output to log_path, until vLLM says it is ready, it exits, or the timeout;
    then stop its process group. Nothing is left behind."""
    start = time.monotonic()
    with open(log_path, "wb") as out:
        child = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                 start_new_session=True, env={**os.environ, **(env or {})})  # fmt: skip
    status, code = "timeout", None
    try:
        while time.monotonic() - start < timeout_s:
            code = child.poll()
            text = log_path.read_text(errors="replace")
            if READY.search(text):
                status = "ready"
                break
            if code is not None:
                status = "ready" if code == 0 and READY.search(text) else "failed"
                break
            time.sleep(0.5)
    finally:
        stop_group(child.pid, leader=child)
        with contextlib.suppress(subprocess.TimeoutExpired):
            child.wait(timeout=10)
    return Launched(status=status, log=log_path.read_text(errors="replace"), seconds=time.monotonic() - start,
                    returncode=child.returncode)  # fmt: skip


def installed_vllm(python: str) -> str | None:
    """The vLLM version installed for `python` (its package metadata; nothing of vLLM is imported), or None."""
    probe = "import importlib.metadata as m\ntry:\n print(m.version('vllm'))\nexcept Exception:\n print('')"
    try:
        out = subprocess.run([python, "-c", probe], check=False, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None


def gpu_count() -> tuple[int, str | None]:
    """(GPUs visible, the first one's name) from nvidia-smi; (0, None) without one."""
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
            check=False,
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired):
        return 0, None
    names = [x.strip() for x in out.stdout.splitlines() if x.strip()] if out.returncode == 0 else []
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and names:
        names = names[: len([x for x in visible.split(",") if x.strip()])]
    return len(names), (names[0] if names else None)


def gpu_name(nvidia_name: str | None) -> str | None:
    """nvidia-smi's name as one of harness's GPU names, where it is one."""
    if not nvidia_name:
        return None
    n = nvidia_name.upper()
    for key, name in (("H200", "H200-141GB"), ("H100 NVL", "H100-94GB"), ("H100", "H100-80GB"), ("H20", "H20-96GB"),
                      ("A100-SXM4-40GB", "A100-40GB"), ("A100", "A100-80GB")):  # fmt: skip
        if key in n:
            return name
    return None
