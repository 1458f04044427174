"""The local launcher: one process per rank on this machine, rendezvous at 127.0.0.1.

Ranks are forked from multiprocessing's fork server, which imports torch and the rank's code once per driver
(`_rank_context`): a rank then starts in milliseconds instead of spending about 2 s of CPU importing torch, and
inherits nothing of the driver's (its threads, a CUDA context): only the arguments, which carry the driver's
environment and working directory at launch, and an ignored SIGINT.

Each process runs `rank_entry` and sends ("event", data), then ("record", data) or ("error", (cause, detail))
over a pipe of its own; the driver writes what arrives. Connection.send returns once the message is in the pipe,
so what a rank sent before it crashed is still read after. A rank's end is a fact, not a guess from silence: its
pipe reaches end-of-file when the process is gone, and its exit code says how it ended. A rank still alive and
silent past the deadline is hung. Either way the rest are terminated.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import signal
import socket
import time
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from harness.core.events import Placed
from harness.core.killpoints import kill_point
from harness.launch.contract import ClusterResources, LaunchOutcome, LaunchPlan, RankEntry, main_module
from harness.launch.deadlines import POLL_INTERVAL_S, RankWatch, exit_cause, without_sigint
from harness.launch.machine import local_machine
from harness.launch.rank_side import format_exception, rank_entry
from harness.launch.sink import RunSink
from harness.rank.distributed import RankInfo, apply_safe_env, free_port

if TYPE_CHECKING:
    from multiprocessing.process import BaseProcess

    from harness.scenario.schema import Scenario

# SIGTERM to a rank, then SIGKILL after this long: ranks are stopped within it, whatever ends the launch.
TERMINATE_GRACE_S = 5.0
# A rank whose pipe closed has exited or is exiting; its exit code is read within this bound.
EXIT_JOIN_S = 5.0


def _rank_process(
    scenario: Scenario,
    info: RankInfo,
    run_dir: str,
    conn: Connection,
    entry: RankEntry,
    environ: dict[str, str],
    cwd: str,
) -> None:
    """Body of one rank's process, forked from the fork server: the driver's environment and working directory
    at launch replace the server's (which are those of the server's start), and SIGINT stays ignored (the driver
    handles it for the rank)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    os.environ.clear()
    os.environ.update(environ)
    os.chdir(cwd)
    apply_safe_env()
    if info.device_type == "cpu":
        import torch

        # P ranks share this machine's cores; without a cap every rank starts one thread per core.
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // info.world_size))
    try:
        data = rank_entry(scenario, info, Path(run_dir), lambda event: conn.send(("event", event)), entry)
        conn.send(("record", data))
    except BaseException as exc:  # noqa: BLE001 - whatever ends the rank is reported, then the process exits
        with contextlib.suppress(OSError, EOFError):  # the driver is gone
            conn.send(("error", format_exception(exc)))
    finally:
        conn.close()


class LocalLauncher:
    name: Literal["local"] = "local"

    def resources(self) -> ClusterResources:
        # NVML's count under CUDA_VISIBLE_DEVICES, as the scenario's fit check sees it: no torch in the driver.
        num_gpus = local_machine().num_gpus
        num_cpus = os.cpu_count() or 1
        return ClusterResources(
            num_gpus=num_gpus,
            num_cpus=num_cpus,
            num_nodes=1,
            description=f"this machine: {num_cpus} CPU, {num_gpus} GPU",
        )

    def launch(self, plan: LaunchPlan, sink: RunSink) -> LaunchOutcome:
        apply_safe_env()  # children inherit the environment; rank_entry applies it again
        ctx = _rank_context(plan.entry)
        port = free_port("127.0.0.1")
        node = socket.gethostname()
        procs: dict[int, BaseProcess] = {}
        pipes: dict[int, Connection] = {}
        try:
            for rank in range(plan.num_ranks):
                info = plan.rank_info(
                    rank,
                    master_addr="127.0.0.1",
                    master_port=port,
                    device_index=rank if plan.device_type == "cuda" else 0,
                )
                reader, writer = ctx.Pipe(duplex=False)
                proc = ctx.Process(
                    target=_rank_process,
                    args=(plan.scenario, info, str(plan.run_dir), writer, plan.entry, dict(os.environ), os.getcwd()),
                    name=f"harness-rank-{rank}",
                )
                without_sigint(proc.start)  # Ctrl-C reaches the driver alone, which stops the ranks
                writer.close()  # the child holds the only write end: its exit closes the pipe
                procs[rank], pipes[rank] = proc, reader
                sink.event(Placed(**sink.header, rank=rank, node=node, pid=proc.pid))
            sink.write_placement(
                {
                    "launcher": "local",
                    "master": f"127.0.0.1:{port}",
                    "ranks": [
                        {
                            "rank": r,
                            "node_ip": "127.0.0.1",
                            "hostname": node,
                            "pid": p.pid,
                            "device_index": r if plan.device_type == "cuda" else 0,
                        }
                        for r, p in procs.items()
                    ],
                }
            )
            kill_point("ranks-started")
            self._watch(plan, sink, procs, pipes)
        except KeyboardInterrupt:  # Ctrl-C, or SIGTERM turned into it by the driver
            _read_available(sink, pipes)
            sink.fail_pending("interrupted: the run was stopped before this rank's record arrived")
            raise
        finally:
            _stop(procs.values())
            for conn in pipes.values():
                conn.close()
        return sink.outcome()

    def _watch(
        self, plan: LaunchPlan, sink: RunSink, procs: dict[int, BaseProcess], pipes: dict[int, Connection]
    ) -> None:
        watch = RankWatch(plan=plan, sink=sink)
        open_pipes = dict(pipes)
        while sink.pending:
            for conn in wait(list(open_pipes.values()), timeout=POLL_INTERVAL_S) if open_pipes else []:
                rank = next(r for r, c in open_pipes.items() if c is conn)
                if not _read_one(sink, rank, open_pipes[rank]):
                    del open_pipes[rank]
                    _ended_without_record(sink, rank, procs[rank])
            if not open_pipes and sink.pending:
                sink.fail_pending("died: no pipe left to the driver")
            if sink.pending and watch.expired():
                watch.fail_hung()

    def close(self) -> None:
        pass


def _rank_context(entry: RankEntry) -> Any:
    """The fork server's context. The server starts at the first rank of this process (inside `without_sigint`, so
    it and every rank it forks ignore SIGINT) and imports torch and the rank's code first; it ends with this process.
    The preload is fixed when the server starts: an entry from another module imports that module in its rank."""
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["torch", "harness.launch.rank_side", main_module(entry.main)])
    return ctx


def _read_one(sink: RunSink, rank: int, conn: Connection) -> bool:
    """Deliver one message from rank's pipe; False once the pipe is closed (the process is gone)."""
    try:
        kind, payload = conn.recv()
    except (EOFError, OSError):
        return False
    if kind == "event":
        sink.rank_event(rank, payload)
    elif kind == "record":
        sink.record(rank, payload)
    elif kind == "error":
        cause, detail = payload
        sink.failure(rank, cause, detail=detail)
    return True


def _read_available(sink: RunSink, pipes: dict[int, Connection]) -> None:
    """Everything already in the pipes, without waiting (after an interrupt)."""
    for rank, conn in pipes.items():
        try:
            while not conn.closed and conn.poll(0):
                if not _read_one(sink, rank, conn):
                    break
        except (EOFError, OSError):
            continue


def _ended_without_record(sink: RunSink, rank: int, proc: BaseProcess) -> None:
    """The pipe of `rank` closed: the process ended. Its exit code says how, when it sent no record or error."""
    if rank not in sink.pending:
        return
    proc.join(EXIT_JOIN_S)
    if proc.exitcode is None:
        sink.failure(rank, "died: closed its pipe to the driver without a record", detail=f"pid {proc.pid}")
    else:
        sink.failure(rank, exit_cause(proc.exitcode), detail=f"pid {proc.pid}")


def _stop(procs: Any) -> None:
    """Terminate every rank process still alive (SIGTERM, then SIGKILL after TERMINATE_GRACE_S)."""
    alive = [p for p in procs if p.is_alive()]
    for proc in alive:
        proc.terminate()
    deadline = time.monotonic() + TERMINATE_GRACE_S
    for proc in alive:
        proc.join(max(0.0, deadline - time.monotonic()))
    for proc in alive:
        if proc.is_alive():
            proc.kill()
            proc.join(TERMINATE_GRACE_S)
