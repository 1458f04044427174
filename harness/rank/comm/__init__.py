"""Comm backends of the batched EP path: quantize-dispatch into (E, M, K) and combine back, one module each.

    tokens (n, K) bf16 -quantize-layout-pack-exchange-unpack-> expert_x (E, M, K) fp8, scales, expert_num_tokens
    out (n, K) bf16 <-token-reduce-exchange-expert-reduce-- expert_out (E, M, K) bf16 (the experts' `out`)

    symm-mem  torch NVSHMEM symmetric memory: counts on the device, no host read; each rank pulls its chunks
              from the peers' mapped send buffers straight into the batched buffer (one node)  symm_mem.py
    nccl      one packed row per (token, destination rank) over all_to_all_single; one host read of the
              split sizes per dispatch                                                       nccl.py
    gloo      the same packed rows on CPU ranks                                              gloo.py
    auto      symm-mem where it can run, else nccl on GPUs, gloo on CPUs

base.py holds the shared types (layout, row format, batched buffers, handle, sub-stage marks); collective.py the
all_to_all_single path nccl and gloo share. Every buffer is allocated once at full capacity.
"""

from __future__ import annotations

import torch

from harness.rank.comm.base import (
    BatchedBuffers, Comm, CommUnavailable, DispatchError, DispatchHandle, DispatchLayout, Quantize, RowFormat,
    Stages, as_words,
)
from harness.rank.comm.fused import row_kernels
from harness.rank.memory import Accountant
from harness.scenario.fit import comm_reason

COMM_CHOICES = ("auto", "symm-mem", "nccl", "gloo")

__all__ = [
    "COMM_CHOICES", "BatchedBuffers", "Comm", "CommUnavailable", "DispatchError", "DispatchHandle",
    "DispatchLayout", "Quantize", "RowFormat", "Stages", "as_words", "create_comm", "resolve_comm",
    "row_kernels", "unavailable_reason",
]


def unavailable_reason(name: str, *, device_type: str, num_local_experts: int, num_ranks: int) -> str | None:
    """Why comm `name` (not auto) cannot carry a run on `device_type` ranks with this layout, or None.

    Answered from the layout (harness.scenario.fit.comm_reason) and the torch build: no GPU is touched.
    """
    from harness.rank.comm.symm_mem import nvshmem_available

    if name not in COMM_CHOICES[1:]:
        return f"comm {name!r} is not one of {', '.join(COMM_CHOICES)}"
    reason = comm_reason(name, device_type=device_type,  # type: ignore[arg-type]
                         num_local_experts=num_local_experts, num_ranks=num_ranks)
    if reason is None and name == "symm-mem" and not nvshmem_available():
        reason = ("comm symm-mem needs NVSHMEM: torch.distributed._symmetric_memory.is_nvshmem_available() is "
                  "False here (install nvidia-nvshmem-cu13 for a CUDA 13 torch)")
    return reason


def resolve_comm(name: str, *, device_type: str, num_local_experts: int, num_ranks: int) -> tuple[str, str]:
    """(the backend to use, why): `auto` takes symm-mem where it can run, else nccl on GPUs and gloo on CPUs.

    Raises CommUnavailable when a named backend cannot run here.
    """
    args = {"device_type": device_type, "num_local_experts": num_local_experts, "num_ranks": num_ranks}
    if name != "auto":
        reason = unavailable_reason(name, **args)
        if reason is not None:
            raise CommUnavailable(reason)
        return name, "named by the scenario"
    if device_type == "cpu":
        return "gloo", "auto: CPU ranks"
    reason = unavailable_reason("symm-mem", **args)
    if reason is None:
        return "symm-mem", "auto: NVSHMEM works and there are peers (no host read per dispatch)"
    return "nccl", f"auto: not symm-mem because {reason.removeprefix('comm symm-mem ')}"


def create_comm(name: str, layout: DispatchLayout, accountant: Accountant, *, device: torch.device,
                out_dtype: torch.dtype) -> Comm:
    """Allocate backend `name` (resolved, not auto) for this rank, every buffer at full capacity: the batched
    buffers and the backend's staging count under dispatch and combine. Collective for symm-mem: every rank calls
    it together."""
    from harness.rank.comm.gloo import GlooComm
    from harness.rank.comm.nccl import NcclComm
    from harness.rank.comm.symm_mem import SymmMemComm

    if name == "gloo":
        return GlooComm(layout, accountant, out_dtype=out_dtype)
    if name == "nccl":
        return NcclComm(layout, accountant, out_dtype=out_dtype)
    if name == "symm-mem":
        return SymmMemComm(layout, accountant, out_dtype=out_dtype, device=device)
    raise CommUnavailable(f"comm {name!r} is not one of {', '.join(COMM_CHOICES[1:])}")
