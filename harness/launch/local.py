"""The local launcher: one spawned process per rank on this machine, rendezvous at 127.0.0.1.

Each process runs `rank_entry` and sends ("event", ...), then ("record", ...) or ("error", ...) over one
multiprocessing queue; the driver writes what arrives. A process that exits without a record is a death, one
that says nothing past the deadline a hang; either way the rest are terminated.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue as queue_module
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from harness.rank.distributed import RankInfo, apply_safe_env, free_port
from harness.launch import (
    EXIT_DRAIN_GRACE_S,
    POLL_INTERVAL_S,
    ClusterResources,
    LaunchOutcome,
    LaunchPlan,
    RankWatch,
    RunSink,
    exit_cause,
    format_exception,
    hostname,
    RankEntry,
    rank_entry,
)

if TYPE_CHECKING:
    from multiprocessing.process import BaseProcess
    from multiprocessing.queues import Queue

    from harness.scenario.schema import Scenario

TERMINATE_GRACE_S = 5.0


def _rank_process(scenario: Scenario, info: RankInfo, run_dir: str, results: Queue, entry: RankEntry) -> None:
    """Body of one rank's process (spawned: nothing inherited but the arguments and the environment)."""
    apply_safe_env()
    if info.device_type == "cpu":
        import torch

        # P ranks share this machine's cores; without a cap every rank starts one thread per core.
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // info.world_size))
    try:
        data = rank_entry(scenario, info, Path(run_dir), lambda event: results.put(("event", info.rank, event)),
                          entry)
        results.put(("record", info.rank, data))
    except BaseException as exc:  # noqa: BLE001 - whatever ends the rank is reported, then the process exits
        cause, detail = format_exception(exc)
        results.put(("error", info.rank, (cause, detail)))
    finally:
        results.close()
        results.join_thread()  # the record must be in the pipe before the process exits


class LocalLauncher:
    name: Literal["local"] = "local"

    def resources(self) -> ClusterResources:
        import torch

        num_gpus = torch.cuda.device_count()
        num_cpus = os.cpu_count() or 1
        return ClusterResources(
            num_gpus=num_gpus, num_cpus=num_cpus, num_nodes=1, description=f"this machine: {num_cpus} CPU, {num_gpus} GPU"
        )

    def launch(self, plan: LaunchPlan, sink: RunSink) -> LaunchOutcome:
        apply_safe_env()  # children inherit the environment; rank_entry applies it again
        ctx = mp.get_context("spawn")
        results: Queue = ctx.Queue()
        port = free_port("127.0.0.1")
        node = hostname()
        procs: dict[int, BaseProcess] = {}
        try:
            for rank in range(plan.num_ranks):
                info = plan.rank_info(
                    rank,
                    master_addr="127.0.0.1",
                    master_port=port,
                    device_index=rank if plan.device_type == "cuda" else 0,
                )
                proc = ctx.Process(
                    target=_rank_process, args=(plan.scenario, info, str(plan.run_dir), results, plan.entry),
                    name=f"harness-rank-{rank}",
                )
                proc.start()
                procs[rank] = proc
                sink.event({"rank": rank, "event": "placed", "node": node, "pid": proc.pid})
            sink.write_placement({
                "launcher": "local",
                "master": f"127.0.0.1:{port}",
                "ranks": [
                    {"rank": r, "node_ip": "127.0.0.1", "hostname": node, "pid": p.pid,
                     "device_index": r if plan.device_type == "cuda" else 0}
                    for r, p in procs.items()
                ],
            })
            self._watch(plan, sink, procs, results)
        except KeyboardInterrupt:
            self._drain(sink, results, timeout_s=0.0)
            sink.fail_pending("interrupted: Ctrl-C before this rank's record arrived")
            raise
        finally:
            _stop(procs.values())
            results.close()
            results.cancel_join_thread()
        return sink.outcome()

    def _watch(self, plan: LaunchPlan, sink: RunSink, procs: dict[int, BaseProcess], results: Queue) -> None:
        watch = RankWatch(plan=plan, sink=sink)
        exited_at: dict[int, float] = {}
        while sink.pending:
            self._drain(sink, results, timeout_s=POLL_INTERVAL_S)
            now = time.monotonic()
            for rank in sink.pending:
                exitcode = procs[rank].exitcode
                if exitcode is None:
                    continue
                exited_at.setdefault(rank, now)
                if now - exited_at[rank] >= EXIT_DRAIN_GRACE_S:
                    sink.failure(rank, exit_cause(exitcode), detail=f"pid {procs[rank].pid}")
            if sink.pending and watch.expired():
                watch.fail_hung()

    @staticmethod
    def _drain(sink: RunSink, results: Queue, *, timeout_s: float) -> None:
        """Hand everything in the queue to the sink; wait up to timeout_s for the first message."""
        block = timeout_s > 0
        while True:
            try:
                kind, rank, payload = results.get(block=block, timeout=timeout_s if block else None)
            except queue_module.Empty:
                return
            except (EOFError, OSError):
                return
            block = False
            _deliver(sink, kind, rank, payload)

    def close(self) -> None:
        pass


def _deliver(sink: RunSink, kind: str, rank: int, payload: Any) -> None:
    if kind == "event":
        sink.event(payload)
    elif kind == "record":
        sink.record(rank, payload)
    elif kind == "error":
        cause, detail = payload
        sink.failure(rank, cause, detail=detail)


def _stop(procs: Any) -> None:
    """Terminate every rank process still alive (SIGTERM, then SIGKILL after a grace period)."""
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
