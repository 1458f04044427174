"""The Ray launcher: one placement-group bundle and one actor per rank, on this machine or a cluster.

    driver                                   actors (one per bundle, num_gpus=1 with GPUs)
    ray.init(address | RAY_ADDRESS | local)
    placement_group([{GPU:1, CPU:c}] * P)    bounded by placement_timeout_s
    actor.where() ───────────────────────>   node IP, Ray node id, a free port on that node
    RankInfo(master = rank 0's IP:port)
    actor.run(scenario, info) ───────────>   rank_entry -> rank_main -> record (JSON data)
    _ProgressLog.drain() <────────────────   events (JSON data, put synchronously): ready, policy, policy-done
                                             carrying the record so far, done; the log outlives a dead rank
    write ranks/rank-NNNNN.json <────────    records so far and the final record: no shared filesystem

Ray sets CUDA_VISIBLE_DEVICES for num_gpus=1, so every rank's device index is 0. Actors that die or hang are
reported as RankFailures and every actor and the placement group are removed, whatever ends the launch.
"""

from __future__ import annotations

import json
import logging
import os
import re
import socket
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import ray
from ray._private.runtime_env.constants import RAY_JOB_CONFIG_JSON_ENV_VAR
from ray.exceptions import GetTimeoutError, RayActorError, RayError, RayTaskError
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

import harness
from harness.core.events import Placed, Placing
from harness.core.killpoints import kill_point
from harness.rank.distributed import SAFE_NCCL_ENV, RankInfo, apply_safe_env, free_port
from harness.launch.contract import ClusterResources, LaunchError, LaunchOutcome, LaunchPlan, RankEntry
from harness.launch.deadlines import POLL_INTERVAL_S, RankWatch, without_sigint
from harness.launch.faults import FAULT_ENV
from harness.launch.rank_side import rank_entry
from harness.launch.sink import RunSink

if TYPE_CHECKING:
    from harness.scenario.schema import Scenario

HARNESS_PACKAGE_DIR = Path(harness.__file__).resolve().parent
DRAIN_TIMEOUT_S = 5.0
CONNECT_TIMEOUT_S = 10.0


@ray.remote(num_cpus=0)
class _ProgressLog:
    """Collects the ranks' progress events; the driver drains it while it waits for records."""

    def __init__(self) -> None:
        self._events: list[tuple[int, dict[str, Any]]] = []

    def put(self, rank: int, data: dict[str, Any]) -> None:
        self._events.append((rank, data))

    def drain(self) -> list[tuple[int, dict[str, Any]]]:
        events, self._events = self._events, []
        return events


@ray.remote
class _RankActor:
    """One rank. Placed in its own bundle; its process lives exactly as long as the launch."""

    def __init__(self, rank: int) -> None:
        apply_safe_env()
        self.rank = rank

    def where(self) -> dict[str, Any]:
        """Where this actor runs, and a port free on its node (rank 0's becomes the rendezvous)."""
        node_ip = ray.util.get_node_ip_address()
        return {
            "rank": self.rank,
            "node_ip": node_ip,
            "node_id": ray.get_runtime_context().get_node_id(),
            "hostname": socket.gethostname(),
            "pid": os.getpid(),
            "gpu_ids": [str(g) for g in ray.get_gpu_ids()],
            "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "safe_env": {k: os.environ.get(k) for k in SAFE_NCCL_ENV},
            "free_port": free_port(node_ip),
        }

    def run(self, scenario: Scenario, info: RankInfo, run_dir: str, log: Any, entry: RankEntry) -> dict[str, Any]:
        # ray.get: the event (a record so far among them) is in the log before the rank goes on, so a crash right
        # after loses nothing; a few events per policy cost a round trip each.
        return rank_entry(scenario, info, Path(run_dir), lambda data: ray.get(log.put.remote(self.rank, data)),
                          entry)


def _format_resources(resources: dict[str, float], keys: tuple[str, ...] = ("CPU", "GPU")) -> str:
    return ", ".join(f"{k} {resources.get(k, 0):g}" for k in keys)


class RayLauncher:
    name: Literal["ray"] = "ray"

    def __init__(self, address: str | None = None, *, num_cpus: int = 1) -> None:
        """Connect to `address`, else to RAY_ADDRESS (set by `ray job submit`), else start a local cluster.

        num_cpus sizes a cluster started here; it is ignored when connecting to one.
        """
        self._owns_connection = False
        if ray.is_initialized():
            self.address = "(already connected)"
            return
        if address and address.startswith(("http://", "https://")):
            raise LaunchError(
                f"--address {address}: that is a Ray dashboard (Jobs API) address. Submit the run with "
                f"launch/submit.sh or `ray job submit --address {address} ...`, or give the cluster's GCS address "
                "(HOST:6379) here"
            )
        apply_safe_env()  # a local cluster's raylet and workers inherit the driver's environment
        common: dict[str, Any] = {
            "log_to_driver": False,  # rank errors come back in RankFailure details; worker logs stay in Ray's log dir
            "logging_level": logging.WARNING,
            "runtime_env": job_runtime_env(),
        }
        try:
            if address:
                self.address = address
                _check_reachable(address)
                without_sigint(lambda: ray.init(address=address, **common))
            elif os.environ.get("RAY_ADDRESS"):
                self.address = os.environ["RAY_ADDRESS"]
                _check_reachable(self.address)
                without_sigint(lambda: ray.init(**common))
            else:
                # "local": never attach to a cluster someone started on this machine with `ray start`.
                self.address = "local"
                without_sigint(lambda: ray.init(address="local", num_cpus=num_cpus, include_dashboard=False,
                                                 **common))
        except LaunchError:
            raise
        except Exception as exc:  # noqa: BLE001 - Ray raises its plain Exception too (a local cluster not up in time)
            _quietly(ray.shutdown)  # whatever part of a local cluster did start goes with it
            raise LaunchError(connect_failure(self.address, exc)) from None
        self._owns_connection = True

    def resources(self) -> ClusterResources:
        total = ray.cluster_resources()
        nodes = [n for n in ray.nodes() if n.get("Alive")]
        num_gpus, num_cpus = int(total.get("GPU", 0)), int(total.get("CPU", 0))
        return ClusterResources(
            num_gpus=num_gpus,
            num_cpus=num_cpus,
            num_nodes=len(nodes),
            description=f"Ray cluster {self.address}: {len(nodes)} node(s), {num_cpus} CPU, {num_gpus} GPU",
        )

    def close(self) -> None:
        if self._owns_connection and ray.is_initialized():
            ray.shutdown()
        self._owns_connection = False

    # -----------------------------------------------------------------------------------------------------------

    def launch(self, plan: LaunchPlan, sink: RunSink) -> LaunchOutcome:
        bundles = [plan.bundle() for _ in range(plan.num_ranks)]
        pg = placement_group(bundles, strategy=plan.placement_strategy, name=f"harness-{plan.run_id}")
        actors: list[Any] = []
        log = None
        try:
            sink.event(Placing(**sink.header, num_bundles=plan.num_ranks, bundle=plan.bundle()))
            if not _wait_ready(pg, plan.placement_timeout_s):
                message = self.placement_message(plan)
                sink.fail_pending(f"not started: placement group not satisfied within {plan.placement_timeout_s:g} s",
                                  detail=message)
                return sink.outcome(error=message)
            log = _ProgressLog.remote()
            actors.extend(_rank_actors(plan, pg))
            wheres = self._start(plan, sink, actors)
            if wheres is None:
                return sink.outcome(error=f"rank actors did not start: {sink.failures[min(sink.failures)].cause}")
            sink.write_placement({
                "launcher": "ray",
                "address": self.address,
                "placement_strategy": plan.placement_strategy,
                "bundle": plan.bundle(),
                "master": f"{wheres[0]['node_ip']}:{wheres[0]['free_port']}",
                "ranks": [{k: v for k, v in w.items() if k != "free_port"} | {"bundle_index": w["rank"]} for w in wheres],
            })
            kill_point("ranks-started")
            refs = {}
            for rank, actor in enumerate(actors):
                info = plan.rank_info(
                    rank, master_addr=wheres[0]["node_ip"], master_port=wheres[0]["free_port"], device_index=0
                )
                refs[actor.run.remote(plan.scenario, info, str(plan.run_dir), log, plan.entry)] = rank
            self._watch(plan, sink, refs, log)
        except KeyboardInterrupt:  # Ctrl-C, or SIGTERM turned into it by the driver
            if log is not None:
                _drain(sink, log)
            sink.fail_pending("interrupted: the run was stopped before this rank's record arrived")
            raise
        finally:
            for actor in actors:
                _quietly(ray.kill, actor, no_restart=True)
            if log is not None:
                _quietly(ray.kill, log, no_restart=True)
            _quietly(remove_placement_group, pg)
        return sink.outcome()

    def _start(self, plan: LaunchPlan, sink: RunSink, actors: list[Any]) -> list[dict[str, Any]] | None:
        """Where each actor runs, once all are up within placement_timeout_s; None (and failures) otherwise."""
        refs = {actor.where.remote(): rank for rank, actor in enumerate(actors)}
        wheres: dict[int, dict[str, Any]] = {}
        deadline = time.monotonic() + plan.placement_timeout_s
        pending = dict(refs)
        while pending and time.monotonic() < deadline:
            ready, _ = ray.wait(list(pending), num_returns=len(pending), timeout=POLL_INTERVAL_S)
            for ref in ready:
                rank = pending.pop(ref)
                try:
                    where = ray.get(ref)
                except RayError as exc:
                    sink.failure(rank, "died: the actor did not start", detail=str(exc))
                    continue
                wheres[rank] = where
                node = f"{where['node_ip']} (ray node {where['node_id'][:12]})"
                sink.event(Placed(**sink.header, rank=rank, node=node, pid=where["pid"]))
            if sink.failures:
                break
        if len(wheres) == plan.num_ranks:
            return [wheres[r] for r in range(plan.num_ranks)]
        if not sink.failures:
            sink.fail_pending(f"not started: actor not up within placement_timeout_s = {plan.placement_timeout_s:g} s")
        else:
            sink.fail_pending(f"not started: rank {min(sink.failures)}'s actor failed to start")
        return None

    def _watch(self, plan: LaunchPlan, sink: RunSink, refs: dict[Any, int], log: Any) -> None:
        watch = RankWatch(plan=plan, sink=sink)
        pending = dict(refs)
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=len(pending), timeout=POLL_INTERVAL_S)
            _drain(sink, log)
            for ref in ready:
                rank = pending.pop(ref)
                try:
                    sink.record(rank, ray.get(ref))
                except RayActorError as exc:
                    sink.failure(rank, _died_cause(exc), detail=str(exc))
                except RayTaskError as exc:
                    cause = getattr(exc, "cause", None)
                    what = f"{type(cause).__name__}: {cause}" if cause is not None else _first_line(exc)
                    sink.failure(rank, f"error: {what}".splitlines()[0], detail=str(exc))
                except RayError as exc:
                    sink.failure(rank, f"died: {_first_line(exc)}", detail=str(exc))
            if pending and watch.expired():
                _drain(sink, log)
                watch.fail_hung()
                return
        _drain(sink, log)

    @staticmethod
    def placement_message(plan: LaunchPlan) -> str:
        """What the scenario asked for against what the cluster has, for an unsatisfied placement group."""
        total, available = ray.cluster_resources(), ray.available_resources()
        nodes = [n for n in ray.nodes() if n.get("Alive")]
        per_node = "; ".join(f"{n['NodeManagerAddress']}: {_format_resources(n['Resources'])}" for n in nodes)
        asked = plan.bundle()
        return (
            f"placement group not satisfied within {plan.placement_timeout_s:g} s: the scenario asks for "
            f"{plan.num_ranks} bundles of {{{_format_resources(asked, tuple(asked))}}} "
            f"({plan.placement_strategy}; {plan.num_ranks * plan.num_cpus_per_rank} CPU"
            + (f", {plan.num_ranks} GPU" if plan.device_type == "cuda" else "")
            + f" in all); the cluster has {_format_resources(total)} in all and {_format_resources(available)} "
            f"available now, on {len(nodes)} node(s) [{per_node}]"
        )


def _rank_actors(plan: LaunchPlan, pg: PlacementGroup) -> list[Any]:
    """One actor per rank, each in its own bundle of the placement group, never restarted."""
    runtime_env = actor_runtime_env()
    return [
        _RankActor.options(
            num_cpus=plan.num_cpus_per_rank,
            num_gpus=1 if plan.device_type == "cuda" else 0,
            scheduling_strategy=PlacementGroupSchedulingStrategy(placement_group=pg, placement_group_bundle_index=rank),
            runtime_env=runtime_env,
            max_restarts=0,
            max_task_retries=0,
        ).remote(rank)
        for rank in range(plan.num_ranks)
    ]


def actor_runtime_env() -> dict[str, Any]:
    """The rank actors' runtime_env: the safe NCCL environment and the fault hook (env_vars merge with the job's)."""
    env_vars = dict(SAFE_NCCL_ENV)
    if os.environ.get(FAULT_ENV):
        env_vars[FAULT_ENV] = os.environ[FAULT_ENV]
    return {"env_vars": env_vars}


def job_runtime_env() -> dict[str, Any] | None:
    """What this driver adds to the job's runtime_env at ray.init: the harness code, unless the job carries it.

    Inside `ray job submit --working-dir .` the job's working_dir already brings the harness to every node.
    Otherwise the driver's harness package travels as a py_module (Ray uploads local paths only at the job
    level), so no node needs it installed and every rank runs the driver's exact code.
    """
    injected = os.environ.get(RAY_JOB_CONFIG_JSON_ENV_VAR)
    if injected:
        job_env = json.loads(injected).get("runtime_env") or {}
        if job_env.get("working_dir") or job_env.get("py_modules"):
            return None
    return {"py_modules": [str(HARNESS_PACKAGE_DIR)]}


def connect_failure(address: str, exc: BaseException) -> str:
    """One line for a failed ray.init: Ray's reason, and for a remote head the token it may want (a head started
    with RAY_AUTH_MODE=token refuses clients without its token; ray.init then retries and says nothing of it)."""
    reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    text = f"cannot connect to the Ray cluster at {address}: {reason}"
    if address == "local":
        return text
    if type(exc).__name__ == "AuthenticationError":
        return (text + "; the head wants its token: set RAY_AUTH_MODE=token and its token in ~/.ray/auth_token "
                "(or RAY_AUTH_TOKEN / RAY_AUTH_TOKEN_PATH)")
    if os.environ.get("RAY_AUTH_MODE") != "token":
        return (text + "; if the head runs with RAY_AUTH_MODE=token, set RAY_AUTH_MODE=token here too with its "
                "token in ~/.ray/auth_token (or RAY_AUTH_TOKEN / RAY_AUTH_TOKEN_PATH)")
    return text


def _check_reachable(address: str) -> None:
    """Fail fast on a GCS address nobody answers at: ray.init itself retries for minutes."""
    if "://" in address or address in ("auto", "local"):
        return  # ray:// client addresses and auto-detection: leave them to Ray
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise LaunchError(f"Ray address {address!r}: expected HOST:PORT (the head's GCS port, 6379 by default)")
    try:
        with socket.create_connection((host, int(port)), timeout=CONNECT_TIMEOUT_S):
            pass
    except OSError as exc:
        raise LaunchError(
            f"cannot reach the Ray cluster's GCS at {address} within {CONNECT_TIMEOUT_S:g} s: "
            f"{exc.strerror or exc}; is the head running (`ray start --head`) and the port open?"
        ) from None


def _wait_ready(pg: PlacementGroup, timeout_s: float) -> bool:
    """Wait for the placement group in short steps, so Ctrl-C is felt at once."""
    ready_ref = pg.ready()
    deadline = time.monotonic() + timeout_s
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return False
        done, _ = ray.wait([ready_ref], timeout=min(remaining, 0.5))
        if done:
            return True


def _drain(sink: RunSink, log: Any) -> None:
    try:
        events = ray.get(log.drain.remote(), timeout=DRAIN_TIMEOUT_S)
    except (GetTimeoutError, RayError):
        return  # progress is for the display only; records never depend on it
    for rank, data in events:
        sink.rank_event(rank, data)


def _died_cause(exc: RayActorError) -> str:
    """'died: <Ray's worker exit detail>' rather than its generic first line."""
    match = re.search(r"Worker exit detail: (.*?)(?: Some common causes|$)", str(exc), re.MULTILINE)
    if match and match.group(1).strip():
        return f"died: {match.group(1).strip()}"
    return f"died: {_first_line(exc)}"


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _quietly(fn: Any, *args: Any, **kwargs: Any) -> None:
    try:
        fn(*args, **kwargs)
    except Exception:  # noqa: BLE001 - teardown of what may already be gone
        pass
