"""parallel_launch: run a worker on N real gloo ranks in processes of their own; failures come back per rank.

Ranks are forked from multiprocessing's fork server, as the local launcher's are: it imports torch once per test
process, so a rank starts without spending about 2 s of CPU on that import. Each rank takes the test's environment
at launch (a test may have changed it since the server started)."""

from __future__ import annotations

import multiprocessing as mp
import os
import traceback
from collections.abc import Callable
from typing import Any, Literal

from harness.rank.distributed import RankInfo, free_port, init_rank, shutdown_rank


def _entry(
    worker: Callable[..., Any], info: RankInfo, args: tuple[Any, ...], queue: Any, environ: dict[str, str]
) -> None:
    os.environ.clear()
    os.environ.update(environ)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    try:
        init_rank(info)
        result = worker(info, *args)
        queue.put((info.rank, "ok", result))
    except BaseException:  # noqa: BLE001 - every failure goes back to the test
        queue.put((info.rank, "failed", traceback.format_exc()))
    finally:
        shutdown_rank()


def parallel_launch(
    world_size: int,
    worker: Callable[..., Any],
    *args: Any,
    timeout_s: float = 120.0,
    device_type: Literal["cuda", "cpu"] = "cpu",
) -> list[Any]:
    """Run worker(info, *args) on `world_size` gloo ranks (device_type "cuda": NCCL ranks, one GPU each); return
    their results in rank order.

    Raises AssertionError "k of n failed" with each failed rank's traceback.
    """
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["torch", "harness.rank.distributed"])
    queue = ctx.Queue()
    port = free_port()
    procs = []
    for rank in range(world_size):
        info = RankInfo(
            rank=rank,
            world_size=world_size,
            master_addr="127.0.0.1",
            master_port=port,
            comm_backend="nccl" if device_type == "cuda" else "gloo",
            device_type=device_type,
            device_index=rank if device_type == "cuda" else 0,
            collective_timeout_s=min(timeout_s, 60.0),
        )
        p = ctx.Process(target=_entry, args=(worker, info, args, queue, dict(os.environ)), daemon=True)
        p.start()
        procs.append(p)
    results: dict[int, tuple[str, Any]] = {}
    try:
        for _ in range(world_size):
            rank, status, payload = queue.get(timeout=timeout_s)
            results[rank] = (status, payload)
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
    failed = {r: payload for r, (status, payload) in results.items() if status != "ok"}
    missing = sorted(set(range(world_size)) - set(results))
    if failed or missing:
        details = "\n".join(f"--- rank {r} ---\n{tb}" for r, tb in sorted(failed.items()))
        raise AssertionError(f"{len(failed) + len(missing)} of {world_size} failed (missing: {missing})\n{details}")
    return [results[r][1] for r in range(world_size)]
