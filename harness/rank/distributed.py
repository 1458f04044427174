"""One rendezvous for every launcher: launchers build `RankInfo`s, `init_rank` sets up torch.distributed; `agree`
makes every rank take the same branch after a step that may have failed on some of them.

torch is imported by what uses it, not by this module: a driver builds RankInfos and picks ports without importing
torch (about 2 s of CPU), which only the ranks need."""

from __future__ import annotations

import datetime
import os
import socket
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    import torch

# NVLink multicast stays off in every process we start (it can take a shared host's GPUs out of service).
SAFE_NCCL_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


@dataclass(frozen=True, kw_only=True)
class RankInfo:
    """Everything one rank needs to join the group; plain data, so it crosses processes and Ray."""

    rank: int
    world_size: int
    master_addr: str
    master_port: int
    comm_backend: Literal["nccl", "gloo"]
    device_type: Literal["cuda", "cpu"]
    device_index: int = 0  # within this process's visible devices (Ray sets CUDA_VISIBLE_DEVICES per actor)
    collective_timeout_s: float = 60.0
    run_id: str = ""

    @property
    def device(self) -> torch.device:
        import torch

        return torch.device("cuda", self.device_index) if self.device_type == "cuda" else torch.device("cpu")


def apply_safe_env() -> None:
    for key, value in SAFE_NCCL_ENV.items():
        os.environ.setdefault(key, value)


def free_port(host: str = "127.0.0.1") -> int:
    """A port free now on `host`; the rendezvous binds it moments later."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def init_rank(info: RankInfo) -> torch.device:
    """Join the process group of `info` and return this rank's device."""
    import torch
    import torch.distributed as dist

    apply_safe_env()
    device = info.device
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        init_kwargs: dict[str, Any] = {}
        if info.comm_backend == "nccl":
            init_kwargs["device_id"] = device  # eager NCCL init: communicator errors surface here, not mid-run
        dist.init_process_group(
            backend=info.comm_backend,
            init_method=f"tcp://{info.master_addr}:{info.master_port}",
            rank=info.rank,
            world_size=info.world_size,
            timeout=datetime.timedelta(seconds=info.collective_timeout_s),
            **init_kwargs,
        )
    return device


def shutdown_rank() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()


# ---------------------------------------------------------------------------------------------------------------
# Agreement: every rank takes the same branch before the next collective.


@dataclass(frozen=True, kw_only=True)
class StageFailure:
    """What ended a step on one rank: an OOM or an exception, with a one-line message."""

    kind: Literal["oom", "error"]
    stage: str  # "workspace", "dispatch", "experts", "combine", ...
    message: str

    @staticmethod
    def of(stage: str, exc: BaseException) -> StageFailure:
        text = str(exc).strip()
        first = text.splitlines()[0] if text else ""
        import torch

        kind: Literal["oom", "error"] = "oom" if isinstance(exc, torch.OutOfMemoryError) else "error"
        return StageFailure(kind=kind, stage=stage, message=f"{type(exc).__name__}: {first}"[:500])


def agree(own: StageFailure | None, device: torch.device) -> dict[int, StageFailure]:
    """Every rank's failure at this point, the same dict on every rank: an empty dict when none failed.

    One all_reduce of a flag per rank; the messages travel (all_gather_object) only when some rank failed, so the
    common path costs one tiny collective. Raises what the collective raises when the group itself is broken (a
    dead peer), which ends the rank.
    """
    import torch
    import torch.distributed as dist

    world, rank = dist.get_world_size(), dist.get_rank()
    flags = torch.zeros(world, dtype=torch.int32, device=device)
    flags[rank] = 0 if own is None else (1 if own.kind == "oom" else 2)
    dist.all_reduce(flags)
    failed = [r for r, flag in enumerate(flags.tolist()) if flag]
    if not failed:
        return {}
    failures: list[StageFailure | None] = [None] * world
    dist.all_gather_object(failures, own)
    return {r: f for r in failed if (f := failures[r]) is not None}
