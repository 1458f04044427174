"""Comm backends of the batched EP path: quantize-dispatch into (E, M, K) and combine back, one module each.

    tokens (n, K) bf16 -quantize-layout-pack-exchange-unpack-> expert_x (E, M, K) fp8, scales, expert_num_tokens
    out (n, K) bf16 <-token-reduce-exchange-expert-reduce-- expert_out (E, M, K) bf16 (the experts' `out`)

    symm-mem  torch symmetric memory (CUDA backend): rows and counts pushed into the peers' buffers by Triton
              kernels, release/acquire flags, no host read, captures in a CUDA graph; P >= 1, one node  symm_mem.py
    nccl      one packed row per (token, destination rank) over all_to_all_single in capacity-sized equal
              splits: no host read, captures in a CUDA graph                                 nccl.py
    gloo      the same packed rows on CPU ranks                                              gloo.py
    auto      the first of symm-mem, nccl, gloo that can run: symm-mem on GPUs with torch's symmetric memory,
              else nccl on GPUs, gloo on CPUs

base.py holds the shared types (layout, row format, batched buffers, handle, sub-stage marks); collective.py the
all_to_all_single path nccl and gloo share. Every buffer is allocated once at full capacity. Each backend is
declared in harness.core.backends.COMM (devices, layouts, auto's order, help text) and bound to its class here in
IMPLEMENTATIONS, with the runtime probe only a rank can answer (torch's symmetric memory on CUDA).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from harness.core.backends import AUTO, COMM, BackendQuery
from harness.rank.comm.base import (
    BatchedBuffers,
    Comm,
    CommUnavailable,
    DispatchError,
    DispatchHandle,
    DispatchLayout,
    Quantize,
    RowFormat,
    Stages,
    as_words,
)
from harness.rank.comm.fused import row_kernels
from harness.rank.comm.gloo import GlooComm
from harness.rank.comm.nccl import NcclComm
from harness.rank.comm.symm_mem import SymmMemComm, symm_mem_available
from harness.rank.memory import Accountant

__all__ = [
    "IMPLEMENTATIONS",
    "BatchedBuffers",
    "Comm",
    "CommUnavailable",
    "DispatchError",
    "DispatchHandle",
    "DispatchLayout",
    "Quantize",
    "RowFormat",
    "Stages",
    "as_words",
    "create_comm",
    "resolve_comm",
    "row_kernels",
    "unavailable_reason",
]


def _no_probe() -> str | None:
    return None


def _symm_mem_reason() -> str | None:
    if symm_mem_available():
        return None
    return "comm symm-mem needs torch's symmetric memory on CUDA, which this torch build or machine lacks"


@dataclass(frozen=True, kw_only=True)
class CommImplementation:
    """How a declared comm backend is built on a rank, and what only the rank can tell about it."""

    cls: type[Comm]
    create: Callable[[DispatchLayout, Accountant, torch.dtype, torch.device], Comm]
    runtime_reason: Callable[[], str | None] = _no_probe  # why it cannot run in this process, or None


# The implementation of every backend harness.core.backends.COMM declares, by its name.
IMPLEMENTATIONS: dict[str, CommImplementation] = {
    "symm-mem": CommImplementation(
        cls=SymmMemComm,
        runtime_reason=_symm_mem_reason,
        create=lambda layout, acc, dt, dev: SymmMemComm(layout, acc, out_dtype=dt, device=dev),
    ),
    "nccl": CommImplementation(cls=NcclComm, create=lambda layout, acc, dt, dev: NcclComm(layout, acc, out_dtype=dt)),
    "gloo": CommImplementation(cls=GlooComm, create=lambda layout, acc, dt, dev: GlooComm(layout, acc, out_dtype=dt)),
}


def _query(device_type: str, num_local_experts: int, num_ranks: int) -> BackendQuery:
    return BackendQuery(
        device_type=device_type,  # type: ignore[arg-type]
        num_local_experts=num_local_experts,
        num_ranks=num_ranks,
    )


def unavailable_reason(name: str, *, device_type: str, num_local_experts: int, num_ranks: int) -> str | None:
    """Why comm `name` (not auto) cannot carry a run on `device_type` ranks with this layout, or None.

    Its declaration (harness.core.backends.COMM), then its runtime probe: no GPU is touched.
    """
    if name not in COMM.names:
        return COMM.unknown(name)
    query = _query(device_type, num_local_experts, num_ranks)
    return COMM.reason(name, query) or IMPLEMENTATIONS[name].runtime_reason()


def resolve_comm(name: str, *, device_type: str, num_local_experts: int, num_ranks: int) -> tuple[str, str]:
    """(the backend to use, why): `auto` takes the first of COMM's order (symm-mem, nccl, gloo) whose
    declaration and runtime probe both pass.

    Raises CommUnavailable when a named backend cannot run here.
    """
    if name != AUTO:
        reason = unavailable_reason(
            name, device_type=device_type, num_local_experts=num_local_experts, num_ranks=num_ranks
        )
        if reason is not None:
            raise CommUnavailable(reason)
        return name, "named by the scenario"
    query = _query(device_type, num_local_experts, num_ranks)
    skipped: list[str] = []
    for backend in COMM.auto_order:
        reason = backend.supports(query) or IMPLEMENTATIONS[backend.name].runtime_reason()
        if reason is None:
            why = f"auto: {backend.name}, the first of {', '.join(b.name for b in COMM.auto_order)} that runs here"
            return backend.name, why + (f" (not {'; not '.join(skipped)})" if skipped else "")
        skipped.append(f"{backend.name}: {reason.removeprefix(f'comm {backend.name} ')}")
    raise CommUnavailable(f"comm auto: none of its order runs here (not {'; not '.join(skipped)})")


def create_comm(
    name: str, layout: DispatchLayout, accountant: Accountant, *, device: torch.device, out_dtype: torch.dtype
) -> Comm:
    """Allocate backend `name` (resolved, not auto) for this rank, every buffer at full capacity: the batched
    buffers and the backend's staging count under dispatch and combine. Collective for symm-mem: every rank calls
    it together."""
    if name not in IMPLEMENTATIONS:
        raise CommUnavailable(f"comm {name!r} is not one of {', '.join(COMM.names)}")
    return IMPLEMENTATIONS[name].create(layout, accountant, out_dtype, device)
