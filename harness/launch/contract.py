"""The launch contract: what a launcher is given (LaunchPlan, RankEntry), what it can place ranks on
(ClusterResources) and what it returns (LaunchOutcome). Plain data: nothing here imports torch, which only the
ranks need.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from harness.core.errors import InfrastructureError

if TYPE_CHECKING:
    from harness.core.records import RankFailure
    from harness.rank.distributed import RankInfo
    from harness.scenario.schema import Scenario
    from harness.sizing.vllm_source.kernels import KernelsLibrary

DeviceType = Literal["cuda", "cpu"]


def comm_backend_for(device_type: DeviceType) -> Literal["nccl", "gloo"]:
    """The process group's backend: on CPU "cpu:gloo,cuda:nccl" fails, so one backend, chosen by the device."""
    return "nccl" if device_type == "cuda" else "gloo"


class LaunchError(InfrastructureError):
    """The launch itself failed (no cluster, placement not satisfied, bad fault spec): exit code 2."""


@dataclass(frozen=True, kw_only=True)
class ClusterResources:
    """What a launcher can place ranks on."""

    num_gpus: int
    num_cpus: int
    num_nodes: int
    description: str  # one line, for messages: "2 nodes, 4 CPU, 0 GPU"


@dataclass(frozen=True)
class NamedMain:
    """A rank's main named by its module and function. It pickles as those two names, so a driver hands it to its
    ranks without importing the rank's code (and torch with it); the rank imports the module when it calls it."""

    module: str
    name: str

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return getattr(importlib.import_module(self.module), self.name)(*args, **kwargs)


def main_module(main: Callable[..., Any]) -> str:
    """The module a rank's main lives in, which a launcher may import ahead of the rank (the local fork server)."""
    return main.module if isinstance(main, NamedMain) else main.__module__


@dataclass(frozen=True, kw_only=True)
class RankEntry:
    """What a rank runs and what it returns, given by the caller so launchers import neither rank nor bench.

    `main(scenario, info, run_dir, progress, kernels=...)` returns a pydantic record; `record_model` validates it on the
    driver. Both are module-level, so they pickle by reference into rank processes and Ray actors.
    """

    main: Callable[..., Any]
    record_model: type[Any]
    policies: tuple[str, ...] = ()  # what each rank measures, in order: a failure names those it never finished
    # The vLLM ops library the driver resolved (None: the scenario loads none), handed to `main` as `kernels=`,
    # so a release is located, fetched and hashed once per run, not once per rank.
    kernels: KernelsLibrary | None = None


@dataclass(frozen=True, kw_only=True)
class LaunchPlan:
    """One run's launch: the scenario, where records go, and the bounds of every wait."""

    scenario: Scenario
    run_id: str
    run_dir: Path
    device_type: DeviceType
    entry: RankEntry  # what each rank runs: the measurement (harness.rank) or the bench (harness.bench)

    @property
    def num_ranks(self) -> int:
        return self.scenario.parallel.num_ranks

    @property
    def comm_backend(self) -> Literal["nccl", "gloo"]:
        return comm_backend_for(self.device_type)

    @property
    def placement_strategy(self) -> Literal["PACK", "SPREAD"]:
        return self.scenario.launch.placement_strategy

    @property
    def num_cpus_per_rank(self) -> int:
        return self.scenario.launch.cpus_per_rank

    @property
    def placement_timeout_s(self) -> float:
        return self.scenario.launch.placement_timeout_s

    @property
    def rank_timeout_s(self) -> float:
        return self.scenario.launch.rank_timeout_s

    @property
    def collective_timeout_s(self) -> float:
        return self.scenario.launch.collective_timeout_s

    def rank_info(self, rank: int, *, master_addr: str, master_port: int, device_index: int) -> RankInfo:
        from harness.rank.distributed import RankInfo  # torch: only once a launch begins

        return RankInfo(
            rank=rank,
            world_size=self.num_ranks,
            master_addr=master_addr,
            master_port=master_port,
            comm_backend=self.comm_backend,
            device_type=self.device_type,
            device_index=device_index,
            collective_timeout_s=self.collective_timeout_s,
            run_id=self.run_id,
        )

    def bundle(self) -> dict[str, float]:
        """One rank's placement-group bundle: {GPU: 1, CPU: c} with GPUs, {CPU: c} without."""
        if self.device_type == "cuda":
            return {"GPU": 1, "CPU": self.num_cpus_per_rank}
        return {"CPU": self.num_cpus_per_rank}


@dataclass(frozen=True, kw_only=True)
class LaunchOutcome:
    num_records: int
    failures: tuple[RankFailure, ...]
    error: str | None = None  # an infrastructure error that stopped the launch, for the user

    @property
    def ok(self) -> bool:
        return not self.failures and self.error is None
